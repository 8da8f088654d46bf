// Package helm holds no code: it is the Helm chart for Sluice's services
// (sluice/, documented in sluice/README.md), and its test renders every
// values combination the README documents with Helm's own Go SDK, decodes
// each manifest strictly into Kubernetes' Go types, and loads what the
// chart gives each container (arguments, SLUICE_* environment, the mounted
// sluice.yaml, policy, keys and secrets) into Sluice's configuration loader.
package helm
