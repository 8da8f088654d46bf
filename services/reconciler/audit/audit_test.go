package audit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

const acmePolicy = `
defaults:
  timezone: UTC
tenants:
  acme:
    timezone: Asia/Shanghai
    budget: {amount: 500, currency: USD}
    models:
      "*":
        monthly_tokens: 10000000
        daily_tokens: 1000000
        hourly_tokens: 200000
      gpt-4o:
        monthly_tokens: 2000000
        mode: soft
prices:
  - {model: gpt-4o, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2.5, completion: 10, cached: 1.25}
  - {model: claude-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 3, completion: 15, cached: 0.3}
`

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// acmeEvents: one Shanghai day (2026-10-14 = [10-13T16:00Z, 10-14T16:00Z))
// with a retried event, a settled estimate and events on both edges.
var acmeEvents = []event{
	{id: "e0", time: utc("2026-10-13T15:59:59Z"), model: "claude-x", prompt: 7, completion: 7, offset: 0}, // day before
	{id: "e1", time: utc("2026-10-13T16:00:05Z"), model: "gpt-4o", prompt: 1000, completion: 200, cached: 100, offset: 1},
	{id: "e2", time: utc("2026-10-13T18:30:10Z"), model: "gpt-4o", prompt: 500, completion: 50, offset: 2, estimated: true},
	{id: "e3", time: utc("2026-10-14T03:15:00Z"), model: "claude-x", prompt: 2000, completion: 400, offset: 3},
	{id: "e4", time: utc("2026-10-14T15:59:59Z"), model: "claude-x", prompt: 10, completion: 10, offset: 4},
	{id: "e1", time: utc("2026-10-13T16:00:05Z"), model: "gpt-4o", prompt: 1000, completion: 200, cached: 100, offset: 5}, // retry
	{id: "e5", time: utc("2026-10-14T16:00:00Z"), model: "gpt-4o", prompt: 999, completion: 1, offset: 6},                 // day after
	{id: "e2", time: utc("2026-10-13T18:30:10Z"), model: "gpt-4o", prompt: 600, completion: 80, offset: 7},                // settles e2
}

// writeCounters writes what a correct aggregator would have written for
// the Shanghai day and its month, minus the minutes and quota cells skip
// names, and with the daily counter off by dailyDrift — and so the
// tenant-wide monthly counter too, which counts the same events.
func writeCounters(t *testing.T, a *Auditor, tn *policy.Tenant, dayStart, dayEnd time.Time, dailyDrift float64, skip func(model string, at time.Time) bool) map[string]map[time.Time]usage {
	agg := aggregate(acmeEvents)
	var minutes []minuteFixture
	for model, byMinute := range agg {
		for m, u := range byMinute {
			if m.Before(dayStart) || !m.Before(dayEnd) || skip(model, m) {
				continue
			}
			minutes = append(minutes, minuteFixture{model, m, u})
		}
	}
	insertMinutes(t, a.conn, tn.ID, 10, minutes...)
	quotas := []quotaFixture{{policy.AllModels, schemas.QuotaDailyTokens, schemas.PeriodDay, dayStart, dayEnd,
		sumTokens(agg, policy.AllModels, dayStart, dayEnd) + dailyDrift, 1000000, "tokens", "hard"}}
	for h := dayStart; h.Before(dayEnd); h = h.Add(time.Hour) {
		used := sumTokens(agg, policy.AllModels, h, h.Add(time.Hour))
		if used == 0 || skip("hourly", h) {
			continue
		}
		quotas = append(quotas, quotaFixture{policy.AllModels, schemas.QuotaHourlyTokens, schemas.PeriodHour, h, h.Add(time.Hour), used, 200000, "tokens", "hard"})
	}
	mStart, mEnd := policy.PeriodBounds(schemas.PeriodMonth, dayStart, tn.Location)
	quotas = append(quotas,
		quotaFixture{policy.AllModels, schemas.QuotaMonthlyTokens, schemas.PeriodMonth, mStart, mEnd, sumTokens(agg, policy.AllModels, mStart, mEnd) + dailyDrift, 10000000, "tokens", "hard"},
		quotaFixture{"gpt-4o", schemas.QuotaMonthlyTokens, schemas.PeriodMonth, mStart, mEnd, sumTokens(agg, "gpt-4o", mStart, mEnd), 2000000, "tokens", "soft"})
	insertQuotas(t, a.conn, tn.ID, 10, quotas...)
	return agg
}

