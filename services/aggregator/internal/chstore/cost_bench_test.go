package chstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// The shapes of BenchmarkClickHouseCost, from the capacity benchmark's
// layout at 75,000 events/s (e2e/capacity_test.go): 4 partitions, a
// flush every 20 ms and a store every 500 ms (aggregator.store_interval),
// 20 load tenants, so one partition's writer stores 9,375 events a write,
// gathered from 25 flushes, of 5 tenants.
const (
	costBlock          = 9_375 // events per write of one partition at 75,000/s
	costFlushesPerSave = 25    // store_interval / flush_interval
	costTenants        = 5
	costModels         = 4
	costRate           = 75_000 // events/s the event times are spread at
)

// BenchmarkClickHouseCost reports what the shared ClickHouse server's
// process spends (CPU time from /proc/<pid>/stat, every thread) per 1,000
// usage events stored, from the first insert until the server has no merge
// running in the benchmark's database, less what the server burned idle
// (its rate over the 2 s before each variant: the server is shared):
//
//   - clickhouse_cpu_ms_per_1k_rows_sluice: as the aggregator stores them,
//     chstore.Write of usage_events, usage_minute and quota_state rows
//     (drained from a tally.Partition after each flush's events, as the
//     consumer does), costBlock events a write;
//   - clickhouse_cpu_ms_per_1k_rows_events_only: the same writes of
//     usage_events alone (no rollups, no quota state);
//   - clickhouse_cpu_ms_per_1k_rows_bare: the same usage_events columns and
//     blocks into a plain MergeTree table (no partitioning, no sorting key,
//     no replacing);
//   - clickhouse_cpu_ms_per_1k_rows_sluice_rollups_once: as the aggregator,
//     but the changed rollup and quota rows drained once a write instead of
//     after each of its 25 flushes (one row per key a write, the latest:
//     what a writer that merged its flushes' rows would send);
//   - clickhouse_cpu_ms_per_1k_rows_sluice_4x_blocks: as the aggregator,
//     with writes of 4 × costBlock events, still drained every costBlock /
//     25 events (a 2 s store_interval, or a quarter of the partitions).
//
// SLUICE_CH_COST_ROWS (default 1,000,000) and SLUICE_CH_COST_BLOCK
// (default 9,375) change the events stored and the events per write.
// Each variant stores into a database of its own.
func BenchmarkClickHouseCost(b *testing.B) {
	rows, block := itest.EnvCount(b, "SLUICE_CH_COST_ROWS", 1_000_000), itest.EnvCount(b, "SLUICE_CH_COST_BLOCK", costBlock)
	pid, err := itest.ServicePID("clickhouse")
	if err != nil {
		b.Fatalf("ClickHouse's CPU cannot be charged: %v", err)
	}
	pol, err := policy.Parse([]byte(`
defaults:
  models:
    "*": {monthly_tokens: 1000000000000}
`), "bench")
	if err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		key          string
		block, flush int // events per write, per drain of the changed rows
		write        func(ctx context.Context, s *Store, batches []*Batch) error
	}{
		{"sluice", block, max(1, block/costFlushesPerSave), func(ctx context.Context, s *Store, bs []*Batch) error { return s.Write(ctx, bs...) }},
		{"events_only", block, max(1, block/costFlushesPerSave), func(ctx context.Context, s *Store, bs []*Batch) error {
			return s.send(ctx, insertEvents, eventColumns(bs, countEvents(bs), bs[0].Stamp))
		}},
		{"bare", block, max(1, block/costFlushesPerSave), func(ctx context.Context, s *Store, bs []*Batch) error {
			return s.send(ctx, strings.Replace(insertEvents, "usage_events", "bare_events", 1), eventColumns(bs, countEvents(bs), bs[0].Stamp))
		}},
		{"sluice_rollups_once", block, block, func(ctx context.Context, s *Store, bs []*Batch) error { return s.Write(ctx, bs...) }},
		{"sluice_4x_blocks", 4 * block, max(1, block/costFlushesPerSave), func(ctx context.Context, s *Store, bs []*Batch) error { return s.Write(ctx, bs...) }},
	}
	for range b.N {
		for _, v := range variants {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			conn := migratedDB(b, ctx)
			if err := conn.Exec(ctx, `CREATE TABLE bare_events AS usage_events ENGINE = MergeTree() PARTITION BY tuple() ORDER BY tuple()`); err != nil {
				b.Fatal(err)
			}
			s := New(conn, func() CostFunc { return nil }, 10_000)
			idle := idleCPURate(b, pid, 2*time.Second)
			cpu0, t0 := serverCPU(b, pid), time.Now()
			writes, other := storeCostEvents(b, ctx, s, pol, rows, v.block, v.flush, v.write)
			inserted := time.Since(t0)
			waitMergesDone(b, ctx, conn)
			elapsed := time.Since(t0)
			used := serverCPU(b, pid) - cpu0 - time.Duration(idle*float64(elapsed))
			perK := float64(used.Microseconds()) / 1000 / (float64(rows) / 1000)
			fmt.Printf("ClickHouse cost, %s: %d events (and %d rollup, %d quota rows, %d repairs) in %d writes of %d, inserted in %v, merges done after %v: server CPU %v (idle rate %.3f cores subtracted) = %.2f ms per 1,000 events\n",
				v.key, rows, other.Minutes, other.Quotas, other.Repairs, writes, v.block, inserted.Round(time.Millisecond), elapsed.Round(time.Millisecond), used.Round(time.Millisecond), idle, perK)
			b.ReportMetric(perK, "clickhouse_cpu_ms_per_1k_rows_"+v.key)
			cancel()
		}
	}
}

