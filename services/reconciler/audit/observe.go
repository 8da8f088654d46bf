// One observation: the aggregator's counters (quota_state, usage_minute)
// and the truth recomputed from distinct raw events, read in that order
// and paired into cells keyed by model, quota and period.

package audit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/reconciler/costquery"
)

// usage is what the raw events say about one model in one bucket of time.
type usage struct {
	requests, prompt, completion, cached, errors uint64
	cacheWrite, reasoning                        uint64
	cost                                         float64
	billed                                       float64 // billed-equivalent tokens
}

func (u *usage) add(o usage) {
	u.requests += o.requests
	u.prompt += o.prompt
	u.completion += o.completion
	u.cached += o.cached
	u.cacheWrite += o.cacheWrite
	u.reasoning += o.reasoning
	u.errors += o.errors
	u.cost += o.cost
	u.billed += o.billed
}

func (u usage) tokens() uint64 { return u.prompt + u.completion }

// counts are the counts a usage_minute row must agree with the events on:
// requests and every token type (errors follow breaker settings the
// audit does not check, and cost is compared with a tolerance).
func (u usage) counts() [6]uint64 {
	return [6]uint64{u.requests, u.prompt, u.completion, u.cached, u.cacheWrite, u.reasoning}
}

// truth holds the raw-event totals of one tenant over the job's range, per
// model and per bucket start (a minute for day jobs, the whole range for
// month jobs).
type truth map[string]map[int64]usage

// sum adds up the buckets in [start, end) of model, or of every model for
// policy.AllModels.
func (t truth) sum(model string, start, end time.Time) usage {
	var out usage
	for m, buckets := range t {
		if model != policy.AllModels && m != model {
			continue
		}
		for at, u := range buckets {
			if at >= start.Unix() && at < end.Unix() {
				out.add(u)
			}
		}
	}
	return out
}

// observe reads the counters and the truth once and pairs them up.
func (a *Auditor) observe(ctx context.Context, job Job, start, end time.Time) (map[string]*cell, error) {
	t := job.Tenant
	// day: the job reads usage_minute and per-minute truth (day and hour
	// jobs); month jobs compare period totals only.
	day := job.Period != schemas.PeriodMonth
	periods := []string{string(schemas.PeriodMonth)}
	quotas := map[string]bool{string(schemas.QuotaMonthlyTokens): true, string(schemas.QuotaBudget): true}
	switch job.Period {
	case schemas.PeriodDay:
		periods = []string{string(schemas.PeriodDay), string(schemas.PeriodHour)}
		quotas = map[string]bool{string(schemas.QuotaDailyTokens): true, string(schemas.QuotaHourlyTokens): true}
	case schemas.PeriodHour:
		periods = []string{string(schemas.PeriodHour)}
		quotas = map[string]bool{string(schemas.QuotaHourlyTokens): true}
	}
	// Counters first, then the truth: an event that lands in between makes
	// the truth run ahead, never behind, and confirmation sorts it out.
	qrows, err := readQuotaState(ctx, a.conn, t.ID, periods, start, end)
	if err != nil {
		return nil, err
	}
	var mrows []minuteRow
	if day {
		if mrows, err = readUsageMinute(ctx, a.conn, t.ID, start, end); err != nil {
			return nil, err
		}
	}
	// A day job also compares the monthly counters of the month the day
	// belongs to, month to date: the drift that made the day's counter
	// wrong is in them too, and the month job would not see it before the
	// month ends. The month is usually still open, so its counters move
	// while the tenant is active; confirmation then marks them unsettled
	// instead of repairing, and the next night tries again.
	var monthRows []quotaRow
	var mStart, mEnd time.Time
	if job.Period == schemas.PeriodDay {
		mStart, mEnd = t.PeriodBounds(schemas.PeriodMonth, start)
		if monthRows, err = readQuotaState(ctx, a.conn, t.ID, []string{string(schemas.PeriodMonth)}, mStart, mEnd); err != nil {
			return nil, err
		}
	}
	tr, err := readTruth(ctx, a.conn, t.ID, start, end, day, a.opt.Unpriced)
	if err != nil {
		return nil, err
	}
	cells := quotaCells(t, quotas, qrows, start, end, tr)
	if job.Period == schemas.PeriodDay {
		mtr, err := readTruth(ctx, a.conn, t.ID, mStart, mEnd, false, a.opt.Unpriced)
		if err != nil {
			return nil, err
		}
		monthly := map[string]bool{string(schemas.QuotaMonthlyTokens): true, string(schemas.QuotaBudget): true}
		for k, c := range quotaCells(t, monthly, monthRows, mStart, mEnd, mtr) {
			cells[k] = c
		}
	}

	if day {
		a.minuteCells(cells, tr, mrows, job.Period, start, end)
	}
	for _, c := range cells {
		c.row.Tenant = t.ID
		c.row.Drift = c.row.Counter - c.row.Truth
	}
	return cells, nil
}