func byKey(rows []Row) map[string]Row {
	out := map[string]Row{}
	for _, r := range rows {
		out[fmt.Sprintf("%s|%s|%s|%s", r.Model, r.Quota, r.Period, r.PeriodStart.UTC().Format(time.RFC3339))] = r
	}
	return out
}

func TestDriftIsFoundRepairedAndGoneOnSecondRun(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, acmePolicy)
	tn := pol.Tenant("acme")
	insertEvents(t, conn, "acme", acmeEvents...)
	pub := &capture{}
	now := utc("2026-10-15T03:00:00Z")
	a := New(conn, pub, Options{Settle: 15 * time.Minute, ConfirmDelay: 50 * time.Millisecond, MaxObservations: 3, Now: func() time.Time { return now }})
	job := Job{Tenant: tn, Period: schemas.PeriodDay, At: utc("2026-10-14T01:00:00Z")}
	dayStart, dayEnd := job.Bounds()
	if !dayStart.Equal(utc("2026-10-13T16:00:00Z")) {
		t.Fatalf("day starts %v, want Shanghai midnight", dayStart.UTC())
	}
	e1Minute, e4Minute, e3Hour := utc("2026-10-13T16:00:00Z"), utc("2026-10-14T15:59:00Z"), utc("2026-10-14T03:00:00Z")
	writeCounters(t, a, tn, dayStart, dayEnd, 500, func(model string, at time.Time) bool {
		return (model == "claude-x" && at.Equal(e4Minute)) || (model == "hourly" && at.Equal(e3Hour))
	})
	// One minute that counts 100 prompt tokens too many.
	insertMinutes(t, conn, "acme", 11, minuteFixture{"gpt-4o", e1Minute, usage{requests: 1, prompt: 1100, completion: 200, cached: 100}})

	res, err := a.Reconcile(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	rows := byKey(res.Rows)
	// Truth by hand: e1 1200 + e2 settled 680 + e3 2400 + e4 20 = 4300.
	daily := rows["*|daily_tokens|day|2026-10-13T16:00:00Z"]
	if daily.Truth != 4300 || daily.Counter != 4800 || daily.Drift != 500 || !daily.Drifted || !daily.Repaired {
		t.Errorf("daily row = %+v, want counter 4800 truth 4300 drift 500, repaired", daily)
	}
	hourly := rows["*|hourly_tokens|hour|2026-10-14T03:00:00Z"]
	if hourly.Truth != 2400 || hourly.Counter != 0 || !hourly.Repaired {
		t.Errorf("missing hourly counter row = %+v, want counter 0 truth 2400, repaired", hourly)
	}
	if r := rows["*|hourly_tokens|hour|2026-10-13T16:00:00Z"]; r.Drifted || r.Truth != 1200 {
		t.Errorf("correct hourly counter row = %+v, want no drift", r)
	}
	if r := rows["gpt-4o|usage_minute|minute|2026-10-13T16:00:00Z"]; r.Drift != 100 || !r.Repaired {
		t.Errorf("gpt-4o minute row = %+v, want drift 100, repaired", r)
	}
	if r := rows["claude-x|usage_minute|minute|2026-10-14T15:59:00Z"]; r.Drift != -20 || !r.Repaired {
		t.Errorf("missing claude-x minute row = %+v, want drift -20, repaired", r)
	}
	if r := rows["*|usage_minute|day|2026-10-13T16:00:00Z"]; r.Drifted || r.Truth != 4300 {
		t.Errorf("tenant-wide minute summary = %+v, want 4300 and no drift", r)
	}
	// The day's drift is in the open month's counter too: repaired month
	// to date, not left until the month job. gpt-4o's was right.
	// Month truth: the day's 4300 + e0 14 + e5 1000 = 5314.
	if r := rows["*|monthly_tokens|month|2026-09-30T16:00:00Z"]; r.Truth != 5314 || r.Counter != 5814 || !r.Repaired {
		t.Errorf("monthly row = %+v, want counter 5814 truth 5314, repaired", r)
	}
	if r := rows["gpt-4o|monthly_tokens|month|2026-09-30T16:00:00Z"]; r.Drifted || r.Truth != 2880 {
		t.Errorf("gpt-4o monthly row = %+v, want 2880 and no drift", r)
	}
	if res.Repaired != 5 {
		t.Errorf("repaired %d counters, want 5 (daily, monthly, hourly, 2 minutes); rows %+v", res.Repaired, res.Rows)
	}
	sigs := pub.all()
	if len(sigs) != 5 || res.Signals != 5 {
		t.Fatalf("published %d signals (result says %d), want 5: daily, monthly, hourly, and the gpt-4o and claude-x minute summaries: %+v", len(sigs), res.Signals, sigs)
	}
	for _, s := range sigs {
		if err := s.Validate(); err != nil {
			t.Errorf("signal %+v is invalid: %v", s, err)
		}
		if s.Kind != schemas.SignalReconciliationDrift || s.Tenant != "acme" {
			t.Errorf("signal kind %q tenant %q", s.Kind, s.Tenant)
		}
	}

	// The repaired counters read back as the truth.
	var used float64
	if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = 'acme' AND quota = 'daily_tokens'").Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used != 4300 {
		t.Errorf("quota_state daily used = %v after repair, want 4300", used)
	}
	if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = 'acme' AND quota = 'monthly_tokens' AND model = '*'").Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used != 5314 {
		t.Errorf("quota_state monthly used = %v after the day's repair, want 5314", used)
	}
	var recorded uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM reconciliation_runs WHERE run_id = ? AND repaired = 1", res.RunID).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded < 5 {
		t.Errorf("reconciliation_runs holds %d repaired rows for run %s, want at least 5", recorded, res.RunID)
	}

	again, err := a.Reconcile(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if again.Drifted != 0 || again.Repaired != 0 || again.Signals != 0 {
		t.Errorf("second run: drifted %d repaired %d signals %d, want none; rows %+v", again.Drifted, again.Repaired, again.Signals, again.Rows)
	}
	if len(again.Rows) == 0 {
		t.Error("second run recorded no rows; every period-level comparison should be recorded")
	}
}

