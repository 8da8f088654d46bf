package gubernatorbench

import (
	"testing"

	guber "github.com/gubernator-io/gubernator/v2"

	"github.com/sluicehq/sluice/bench/sidebyside"
)

// pair is one of Sluice's modes and the gubernator behaviour it is
// compared with: exact (every decision a round trip to Redis) against
// BATCHING (every decision at the owning daemon, its default), leased
// (decisions from a local lease, reconciled in the background) against
// GLOBAL (decisions from a local copy, hits sent to the owner
// asynchronously).
type pair struct {
	mode, peerMode string
	exact          bool
	behavior       guber.Behavior
}

var pairs = []pair{
	{"exact", "batching", true, guber.Behavior_BATCHING},
	{"lease", "global", false, guber.Behavior_GLOBAL},
}

// BenchmarkAdmissionVsGubernator measures Sluice's admission and
// gubernator side by side on the same rules and the same load, in one run
// so that the ratios hold on a machine other work shares. Every decision
// checks two limits of one key: a window of W requests per window and a
// token bucket. Three loads, each for every side (sidebyside.Loads,
// sidebyside.Measure):
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
// The deciding side's CPU is the server's (Redis's or gubernator's daemon's,
// from /proc) plus this process's less the load generator's own, measured
// alone first with a decider that answers at once. Keys and their meaning:
// bench/README.md, "Admission against gubernator".
func BenchmarkAdmissionVsGubernator(b *testing.B) {
	if testing.Short() {
		b.Skip("runs gubernator's daemon and the real Redis")
	}
	open, tight := sidebyside.Loads()
	addr, pid := gubernatorDaemon(b)
	for i := 0; i < b.N; i++ {
		genCPU := sidebyside.LoadGenCPU(b, open)
		b.ReportMetric(genCPU, "admission_peer_loadgen_cpu_ns_per_decision")
		for _, p := range pairs {
			sl := sidebyside.Measure(b, genCPU, open, tight, func(ru sidebyside.Rules) sidebyside.Side {
				return sidebyside.SluiceSide(b, "sluice_"+p.mode, ru, p.exact, open.Clients)
			})
			gu := sidebyside.Measure(b, genCPU, open, tight, func(ru sidebyside.Rules) sidebyside.Side {
				return gubernatorSide(b, "gubernator_"+p.peerMode, addr, pid, ru, p.behavior)
			})
			k := "admission_vs_gubernator_"
			b.ReportMetric(sl.PerCore/gu.PerCore, k+"decisions_per_core_"+p.mode+"_ratio")
			b.ReportMetric(gu.P50/sl.P50, k+"p50_"+p.mode+"_ratio")
			b.ReportMetric(gu.P99/sl.P99, k+"p99_"+p.mode+"_ratio")
			// A fixed window is judged by its own promise, a sliding one by
			// its own; 1 + overshoot so that none on both sides is 1.
			b.ReportMetric((1+gu.Own)/(1+sl.Own), k+"overshoot_"+p.mode+"_ratio")
		}
	}
}
