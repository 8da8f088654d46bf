package enforcer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/enforcer/adminapi"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
	"github.com/sluicehq/sluice/services/enforcer/internal/flagwriter"
)

// core is the enforcer without its transports: signals in, flags out.
type core struct {
	cfg    Config
	log    *slog.Logger
	table  *breaker.Table
	writer *flagwriter.Writer
	policy *policy.Watcher

	dedupMu sync.Mutex
	seen    map[string]struct{}
	ring    []string
	next    int

	signals *prometheus.CounterVec
}

func newCore(cfg Config, rdb *redis.Client, pw *policy.Watcher, log *slog.Logger) *core {
	c := &core{cfg: cfg, log: log, table: breaker.NewTable(), policy: pw, seen: map[string]struct{}{},
		ring: make([]string, cfg.DedupSignals),
		signals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_enforcer_signals_total",
			Help: "Signals consumed by the enforcer, by result."}, []string{"result"})}
	c.writer = flagwriter.New(rdb, c.table, flagwriter.Config{KeyPrefix: cfg.KeyPrefix, FlushInterval: cfg.FlushInterval,
		FlagTTL: cfg.FlagTTL, HeartbeatEvery: cfg.HeartbeatEvery, MaxDirty: cfg.MaxDirty, BatchTenants: cfg.BatchTenants}, log)
	c.publishFailModes(pw.Current())
	return c
}

// duplicate remembers id in a bounded ring; the oldest id is forgotten
// when the ring is full.
func (c *core) duplicate(id string) bool {
	if len(c.ring) == 0 {
		return false
	}
	c.dedupMu.Lock()
	defer c.dedupMu.Unlock()
	if _, ok := c.seen[id]; ok {
		return true
	}
	if old := c.ring[c.next]; old != "" {
		delete(c.seen, old)
	}
	c.ring[c.next] = id
	c.next = (c.next + 1) % len(c.ring)
	c.seen[id] = struct{}{}
	return false
}

// handle folds one decoded signal in; flags are written by the next flush.
func (c *core) handle(s *schemas.Signal, now time.Time) {
	if c.duplicate(s.ID) {
		c.signals.WithLabelValues("duplicate").Inc()
		return
	}
	res := c.table.Apply(s, c.policy.Current().Tenant(s.Tenant), now)
	switch {
	case res.SoftOverage:
		c.signals.WithLabelValues("soft_overage").Inc()
		c.log.Info("soft quota overage recorded", "tenant", s.Tenant, "model", s.Model, "quota", s.Quota, "used", s.Used, "limit", s.Limit)
	case len(res.Changed) > 0:
		c.signals.WithLabelValues("changed").Inc()
		c.writer.MarkDirty(res.Changed...)
	default:
		c.signals.WithLabelValues("no_change").Inc()
	}
}

// handleRecord decodes one Kafka record; bad records are logged and
// skipped, never fatal.
func (c *core) handleRecord(value []byte, now time.Time) {
	var s schemas.Signal
	if err := schemas.DecodeSignal(value, &s); err != nil {
		c.signals.WithLabelValues("invalid").Inc()
		c.log.Warn("enforcer: skipping undecodable signal", "err", err)
		return
	}
	c.handle(&s, now)
}

func (c *core) tick(now time.Time) {
	p := c.policy.Current()
	if changed := c.table.Tick(now, p.Tenant); len(changed) > 0 {
		c.writer.MarkDirty(changed...)
	}
}

func (c *core) publishFailModes(p *policy.Policy) {
	m := map[string]string{"*": string(p.Tenant("").FailMode)}
	for _, id := range p.TenantIDs() {
		m[id] = string(p.Tenant(id).FailMode)
	}
	c.writer.SetFailModes(m)
}

