// Package envoyratelimitbench measures Sluice's admission (sdk/go/admission)
// side by side with the Envoy ratelimit service
// (github.com/envoyproxy/ratelimit, at the pseudo-version
// v1.4.1-0.20260122083618-3fb702589d36: the module proxy serves no tagged
// release), the rate-limit service Envoy's rate-limit filter calls: the
// gubernator comparison's rules, keys and closed-loop load
// (bench/peers/gubernator, bench/sidebyside) against each, decisions per core, p50/p99
// latency and overshoot as the load generator counts it
// (BenchmarkAdmissionVsEnvoyRatelimit; bench/README.md, "Admission against
// the Envoy ratelimit service").
//
// It is a module of its own, like gubernator's, so that nothing of the
// service's enters Sluice's go.mod: it requires go-control-plane for the
// RLS gRPC client (envoy.service.ratelimit.v3, which Sluice already
// requires) and Sluice through a replace of the checkout. The service is
// built apart, with its own go.mod (go install ...@version), and run as its
// own process, configured by its environment and a runtime directory of
// descriptor YAML, as its README runs it. The rules, the load generator and
// the figures are bench/sidebyside's, which the gubernator module uses
// too. Run the benchmark from this folder with GOWORK=off (the checkout's
// go.work lists only the main module); `make bench` and `make bench-peers`
// do.
package envoyratelimitbench
