package chstore

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// BenchmarkRebuild reports what a restart costs today, without a snapshot:
// the rebuild at assignment (Store.Replay into a tally.Partition in replay
// mode, as the aggregator's onAssigned does) of one partition holding n
// tenant × model keys (n/4 tenants × 4 models), with
// SLUICE_SCALE_REBUILD_EVENTS_PER_KEY stored events per key (default 1:
// the floor; a month of history multiplies it), from a fresh database on
// the shared ClickHouse 18.16. Sizes 100,000 and 1,000,000 keys
// (SLUICE_SCALE_MAX_KEYS lowers the largest). Keys:
// scale_aggregator_rebuild_seconds_<n>keys (query, transfer and replay
// until the partition could consume again) and
// scale_aggregator_rebuild_events_per_sec_<n>keys. Inserting the events is
// not timed.
func BenchmarkRebuild(b *testing.B) {
	perKey, limit, pol := rebuildBenchSetup(b)
	for _, n := range []int{100_000, 1_000_000} {
		if n > limit && n != 100_000 {
			continue
		}
		b.Run(fmt.Sprintf("%dkeys", n), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
			defer cancel()
			s := New(migratedDB(b, ctx), func() CostFunc { return nil }, 10_000)
			total := writeRebuildEvents(b, ctx, s, n, perKey)
			var took time.Duration
			for range b.N {
				start := time.Now()
				st := tally.New(0, tally.DefaultOptions())
				st.SetPolicy(pol)
				st.SetReplay(true)
				st.SetClock(time.Now())
				got, err := s.Replay(ctx, 0, int64(total), func(ev *schemas.UsageEvent, off int64) { st.Apply(ev, off) })
				if err != nil {
					b.Fatal(err)
				}
				st.SetReplay(false)
				st.ClearDirty()
				st.TakeSignals()
				took = time.Since(start)
				if got != total {
					b.Fatalf("replayed %d events, want %d", got, total)
				}
				if series, _ := st.Entries(); series != n+n/4 {
					b.Fatalf("rebuilt %d series, want %d keys and %d tenant-wide series", series, n, n/4)
				}
			}
			b.ReportMetric(took.Seconds(), fmt.Sprintf("scale_aggregator_rebuild_seconds_%dkeys", n))
			b.ReportMetric(float64(total)/took.Seconds(), fmt.Sprintf("scale_aggregator_rebuild_events_per_sec_%dkeys", n))
		})
	}
}

// rebuildBenchSetup reads the restart benchmarks' settings: events per
// key, the largest size, and their policy.
func rebuildBenchSetup(b *testing.B) (perKey, limit int, pol *policy.Policy) {
	perKey = 1
	if v := os.Getenv("SLUICE_SCALE_REBUILD_EVENTS_PER_KEY"); v != "" {
		var err error
		if perKey, err = strconv.Atoi(v); err != nil || perKey < 1 {
			b.Fatalf("SLUICE_SCALE_REBUILD_EVENTS_PER_KEY=%q: want a positive number of events", v)
		}
	}
	limit = 1_000_000
	if v := os.Getenv("SLUICE_SCALE_MAX_KEYS"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil {
			b.Fatalf("SLUICE_SCALE_MAX_KEYS=%q: want a number of keys", v)
		}
	}
	pol, err := policy.Parse([]byte(`
defaults:
  models:
    "*": {monthly_tokens: 100000000, daily_tokens: 10000000, hourly_tokens: 1000000, tokens_per_minute: 100000}
`), "bench")
	if err != nil {
		b.Fatal(err)
	}
	return perKey, limit, pol
}

