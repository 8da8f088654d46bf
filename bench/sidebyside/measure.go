package sidebyside

import (
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

// Rules are the two limits every request is checked against, per key: a
// window of WindowLimit requests per Window, and a bucket (BucketBurst,
// refilled per BucketPeriod) that never refuses at these loads: its cost
// is what is measured.
type Rules struct {
	WindowLimit int64
	Window      time.Duration
}

const (
	// BucketBurst is the bucket's burst, and its refill per BucketPeriod.
	BucketBurst = int64(1) << 40
	// BucketPeriod is the time the bucket takes to refill BucketBurst.
	BucketPeriod = time.Minute
)

var (
	// OpenRules never refuse: the open load measures the cost of deciding.
	OpenRules = Rules{WindowLimit: 1 << 40, Window: time.Minute}
	// TightRules allow 500 requests per second and key, which the tight
	// load exceeds on every side (2,000 a second over its 4 keys).
	TightRules = Rules{WindowLimit: 500, Window: time.Second}
)

// Loads are the open and tight loads: SLUICE_PEER_BENCH_KEYS keys (100)
// drawn uniformly by SLUICE_PEER_BENCH_CLIENTS closed-loop clients (32)
// for SLUICE_PEER_BENCH_DURATION (5 s); and 4 keys, the same clients, for
// SLUICE_PEER_BENCH_TIGHT_DURATION (4 s), every admission recorded.
func Loads() (open, tight Load) {
	open = Load{Keys: envInt("SLUICE_PEER_BENCH_KEYS", 100), Clients: envInt("SLUICE_PEER_BENCH_CLIENTS", 32),
		Dur: envDuration("SLUICE_PEER_BENCH_DURATION", 5*time.Second)}
	tight = Load{Keys: 4, Clients: open.Clients, Dur: envDuration("SLUICE_PEER_BENCH_TIGHT_DURATION", 4*time.Second), Record: true}
	return open, tight
}

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

// Figures are one side's measurements that the comparisons divide.
type Figures struct {
	// PerCore is decisions per CPU-second of the deciding side.
	PerCore float64
	// P50 and P99 are one client's decision latency, ns.
	P50, P99 float64
	// Own is the overshoot over what the limiter promises (Side.Window).
	Own float64
}

// Measure runs one side under the open load (after a warm-up: connections,
// scripts, leases), alone (one client for 2 s) and under the tight load,
// each side built afresh by mk for the rules, with its own keys, and
// reports its figures as admission_peer_<name>_<figure>. The deciding
// side's CPU is its servers' plus this process's, less the load
// generator's own (genCPU ns per decision, from LoadGenCPU).
func Measure(b *testing.B, genCPU float64, open, tight Load, mk func(Rules) Side) Figures {
	b.Helper()
	s := mk(OpenRules)
	drive(b, s, Load{Keys: open.Keys, Clients: open.Clients, Dur: 500 * time.Millisecond})
	stop := profile(b, s)
	r := drive(b, s, open)
	stop()
	checkRun(b, s, r)
	client := max(float64(r.ownCPU)-genCPU*float64(r.decisions), 0)
	deciding := float64(r.serverCPU) + client
	var f Figures
	f.PerCore = float64(r.decisions) / (deciding / 1e9)
	alone := drive(b, s, Load{Keys: open.Keys, Clients: 1, Dur: 2 * time.Second})
	checkRun(b, s, alone)
	f.P50 = float64(itest.Percentile(alone.lat, 0.5))
	f.P99 = float64(itest.Percentile(alone.lat, 0.99))

	ts := mk(TightRules)
	tr := drive(b, ts, tight)
	checkRun(b, ts, tr)
	w, lim := TightRules.Window, TightRules.WindowLimit
	sliding := slidingOvershoot(tr.events, tight.Keys, lim, w)
	switch s.Window {
	case FixedReset:
		f.Own = fixedOvershoot(tr.events, lim)
	case FixedAligned:
		f.Own = alignedOvershoot(tr.events, lim, w)
	default:
		f.Own = slidingOvershoot(tr.events, tight.Keys, lim, w-w/admission.Granules)
	}

	k := "admission_peer_" + s.Name + "_"
	b.ReportMetric(float64(r.decisions)/r.wall.Seconds(), k+"decisions_per_sec")
	b.ReportMetric(f.PerCore, k+"decisions_per_core")
	b.ReportMetric(deciding/float64(r.wall), k+"cores")
	b.ReportMetric(r.serverCPU.Seconds()/r.wall.Seconds(), k+"server_cores")
	b.ReportMetric(f.P50, k+"p50_ns")
	b.ReportMetric(f.P99, k+"p99_ns")
	b.ReportMetric(float64(itest.Percentile(r.lat, 0.5)), k+"loaded_p50_ns")
	b.ReportMetric(float64(itest.Percentile(r.lat, 0.99)), k+"loaded_p99_ns")
	b.ReportMetric(sliding, k+"overshoot_sliding_ratio")
	b.ReportMetric(f.Own, k+"overshoot_ratio")
	b.ReportMetric(float64(tr.allowed)/tr.wall.Seconds(), k+"tight_admitted_per_sec")
	if s.Commands != nil {
		b.ReportMetric(float64(r.commands)/float64(r.decisions), k+"redis_commands_per_decision")
	}
	b.Logf("%s: open %d decisions in %s (%d allowed), own CPU %s, server CPU %s; tight %d decisions, %d admitted",
		s.Name, r.decisions, r.wall.Round(time.Millisecond), r.allowed, r.ownCPU.Round(time.Millisecond),
		r.serverCPU.Round(time.Millisecond), tr.decisions, tr.allowed)
	return f
}

// checkRun fails the benchmark when a run's figures would not be the
// limiter's: errors, or decisions taken by a fail mode.
func checkRun(b *testing.B, s Side, r result) {
	b.Helper()
	if r.decisions == 0 {
		b.Fatalf("%s: no decision in %s", s.Name, r.wall)
	}
	if r.errs > 0 || r.failed > 0 {
		b.Fatalf("%s: %d errors and %d fail-mode decisions of %d", s.Name, r.errs, r.failed, r.decisions)
	}
}

// profile, when SLUICE_PEER_BENCH_PROFILE names a folder, profiles s's open
// run into it: this process with runtime/pprof (<side>.client.pprof) and
// the servers with perf record, if perf is installed
// (<side>.server.perf.data; `perf report -i` reads it). The returned
// function stops both.
func profile(b *testing.B, s Side) (stop func()) {
	dir := os.Getenv("SLUICE_PEER_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, s.Name+".client.pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	pids := make([]string, len(s.Servers))
	for i, p := range s.Servers {
		pids[i] = strconv.Itoa(p)
	}
	perf := exec.Command("perf", "record", "-F", "499", "-g", "-o", filepath.Join(dir, s.Name+".server.perf.data"), "-p", strings.Join(pids, ","))
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