// collectors are the enforcer's Prometheus metrics.
func (c *core) collectors() []prometheus.Collector {
	stat := func(pick func(f, e, r int64) int64) func() float64 {
		return func() float64 { f, e, r := c.writer.Stats(); return float64(pick(f, e, r)) }
	}
	return []prometheus.Collector{
		c.signals,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_flag_writes_total",
			Help: "Pipelined Redis round trips that wrote flags."}, stat(func(f, _, _ int64) int64 { return f })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_flag_write_errors_total",
			Help: "Flag writes that failed (Redis unreachable); state is kept and rewritten."}, stat(func(_, e, _ int64) int64 { return e })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_full_rewrites_total",
			Help: "Rewrites of every flag (start, TTL refresh, Redis back or emptied)."}, stat(func(_, _, r int64) int64 { return r })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_enforcer_tenants_with_breakers",
			Help: "Tenants with at least one open or half-open breaker."}, func() float64 { return float64(len(c.table.Tenants())) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_soft_overage_signals_total",
			Help: "Soft-quota overage signals recorded (not blocked)."}, c.table.Overage),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_policy_reload_failures_total",
			Help: "Policy reloads rejected as invalid; the previous policy stays in force."},
			func() float64 { return float64(c.policy.Failures.Load()) }),
	}
}

