package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/costquery"
)

// usage is what the raw events say about one model in one bucket of time.
type usage struct {
	requests, prompt, completion, cached, errors uint64
	cost                                         float64
}

func (u *usage) add(o usage) {
	u.requests += o.requests
	u.prompt += o.prompt
	u.completion += o.completion
	u.cached += o.cached
	u.errors += o.errors
	u.cost += o.cost
}

func (u usage) tokens() uint64 { return u.prompt + u.completion }

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

// truthSQL recomputes usage from distinct events: FINAL keeps one row per
// (tenant, id), the one with the highest Kafka offset, so retries count once
// and a settled estimate replaces its pre-debit; costquery prices each
// event with the price period containing its time. %s is the bucket.
var truthSQL = `
SELECT model, %s AS bucket, count(), sum(prompt_tokens), sum(completion_tokens), sum(cached_tokens),
       countIf(outcome IN ('error', 'timeout')), sum(cost)
FROM (` + costquery.Events("tenant = ? AND time >= ? AND time < ?") + `)
GROUP BY model, bucket`

func readTruth(ctx context.Context, conn driver.Conn, tenant string, start, end time.Time, perMinute bool) (truth, error) {
	bucket := "toStartOfMinute(time)"
	// Bound parameters travel as literals naming their zone; UTC is the
	// one zone every server knows.
	start, end = start.UTC(), end.UTC()
	args := []any{tenant, start, end}
	if !perMinute {
		bucket = "toDateTime(?)"
		args = append([]any{start}, args...)
	}
	rows, err := conn.Query(ctx, fmt.Sprintf(truthSQL, bucket), args...)
	if err != nil {
		return nil, fmt.Errorf("audit: read usage_events of %s: %w", tenant, err)
	}
	defer rows.Close()
	out := truth{}
	for rows.Next() {
		var (
			model string
			at    time.Time
			u     usage
		)
		if err := rows.Scan(&model, &at, &u.requests, &u.prompt, &u.completion, &u.cached, &u.errors, &u.cost); err != nil {
			return nil, fmt.Errorf("audit: scan usage_events: %w", err)
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
	used, limit, rate                float64
	tier                             uint16
	version                          uint64
}

func readQuotaState(ctx context.Context, conn driver.Conn, tenant string, periods []string, start, end time.Time) ([]quotaRow, error) {
	rows, err := conn.Query(ctx, `
SELECT model, quota, period, unit, mode, period_start, period_end, predicted_exhaustion,
       used, quota_limit, rate_per_minute, tier, version
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
			&r.used, &r.limit, &r.rate, &r.tier, &r.version); err != nil {
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
SELECT model, minute, requests, prompt_tokens, completion_tokens, cached_tokens, errors, slow_calls, cost, version
FROM usage_minute FINAL
WHERE tenant = ? AND minute >= ? AND minute < ?`, tenant, start.UTC(), end.UTC())
	if err != nil {
		return nil, fmt.Errorf("audit: read usage_minute of %s: %w", tenant, err)
	}
	defer rows.Close()
	var out []minuteRow
	for rows.Next() {
		var r minuteRow
		if err := rows.Scan(&r.model, &r.minute, &r.u.requests, &r.u.prompt, &r.u.completion, &r.u.cached, &r.u.errors,
			&r.slowCalls, &r.cost, &r.version); err != nil {
			return nil, fmt.Errorf("audit: scan usage_minute: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