func TestMonthlyBudgetDriftUsesPrices(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, acmePolicy)
	tn := pol.Tenant("acme")
	insertEvents(t, conn, "acme", acmeEvents...)
	insertPrices(t, conn, pol)
	now := utc("2026-11-02T00:00:00Z")
	pub := &capture{}
	a := New(conn, pub, Options{Settle: 15 * time.Minute, ConfirmDelay: 50 * time.Millisecond, Now: func() time.Time { return now }})
	job := Job{Tenant: tn, Period: schemas.PeriodMonth, At: utc("2026-10-20T00:00:00Z")}
	start, end := job.Bounds()
	// Every event is in the Shanghai October. Cost by hand, USD:
	// e0 (7*3 + 7*15)/1e6 = 0.000126; e1 (900*2.5 + 100*1.25 + 200*10)/1e6
	// = 0.004375; e2 (600*2.5 + 80*10)/1e6 = 0.0023; e3 (2000*3 + 400*15)/1e6
	// = 0.012; e4 (10*3 + 10*15)/1e6 = 0.00018; e5 (999*2.5 + 10)/1e6 = 0.0025075.
	const cost = 0.0214885
	insertQuotas(t, conn, "acme", 3,
		quotaFixture{"*", schemas.QuotaBudget, schemas.PeriodMonth, start, end, cost + 0.5, 500, "currency", "hard"},
		quotaFixture{"*", schemas.QuotaMonthlyTokens, schemas.PeriodMonth, start, end, 5314, 10000000, "tokens", "hard"},
		quotaFixture{"gpt-4o", schemas.QuotaMonthlyTokens, schemas.PeriodMonth, start, end, 2880, 2000000, "tokens", "soft"},
	)
	res, err := a.Reconcile(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	rows := byKey(res.Rows)
	b := rows["*|budget|month|2026-09-30T16:00:00Z"]
	if math.Abs(b.Truth-cost) > 1e-12 || math.Abs(b.Drift-0.5) > 1e-9 || !b.Repaired {
		t.Errorf("budget row = %+v, want truth %v drift 0.5, repaired", b, cost)
	}
	for _, k := range []string{"*|monthly_tokens|month|2026-09-30T16:00:00Z", "gpt-4o|monthly_tokens|month|2026-09-30T16:00:00Z"} {
		if r := rows[k]; r.Drifted || r.Counter == 0 {
			t.Errorf("%s = %+v, want a correct counter and no drift", k, r)
		}
	}
	if res.Repaired != 1 || len(pub.all()) != 1 {
		t.Errorf("repaired %d, signalled %d; want the budget only", res.Repaired, len(pub.all()))
	}
}

