package emitter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/sdk/go/metricset"
)

type metrics struct {
	emitted     prometheus.Counter
	delivered   prometheus.Counter
	dropped     *prometheus.CounterVec
	retries     prometheus.Counter
	splits      prometheus.Counter
	sendSeconds prometheus.Histogram
	buffered    prometheus.GaugeFunc
	setBuffered func() float64
	all         metricset.Set
}

func newMetrics() *metrics {
	m := &metrics{
		emitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_emitter_emitted_events_total", Help: "Usage events accepted into the emitter's buffer.",
		}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_emitter_delivered_events_total", Help: "Usage events Sluice acknowledged.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_emitter_dropped_events_total",
			Help: "Usage events lost, by reason: buffer_full (dropped newest), invalid, rejected (by Sluice), refused (whole batch), too_large (a single event refused for its size), closed (undelivered at Close).",
		}, []string{"reason"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_emitter_retries_total", Help: "Batch send attempts that failed and were retried.",
		}),
		splits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_emitter_batch_splits_total", Help: "Batches Sluice refused as too large (413) that were split in halves and sent again.",
		}),
		sendSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_emitter_send_seconds", Help: "Duration of one batch send attempt.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
	}
	// Pre-create the reasons so dashboards show zeros rather than gaps.
	for _, r := range []string{"buffer_full", "invalid", "rejected", "refused", "too_large", "closed"} {
		m.dropped.WithLabelValues(r)
	}
	m.buffered = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_emitter_buffered_events", Help: "Usage events held: waiting plus the batch being sent.",
	}, func() float64 {
		if m.setBuffered == nil {
			return 0
		}
		return m.setBuffered()
	})
	m.all = metricset.Set{m.emitted, m.delivered, m.dropped, m.retries, m.splits, m.sendSeconds, m.buffered}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error { return m.all.Register(r) }

func (m *metrics) unregister(r prometheus.Registerer) { m.all.Unregister(r) }

// RegisterMetrics registers an Emitter's collectors on reg as New does
// with Config.Registerer, reading zero: for what lists the series a Sluice
// process exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	m := newMetrics()
	return m.register(reg)
}
