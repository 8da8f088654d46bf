// Package demo holds what `make run` and the end-to-end tests put around
// Sluice to show it working: an OpenAI-compatible mock upstream (mockllm),
// a reference gateway built on the SDK (refgateway), a load generator with
// tenants on different plans (loadgen) and the live terminal view
// (dashboard). None of it is part of a production deployment.
package demo
