package envoyratelimitbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

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

// figures are one side's measurements.
type figures struct {
	perSec, perCore, cores, p50, p99 float64
	// overshoot is over any span of one window; own over what the
	// limiter promises: the service's clock-aligned fixed windows,
	// Sluice's granules.
	overshoot, own float64
}

// BenchmarkAdmissionVsEnvoyRatelimit measures Sluice's admission and the
// Envoy ratelimit service side by side on the same rules and the same
// load, in one run so that the ratios hold on a machine other work shares:
// the gubernator comparison's rules, loads and figures
// (bench/peers/gubernator), against the Envoy service instead. Every
// decision checks two limits of one key: a window of W requests per window
// and a token bucket (for the service, which has neither sliding windows
// nor buckets, a fixed window of the same W and unit, and a one-minute
// fixed window that never refuses). Three loads, each for every side:
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
	open := load{keys: envInt("SLUICE_PEER_BENCH_KEYS", 100), clients: envInt("SLUICE_PEER_BENCH_CLIENTS", 32),
		dur: envDuration("SLUICE_PEER_BENCH_DURATION", 5*time.Second)}
	tight := load{keys: 4, clients: open.clients, dur: envDuration("SLUICE_PEER_BENCH_TIGHT_DURATION", 4*time.Second), record: true}
	openRules := rules{windowLimit: 1 << 40, window: time.Minute}
	tightRules := rules{windowLimit: 500, window: time.Second}
	services := map[string]envoyProcess{}
	for _, p := range pairs {
		services[p.peer.name] = envoyService(b, p.peer, openRules, tightRules)
	}
	for i := 0; i < b.N; i++ {
		// The load generator alone: its CPU per decision is taken out of
		// every side's.
		null := drive(b, side{name: "null", decide: func(context.Context, int) (bool, bool, error) {
			return true, false, nil
		}}, load{keys: open.keys, clients: open.clients, dur: time.Second})
		genCPU := float64(null.ownCPU) / float64(null.decisions)
		b.ReportMetric(genCPU, "admission_peer_envoy_ratelimit_loadgen_cpu_ns_per_decision")
		for _, p := range pairs {
			// Sluice's side under its own name here: the gubernator
			// module reports admission_peer_sluice_<mode>_* from its run.
			sl := measure(b, genCPU, open, tight,
				func(ru rules) side { return sluiceSide(b, "sluice_"+p.mode+"_vs_envoy", ru, p.exact, open.clients) }, openRules, tightRules)
			svc := services[p.peer.name]
			en := measure(b, genCPU, open, tight, func(ru rules) side {
				key := openKey
				if ru == tightRules {
					key = tightKey
				}
				return envoySide(b, "envoy_ratelimit_"+p.peer.name, svc, key)
			}, openRules, tightRules)
			k := "admission_vs_envoy_ratelimit_"
			b.ReportMetric(sl.perCore/en.perCore, k+"decisions_per_core_"+p.mode+"_ratio")
			b.ReportMetric(en.p50/sl.p50, k+"p50_"+p.mode+"_ratio")
			b.ReportMetric(en.p99/sl.p99, k+"p99_"+p.mode+"_ratio")
			// A fixed window is judged by its own promise, a sliding one by
			// its own; 1 + overshoot so that none on both sides is 1.
			b.ReportMetric((1+en.own)/(1+sl.own), k+"overshoot_"+p.mode+"_ratio")
		}
	}
}

