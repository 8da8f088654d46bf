package deferred

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/sdk/go/metricset"
)

// Metrics are the deferred queue's series, shared by a gateway's Queue
// and Worker; register them once with Register.
type Metrics struct {
	// Tasks counts task events by class and event: accepted, refused_full,
	// succeeded, failed, expired, retried (a run answered 429/503).
	Tasks *prometheus.CounterVec
	// Buffered is the tasks of each class a Worker holds waiting.
	Buffered *prometheus.GaugeVec
	// Running is the tasks a Worker runs now.
	Running prometheus.Gauge
	all     metricset.Set
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		Tasks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gateway_deferred_tasks_total",
			Help: "deferred tasks by class and event: accepted, refused_full, succeeded, failed, expired, retried"}, []string{"class", "event"}),
		Buffered: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_gateway_deferred_buffered",
			Help: "deferred tasks of each class this gateway holds waiting for a worker"}, []string{"class"}),
		Running: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_gateway_deferred_running",
			Help: "deferred tasks this gateway runs now"}),
	}
	m.all = metricset.Set{m.Tasks, m.Buffered, m.Running}
	return m
}

// Register registers every series on r, or none.
func (m *Metrics) Register(r prometheus.Registerer) error { return m.all.Register(r) }

// Unregister takes them off r.
func (m *Metrics) Unregister(r prometheus.Registerer) { m.all.Unregister(r) }

func (m *Metrics) count(class int, event string) {
	if m != nil {
		m.Tasks.WithLabelValues(string(Classes[class]), event).Inc()
	}
}
