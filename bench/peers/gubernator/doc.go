// Package gubernatorbench measures Sluice's admission (sdk/go/admission)
// side by side with gubernator (github.com/gubernator-io/gubernator/v2,
// pinned at v2.13.0), a rate-limit service a user might run instead: the
// same rules, the same keys and the same closed-loop load against each,
// decisions per core, p50/p99 latency and overshoot as the load generator
// counts it (BenchmarkAdmissionVsGubernator; bench/README.md, "Admission
// against gubernator").
//
// It is a module of its own so that gubernator's large dependency tree
// (etcd, Kubernetes client, memberlist, OpenTelemetry exporters) stays out
// of Sluice's go.mod: it requires gubernator for its gRPC client and
// Sluice through a replace of the checkout. gubernator's daemon is built
// apart, with gubernator's own go.mod (go install ...@v2.13.0), and run as
// its own process, as its README deploys it. The rules, the load generator
// and the figures are bench/sidebyside's, shared with the other peers'
// modules so that every peer is measured the same way. Run the benchmark
// from this folder with GOWORK=off (the checkout's go.work lists only the
// main module); `make bench` and `make bench-peers` do.
package gubernatorbench
