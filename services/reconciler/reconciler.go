// Package reconciler is the nightly audit service: at a local time of day
// in each tenant's zone it reconciles the aggregator's counters with the
// raw events for the day (and, on the first, the month) that just ended,
// repairs drifted counters, records every run in reconciliation_runs and
// publishes reconciliation_drift signals (see package audit for the rules
// that make it safe during live ingestion and safe to run twice). It also
// keeps the prices table in step with the quota policy, so the SQL cost
// reports price usage as the policy does.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/reconciler/audit"
	"github.com/sluicehq/sluice/services/reconciler/pricetable"
	"github.com/sluicehq/sluice/services/reconciler/schedule"
)

// Config is the reconciler's section of the configuration.
type Config struct {
	PolicyFile      string        `yaml:"policy_file" help:"quota policy file (timezones, quotas, prices)"`
	PolicyReload    time.Duration `yaml:"policy_reload" help:"how often the policy file is checked for changes"`
	At              string        `yaml:"at" help:"local time of day (HH:MM) at which each tenant's previous day is reconciled, in the tenant's zone"`
	CheckInterval   time.Duration `yaml:"check_interval" help:"how often the schedule is checked for due tenants"`
	Settle          time.Duration `yaml:"settle" help:"a period is audited only once it ended at least this long ago"`
	RepairThreshold float64       `yaml:"repair_threshold" help:"repair and alert when |counter - truth| exceeds this fraction of the truth (0: any drift)"`
	ConfirmDelay    time.Duration `yaml:"confirm_delay" help:"pause between the two observations that must agree before a drift is believed"`
	MaxObservations int           `yaml:"max_observations" help:"how often a period that keeps changing is re-read before it is left for the next run"`
	TenantLookback  time.Duration `yaml:"tenant_lookback" help:"tenants with events this far back are reconciled even when the policy does not name them"`
	JobTimeout      time.Duration `yaml:"job_timeout" help:"deadline for one tenant's nightly jobs"`
	ShutdownGrace   time.Duration `yaml:"shutdown_grace" help:"how long an in-flight job may run on after shutdown begins"`
}

// DefaultConfig reconciles at 00:30 local time, after a 15-minute settle.
func DefaultConfig() Config {
	return Config{
		PolicyFile:      "policy.yaml",
		PolicyReload:    10 * time.Second,
		At:              "00:30",
		CheckInterval:   time.Minute,
		Settle:          15 * time.Minute,
		RepairThreshold: 0,
		ConfirmDelay:    5 * time.Second,
		MaxObservations: 3,
		TenantLookback:  72 * time.Hour,
		JobTimeout:      30 * time.Minute,
		ShutdownGrace:   30 * time.Second,
	}
}

// Validate names each bad field and its limit.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(c.PolicyFile) == "" {
		bad("reconciler.policy_file: is required (the quota policy file)")
	}
	if c.PolicyReload < time.Second {
		bad("reconciler.policy_reload: %s is below the minimum of 1s", c.PolicyReload)
	}
	at, err := schedule.ParseTimeOfDay(c.At)
	if err != nil {
		bad("reconciler.at: %v", err)
	}
	if c.CheckInterval < time.Second || c.CheckInterval > time.Hour {
		bad("reconciler.check_interval: %s is outside 1s..1h", c.CheckInterval)
	}
	if c.Settle < 0 || c.Settle > 24*time.Hour {
		bad("reconciler.settle: %s is outside 0..24h", c.Settle)
	}
	if err == nil && time.Duration(at.Hour)*time.Hour+time.Duration(at.Minute)*time.Minute < c.Settle {
		bad("reconciler.at: %s is earlier than reconciler.settle (%s) after midnight; the day would not be auditable yet", c.At, c.Settle)
	}
	if c.RepairThreshold < 0 || c.RepairThreshold > 1 {
		bad("reconciler.repair_threshold: %v is outside 0..1", c.RepairThreshold)
	}
	if c.ConfirmDelay < 0 || c.ConfirmDelay > 5*time.Minute {
		bad("reconciler.confirm_delay: %s is outside 0..5m", c.ConfirmDelay)
	}
	if c.MaxObservations < 2 || c.MaxObservations > 10 {
		bad("reconciler.max_observations: %d is outside 2..10", c.MaxObservations)
	}
	if c.TenantLookback < 0 {
		bad("reconciler.tenant_lookback: %s must not be negative", c.TenantLookback)
	}
	if c.JobTimeout < time.Second {
		bad("reconciler.job_timeout: %s is below the minimum of 1s", c.JobTimeout)
	}
	if c.ShutdownGrace < 0 {
		bad("reconciler.shutdown_grace: %s must not be negative", c.ShutdownGrace)
	}
	return errors.Join(errs...)
}