func TestOpenPeriodIsRefused(t *testing.T) {
	pol := mustPolicy(t, acmePolicy)
	now := utc("2026-10-14T16:05:00Z") // 5 minutes after the Shanghai day ended
	a := New(nil, nil, Options{Settle: 15 * time.Minute, Now: func() time.Time { return now }})
	_, err := a.Reconcile(context.Background(), Job{Tenant: pol.Tenant("acme"), Period: schemas.PeriodDay, At: utc("2026-10-14T01:00:00Z")})
	if !errors.Is(err, ErrOpenPeriod) {
		t.Fatalf("err = %v, want ErrOpenPeriod for a period that has not settled", err)
	}
}

// TestLiveIngestionIsNoDrift runs audits of yesterday while a writer plays
// the aggregator: it keeps adding events for today and late events for
// yesterday, each followed by the counters it changes, as separate inserts.
func TestLiveIngestionIsNoDrift(t *testing.T) {
	conn := db(t)
	pol := mustPolicy(t, `
tenants:
  live:
    timezone: UTC
    models:
      "*": {daily_tokens: 100000000}
`)
	tn := pol.Tenant("live")
	now := utc("2026-10-15T00:45:00Z")
	yStart := utc("2026-10-14T00:00:00Z")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		wg      sync.WaitGroup
		written atomic.Int64
		mu      sync.Mutex
		werr    error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		var evs []event
		var version uint64
		for i := 0; ctx.Err() == nil; i++ {
			// Alternate: a late event for yesterday, an event for today.
			at := yStart.Add(time.Duration(i%1440) * time.Minute).Add(7 * time.Second)
			if i%2 == 1 {
				at = now.Add(time.Duration(i) * time.Second)
			}
			e := event{id: fmt.Sprintf("live-%d", i), time: at, model: "m1", prompt: uint64(10 + i%7), completion: 5, offset: int64(i)}
			evs = append(evs, e)
			version++
			agg := aggregate(evs)
			minute := at.Truncate(time.Minute)
			day, dayEnd := policy.PeriodBounds(schemas.PeriodDay, at, time.UTC)
			err := errors.Join(writeEvents(conn, "live", e),
				writeMinutes(conn, "live", version, minuteFixture{"m1", minute, agg["m1"][minute]}, minuteFixture{"*", minute, agg["*"][minute]}),
				writeQuotas(conn, "live", version, quotaFixture{"*", schemas.QuotaDailyTokens, schemas.PeriodDay, day, dayEnd,
					sumTokens(agg, "*", day, dayEnd), 100000000, "tokens", "hard"}))
			if err != nil {
				if ctx.Err() == nil {
					mu.Lock()
					werr = err
					mu.Unlock()
				}
				return
			}
			written.Add(1)
		}
	}()
	itest.Eventually(t, 30*time.Second, "the live writer to write 20 batches", func() bool { return written.Load() >= 20 })

	a := New(conn, &capture{}, Options{Settle: 15 * time.Minute, ConfirmDelay: 300 * time.Millisecond, MaxObservations: 3, Now: func() time.Time { return now }})
	before := written.Load()
	var checked int
	for run := 0; run < 3; run++ {
		res, err := a.Reconcile(ctx, Job{Tenant: tn, Period: schemas.PeriodDay, At: yStart})
		if err != nil {
			t.Fatal(err)
		}
		if res.Drifted != 0 || res.Repaired != 0 || res.Signals != 0 {
			t.Fatalf("run %d during live ingestion: drifted %d repaired %d signals %d, want none: %+v", run, res.Drifted, res.Repaired, res.Signals, res.Rows)
		}
		checked += len(res.Rows)
	}
	if written.Load() == before {
		t.Fatal("the writer wrote nothing while the audits ran; the test proved nothing")
	}
	if checked == 0 {
		t.Fatal("the audits compared nothing")
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if werr != nil {
		t.Fatalf("the writer failed: %v", werr)
	}

	// Once ingestion stops the audit agrees with the writer exactly.
	res, err := a.Reconcile(context.Background(), Job{Tenant: tn, Period: schemas.PeriodDay, At: yStart})
	if err != nil {
		t.Fatal(err)
	}
	if res.Drifted != 0 || res.Unsettled != 0 {
		t.Fatalf("after ingestion stopped: drifted %d unsettled %d: %+v", res.Drifted, res.Unsettled, res.Rows)
	}
}