// writeRebuildEvents stores n*perKey events of one day on partition 0,
// oldest first, keys interleaved (n/4 tenants × 4 models), at offsets 0
// to the total it returns.
func writeRebuildEvents(b *testing.B, ctx context.Context, s *Store, n, perKey int) int {
	total := n * perKey
	base := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Second)
	step := 24 * time.Hour / time.Duration(total)
	bt := &Batch{}
	for i := 0; i < total; i++ {
		k := i % n
		bt.Events = append(bt.Events, Event{UsageEvent: schemas.UsageEvent{
			ID: "r-" + strconv.Itoa(i), Time: base.Add(time.Duration(i) * step),
			Tenant: fmt.Sprintf("tenant-%07d", k/4), Model: fmt.Sprintf("m%d", k%4),
			PromptTokens: int64(100 + i%400), CompletionTokens: int64(i % 200), Outcome: schemas.OutcomeOK,
		}, Partition: 0, Offset: int64(i)})
		if len(bt.Events) == 50_000 || i == total-1 {
			if err := s.Write(ctx, bt); err != nil {
				b.Fatal(err)
			}
			bt.Reset()
		}
	}
	return total
}

// BenchmarkRestartFromSnapshot is BenchmarkRebuild's restart with a
// snapshot: the partition's state (n keys, built by replaying the stored
// events, not timed) is snapshotted as of offset total - tail, with tail =
// 1% of the stored events (at least 1,000) stored after it, and the
// snapshot stored in ClickHouse (not timed). Timed: Store.LoadPartition,
// the aggregator's restart path — reading the snapshot back, tally.Load
// and replaying the events stored since — until the partition could
// consume again. Keys:
// scale_aggregator_restart_seconds_<n>keys (with a snapshot) and
// scale_aggregator_snapshot_mbytes_<n>keys. The snapshot's size and the
// load do not grow with the events per key; the replay after it grows
// with the events since the snapshot, which the snapshot interval bounds.
func BenchmarkRestartFromSnapshot(b *testing.B) {
	perKey, limit, pol := rebuildBenchSetup(b)
	for _, n := range []int{100_000, 1_000_000} {
		if n > limit && n != 100_000 {
			continue
		}
		b.Run(fmt.Sprintf("%dkeys", n), func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			s := New(migratedDB(b, ctx), func() CostFunc { return nil }, 10_000)
			total := writeRebuildEvents(b, ctx, s, n, perKey)
			tail := max(total/100, 1000)
			from := int64(total - tail)
			st := tally.New(0, tally.DefaultOptions())
			st.SetPolicy(pol)
			st.SetReplay(true)
			if _, err := s.Replay(ctx, 0, from, func(ev *schemas.UsageEvent, off int64) { st.Apply(ev, off) }); err != nil {
				b.Fatal(err)
			}
			st.SetReplay(false)
			st.ClearDirty()
			st.TakeSignals()
			snap, err := st.Snapshot(nil, pol.Fingerprint())
			if err != nil {
				b.Fatal(err)
			}
			st = nil
			if err := s.WriteSnapshot(ctx, 0, from, tally.SnapshotVersion, pol.Fingerprint(), snap); err != nil {
				b.Fatal(err)
			}
			size := len(snap)
			snap = nil
			runtime.GC()
			var took time.Duration
			for range b.N {
				start := time.Now()
				l, got, err := s.LoadPartition(ctx, 0, int64(total), tally.DefaultOptions(), pol, func(st *tally.Partition) { st.SetClock(time.Now()) })
				if err != nil {
					b.Fatal(err)
				}
				took = time.Since(start)
				if got != tail {
					b.Fatalf("%d events replayed after the snapshot, want %d", got, tail)
				}
				if series, _ := l.Entries(); series != n+n/4 {
					b.Fatalf("restarted with %d series, want %d keys and %d tenant-wide series", series, n, n/4)
				}
				l = nil
				runtime.GC()
			}
			b.ReportMetric(took.Seconds(), fmt.Sprintf("scale_aggregator_restart_seconds_%dkeys", n))
			b.ReportMetric(float64(size)/1e6, fmt.Sprintf("scale_aggregator_snapshot_mbytes_%dkeys", n))
		})
	}
}