func countEvents(bs []*Batch) int {
	n := 0
	for _, b := range bs {
		n += len(b.Events)
	}
	return n
}

// storeCostEvents counts rows events in a tally.Partition as the consumer
// does, drains the rows changed after every flush of flush events and
// writes every block's flushes at once, as the partition's writer does; it
// returns the number of writes and the other rows they carried.
func storeCostEvents(b *testing.B, ctx context.Context, s *Store, pol *policy.Policy, rows, block, flush int, write func(context.Context, *Store, []*Batch) error) (writes int, other costRows) {
	st := tally.New(0, tally.DefaultOptions())
	st.SetPolicy(pol)
	base := time.Now().UTC().Add(-time.Duration(rows/costRate+60) * time.Second)
	st.SetClock(base)
	var pending []*Batch
	bt := &Batch{}
	for i := range rows {
		ev := schemas.UsageEvent{
			ID: "c-" + strconv.Itoa(i), Time: base.Add(time.Duration(i) * time.Second / costRate),
			Tenant: "tenant-" + strconv.Itoa(i%costTenants), Model: "m" + strconv.Itoa((i/costTenants)%costModels),
			PromptTokens: int64(100 + i%400), CompletionTokens: int64(i % 200), LatencyMS: int64(i % 3000), Outcome: schemas.OutcomeOK,
			Provider: "openai", Endpoint: "chat", Status: 200,
		}
		st.SetClock(ev.Time)
		st.Apply(&ev, int64(i))
		bt.Events = append(bt.Events, Event{UsageEvent: ev, Partition: 0, Offset: int64(i)})
		if len(bt.Events) == flush || i == rows-1 {
			st.Drain(&bt.Rows)
			other.Minutes += len(bt.Minutes)
			other.Quotas += len(bt.Quotas)
			other.Repairs += len(bt.MinuteRepairs) + len(bt.QuotaRepairs)
			st.TakeSignals()
			bt.Version = uint64(i) + 1
			pending = append(pending, bt)
			bt = &Batch{}
		}
		if countEvents(pending) >= block || i == rows-1 {
			pending[0].Stamp = time.Now().UTC().Truncate(time.Second)
			if err := write(ctx, s, pending); err != nil {
				b.Fatal(err)
			}
			writes++
			pending = pending[:0]
		}
	}
	return writes, other
}

// costRows counts the rows a variant wrote besides the events.
type costRows struct{ Minutes, Quotas, Repairs int }

func serverCPU(b *testing.B, pid int) time.Duration {
	c, err := itest.ProcCPU(pid)
	if err != nil {
		b.Fatalf("ClickHouse's CPU: %v", err)
	}
	return c
}

// idleCPURate is the cores the server used over d before the variant
// starts: other tests' queries and its own background work.
func idleCPURate(b *testing.B, pid int, d time.Duration) float64 {
	c0 := serverCPU(b, pid)
	time.Sleep(d) // a sampling interval, not a timing assertion
	return float64(serverCPU(b, pid)-c0) / float64(d)
}

// waitMergesDone polls until no merge has run in the connection's database
// for a second (the merges the inserts caused are then done: the server
// picks merges more often than that).
func waitMergesDone(b *testing.B, ctx context.Context, conn driver.Conn) {
	busy := time.Now()
	itest.Eventually(b, 5*time.Minute, "the inserts' merges done", func() bool {
		var n uint64
		if err := conn.QueryRow(ctx, `SELECT count() FROM system.merges WHERE database = currentDatabase()`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n > 0 {
			busy = time.Now()
		}
		return time.Since(busy) >= time.Second
	})
}