// TestClosedHourOfTheOpenDayIsAudited: drift in today's counters must not
// wait for tomorrow's nightly run. At 12:20 Shanghai time the day is open,
// but 11:00-12:00 closed 20 minutes ago: an hour job audits its
// hourly_tokens counter and its minutes, repairs them and signals, and
// leaves the open day's counter alone.
func TestClosedHourOfTheOpenDayIsAudited(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, acmePolicy)
	tn := pol.Tenant("acme")
	hour := utc("2026-10-14T03:00:00Z") // 11:00 in Shanghai
	evs := []event{
		{id: "h1", time: hour.Add(5 * time.Minute), model: "gpt-4o", prompt: 100, completion: 20, offset: 1},
		{id: "h2", time: hour.Add(59 * time.Minute), model: "claude-x", prompt: 300, completion: 30, offset: 2},
		{id: "next", time: hour.Add(70 * time.Minute), model: "gpt-4o", prompt: 1, completion: 1, offset: 3}, // the open hour
	}
	insertEvents(t, conn, "acme", evs...)
	// The hourly counter missed h2; the minute rows are right for h1 and
	// missing for h2. The open day's counter is off too, but that is the
	// nightly run's business.
	dayStart, dayEnd := policy.PeriodBounds(schemas.PeriodDay, hour, tn.Location)
	insertQuotas(t, conn, "acme", 10,
		quotaFixture{policy.AllModels, schemas.QuotaHourlyTokens, schemas.PeriodHour, hour, hour.Add(time.Hour), 120, 200000, "tokens", "hard"},
		quotaFixture{policy.AllModels, schemas.QuotaDailyTokens, schemas.PeriodDay, dayStart, dayEnd, 7, 1000000, "tokens", "hard"})
	insertMinutes(t, conn, "acme", 10,
		minuteFixture{"gpt-4o", hour.Add(5 * time.Minute), usage{requests: 1, prompt: 100, completion: 20}},
		minuteFixture{policy.AllModels, hour.Add(5 * time.Minute), usage{requests: 1, prompt: 100, completion: 20}})

	pub := &capture{}
	now := hour.Add(80 * time.Minute)
	a := New(conn, pub, Options{Settle: 15 * time.Minute, ConfirmDelay: 20 * time.Millisecond, MaxObservations: 3, Now: func() time.Time { return now }})
	res, err := a.Reconcile(ctx, Job{Tenant: tn, Period: schemas.PeriodHour, At: hour.Add(30 * time.Minute)})
	if err != nil {
		t.Fatalf("hour job: %v", err)
	}
	rows := byKey(res.Rows)
	if r := rows["*|hourly_tokens|hour|2026-10-14T03:00:00Z"]; r.Counter != 120 || r.Truth != 450 || !r.Repaired {
		t.Errorf("hourly row = %+v, want counter 120 truth 450, repaired", r)
	}
	if r := rows["claude-x|usage_minute|minute|2026-10-14T03:59:00Z"]; r.Truth != 330 || !r.Repaired {
		t.Errorf("claude-x minute = %+v, want truth 330, repaired", r)
	}
	for k, r := range rows {
		if r.Quota == string(schemas.QuotaDailyTokens) {
			t.Errorf("hour job compared the open day's counter: %s %+v", k, r)
		}
		if r.PeriodStart.Before(hour) || !r.PeriodStart.Before(hour.Add(time.Hour)) {
			t.Errorf("hour job row %s outside its hour", k)
		}
	}
	if res.Signals == 0 {
		t.Error("no reconciliation_drift signal for the drifted hour")
	}
	var used float64
	if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = 'acme' AND quota = 'hourly_tokens'").Scan(&used); err != nil || used != 450 {
		t.Errorf("hourly counter after repair = %v, %v; want 450", used, err)
	}
	if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = 'acme' AND quota = 'daily_tokens'").Scan(&used); err != nil || used != 7 {
		t.Errorf("open day's counter = %v, %v; want it untouched at 7", used, err)
	}

	// The open hour is refused like any open period.
	if _, err := a.Reconcile(ctx, Job{Tenant: tn, Period: schemas.PeriodHour, At: now}); !errors.Is(err, ErrOpenPeriod) {
		t.Errorf("open hour: err = %v, want ErrOpenPeriod", err)
	}
}