// AuditOptions turns c into the audit's options.
func (c Config) AuditOptions() audit.Options {
	return audit.Options{Settle: c.Settle, RepairThreshold: c.RepairThreshold, ConfirmDelay: c.ConfirmDelay, MaxObservations: c.MaxObservations}
}

// metrics are the reconciler's Prometheus collectors.
type metrics struct {
	jobs        *prometheus.CounterVec
	drifted     prometheus.Counter
	repaired    prometheus.Counter
	unsettled   prometheus.Counter
	lastSuccess prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		jobs:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_reconciler_jobs_total", Help: "Reconciliation jobs by period and result (ok, error)."}, []string{"period", "result"}),
		drifted:     prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_reconciler_drifted_total", Help: "Counters found disagreeing with the raw events."}),
		repaired:    prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_reconciler_repaired_total", Help: "Counters rewritten with the truth."}),
		unsettled:   prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_reconciler_unsettled_total", Help: "Counters that moved during the audit and were left for the next run."}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_reconciler_last_success_timestamp_seconds", Help: "When a reconciliation job last succeeded."}),
	}
	for _, c := range []prometheus.Collector{m.jobs, m.drifted, m.repaired, m.unsettled, m.lastSuccess} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("reconciler: register metrics: %w", err)
		}
	}
	return m, nil
}

// Run reconciles on schedule until ctx ends. A job running when ctx ends
// gets cfg.ShutdownGrace to finish before it is cancelled.
func Run(ctx context.Context, cfg Config, env platform.Env) error {
	return run(ctx, cfg, env, schedule.RealClock)
}