// recoverState rebuilds open quota breakers from quota_state and replays
// the admin actions still in force from admin_audit.
func (c *core) recoverState(ctx context.Context, conn driver.Conn, now time.Time) error {
	// Aliases differ from column names: ClickHouse 18.16 resolves a WHERE
	// column to a same-named aggregate alias.
	rows, err := conn.Query(ctx, `SELECT tenant, model, quota, period, pe, u, l, md FROM (
  SELECT tenant, model, quota, period, period_start, any(period_end) AS pe,
         argMax(used, version) AS u, argMax(quota_limit, version) AS l, argMax(mode, version) AS md
  FROM quota_state WHERE period_end > toDateTime(?) GROUP BY tenant, model, quota, period, period_start
) WHERE l > 0 AND u >= l`, now.Unix())
	if err != nil {
		return fmt.Errorf("recover quota_state: %w", err)
	}
	p := c.policy.Current()
	n := 0
	for rows.Next() {
		var s schemas.Signal
		var quota, period, mode string
		if err := rows.Scan(&s.Tenant, &s.Model, &quota, &period, &s.PeriodEnd, &s.Used, &s.Limit, &mode); err != nil {
			rows.Close()
			return fmt.Errorf("recover quota_state: %w", err)
		}
		s.Kind, s.Quota, s.Period, s.Mode = schemas.SignalQuotaExhausted, schemas.QuotaKind(quota), schemas.Period(period), schemas.Mode(mode)
		if res := c.table.Apply(&s, p.Tenant(s.Tenant), now); len(res.Changed) > 0 {
			c.writer.MarkDirty(res.Changed...)
			n++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("recover quota_state: %w", err)
	}
	entries, err := audit.New(conn).Since(ctx, now.Add(-adminapi.MaxExpiry))
	if err != nil {
		return err
	}
	touched := admin.Replay(c.table, entries, now, c.log)
	c.writer.MarkDirty(touched...)
	c.log.Info("enforcer: state recovered from ClickHouse", "quota_breakers", n, "admin_actions", len(entries))
	return nil
}

// recoveryWait bounds how long signal consumption waits for recovery.
const recoveryWait = 30 * time.Second

// Run runs the enforcer until ctx is cancelled, then writes the last flags
// and stops within cfg.ShutdownGrace.
func Run(ctx context.Context, cfg Config, env platform.Env) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	env = env.Named("enforcer")
	log := env.Logger

	pw, err := loadPolicy(cfg, log)
	if err != nil {
		return err
	}
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	chc, err := chconn.Open(ctx, env.ClickHouse)
	if err != nil {
		return err
	}
	defer chc.Close()
	kc, err := kafkaconn.NewClient(env.Kafka,
		kgo.ConsumerGroup(cfg.ConsumerGroup),
		kgo.ConsumeTopics(cfg.SignalsTopic),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return err
	}
	defer func() {
		// Leaving waits for a join in progress; bound it so a shutdown
		// during a rebalance cannot overrun the process's grace period.
		lctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = kc.LeaveGroupContext(lctx)
		kc.Close()
	}()
	if err := kafkaconn.EnsureTopics(ctx, kc, env.Kafka, cfg.SignalsTopic); err != nil {
		return err
	}

	c := newCore(cfg, rdb, pw, log)
	for _, m := range c.collectors() {
		if err := env.Metrics.Register(m); err != nil {
			return fmt.Errorf("enforcer: metrics: %w", err)
		}
	}
	env.Health.AddReadiness("enforcer-redis", redisconn.Ready(rdb))
	env.Health.AddReadiness("enforcer-kafka", kafkaconn.Ready(kc))
	env.Health.AddReadiness("enforcer-clickhouse", chconn.Ready(chc))

	var wg sync.WaitGroup
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 4)
	goRun := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }

	var recovered sync.WaitGroup
	recovered.Add(1)
	if cfg.Recover {
		env.Health.AddReadiness("enforcer-recovered", func(context.Context) error {
			return errors.New("state not yet recovered from ClickHouse")
		})
		goRun(func() {
			defer recovered.Done()
			for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
				rctx, cancel := context.WithTimeout(runCtx, time.Minute)
				err := c.recoverState(rctx, chc, time.Now())
				cancel()
				if err == nil {
					env.Health.RemoveReadiness("enforcer-recovered")
					return
				}
				log.Warn("enforcer: recovery from ClickHouse failed; retrying", "err", err, "in", delay)
				select {
				case <-runCtx.Done():
					return
				case <-time.After(delay):
				}
			}
		})
	} else {
		recovered.Done()
	}

	goRun(func() { _ = c.writer.Run(runCtx, cfg.ShutdownGrace) })
	goRun(func() {
		t := time.NewTicker(cfg.TickEvery)
		defer t.Stop()
		for {
			select {
			case <-runCtx.Done():
				return
			case now := <-t.C:
				c.tick(now)
			}
		}
	})
	goRun(func() {
		if pw == nil {
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = pw.Run(runCtx) }()
		for {
			select {
			case <-runCtx.Done():
				return
			case p := <-pw.Subscribe():
				c.publishFailModes(p)
			}
		}
	})
	goRun(func() {
		// Signals wait (boundedly) for recovery, so that the first flags
		// written already include the state recovered from ClickHouse; a
		// ClickHouse outage must not stop enforcement, hence the bound.
		waited := make(chan struct{})
		go func() { recovered.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-time.After(recoveryWait):
			log.Warn("enforcer: consuming signals before recovery finished", "waited", recoveryWait)
		case <-runCtx.Done():
			return
		}
		for runCtx.Err() == nil {
			fs := kc.PollFetches(runCtx)
			now := time.Now()
			fs.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.Canceled) {
					log.Warn("enforcer: fetch error", "topic", t, "partition", p, "err", err)
				}
			})
			fs.EachRecord(func(r *kgo.Record) { c.handleRecord(r.Value, now) })
		}
	})
	if cfg.Admin.Listen != "" {
		if len(cfg.Admin.Tokens) == 0 {
			log.Warn("enforcer: admin API disabled: no admin.tokens configured")
		} else {
			ln, err := net.Listen("tcp", cfg.Admin.Listen)
			if err != nil {
				stop()
				wg.Wait()
				return fmt.Errorf("enforcer.admin.listen: %w", err)
			}
			api := admin.New(c.table, c.writer.MarkDirty, audit.New(chc), cfg.Admin.Tokens, cfg.FlagTTL, log)
			srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second}
			goRun(func() {
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					errc <- fmt.Errorf("enforcer: admin API: %w", err)
				}
			})
			goRun(func() {
				<-runCtx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
				defer cancel()
				_ = srv.Shutdown(sctx)
			})
			log.Info("enforcer: admin API listening", "addr", ln.Addr().String())
		}
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	stop()
	wg.Wait()
	return runErr
}

func loadPolicy(cfg Config, log *slog.Logger) (*policy.Watcher, error) {
	if cfg.PolicyFile == "" {
		p, err := policy.Parse([]byte("{}\n"), "(built-in defaults)")
		if err != nil {
			return nil, err
		}
		return policy.Static(p), nil
	}
	w, err := policy.NewWatcher(cfg.PolicyFile, cfg.PolicyReload, log)
	if err != nil {
		return nil, fmt.Errorf("enforcer.policy_file: %w", err)
	}
	return w, nil
}
