// Package reconciler is the audit service: at a local time of day in each
// tenant's zone it reconciles the aggregator's counters with the raw
// events for the day (and, on the first, the month) that just ended, and
// every hour those of the hour that just closed (reconciler.hourly),
// repairs drifted counters, records every run in reconciliation_runs and
// publishes reconciliation_drift signals (see package audit for the rules
// that make it safe during live ingestion and safe to run twice). It also
// keeps the prices table in step with the quota policy, so the SQL cost
// reports price usage as the policy does. The policy is the file with the
// admin API's tenants and plans laid over it (topics.admin), as the
// aggregator counts under it.
//
// The package is split along its edges: nightly.go is the service's core
// (what a due tenant's run does and how prices follow the policy; the
// audit itself is package audit), clickhouse.go and kafka.go are the
// adapters behind its Store and audit.Publisher, config.go and metrics.go
// are its settings and collectors, and this file wires them together.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/audit"
	"github.com/sluicehq/sluice/services/reconciler/schedule"
)

// New returns the reconciler of cfg in env. Once started it reconciles on
// schedule until stopped; a job running then gets cfg.ShutdownTimeout to
// finish before it is cancelled. It has no API of its own (Addr is "").
func New(cfg Config, env platform.Env, opts ...Option) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.reconciler", err)
	}
	if err := env.Topics.Check("signals", "admin"); err != nil {
		return nil, fmt.Errorf("reconciler: %w", err)
	}
	clock := schedule.Clock(schedule.RealClock)
	for _, o := range opts {
		o(&clock)
	}
	return platform.NewService("reconciler", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, clock, ready)
	}), nil
}

// Option adds to a reconciler what its host (a test) gives.
type Option func(*schedule.Clock)

// WithClock runs the schedule on clock instead of the wall clock.
func WithClock(clock schedule.Clock) Option { return func(c *schedule.Clock) { *c = clock } }

func run(ctx context.Context, cfg Config, env platform.Env, clock schedule.Clock, ready func(addr string)) error {
	env = env.Named("reconciler")
	log := env.Logger
	at, _ := schedule.ParseTimeOfDay(cfg.At)
	auth, err := signalauth.Open(env.SignalAuth, log)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	if env.Policy.File == "" {
		return errors.New("reconciler: policy.file is required: the reconciler audits the quotas and prices it names")
	}
	watcher, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	// The tenants and plans of the admin API, read to the end before any
	// audit: a tenant defined at runtime is audited in its own zone, under
	// its own quotas, as the aggregator counted it, not under the file's
	// defaults.
	records, stopRecords, err := controlplane.FollowPolicy(ctx, "reconciler", env, watcher, nil)
	if err != nil {
		return fmt.Errorf("reconciler: admin topic: %w", err)
	}
	defer stopRecords()
	if err := records.CatchUp(ctx); err != nil {
		return fmt.Errorf("reconciler: read admin topic %s: %w", env.Topics.Admin, err)
	}
	conn, err := chconn.Open(ctx, env.ClickHouse)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	defer conn.Close()
	cl, err := kafkaconn.NewClient(env.Kafka, ProducerOptions()...)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
	}
	defer cl.Close()
	m, err := newMetrics(env.Metrics)
	if err != nil {
		return err
	}
	env.Health.AddReadiness("reconciler-clickhouse", chconn.Ready(conn))
	env.Health.AddReadiness("reconciler-kafka", kafkaconn.Ready(cl))
	defer env.Health.RemoveReadiness("reconciler-clickhouse")
	defer env.Health.RemoveReadiness("reconciler-kafka")

	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	opt := cfg.AuditOptions()
	opt.Now = clock.Now
	opt.Log = log
	opt.Unpriced = func() (policy.Price, bool) { return watcher.Current().UnpricedPrice() }
	n := &nightly{cfg: cfg, clock: clock, log: log, policy: watcher, store: clickHouse{conn},
		auditor: audit.New(conn, &KafkaPublisher{Client: cl, Topic: env.Topics.Signals, Auth: auth}, opt), m: m, jobCtx: jobCtx}
	n.syncPrices(watcher.Current())
	s := &schedule.Scheduler{At: at, Interval: cfg.CheckInterval, Clock: clock, Log: log, Tenants: n.tenants, Run: n.runJobs,
		Hourly: cfg.Hourly, Settle: cfg.Settle}

	// One group, one cancellation: the policy and records followers and
	// the scheduler stop with ctx. The scheduler returns once its current tenant's run
	// is over, which ends jobCtx; the grace member cuts that run short if
	// it outlasts cfg.ShutdownTimeout.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return watcher.Follow(gctx, n.syncPrices) })
	g.Go(func() error { return records.Run(gctx) })
	g.Go(func() error {
		defer cancelJobs()
		return s.Loop(gctx)
	})
	g.Go(func() error {
		select {
		case <-gctx.Done():
		case <-jobCtx.Done():
			return nil
		}
		t := time.NewTimer(cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancelJobs()
		case <-jobCtx.Done():
		}
		return nil
	})
	log.Info("reconciler started", "at", at.String(), "settle", cfg.Settle, "policy_file", env.Policy.File)
	ready("")
	return g.Wait()
}
