package envoyratelimitbench

import (
	"testing"

	"github.com/sluicehq/sluice/bench/sidebyside"
)

// pair is one of Sluice's modes and the Envoy ratelimit service's
// configuration it is compared with. Every decision of the service is a
// Redis round trip (it keeps no state of its own under the limit), so
// both of its configurations decide as Sluice exact does; each Sluice mode
// meets the one of the same intent: exact against the service's defaults,
// leased (Sluice's throughput mode) against the service's README's
// settings for throughput — a pipelining window that buffers concurrent
// requests' Redis writes into one flush, and a local cache of keys over
// their limit, answered without Redis until their window ends.
type pair struct {
	mode  string
	exact bool
	peer  envoyMode
}

var pairs = []pair{
	{"exact", true, envoyMode{name: "default"}},
	{"lease", false, envoyMode{name: "tuned", env: []string{"REDIS_PIPELINE_WINDOW=150us", "LOCAL_CACHE_SIZE_IN_BYTES=1048576"}}},
}

// BenchmarkAdmissionVsEnvoyRatelimit measures Sluice's admission and the
// Envoy ratelimit service side by side on the same rules and the same
// load, in one run so that the ratios hold on a machine other work shares:
// the gubernator comparison's rules, loads and figures (bench/sidebyside),
// against the Envoy service instead. Every decision checks two limits of
// one key: a window of W requests per window and a token bucket (for the
// service, which has neither sliding windows nor buckets, a fixed window of
// the same W and unit, and a one-minute fixed window that never refuses).
// Three loads, each for every side:
//
//   - open: SLUICE_PEER_BENCH_KEYS keys (100) drawn uniformly by
//     SLUICE_PEER_BENCH_CLIENTS closed-loop clients (32) for
//     SLUICE_PEER_BENCH_DURATION (5 s), limits that never refuse: decisions
//     per second, per core of the deciding side, and latency;
//   - alone: the same with one client for 2 s: the latency of a decision
//     when nothing queues for the server;
//   - tight: 4 keys, a window of 500 requests per second, which the load
//     exceeds on every side (2,000 a second in all), for 4 s: overshoot
//     from the admissions the load generator counted itself.
//
// The deciding side's CPU is the servers' (Redis, and for the Envoy side
// the service's process, from /proc) plus this process's less the load
// generator's own, measured alone first with a decider that answers at
// once. Keys and their meaning: bench/README.md, "Admission against the
// Envoy ratelimit service".
func BenchmarkAdmissionVsEnvoyRatelimit(b *testing.B) {
	if testing.Short() {
		b.Skip("runs the Envoy ratelimit service and the real Redis")
	}
	open, tight := sidebyside.Loads()
	services := map[string]envoyProcess{}
	for _, p := range pairs {
		services[p.peer.name] = envoyService(b, p.peer)
	}
	for i := 0; i < b.N; i++ {
		genCPU := sidebyside.LoadGenCPU(b, open)
		b.ReportMetric(genCPU, "admission_peer_envoy_ratelimit_loadgen_cpu_ns_per_decision")
		for _, p := range pairs {
			// Sluice's side under a name of its own: the gubernator
			// module reports admission_peer_sluice_<mode>_* from its run.
			sl := sidebyside.Measure(b, genCPU, open, tight, func(ru sidebyside.Rules) sidebyside.Side {
				return sidebyside.SluiceSide(b, "sluice_"+p.mode+"_vs_envoy", ru, p.exact, open.Clients)
			})
			en := sidebyside.Measure(b, genCPU, open, tight, func(ru sidebyside.Rules) sidebyside.Side {
				return envoySide(b, "envoy_ratelimit_"+p.peer.name, services[p.peer.name], ru)
			})
			k := "admission_vs_envoy_ratelimit_"
			b.ReportMetric(sl.PerCore/en.PerCore, k+"decisions_per_core_"+p.mode+"_ratio")
			b.ReportMetric(en.P50/sl.P50, k+"p50_"+p.mode+"_ratio")
			b.ReportMetric(en.P99/sl.P99, k+"p99_"+p.mode+"_ratio")
			// A fixed window is judged by its own promise, a sliding one by
			// its own; 1 + overshoot so that none on both sides is 1.
			b.ReportMetric((1+en.Own)/(1+sl.Own), k+"overshoot_"+p.mode+"_ratio")
		}
	}
}
