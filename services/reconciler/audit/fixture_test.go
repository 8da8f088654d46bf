package audit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// db opens a fresh, migrated test database.
func db(t *testing.T) driver.Conn { return dbTB(t) }

func dbTB(t testing.TB) driver.Conn {
	t.Helper()
	_, conn := migrationtest.Open(t)
	return conn
}

// event is a raw usage event as the aggregator stores it.
type event struct {
	id                         string
	time                       time.Time
	model                      string
	prompt, completion, cached uint64
	cacheWrite, reasoning      uint64
	offset                     int64
	estimated                  bool
}

func insertEvents(t testing.TB, conn driver.Conn, tenant string, evs ...event) {
	t.Helper()
	if err := writeEvents(conn, tenant, evs...); err != nil {
		t.Fatal(err)
	}
}

// writeEvents is insertEvents for goroutines, which must not call t.Fatal.
func writeEvents(conn driver.Conn, tenant string, evs ...event) error {
	ctx := context.Background()
	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens,
cached_tokens, cache_write_tokens, reasoning_tokens, outcome, estimated, kafka_partition, kafka_offset, ingested_at)`)
	if err != nil {
		return err
	}
	for _, e := range evs {
		var est uint8
		if e.estimated {
			est = 1
		}
		if err := b.Append(e.id, e.time, tenant, e.model, e.prompt, e.completion, e.cached, e.cacheWrite, e.reasoning, "ok", est, int32(0), e.offset, time.Now()); err != nil {
			return err
		}
	}
	return b.Send()
}

// aggregate is the test's own aggregator: distinct ids (highest offset
// wins), summed per model ("*" too) and UTC minute.
func aggregate(evs []event) map[string]map[time.Time]usage {
	latest := map[string]event{}
	for _, e := range evs {
		if cur, ok := latest[e.id]; !ok || e.offset > cur.offset {
			latest[e.id] = e
		}
	}
	out := map[string]map[time.Time]usage{}
	for _, e := range latest {
		m := e.time.UTC().Truncate(time.Minute)
		for _, model := range []string{e.model, policy.AllModels} {
			if out[model] == nil {
				out[model] = map[time.Time]usage{}
			}
			u := out[model][m]
			u.add(usage{requests: 1, prompt: e.prompt, completion: e.completion, cached: e.cached, cacheWrite: e.cacheWrite, reasoning: e.reasoning})
			out[model][m] = u
		}
	}
	return out
}

func sumTokens(agg map[string]map[time.Time]usage, model string, start, end time.Time) float64 {
	var n uint64
	for m, u := range agg[model] {
		if !m.Before(start) && m.Before(end) {
			n += u.tokens()
		}
	}
	return float64(n)
}

type minuteFixture struct {
	model  string
	minute time.Time
	u      usage
}

func insertMinutes(t testing.TB, conn driver.Conn, tenant string, version uint64, rows ...minuteFixture) {
	t.Helper()
	if err := writeMinutes(conn, tenant, version, rows...); err != nil {
		t.Fatal(err)
	}
}

func writeMinutes(conn driver.Conn, tenant string, version uint64, rows ...minuteFixture) error {
	b, err := conn.PrepareBatch(context.Background(), `INSERT INTO usage_minute (tenant, model, minute, requests, prompt_tokens,
completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens, errors, slow_calls, cost, version, updated_at)`)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if err := b.Append(tenant, r.model, r.minute, r.u.requests, r.u.prompt, r.u.completion, r.u.cached, r.u.cacheWrite, r.u.reasoning,
			uint64(0), uint64(0), 0., version, time.Now()); err != nil {
			return err
		}
	}
	return b.Send()
}

type quotaFixture struct {
	model       string
	quota       schemas.QuotaKind
	period      schemas.Period
	start, end  time.Time
	used, limit float64
	unit, mode  string
}

func insertQuotas(t testing.TB, conn driver.Conn, tenant string, version uint64, rows ...quotaFixture) {
	t.Helper()
	if err := writeQuotas(conn, tenant, version, rows...); err != nil {
		t.Fatal(err)
	}
}

func writeQuotas(conn driver.Conn, tenant string, version uint64, rows ...quotaFixture) error {
	b, err := conn.PrepareBatch(context.Background(), `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used,
quota_limit, unit, mode, tier, rate_per_minute, predicted_exhaustion, version, updated_at)`)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if err := b.Append(tenant, r.model, string(r.quota), string(r.period), r.start, r.end, r.used, r.limit, r.unit, r.mode, uint16(0), 0., time.Unix(0, 0), version, time.Now()); err != nil {
			return err
		}
	}
	return b.Send()
}

// capture is a Publisher that keeps what it was given.
type capture struct {
	mu      sync.Mutex
	signals []schemas.Signal
}

func (c *capture) Publish(_ context.Context, s []schemas.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.signals = append(c.signals, s...)
	return nil
}

func (c *capture) all() []schemas.Signal {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]schemas.Signal(nil), c.signals...)
}

func mustPolicy(t testing.TB, yaml string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func insertPrices(t testing.TB, conn driver.Conn, pol *policy.Policy) {
	t.Helper()
	if _, err := pricetable.Sync(context.Background(), conn, pol.Prices(), time.Now()); err != nil {
		t.Fatal(err)
	}
}
