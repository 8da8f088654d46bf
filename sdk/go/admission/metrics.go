package admission

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Limiter's Prometheus series. Rule labels carry the rule
// name only (never a user, key or tenant value), so their number is the
// number of rules in the policy.
type metrics struct {
	c           counters
	byRule      *prometheus.CounterVec // rule, result
	duration    *prometheus.HistogramVec
	leases      *prometheus.CounterVec // event: taken, returned
	leaseUnits  *prometheus.CounterVec // event
	failMode    *prometheus.CounterVec // mode, result
	redisErrors prometheus.Counter
	settles     *prometheus.CounterVec // result
	reconciled  prometheus.Counter
	dropped     prometheus.Counter
	waiters     prometheus.Gauge
	waitSeconds *prometheus.HistogramVec // class, result
	waitSkipped *prometheus.CounterVec   // reason

	durLease, durRedis, durOther prometheus.Observer

	mu    sync.Mutex
	rules map[string]*ruleMetrics
}

type ruleMetrics struct{ allowed, refused prometheus.Counter }

// counters are plain atomics that the hot path adds to once each, read
// by Stats and, at scrape time, by countersCollector.
type counters struct {
	// leaseHits are allowed admissions decided from leases; allowed the
	// other allowed ones.
	leaseHits, allowed, refused, unavailable atomic.Int64
	roundTrips, failOpen                     atomic.Int64
}

var (
	requestsDesc = prometheus.NewDesc("sluice_admission_requests_total",
		"Admission decisions by result: allowed, refused (a rule said no), unavailable (Redis unreachable and the tenant fails closed).",
		[]string{"result"}, nil)
	roundTripsDesc = prometheus.NewDesc("sluice_admission_redis_roundtrips_total",
		"Redis round trips (a pipeline counts once): admissions, renewals, settlements, lease returns, reconciliation, probes.", nil, nil)
)

type countersCollector struct{ c *counters }

func (cc countersCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- requestsDesc
	ch <- roundTripsDesc
}

func (cc countersCollector) Collect(ch chan<- prometheus.Metric) {
	c := cc.c
	ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(c.allowed.Load()+c.leaseHits.Load()), "allowed")
	ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(c.refused.Load()), "refused")
	ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(c.unavailable.Load()), "unavailable")
	ch <- prometheus.MustNewConstMetric(roundTripsDesc, prometheus.CounterValue, float64(c.roundTrips.Load()))
}

// newMetrics builds a Limiter's collectors and registers them on reg when
// it is not nil.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		byRule: counterVec("sluice_admission_rule_decisions_total",
			"Per rule: requests it admitted (allowed) and requests it refused (refused).",
			"rule", "result"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_admission_duration_seconds",
			Help:    "Time Admit took, by path: lease (memory only), redis (one round trip), other (cached refusal, fail mode, no rule).",
			Buckets: []float64{1e-7, 2.5e-7, 1e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2},
		}, []string{"path"}),
		leases: counterVec("sluice_admission_leases_total",
			"Local leases taken from Redis and returned to it (their unused rest).",
			"event"),
		leaseUnits: counterVec("sluice_admission_lease_units_total",
			"Units (requests or tokens) taken as leases and returned unused.",
			"event"),
		failMode: counterVec("sluice_admission_fail_mode_decisions_total",
			"Decisions made while Redis was unreachable, by the tenant's fail mode and the result.",
			"mode", "result"),
		redisErrors: counter("sluice_admission_redis_errors_total",
			"Redis calls that failed or exceeded the wait bound."),
		settles: counterVec("sluice_admission_settlements_total",
			"Ticket settlements: applied and duplicate (a retry Redis had already applied) per slot group, deferred (Redis unreachable; applied when it is back), failed (neither applied nor queued: the backlog was full; lost unless the ticket is settled again).",
			"result"),
		reconciled: counter("sluice_admission_reconciled_units_total",
			"Units debited locally while Redis was unreachable and sent to Redis once it was back."),
		dropped: counter("sluice_admission_reconcile_dropped_total",
			"Corrections dropped because the pending queue was full (WithMaxPending)."),
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_admission_waiters",
			Help: "Requests Acquire holds now, waiting for a rule that refused them to admit them (at most WithMaxWaiters).",
		}),
		waitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_admission_wait_seconds",
			Help:    "How long requests waited in Acquire for a rule to admit them, by priority class and result (admitted, refused: their deadline came first).",
			Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"class", "result"}),
		waitSkipped: counterVec("sluice_admission_wait_skipped_total",
			"Requests a rule let wait that were refused at once: full (WithMaxWaiters were waiting), deadline (their deadline came before the rule's retry-after).",
			"reason"),
		rules: map[string]*ruleMetrics{},
	}
	m.durLease = m.duration.WithLabelValues("lease")
	m.durRedis = m.duration.WithLabelValues("redis")
	m.durOther = m.duration.WithLabelValues("other")
	if reg != nil {
		for _, c := range []prometheus.Collector{countersCollector{&m.c}, m.byRule, m.duration, m.leases, m.leaseUnits, m.failMode,
			m.redisErrors, m.settles, m.reconciled, m.dropped, m.waiters, m.waitSeconds, m.waitSkipped} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("admission: register metrics: %w (Limiters sharing a registry need each a label value of its own: register through prometheus.WrapRegistererWith)", err)
			}
		}
	}
	return m, nil
}

// counterVec is a counter of name with help, by labels.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// counter is a counter of name with help.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func (m *metrics) rule(name string) *ruleMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.rules[name]; ok {
		return r
	}
	r := &ruleMetrics{allowed: m.byRule.WithLabelValues(name, "allowed"), refused: m.byRule.WithLabelValues(name, "refused")}
	m.rules[name] = r
	return r
}

// RegisterMetrics registers a Limiter's collectors on reg as New does,
// reading zero: for what lists the series a Sluice process exports, such
// as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg)
	return err
}