// measure runs one side under the open and the tight load (each side
// built afresh, with its own keys) and reports its raw figures.
func measure(b *testing.B, genCPU float64, open, tight load, mk func(rules) side, openRules, tightRules rules) figures {
	b.Helper()
	s := mk(openRules)
	drive(b, s, load{keys: open.keys, clients: open.clients, dur: 500 * time.Millisecond}) // connections, scripts, leases
	stop := profile(b, s)
	r := drive(b, s, open)
	stop()
	checkRun(b, s, r)
	f := figures{perSec: float64(r.decisions) / r.wall.Seconds()}
	client := max(float64(r.ownCPU)-genCPU*float64(r.decisions), 0)
	deciding := float64(r.serverCPU) + client
	f.cores = deciding / float64(r.wall)
	f.perCore = float64(r.decisions) / (deciding / 1e9)
	alone := drive(b, s, load{keys: open.keys, clients: 1, dur: 2 * time.Second})
	checkRun(b, s, alone)
	f.p50 = float64(itest.Percentile(alone.lat, 0.5))
	f.p99 = float64(itest.Percentile(alone.lat, 0.99))

	ts := mk(tightRules)
	tr := drive(b, ts, tight)
	checkRun(b, ts, tr)
	w, lim := tightRules.window, tightRules.windowLimit
	f.overshoot = slidingOvershoot(tr.events, tight.keys, lim, w)
	if s.alignedWindow {
		f.own = alignedOvershoot(tr.events, lim, w)
	} else {
		// Sluice's window counts in admission.Granules granules: it
		// promises at most the limit in any span one granule shorter
		// than the window.
		f.own = slidingOvershoot(tr.events, tight.keys, lim, w-w/admission.Granules)
	}

	k := "admission_peer_" + s.name + "_"
	b.ReportMetric(f.perSec, k+"decisions_per_sec")
	b.ReportMetric(f.perCore, k+"decisions_per_core")
	b.ReportMetric(f.cores, k+"cores")
	b.ReportMetric(r.serverCPU.Seconds()/r.wall.Seconds(), k+"server_cores")
	b.ReportMetric(f.p50, k+"p50_ns")
	b.ReportMetric(f.p99, k+"p99_ns")
	b.ReportMetric(float64(itest.Percentile(r.lat, 0.5)), k+"loaded_p50_ns")
	b.ReportMetric(float64(itest.Percentile(r.lat, 0.99)), k+"loaded_p99_ns")
	b.ReportMetric(f.overshoot, k+"overshoot_sliding_ratio")
	b.ReportMetric(f.own, k+"overshoot_ratio")
	b.ReportMetric(float64(tr.allowed)/tr.wall.Seconds(), k+"tight_admitted_per_sec")
	if s.commands != nil {
		b.ReportMetric(float64(r.commands)/float64(r.decisions), k+"redis_commands_per_decision")
	}
	b.Logf("%s: open %d decisions in %s (%d allowed), own CPU %s, server CPU %s; tight %d decisions, %d admitted",
		s.name, r.decisions, r.wall.Round(time.Millisecond), r.allowed, r.ownCPU.Round(time.Millisecond),
		r.serverCPU.Round(time.Millisecond), tr.decisions, tr.allowed)
	return f
}

// checkRun fails the benchmark when a run's figures would not be the
// limiter's: errors, or decisions taken by a fail mode.
func checkRun(b *testing.B, s side, r result) {
	b.Helper()
	if r.decisions == 0 {
		b.Fatalf("%s: no decision in %s", s.name, r.wall)
	}
	if r.errs > 0 || r.failed > 0 {
		b.Fatalf("%s: %d errors and %d fail-mode decisions of %d", s.name, r.errs, r.failed, r.decisions)
	}
}

// profile, when SLUICE_PEER_BENCH_PROFILE names a folder, profiles s's open
// run into it: this process with runtime/pprof (<side>.client.pprof) and
// the servers with perf record, if perf is installed
// (<side>.server.perf.data; `perf report -i` reads it). The returned
// function stops both.
func profile(b *testing.B, s side) (stop func()) {
	dir := os.Getenv("SLUICE_PEER_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, s.name+".client.pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	perf := exec.Command("perf", "record", "-F", "499", "-g", "-o", filepath.Join(dir, s.name+".server.perf.data"), "-p", pidList(s.servers))
	if err := perf.Start(); err != nil {
		b.Logf("no server profile: %v", err)
		perf = nil
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		if perf != nil {
			_ = perf.Process.Signal(os.Interrupt)
			_ = perf.Wait()
		}
	}
}

func pidList(pids []int) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}