// quotaCells pairs the quota_state rows of the given quotas in [start,
// end) — and the policy's quotas whose counter is missing — with the
// truth tr.
func quotaCells(t *policy.Tenant, quotas map[string]bool, qrows []quotaRow, start, end time.Time, tr truth) map[string]*cell {
	cells := map[string]*cell{}
	qkey := func(model, quota string, ps time.Time) string {
		return "q|" + model + "|" + quota + "|" + strconv.FormatInt(ps.Unix(), 10)
	}
	for i := range qrows {
		r := &qrows[i]
		if !quotas[r.quota] {
			continue // rate windows are not period totals
		}
		cells[qkey(r.model, r.quota, r.start)] = &cell{quota: r, row: Row{Model: r.model, Quota: r.quota, Period: r.period,
			PeriodStart: r.start, PeriodEnd: r.end, Unit: r.unit, Mode: r.mode, Limit: r.limit, Counter: r.used}}
	}
	// Quotas of the policy whose counter is missing: a counter the
	// aggregator never wrote while events exist is drift too.
	models := []string{policy.AllModels}
	for m := range t.Models {
		if m != policy.AllModels {
			models = append(models, m)
		}
	}
	for _, m := range models {
		for _, q := range t.Quotas(m) {
			if !quotas[string(q.Name)] {
				continue
			}
			for ps := start; ps.Before(end); {
				s, e := t.PeriodBounds(q.Period, ps)
				k := qkey(m, string(q.Name), s)
				if cells[k] == nil {
					cells[k] = &cell{row: Row{Model: m, Quota: string(q.Name), Period: string(q.Period), PeriodStart: s, PeriodEnd: e,
						Unit: string(q.Unit), Mode: string(q.Mode), Limit: q.Limit}}
				}
				cells[k].billed = q.Billed
				ps = e
			}
		}
	}
	for k, c := range cells {
		u := tr.sum(c.row.Model, c.row.PeriodStart, c.row.PeriodEnd)
		c.truth = u
		c.row.Truth = float64(u.tokens())
		switch {
		case c.row.Quota == string(schemas.QuotaBudget):
			c.row.Truth = u.cost
		case c.billed:
			c.row.Truth = u.billed
		}
		if c.quota == nil && c.row.Truth == 0 {
			delete(cells, k) // nothing counted, nothing used: nothing to compare
			continue
		}
		c.drifted = !equal(c.row.Counter, c.row.Truth)
		c.fingerprint = fmt.Sprintf("%v/%v", c.row.Counter, c.row.Truth)
	}
	return cells
}

// truthSQL recomputes usage from distinct events: costquery collapses each
// (tenant, id) before filtering by time, so retries count once and a
// settled estimate replaces its pre-debit even when the two lie in
// different day partitions (FINAL would keep both), and prices each event
// with the price period containing its time. %s is the bucket.
var truthSQL = `
SELECT model, %s AS bucket, count(), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),
       sum(cache_write_tokens), sum(reasoning_tokens), countIf(outcome IN ('error', 'timeout')), sum(cost), sumIf(billed, priced = 1),
       sumIf(prompt_tokens, priced = 0), sumIf(completion_tokens, priced = 0), sumIf(cached_tokens, priced = 0),
       sumIf(cache_write_tokens, priced = 0), sumIf(reasoning_tokens, priced = 0)
FROM (` + costquery.EventsBetween() + `)
GROUP BY model, bucket`

