// Repair: the truth written over drifted counters as their next version.

package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/policy"
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
cached_tokens, cache_write_tokens, reasoning_tokens, quota_limit, unit, mode, tier, rate_per_minute, predicted_exhaustion, predicted_earliest, predicted_latest, prediction_basis,
version, updated_at)`)
		if err != nil {
			return fmt.Errorf("audit: repair quota_state: %w", err)
		}
		for _, c := range quotas {
			r := c.row
			var (
				rate                        float64
				predicted, earliest, latest = time.Unix(0, 0), time.Unix(0, 0), time.Unix(0, 0)
				basis                       string
				version                     uint64 = 1
			)
			if q := c.quota; q != nil {
				rate, predicted, earliest, latest, basis, version = q.rate, q.predicted, q.earliest, q.latest, q.basis, q.version+1
			}
			if err := b.Append(t.ID, r.Model, r.Quota, r.Period, r.PeriodStart, r.PeriodEnd, r.Truth,
				c.truth.cached, c.truth.cacheWrite, c.truth.reasoning, r.Limit, r.Unit, r.Mode, uint16(policy.TierReached(t.AlertTiers, policy.Percent(r.Truth, r.Limit))), rate,
				predicted, earliest, latest, basis, version, now); err != nil {
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
completion_tokens, cached_tokens, cache_write_tokens, reasoning_tokens, errors, slow_calls, cost, version, updated_at)`)
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
				u.cacheWrite, u.reasoning, errs, slow, u.cost, version, now); err != nil {
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
