package chstore

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// TestReplaySeesWhatWasCountedAtTheOffset: a rebuild below an offset must
// see each id's latest version below it — the estimate before its
// settlement was read, the settlement after — once per id, in offset
// order; of other partitions, it sees the events of its own tenants only
// (stored there before the topic gained partitions and moved them), and
// sees them first. Writing the batch twice (a retry) changes nothing.
func TestReplaySeesWhatWasCountedAtTheOffset(t *testing.T) {
	ctx, s := testStore(t, nil)
	conn := s.conn
	at := time.Date(2026, 2, 10, 3, 0, 0, 250e6, time.UTC)
	ev := func(id string, tokens int64, est bool, part int32, off int64) Event {
		return Event{UsageEvent: schemas.UsageEvent{ID: id, Time: at, Tenant: "acme", Model: "m", PromptTokens: tokens, Estimated: est}, Partition: part, Offset: off}
	}
	b := &Batch{Version: 13, Events: []Event{
		ev("a", 10, false, 0, 10),
		ev("b", 500, true, 0, 11),
		ev("c", 7, false, 1, 11), // acme's event on another partition
		ev("b", 60, false, 0, 12),
		{UsageEvent: schemas.UsageEvent{ID: "z", Time: at, Tenant: "other", Model: "m", PromptTokens: 3}, Partition: 1, Offset: 12},
	}}
	b.Minutes = []tally.MinuteRow{{Tenant: "acme", Model: "m", Minute: at.Truncate(time.Minute), Requests: 2, PromptTokens: 70}}
	for range 2 {
		if err := s.Write(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	replay := func(before int64) map[string]int64 {
		got := map[string]int64{}
		last := int64(-1)
		if _, err := s.Replay(ctx, 0, before, func(e *schemas.UsageEvent, off int64) {
			if e.ID == "c" {
				if last != -1 {
					t.Errorf("acme's event of partition 1 replayed after those of partition 0")
				}
				got[e.ID] += e.PromptTokens
				return
			}
			if off <= last {
				t.Errorf("replay out of offset order: %d after %d", off, last)
			}
			last = off
			if !e.Time.Equal(at) {
				t.Errorf("time %v, want %v (milliseconds kept)", e.Time, at)
			}
			got[e.ID] += e.PromptTokens
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := replay(12); got["a"] != 10 || got["b"] != 500 || got["c"] != 7 || len(got) != 3 {
		t.Errorf("below offset 12: %v, want a=10, the estimate b=500 and acme's c=7 of partition 1", got)
	}
	if got := replay(13); got["a"] != 10 || got["b"] != 60 || got["c"] != 7 || len(got) != 3 {
		t.Errorf("below offset 13: %v, want a=10, the settlement b=60 and c=7, once each", got)
	}
	var req uint64
	if err := conn.QueryRow(ctx, "SELECT requests FROM usage_minute FINAL WHERE tenant = 'acme'").Scan(&req); err != nil || req != 2 {
		t.Errorf("usage_minute after a repeated write: requests %d (%v), want 2", req, err)
	}
}

// TestOneWriteOfSeveralBatches: the writer stores the flushes queued
// during store_interval in one Write; each batch's rows keep its version,
// so the later batch's row of a key wins under FINAL whichever order the
// rows reach ClickHouse, and a row only the earlier batch changed stays.
func TestOneWriteOfSeveralBatches(t *testing.T) {
	ctx, s := testStore(t, nil)
	conn := s.conn
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	minute := func(tenant string, req uint64) tally.MinuteRow {
		return tally.MinuteRow{Tenant: tenant, Model: "m", Minute: at, Requests: req}
	}
	quota := func(tenant string, used float64) tally.QuotaRow {
		return tally.QuotaRow{Tenant: tenant, Model: "*", Quota: "hourly_tokens", Period: "hour", PeriodStart: at.Truncate(time.Hour),
			PeriodEnd: at.Truncate(time.Hour).Add(time.Hour), Used: used, Limit: 1000, Unit: "tokens", Mode: "hard"}
	}
	ev := func(id, tenant string, off int64) Event {
		return Event{UsageEvent: schemas.UsageEvent{ID: id, Time: at, Tenant: tenant, Model: "m", PromptTokens: 1}, Offset: off}
	}
	// The newer batch comes first in the call: only versions may decide.
	newer := &Batch{Version: 20, Events: []Event{ev("n1", "acme", 19)},
		Rows: tally.Rows{Minutes: []tally.MinuteRow{minute("acme", 5)}, Quotas: []tally.QuotaRow{quota("acme", 50)}}}
	older := &Batch{Version: 10, Events: []Event{ev("o1", "acme", 9), ev("o2", "beta", 9)},
		Rows: tally.Rows{Minutes: []tally.MinuteRow{minute("acme", 3), minute("beta", 1)}, Quotas: []tally.QuotaRow{quota("acme", 30), quota("beta", 10)}}}
	if err := s.Write(ctx, newer, older); err != nil {
		t.Fatal(err)
	}
	check := func(query string, want map[string]float64) {
		t.Helper()
		got := floatsByKey(t, ctx, conn, query)
		if len(got) != len(want) || got["acme"] != want["acme"] || got["beta"] != want["beta"] {
			t.Errorf("%s: %v, want %v", query, got, want)
		}
	}
	check("SELECT tenant, toFloat64(requests) FROM usage_minute FINAL", map[string]float64{"acme": 5, "beta": 1})
	check("SELECT tenant, used FROM quota_state FINAL", map[string]float64{"acme": 50, "beta": 10})
	check("SELECT tenant, toFloat64(count()) FROM usage_events GROUP BY tenant", map[string]float64{"acme": 2, "beta": 1})
}

// TestTokenTypesStored: the cache read, the cache write and the reasoning
// tokens an event carries reach usage_events, and a minute's rollup
// usage_minute, each in its own column, so that reports can price each
// token type.
func TestTokenTypesStored(t *testing.T) {
	ctx, s := testStore(t, nil)
	conn := s.conn
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	ev := schemas.UsageEvent{ID: "t1", Time: at, Tenant: "acme", Model: "claude", PromptTokens: 1200, CompletionTokens: 350,
		CachedTokens: 700, CacheWriteTokens: 500, ReasoningTokens: 120}
	b := &Batch{Version: 1, Events: []Event{{UsageEvent: ev, Offset: 1}}}
	b.Rows.Minutes = []tally.MinuteRow{{Tenant: "acme", Model: "claude", Minute: at, Requests: 1, PromptTokens: 1200, CompletionTokens: 350,
		CachedTokens: 700, CacheWriteTokens: 500, ReasoningTokens: 120}}
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	var minRead, minWrite, minReasoning uint64
	if err := conn.QueryRow(ctx, "SELECT cached_tokens, cache_write_tokens, reasoning_tokens FROM usage_minute FINAL WHERE tenant = 'acme'").
		Scan(&minRead, &minWrite, &minReasoning); err != nil {
		t.Fatal(err)
	}
	if minRead != 700 || minWrite != 500 || minReasoning != 120 {
		t.Errorf("usage_minute cache read %d cache write %d reasoning %d, want 700 500 120", minRead, minWrite, minReasoning)
	}
	var prompt, completion, read, write, reasoning uint64
	if err := conn.QueryRow(ctx, "SELECT prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens FROM usage_events WHERE id = 't1'").
		Scan(&prompt, &completion, &read, &write, &reasoning); err != nil {
		t.Fatal(err)
	}
	if prompt != 1200 || completion != 350 || read != 700 || write != 500 || reasoning != 120 {
		t.Errorf("stored prompt %d completion %d cache read %d cache write %d reasoning %d, want 1200 350 700 500 120",
			prompt, completion, read, write, reasoning)
	}
	// A rebuild from ClickHouse sees every type, so that a restarted
	// aggregator prices the event as the one that first counted it.
	var got []schemas.UsageEvent
	if _, err := s.Replay(ctx, 0, 2, func(e *schemas.UsageEvent, _ int64) { got = append(got, *e) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].CachedTokens != 700 || got[0].CacheWriteTokens != 500 || got[0].ReasoningTokens != 120 {
		t.Errorf("replayed %+v, want the one event with 700 cache read, 500 cache write and 120 reasoning tokens", got)
	}
}

// floatsByKey runs query, whose rows are a string and a Float64, and
// returns the second column by the first.
func floatsByKey(t testing.TB, ctx context.Context, conn driver.Conn, query string) map[string]float64 {
	t.Helper()
	rows, err := conn.Query(ctx, query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]float64{}
	for rows.Next() {
		var key string
		var v float64
		if err := rows.Scan(&key, &v); err != nil {
			t.Fatal(err)
		}
		got[key] = v
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// testStore returns a Store that prices with cost (nil: no prices) over
// a migrated database of the test's own, and a context of 60 s for its
// calls that ends with the test.
func testStore(t *testing.T, cost CostFunc) (context.Context, *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx, New(migratedDB(t, ctx), func() CostFunc { return cost }, 1000)
}

// migratedDB opens a fresh ClickHouse database with the migrations applied.
func migratedDB(t testing.TB, ctx context.Context) driver.Conn {
	t.Helper()
	conn, err := chconn.Open(ctx, itest.ClickHouse(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := migrations.Apply(ctx, conn, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestQuotaRepairWeighsBilledQuotas: a closed period's quota row
// recomputed from the raw events counts billed-equivalent tokens for a
// quota that counts them, total tokens for one that does not.
func TestQuotaRepairWeighsBilledQuotas(t *testing.T) {
	// Cache reads at a quarter of the input price: prompt 1000 with 800
	// read, completion 100 at four times input.
	weigh := func(_ string, _ time.Time, tok policy.Tokens) (float64, float64) {
		return 0, float64(tok.Prompt-tok.Cached) + float64(tok.Cached)*0.25 + float64(tok.Completion)*4
	}
	ctx, s := testStore(t, weigh)
	conn := s.conn
	at := time.Date(2026, 3, 4, 5, 6, 0, 0, time.UTC)
	b := &Batch{Version: 1, Events: []Event{{UsageEvent: schemas.UsageEvent{ID: "q1", Time: at, Tenant: "acme", Model: "m",
		PromptTokens: 1000, CachedTokens: 800, CompletionTokens: 100}, Offset: 1}}}
	hour := at.Truncate(time.Hour)
	for _, billed := range []bool{true, false} {
		b.Rows.QuotaRepairs = append(b.Rows.QuotaRepairs, tally.QuotaRow{Tenant: "acme", Model: map[bool]string{true: "*", false: "m"}[billed],
			Quota: "hourly_tokens", Period: "hour", PeriodStart: hour, PeriodEnd: hour.Add(time.Hour), Unit: "tokens", Mode: "hard", Billed: billed})
	}
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	const rows = " FROM quota_state FINAL WHERE tenant = 'acme'"
	used := floatsByKey(t, ctx, conn, "SELECT model, used"+rows)
	for m, cached := range floatsByKey(t, ctx, conn, "SELECT model, toFloat64(cached_tokens)"+rows) {
		if cached != 800 {
			t.Errorf("recomputed %s row: cache read %v, want 800", m, cached)
		}
	}
	if used["*"] != 200+800*0.25+100*4 || used["m"] != 1100 {
		t.Errorf("recomputed used %v, want * 800 (billed-equivalent) and m 1100 (total)", used)
	}
}
