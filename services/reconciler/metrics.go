package reconciler

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

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

// RegisterMetrics registers the reconciler's collectors on reg as Run
// does, unconnected (they read zero): for what lists the series a Sluice
// process exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg)
	return err
}