func run(ctx context.Context, cfg Config, env platform.Env, clock schedule.Clock) error {
	env = env.Named("reconciler")
	log := env.Logger
	if err := cfg.Validate(); err != nil {
		return err
	}
	at, _ := schedule.ParseTimeOfDay(cfg.At)
	watcher, err := policy.NewWatcher(cfg.PolicyFile, cfg.PolicyReload, log)
	if err != nil {
		return fmt.Errorf("reconciler: %w", err)
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

	// Jobs outlive ctx by the grace period so an audit half-way through
	// its repairs can finish rather than leave a run record missing.
	jobCtx, cancelJobs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelJobs()
	go func() {
		select {
		case <-ctx.Done():
		case <-jobCtx.Done():
			return
		}
		t := time.NewTimer(cfg.ShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancelJobs()
		case <-jobCtx.Done():
		}
	}()

	// The prices table follows the policy: at start and on every reload,
	// so reports price new usage right away, not after the next night.
	syncPrices := func(p *policy.Policy) {
		sctx, cancel := context.WithTimeout(jobCtx, time.Minute)
		defer cancel()
		if n, err := pricetable.Sync(sctx, conn, p.Prices(), clock.Now()); err != nil {
			log.Error("prices table not updated from the policy; retrying at the next reload or job", "err", err)
		} else if n > 0 {
			log.Info("prices table updated from the policy", "rows", n)
		}
	}
	syncPrices(watcher.Current())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		_ = watcher.Run(ctx)
	}()
	syncDone := make(chan struct{})
	go func() {
		defer close(syncDone)
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-watcher.Subscribe():
				syncPrices(p)
			}
		}
	}()
	defer func() { <-watchDone; <-syncDone }()

	pub := &KafkaPublisher{Client: cl}
	opt := cfg.AuditOptions()
	opt.Now = clock.Now
	opt.Log = log
	auditor := audit.New(conn, pub, opt)
	s := &schedule.Scheduler{
		At: at, Interval: cfg.CheckInterval, Clock: clock, Log: log,
		Tenants: func(ctx context.Context) ([]schedule.Tenant, error) {
			return Tenants(ctx, conn, watcher.Current(), clock.Now().Add(-cfg.TenantLookback))
		},
		Run: func(_ context.Context, jobs []schedule.Job) error {
			ctx, cancel := context.WithTimeout(jobCtx, cfg.JobTimeout)
			defer cancel()
			pol := watcher.Current()
			if _, err := pricetable.Sync(ctx, conn, pol.Prices(), clock.Now()); err != nil {
				return err
			}
			for _, j := range jobs {
				res, err := auditor.Reconcile(ctx, audit.Job{Tenant: pol.Tenant(j.Tenant), Period: j.Period, At: j.At})
				if err != nil {
					m.jobs.WithLabelValues(string(j.Period), "error").Inc()
					return err
				}
				m.jobs.WithLabelValues(string(j.Period), "ok").Inc()
				m.drifted.Add(float64(res.Drifted))
				m.repaired.Add(float64(res.Repaired))
				m.unsettled.Add(float64(res.Unsettled))
				m.lastSuccess.SetToCurrentTime()
				log.Info("reconciled", "tenant", j.Tenant, "period", j.Period, "start", res.Start, "run_id", res.RunID,
					"rows", len(res.Rows), "drifted", res.Drifted, "repaired", res.Repaired, "unsettled", res.Unsettled, "signals", res.Signals)
			}
			return nil
		},
	}
	log.Info("reconciler started", "at", at.String(), "settle", cfg.Settle, "policy", cfg.PolicyFile)
	return s.Loop(ctx)
}

// Tenants lists the tenants to reconcile: every tenant the policy names
// and every tenant with events since `since` (an unnamed tenant is
// metered under the defaults, so it is audited too), each with its zone.
func Tenants(ctx context.Context, conn driver.Conn, pol *policy.Policy, since time.Time) ([]schedule.Tenant, error) {
	ids := map[string]bool{}
	for _, id := range pol.TenantIDs() {
		ids[id] = true
	}
	rows, err := conn.Query(ctx, "SELECT DISTINCT tenant FROM usage_events WHERE time >= ?", since.UTC())
	if err != nil {
		return nil, fmt.Errorf("reconciler: list tenants: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("reconciler: list tenants: %w", err)
		}
		ids[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reconciler: list tenants: %w", err)
	}
	out := make([]schedule.Tenant, 0, len(ids))
	for id := range ids {
		out = append(out, schedule.Tenant{ID: id, Location: pol.Tenant(id).Location})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ProducerOptions are the franz-go options for publishing signals:
// idempotent, acks from all in-sync replicas.
func ProducerOptions() []kgo.Opt {
	return []kgo.Opt{kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0)}
}

// KafkaPublisher produces signals to schemas.TopicSignalsV1, keyed by
// tenant like the aggregator's, with the schema header.
type KafkaPublisher struct {
	Client *kgo.Client
}

// Publish produces every signal and waits for the acknowledgements.
func (p *KafkaPublisher) Publish(ctx context.Context, signals []schemas.Signal) error {
	recs := make([]*kgo.Record, 0, len(signals))
	for i := range signals {
		v, err := schemas.EncodeSignal(&signals[i])
		if err != nil {
			return fmt.Errorf("reconciler: encode signal %s: %w", signals[i].ID, err)
		}
		recs = append(recs, &kgo.Record{Topic: schemas.TopicSignalsV1, Key: []byte(signals[i].Tenant), Value: v,
			Headers: []kgo.RecordHeader{{Key: schemas.HeaderSchema, Value: []byte(schemas.SchemaSignalsV1)}}})
	}
	return p.Client.ProduceSync(ctx, recs...).FirstErr()
}
