package admission

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the Limiter's Prometheus series. Rule labels carry the rule
// name only (never a user, key or tenant value), so their number is the
// number of rules in the policy.
type metrics struct {
	requests    *prometheus.CounterVec // result
	byRule      *prometheus.CounterVec // rule, result
	duration    *prometheus.HistogramVec
	leases      *prometheus.CounterVec // event: taken, returned
	leaseUnits  *prometheus.CounterVec // event
	failMode    *prometheus.CounterVec // mode, result
	roundTrips  prometheus.Counter
	redisErrors prometheus.Counter
	settles     *prometheus.CounterVec // result
	reconciled  prometheus.Counter
	dropped     prometheus.Counter

	allowed, refused, unavailable prometheus.Counter
	durLease, durRedis, durOther  prometheus.Observer

	mu    sync.Mutex
	rules map[string]*ruleMetrics
}

type ruleMetrics struct{ allowed, refused prometheus.Counter }

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_requests_total",
			Help: "Admission decisions by result: allowed, refused (a rule said no), unavailable (Redis unreachable and the tenant fails closed).",
		}, []string{"result"}),
		byRule: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_rule_decisions_total",
			Help: "Per rule: requests it admitted (allowed) and requests it refused (refused).",
		}, []string{"rule", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_admission_duration_seconds",
			Help:    "Time Admit took, by path: lease (memory only), redis (one round trip), other (cached refusal, fail mode, no rule).",
			Buckets: []float64{1e-7, 2.5e-7, 1e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2},
		}, []string{"path"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_leases_total",
			Help: "Local leases taken from Redis and returned to it (their unused rest).",
		}, []string{"event"}),
		leaseUnits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_lease_units_total",
			Help: "Units (requests or tokens) taken as leases and returned unused.",
		}, []string{"event"}),
		failMode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_fail_mode_decisions_total",
			Help: "Decisions made while Redis was unreachable, by the tenant's fail mode and the result.",
		}, []string{"mode", "result"}),
		roundTrips: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_redis_roundtrips_total",
			Help: "Redis round trips (a pipeline counts once): admissions, settlements, lease returns, reconciliation, probes.",
		}),
		redisErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_redis_errors_total",
			Help: "Redis calls that failed or exceeded the wait bound.",
		}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_admission_settlements_total",
			Help: "Ticket settlements: applied, duplicate (a retry Redis had already applied), deferred (Redis unreachable; applied when it is back).",
		}, []string{"result"}),
		reconciled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_reconciled_units_total",
			Help: "Units debited locally while Redis was unreachable and sent to Redis once it was back.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_admission_reconcile_dropped_total",
			Help: "Corrections dropped because the pending queue was full (WithMaxPending).",
		}),
		rules: map[string]*ruleMetrics{},
	}
	m.allowed = m.requests.WithLabelValues("allowed")
	m.refused = m.requests.WithLabelValues("refused")
	m.unavailable = m.requests.WithLabelValues("unavailable")
	m.durLease = m.duration.WithLabelValues("lease")
	m.durRedis = m.duration.WithLabelValues("redis")
	m.durOther = m.duration.WithLabelValues("other")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.byRule, m.duration, m.leases, m.leaseUnits, m.failMode,
			m.roundTrips, m.redisErrors, m.settles, m.reconciled, m.dropped} {
			reg.MustRegister(c)
		}
	}
	return m
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
