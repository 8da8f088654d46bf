// Record and signal: every comparison of a run appended to
// reconciliation_runs, and the reconciliation_drift signal of a drift.

package audit

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

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
