package audit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// repair writes the truth into every cell's counter table as the next
// version of its row, copying the columns the audit does not recompute
// (limits, rates, predictions, slow calls) from the row it replaces.
func (a *Auditor) repair(ctx context.Context, t *policy.Tenant, cells []*cell, now time.Time) error {
	var quotas, minutes []*cell
	for _, c := range cells {
		if c.minuteCell {
			minutes = append(minutes, c)
		} else {
			quotas = append(quotas, c)
		}
	}
	if len(quotas) > 0 {
		b, err := a.conn.PrepareBatch(ctx, `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used,
quota_limit, unit, mode, tier, rate_per_minute, predicted_exhaustion, version, updated_at)`)
		if err != nil {
			return fmt.Errorf("audit: repair quota_state: %w", err)
		}
		for _, c := range quotas {
			r := c.row
			var (
				rate      float64
				predicted        = time.Unix(0, 0)
				version   uint64 = 1
			)
			if q := c.quota; q != nil {
				rate, predicted, version = q.rate, q.predicted, q.version+1
			}
			if err := b.Append(t.ID, r.Model, r.Quota, r.Period, r.PeriodStart, r.PeriodEnd, r.Truth,
				r.Limit, r.Unit, r.Mode, uint16(policy.TierReached(t.AlertTiers, policy.Percent(r.Truth, r.Limit))), rate, predicted, version, now); err != nil {
				_ = b.Abort()
				return fmt.Errorf("audit: repair quota_state: %w", err)
			}
		}
		if err := b.Send(); err != nil {
			return fmt.Errorf("audit: repair quota_state: %w", err)
		}
	}
	if len(minutes) > 0 {
		b, err := a.conn.PrepareBatch(ctx, `INSERT INTO usage_minute (tenant, model, minute, requests, prompt_tokens,
completion_tokens, cached_tokens, errors, slow_calls, cost, version, updated_at)`)
		if err != nil {
			return fmt.Errorf("audit: repair usage_minute: %w", err)
		}
		for _, c := range minutes {
			u := c.truth
			var (
				errs    = u.errors
				slow    uint64
				version uint64 = 1
			)
			if m := c.minute; m != nil {
				// The aggregator's error and slow-call counts follow the
				// tenant's breaker settings, which the audit does not check.
				errs, slow, version = m.u.errors, m.slowCalls, m.version+1
			}
			if err := b.Append(t.ID, c.row.Model, c.row.PeriodStart, u.requests, u.prompt, u.completion, u.cached,
				errs, slow, u.cost, version, now); err != nil {
				_ = b.Abort()
				return fmt.Errorf("audit: repair usage_minute: %w", err)
			}
		}
		if err := b.Send(); err != nil {
			return fmt.Errorf("audit: repair usage_minute: %w", err)
		}
	}
	return nil
}

// record appends the run's rows to reconciliation_runs.
func (a *Auditor) record(ctx context.Context, res Result, now time.Time) error {
	if len(res.Rows) == 0 {
		return nil
	}
	b, err := a.conn.PrepareBatch(ctx, `INSERT INTO reconciliation_runs (run_id, started_at, tenant, model, quota, period,
period_start, counter, truth, drift, repaired)`)
	if err != nil {
		return fmt.Errorf("audit: record run %s: %w", res.RunID, err)
	}
	for _, r := range res.Rows {
		var repaired uint8
		if r.Repaired {
			repaired = 1
		}
		if err := b.Append(res.RunID, now, r.Tenant, r.Model, r.Quota, r.Period, r.PeriodStart, r.Counter, r.Truth, r.Drift, repaired); err != nil {
			_ = b.Abort()
			return fmt.Errorf("audit: record run %s: %w", res.RunID, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("audit: record run %s: %w", res.RunID, err)
	}
	return nil
}

// driftSignal describes one drifted counter for the alerter. The id
// depends on the drift only, not on the run, so the same drift found twice
// is one alert.
func driftSignal(r Row, runID string, now time.Time) schemas.Signal {
	ff := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	s := schemas.Signal{
		ID:     schemas.SignalID(string(schemas.SignalReconciliationDrift), r.Tenant, r.Model, r.Quota, r.PeriodStart.UTC().Format(time.RFC3339), ff(r.Counter), ff(r.Truth)),
		Kind:   schemas.SignalReconciliationDrift,
		Time:   now.UTC().Truncate(time.Second),
		Tenant: r.Tenant,
		Model:  r.Model,
		Period: schemas.Period(r.Period),
		Used:   r.Truth,
		Limit:  r.Limit,
		Unit:   schemas.Unit(r.Unit),
		Mode:   schemas.Mode(r.Mode),
		Reason: fmt.Sprintf("%s counter %s for %s was %s, the events say %s (drift %+g %s); repaired",
			r.Quota, r.Model, r.PeriodStart.UTC().Format(time.RFC3339), ff(r.Counter), ff(r.Truth), r.Drift, r.Unit),
		Attributes: map[string]string{
			"counter": ff(r.Counter), "truth": ff(r.Truth), "drift": ff(r.Drift),
			"counter_table": "quota_state", "run_id": runID,
		},
	}
	if !r.PeriodStart.IsZero() {
		s.PeriodStart, s.PeriodEnd = r.PeriodStart.UTC(), r.PeriodEnd.UTC()
	}
	if q := schemas.QuotaKind(r.Quota); q.Valid() {
		s.Quota = q
	}
	if r.Quota == UsageMinuteQuota {
		s.Attributes["counter_table"] = "usage_minute"
	}
	if !s.Mode.Valid() {
		s.Mode = ""
	}
	if !s.Unit.Valid() {
		s.Unit = ""
	}
	return s
}
