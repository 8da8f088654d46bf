package tally

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// scaleModels is how many models each tenant of the growth-curve
// benchmarks uses: n tenant × model keys are n/scaleModels tenants.
const scaleModels = 4

// scaleSizes are the tenant × model key counts of the growth curves
// (issue 19, item 4). SLUICE_SCALE_MAX_KEYS lowers the largest size
// measured (1,000,000 keys needs about 3 GB of heap and a minute or two).
func scaleSizes(b *testing.B) []int {
	sizes := []int{1_000, 10_000, 100_000, 1_000_000}
	if v := os.Getenv("SLUICE_SCALE_MAX_KEYS"); v != "" {
		limit, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("SLUICE_SCALE_MAX_KEYS=%q: want a number of keys", v)
		}
		for len(sizes) > 1 && sizes[len(sizes)-1] > limit {
			sizes = sizes[:len(sizes)-1]
		}
	}
	return sizes
}

// scaleEvent fills ev as an event of key k (tenant k/scaleModels, model
// k mod scaleModels).
func scaleEvent(ev *schemas.UsageEvent, tenants []string, k int) {
	ev.Tenant = tenants[k/scaleModels]
	ev.Model = scaleModelNames[k%scaleModels]
	ev.PromptTokens = int64(100 + k%500)
	ev.CompletionTokens = int64(k % 300)
	ev.LatencyMS = int64(k % 2000)
	ev.Outcome = schemas.OutcomeOK
}

var scaleModelNames = [scaleModels]string{"gpt-4o", "gpt-4o-mini", "claude-3-5-sonnet", "o1"}

const scalePolicy = `
defaults:
  budget: {amount: 1000, currency: USD}
  models:
    "*": {monthly_tokens: 100000000, daily_tokens: 10000000, hourly_tokens: 1000000, tokens_per_minute: 100000, requests_per_minute: 1000}
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
`

// BenchmarkScale reports the aggregator's growth curves, one sub-benchmark
// per size n of 1,000 / 10,000 / 100,000 / 1,000,000 active tenant × model
// keys (n/4 tenants × 4 models, default options: 200,000 remembered ids,
// five quotas and a budget on every tenant):
//
//   - scale_aggregator_bytes_per_key_<n>keys: heap after every key has
//     counted one event (each tenant's "*" series, its tenant record and
//     the remembered ids included), divided by n;
//   - scale_aggregator_events_per_sec_<n>keys: Apply on one core of events
//     of keys drawn at random among the n, unique ids, event time moving
//     one second every 1,000 events (signals and dirty rows taken
//     regularly, as a flush would);
//   - scale_aggregator_replay_events_per_sec_<n>keys: the same events
//     applied in replay mode (no signals), the in-memory part of the
//     rebuild at assignment; restart time without a snapshot is the
//     stored events of the partition's month and a half divided by it,
//     plus reading them from ClickHouse.
func BenchmarkScale(b *testing.B) {
	pol := mustPolicy(b, scalePolicy)
	for _, n := range scaleSizes(b) {
		tenants := scaleTenants(n)
		rng := rand.New(rand.NewPCG(uint64(n), 19))
		keys := make([]int32, 1<<16)
		for i := range keys {
			keys[i] = int32(rng.IntN(n))
		}
		// The states are built once per size and kept across the
		// benchmark's calibration rounds (building 1,000,000 keys takes
		// seconds); next numbers the events applied so far.
		var live, replay *Partition
		var perKey float64
		next := 0
		b.Run(fmt.Sprintf("%dkeys", n), func(b *testing.B) {
			var ev schemas.UsageEvent
			warm := func(q *Partition) { scaleWarm(q, tenants, n) }
			if live == nil {
				// Memory: every key has counted one event, on a fresh state.
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				live = New(0, DefaultOptions())
				live.SetPolicy(pol)
				warm(live)
				runtime.GC()
				runtime.ReadMemStats(&after)
				if series, _ := live.Entries(); series != n+n/scaleModels {
					b.Fatalf("state holds %d series, want %d keys and %d tenant-wide series", series, n, n/scaleModels)
				}
				perKey = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				replay = New(0, DefaultOptions())
				replay.SetPolicy(pol)
				replay.SetReplay(true)
				warm(replay)
			}
			ids := make([]string, b.N)
			for i := range ids {
				ids[i] = "e-" + strconv.Itoa(next+i)
			}
			base := t0.Add(time.Duration(n/1000+1) * time.Second)
			// run reports wall and process CPU time (user + system: this
			// goroutine and the garbage collector) of b.N events.
			run := func(q *Partition) (wall, cpu time.Duration) {
				c0 := processCPU(b)
				start := time.Now()
				for i := 0; i < b.N; i++ {
					j := next + i
					scaleEvent(&ev, tenants, int(keys[j&(len(keys)-1)]))
					ev.ID = ids[i]
					ev.Time = base.Add(time.Duration(j/1000) * time.Second)
					q.Apply(&ev, int64(n+j))
					if i%4096 == 0 {
						q.TakeSignals()
						q.ClearDirty()
					}
				}
				return time.Since(start), processCPU(b) - c0
			}
			b.ResetTimer()
			wall, cpu := run(live)
			b.StopTimer()
			replayWall, replayCPU := run(replay)
			next += b.N
			// ResetTimer drops metrics reported before it.
			b.ReportMetric(perKey, fmt.Sprintf("scale_aggregator_bytes_per_key_%dkeys", n))
			b.ReportMetric(float64(b.N)/wall.Seconds(), fmt.Sprintf("scale_aggregator_events_per_sec_%dkeys", n))
			b.ReportMetric(float64(b.N)/cpu.Seconds(), fmt.Sprintf("scale_aggregator_events_per_cpu_sec_%dkeys", n))
			b.ReportMetric(float64(b.N)/replayWall.Seconds(), fmt.Sprintf("scale_aggregator_replay_events_per_sec_%dkeys", n))
			b.ReportMetric(float64(b.N)/replayCPU.Seconds(), fmt.Sprintf("scale_aggregator_replay_events_per_cpu_sec_%dkeys", n))
		})
	}
}