// readTruth reads the truth of tenant's usage in [start, end), by model
// and minute (perMinute) or over the whole range. unpriced is the policy's
// unpriced_price, nil when none: the cost of unpriced events is computed
// here from their token sums (Price.Cost is linear), as the aggregator
// counts them, since the SQL prices them at 0.
func readTruth(ctx context.Context, conn driver.Conn, tenant string, start, end time.Time, perMinute bool, unpriced func() (policy.Price, bool)) (truth, error) {
	var fallback *policy.Price
	if unpriced != nil {
		if pr, ok := unpriced(); ok {
			fallback = &pr
		}
	}
	bucket := "toStartOfMinute(time)"
	args := costquery.BetweenArgs(tenant, start, end)
	if !perMinute {
		bucket = "toDateTime(?)"
		args = append([]any{start.UTC()}, args...)
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(truthSQL, bucket), args...)
	if err != nil {
		return nil, fmt.Errorf("audit: read usage_events of %s: %w", tenant, err)
	}
	defer rows.Close()
	out := truth{}
	for rows.Next() {
		var (
			model                        string
			at                           time.Time
			u                            usage
			up, uc, ucach, uwrite, ureas uint64
		)
		if err := rows.Scan(&model, &at, &u.requests, &u.prompt, &u.completion, &u.cached, &u.cacheWrite, &u.reasoning, &u.errors, &u.cost, &u.billed,
			&up, &uc, &ucach, &uwrite, &ureas); err != nil {
			return nil, fmt.Errorf("audit: scan usage_events: %w", err)
		}
		// Unpriced events: Price.Cost and BilledTokens are linear, so the
		// sums weigh as the events would one by one.
		unpriced := policy.Tokens{Prompt: int64(up), Completion: int64(uc), Cached: int64(ucach), CacheWrite: int64(uwrite), Reasoning: int64(ureas)}
		if fallback != nil && up+uc > 0 {
			u.cost += fallback.Cost(unpriced)
			u.billed += fallback.BilledTokens(unpriced)
		} else {
			u.billed += float64(up + uc)
		}
		if out[model] == nil {
			out[model] = map[int64]usage{}
		}
		b := out[model][at.Unix()]
		b.add(u)
		out[model][at.Unix()] = b
	}
	return out, rows.Err()
}

// quotaRow is one quota_state row as the highest version has it.
type quotaRow struct {
	model, quota, period, unit, mode string
	start, end, predicted            time.Time
	earliest, latest                 time.Time // the prediction's range
	basis                            string
	used, limit, rate                float64
	tier                             uint16
	version                          uint64
}

func readQuotaState(ctx context.Context, conn driver.Conn, tenant string, periods []string, start, end time.Time) ([]quotaRow, error) {
	rows, err := conn.Query(ctx, `
SELECT model, quota, period, unit, mode, period_start, period_end, predicted_exhaustion,
       predicted_earliest, predicted_latest, prediction_basis, used, quota_limit, rate_per_minute, tier, version
FROM quota_state FINAL
WHERE tenant = ? AND has(?, period) AND period_start >= ? AND period_start < ?`, tenant, periods, start.UTC(), end.UTC())
	if err != nil {
		return nil, fmt.Errorf("audit: read quota_state of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []quotaRow
	for rows.Next() {
		var r quotaRow
		if err := rows.Scan(&r.model, &r.quota, &r.period, &r.unit, &r.mode, &r.start, &r.end, &r.predicted,
			&r.earliest, &r.latest, &r.basis, &r.used, &r.limit, &r.rate, &r.tier, &r.version); err != nil {
			return nil, fmt.Errorf("audit: scan quota_state: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// minuteRow is one usage_minute row as the highest version has it.
type minuteRow struct {
	model              string
	minute             time.Time
	u                  usage
	slowCalls, version uint64
	cost               float64
}

func readUsageMinute(ctx context.Context, conn driver.Conn, tenant string, start, end time.Time) ([]minuteRow, error) {
	rows, err := conn.Query(ctx, `
SELECT model, minute, requests, prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens,
       errors, slow_calls, cost, version
FROM usage_minute FINAL
WHERE tenant = ? AND minute >= ? AND minute < ?`, tenant, start.UTC(), end.UTC())
	if err != nil {
		return nil, fmt.Errorf("audit: read usage_minute of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []minuteRow
	for rows.Next() {
		var r minuteRow
		if err := rows.Scan(&r.model, &r.minute, &r.u.requests, &r.u.prompt, &r.u.completion, &r.u.cached,
			&r.u.cacheWrite, &r.u.reasoning, &r.u.errors, &r.slowCalls, &r.cost, &r.version); err != nil {
			return nil, fmt.Errorf("audit: scan usage_minute: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
