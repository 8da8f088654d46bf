package enforcer

import (
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
)

// collectors are the enforcer's Prometheus metrics, read from the core's
// own counters at scrape time.
func (c *core) collectors() []prometheus.Collector {
	stat := func(pick func(f, e, r int64) int64) func() float64 {
		return func() float64 { f, e, r := c.writer.Stats(); return float64(pick(f, e, r)) }
	}
	return []prometheus.Collector{
		c.signals,
		c.restored,
		c.leader,
		c.lag,
		c.offsets.errors,
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_flag_writes_total",
			Help: "Pipelined Redis round trips that wrote flags."}, stat(func(f, _, _ int64) int64 { return f })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_flag_write_errors_total",
			Help: "Flag writes that failed (Redis unreachable); state is kept and rewritten."}, stat(func(_, e, _ int64) int64 { return e })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_full_rewrites_total",
			Help: "Rewrites of every flag at once (start, taking the lead, Redis back or emptied, a refresh that fell behind); the refresh every flag_ttl/3 is spread over the flushes and not counted here."}, stat(func(_, _, r int64) int64 { return r })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_flag_writes_fenced_total",
			Help: "Flag hash writes Redis refused because the hash holds a newer version: another replica took the lead while this one was paused past its lease, or led with its clock ahead. The replica stops writing until the lease grants it a newer range of versions."},
			func() float64 { return float64(c.writer.FencedWrites()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_enforcer_tenants_with_breakers",
			Help: "Tenants with at least one open or half-open breaker."}, func() float64 { return float64(len(c.table.Tenants())) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_soft_overage_signals_total",
			Help: "Soft-quota overage signals recorded (not blocked)."}, c.table.Overage),
		redisconn.NewUp("enforcer", c.redisPing),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_enforcer_policy_reload_failures_total",
			Help: "Policy reloads rejected as invalid; the previous policy stays in force."},
			func() float64 { return float64(c.policy.Failures.Load()) }),
		controlplane.PolicyConflicts("enforcer", c.policy),
	}
}

// registerMetrics registers the core's collectors on reg.
func (c *core) registerMetrics(reg prometheus.Registerer) error {
	for _, m := range c.collectors() {
		if err := reg.Register(m); err != nil {
			return err
		}
	}
	return nil
}

// RegisterMetrics registers the enforcer's collectors on reg as Run does,
// unconnected (they read zero): for what lists the series a Sluice
// process exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	pol, err := policy.Parse([]byte("{}"), "empty")
	if err != nil {
		return err
	}
	c := newCore(DefaultConfig(), nil, policy.Static(pol), slog.New(slog.DiscardHandler))
	a := newAdminMetrics()
	return errors.Join(c.registerMetrics(reg), reg.Register(a))
}