// scaleWarm has each of the n keys count one event in q, as the growth
// curves' states are built, and leaves nothing pending.
func scaleWarm(q *Partition, tenants []string, n int) {
	var ev schemas.UsageEvent
	for k := 0; k < n; k++ {
		scaleEvent(&ev, tenants, k)
		ev.ID = "w-" + strconv.Itoa(k)
		ev.Time = t0.Add(time.Duration(k/1000) * time.Second)
		q.Apply(&ev, int64(k))
		if k%4096 == 0 {
			q.TakeSignals()
			q.ClearDirty()
		}
	}
	q.TakeSignals()
	q.ClearDirty()
}

// scaleTenants returns the n/scaleModels tenant names of n keys.
func scaleTenants(n int) []string {
	tenants := make([]string, n/scaleModels)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%07d", i)
	}
	return tenants
}

// BenchmarkSnapshot measures the snapshot codec at the growth curves'
// sizes (states built as BenchmarkScale's, one event per key):
//
//   - scale_aggregator_snapshot_bytes_per_key_<n>keys: encoded size / n;
//   - scale_aggregator_snapshot_encode_seconds_<n>keys: Snapshot's time;
//   - scale_aggregator_snapshot_copy_seconds_<n>keys: SnapshotCopy's
//     time into the memory of an earlier copy, as the aggregator takes it:
//     what its poll loop (and the partition) waits for a snapshot since
//     issue 37 — the encoding runs from the copy, on a goroutine of its
//     own (Snapshot is a fresh copy and its encoding);
//   - scale_aggregator_snapshot_copy_cpu_seconds_<n>keys and
//     scale_aggregator_snapshot_encode_cpu_seconds_<n>keys: the same as
//     the process's CPU time (the garbage collector included), steadier
//     than wall time on a shared machine;
//   - scale_aggregator_snapshot_load_seconds_<n>keys: Load's time (the
//     in-memory part of a restart from a snapshot; reading the bytes from
//     ClickHouse and replaying the events after it come on top).
func BenchmarkSnapshot(b *testing.B) {
	pol := mustPolicy(b, scalePolicy)
	for _, n := range scaleSizes(b) {
		tenants := scaleTenants(n)
		var q *Partition
		var buf []byte
		b.Run(fmt.Sprintf("%dkeys", n), func(b *testing.B) {
			if q == nil {
				q = New(0, DefaultOptions())
				q.SetPolicy(pol)
				scaleWarm(q, tenants, n)
			}
			var enc, load, cp, encCPU, cpCPU time.Duration
			spare, err := q.SnapshotCopy(nil) // the aggregator copies into its last copy
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < b.N; i++ {
				runtime.GC()
				start, cpu := time.Now(), processCPU(b)
				if spare, err = q.SnapshotCopy(spare); err != nil {
					b.Fatal(err)
				}
				cp += time.Since(start)
				cpCPU += processCPU(b) - cpu
				runtime.GC()
				start, cpu = time.Now(), processCPU(b)
				buf, err = q.Snapshot(buf[:0], "fp")
				if err != nil {
					b.Fatal(err)
				}
				enc += time.Since(start)
				encCPU += processCPU(b) - cpu
				start = time.Now()
				l, err := Load(0, DefaultOptions(), pol, "fp", buf)
				if err != nil {
					b.Fatal(err)
				}
				load += time.Since(start)
				if series, _ := l.Entries(); series != n+n/scaleModels {
					b.Fatalf("loaded state holds %d series, want %d", series, n+n/scaleModels)
				}
			}
			b.ReportMetric(float64(len(buf))/float64(n), fmt.Sprintf("scale_aggregator_snapshot_bytes_per_key_%dkeys", n))
			b.ReportMetric(enc.Seconds()/float64(b.N), fmt.Sprintf("scale_aggregator_snapshot_encode_seconds_%dkeys", n))
			b.ReportMetric(cp.Seconds()/float64(b.N), fmt.Sprintf("scale_aggregator_snapshot_copy_seconds_%dkeys", n))
			b.ReportMetric(cpCPU.Seconds()/float64(b.N), fmt.Sprintf("scale_aggregator_snapshot_copy_cpu_seconds_%dkeys", n))
			b.ReportMetric(encCPU.Seconds()/float64(b.N), fmt.Sprintf("scale_aggregator_snapshot_encode_cpu_seconds_%dkeys", n))
			b.ReportMetric(load.Seconds()/float64(b.N), fmt.Sprintf("scale_aggregator_snapshot_load_seconds_%dkeys", n))
		})
	}
}

// processCPU returns the process's CPU time so far (user + system, every
// thread): throughput per CPU second is steadier than per wall second on
// a machine other processes share.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