// TestSettlementAcrossMidnightIsNotDrift: an estimate written at 23:59:50
// and settled at 00:00:20 lie in two day partitions of usage_events. The
// aggregator counts the request once, in the settlement's day; the audit's
// truth must too, or it "repairs" yesterday's correct counter to the
// estimate.
func TestSettlementAcrossMidnightIsNotDrift(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, "tenants:\n  night:\n    timezone: UTC\n    models:\n      \"*\": {daily_tokens: 1000000}\n")
	tn := pol.Tenant("night")
	midnight := utc("2026-10-15T00:00:00Z")
	insertEvents(t, conn, "night",
		event{id: "a", time: midnight.Add(-time.Hour), model: "m", prompt: 10, completion: 10, offset: 1},
		event{id: "x", time: midnight.Add(-10 * time.Second), model: "m", prompt: 1000, completion: 1000, offset: 2, estimated: true},
		event{id: "x", time: midnight.Add(20 * time.Second), model: "m", prompt: 100, completion: 50, offset: 3})
	// What the aggregator wrote: the estimate moved to the settlement's day.
	yStart := midnight.AddDate(0, 0, -1)
	insertQuotas(t, conn, "night", 10,
		quotaFixture{policy.AllModels, schemas.QuotaDailyTokens, schemas.PeriodDay, yStart, midnight, 20, 1000000, "tokens", "hard"})
	a := New(conn, &capture{}, Options{Settle: 15 * time.Minute, ConfirmDelay: 20 * time.Millisecond, MaxObservations: 2,
		Now: func() time.Time { return midnight.Add(time.Hour) }})
	res, err := a.Reconcile(ctx, Job{Tenant: tn, Period: schemas.PeriodDay, At: yStart.Add(12 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	rows := byKey(res.Rows)
	if r := rows["*|daily_tokens|day|2026-10-14T00:00:00Z"]; r.Truth != 20 || r.Drifted || r.Repaired {
		t.Errorf("yesterday's daily row = %+v, want truth 20 (the estimate settled after midnight), no drift", r)
	}
	var used float64
	if err := conn.QueryRow(ctx, "SELECT used FROM quota_state FINAL WHERE tenant = 'night' AND quota = 'daily_tokens'").Scan(&used); err != nil || used != 20 {
		t.Errorf("daily counter after the audit = %v, %v; want it left at 20", used, err)
	}
}

// TestBudgetTruthCountsUnpricedAtTheUnpricedPrice: the aggregator counts
// a model without a price at the policy's unpriced_price, so the audit's
// truth must too, or every budget with unpriced usage would "drift" back
// to the SQL's 0 each night. Here claude-x loses its price and
// unpriced_price has its figures: the budget is the same, and correct.
func TestBudgetTruthCountsUnpricedAtTheUnpricedPrice(t *testing.T) {
	conn := db(t)
	ctx := context.Background()
	pol := mustPolicy(t, strings.Replace(acmePolicy,
		"  - {model: claude-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 3, completion: 15, cached: 0.3}\n",
		"unpriced_price: {currency: USD, prompt: 3, completion: 15, cached: 0.3}\n", 1))
	if _, ok := pol.Price("claude-x", utc("2026-10-20T00:00:00Z")); ok {
		t.Fatal("claude-x still priced")
	}
	tn := pol.Tenant("acme")
	insertEvents(t, conn, "acme", acmeEvents...)
	insertPrices(t, conn, pol)
	now := utc("2026-11-02T00:00:00Z")
	job := Job{Tenant: tn, Period: schemas.PeriodMonth, At: utc("2026-10-20T00:00:00Z")}
	start, end := job.Bounds()
	const cost = 0.0214885 // as in TestMonthlyBudgetDriftUsesPrices
	insertQuotas(t, conn, "acme", 3,
		quotaFixture{"*", schemas.QuotaBudget, schemas.PeriodMonth, start, end, cost, 500, "currency", "hard"},
	)
	a := New(conn, nil, Options{Settle: 15 * time.Minute, ConfirmDelay: 50 * time.Millisecond, DryRun: true,
		Now: func() time.Time { return now }, Unpriced: pol.UnpricedPrice})
	res, err := a.Reconcile(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if b := byKey(res.Rows)["*|budget|month|2026-09-30T16:00:00Z"]; math.Abs(b.Truth-cost) > 1e-12 || b.Drifted {
		t.Errorf("budget row = %+v, want truth %v and no drift", b, cost)
	}
}
