package reconciler

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/reconciler/audit"
	"github.com/sluicehq/sluice/services/reconciler/schedule"
)

// Store is what the nightly core needs from ClickHouse besides the audit
// itself; clickHouse is the production adapter.
type Store interface {
	// SyncPrices brings the prices table in step with prices and returns
	// how many rows it wrote.
	SyncPrices(ctx context.Context, prices []policy.Price, now time.Time) (int, error)
	// Tenants lists the tenants to schedule: those pol names and those
	// with events since `since`.
	Tenants(ctx context.Context, pol *policy.Policy, since time.Time) ([]schedule.Tenant, error)
}

// Auditor reconciles one tenant's period; *audit.Auditor is the production
// implementation.
type Auditor interface {
	Reconcile(ctx context.Context, job audit.Job) (audit.Result, error)
}

// nightly is the reconciler's core: what runs when the schedule says a
// tenant is due, and what keeps the prices table following the policy.
// It holds no connection of its own; Run wires it to ClickHouse and Kafka.
type nightly struct {
	cfg     Config
	clock   schedule.Clock
	log     *slog.Logger
	policy  *policy.Watcher
	store   Store
	auditor Auditor
	m       *metrics
	// jobCtx outlives the service's context by cfg.ShutdownTimeout, so a job
	// half-way through its repairs finishes rather than leaving a run
	// record missing; every job and price sync runs under it.
	jobCtx context.Context
}

// syncPrices copies p's prices into ClickHouse: at start and on every
// reload, so reports price new usage right away, not after the next night.
// A failure is logged, not returned: the next reload or job retries, and
// the audits do not depend on it until then.
func (n *nightly) syncPrices(p *policy.Policy) {
	ctx, cancel := context.WithTimeout(n.jobCtx, time.Minute)
	defer cancel()
	if rows, err := n.store.SyncPrices(ctx, p.Prices(), n.clock.Now()); err != nil {
		n.log.Error("prices table not updated from the policy; retrying at the next reload or job", "err", err)
	} else if rows > 0 {
		n.log.Info("prices table updated from the policy", "rows", rows)
	}
}

// tenants is the scheduler's tenant list.
func (n *nightly) tenants(ctx context.Context) ([]schedule.Tenant, error) {
	return n.store.Tenants(ctx, n.policy.Current(), n.clock.Now().Add(-n.cfg.TenantLookback))
}

// runJobs runs one tenant's due jobs under cfg.JobTimeout. Prices are
// synced first because the budget audit prices events through the prices
// table; a failed sync fails the tenant's run, which the scheduler retries
// at its next check. The scheduler's own context is not used: jobs follow
// jobCtx and its shutdown grace.
func (n *nightly) runJobs(_ context.Context, jobs []schedule.Job) error {
	ctx, cancel := context.WithTimeout(n.jobCtx, n.cfg.JobTimeout)
	defer cancel()
	pol := n.policy.Current()
	if _, err := n.store.SyncPrices(ctx, pol.Prices(), n.clock.Now()); err != nil {
		return err
	}
	for _, j := range jobs {
		res, err := n.auditor.Reconcile(ctx, audit.Job{Tenant: pol.Tenant(j.Tenant), Period: j.Period, At: j.At})
		if err != nil {
			n.m.jobs.WithLabelValues(string(j.Period), "error").Inc()
			return err
		}
		n.m.jobs.WithLabelValues(string(j.Period), "ok").Inc()
		n.m.drifted.Add(float64(res.Drifted))
		n.m.repaired.Add(float64(res.Repaired))
		n.m.unsettled.Add(float64(res.Unsettled))
		n.m.lastSuccess.SetToCurrentTime()
		// Hour jobs run for every tenant every hour: only those that found
		// something are worth an info line.
		level := slog.LevelInfo
		if j.Period == schemas.PeriodHour && res.Drifted == 0 && res.Unsettled == 0 {
			level = slog.LevelDebug
		}
		n.log.Log(ctx, level, "reconciled", "tenant", j.Tenant, "period", j.Period, "start", res.Start, "run_id", res.RunID,
			"rows", len(res.Rows), "drifted", res.Drifted, "repaired", res.Repaired, "unsettled", res.Unsettled, "signals", res.Signals)
	}
	return nil
}
