package ingest

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// metrics are the ingest service's Prometheus collectors.
type metrics struct {
	requests       *prometheus.CounterVec // by HTTP status code
	events         *prometheus.CounterVec // by result: accepted, duplicate, rejected
	rejected       *prometheus.CounterVec // by reason
	unavailable    *prometheus.CounterVec // 503 answers by cause
	batchSize      prometheus.Histogram   // events per request
	produceLatency prometheus.Histogram   // seconds from first produce to last ack of a request
	produceErrors  prometheus.Counter     // records the producer failed
	produceReqs    prometheus.Counter     // produce requests written to brokers
	dedupHits      prometheus.Counter     // events acknowledged without producing
	keyReloads     *prometheus.CounterVec // by result: ok, error
	inflight       prometheus.GaugeFunc   // events produced and not yet acknowledged
	decodeMemory   prometheus.GaugeFunc   // bytes reserved by bodies being read and decoded
	hotServed      prometheus.CounterFunc // requests answered by the hot route
	hotHandedOff   prometheus.CounterFunc // connections handed to net/http
	collectors     []prometheus.Collector

	// Children resolved once: the one-event request path would otherwise
	// hash their label values on every request.
	accepted, duplicates prometheus.Counter // events{result}
	accepted202          prometheus.Counter // requests{code="202"}
}

// newMetrics reads the in-flight events, the decode memory and the hot
// route's counts through the given functions.
func newMetrics(inflight, decodeMemory, hotServed, hotHandedOff func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_requests_total", Help: "POST /v1/events requests by HTTP status code.",
		}, []string{"code"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_events_total", Help: "Events received, by result: accepted (produced and acknowledged), duplicate (acknowledged without producing), rejected.",
		}, []string{"result"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_rejected_events_total", Help: "Rejected events by reason: malformed, invalid, time_window, tenant_forbidden.",
		}, []string{"reason"}),
		unavailable: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_unavailable_total", Help: "503 answers by cause: budget, decode_memory, produce_timeout, produce_error, in_flight_duplicate, shutting_down, canceled (the request ended before the broker answered).",
		}, []string{"cause"}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_ingest_batch_events", Help: "Events per request.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		produceLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_ingest_produce_seconds", Help: "Time from producing a request's events to the broker acknowledging the last of them.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}),
		produceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_ingest_produce_errors_total", Help: "Records the producer failed to deliver (the request got 503).",
		}),
		produceReqs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_ingest_produce_requests_total", Help: "Produce requests written to the brokers; sluice_ingest_events_total{result=\"accepted\"} over it is how many events one produce request carries (the broker's work grows with the requests, not the events).",
		}),
		dedupHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_ingest_dedup_hits_total", Help: "Events acknowledged without producing because their id was already acknowledged.",
		}),
		keyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ingest_keys_reloads_total", Help: "Keys file reloads by result: ok, error (previous keys kept).",
		}, []string{"result"}),
		inflight: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_ingest_inflight_events", Help: "Events produced and not yet acknowledged by the broker.",
		}, inflight),
		decodeMemory: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_ingest_decode_memory_bytes", Help: "Memory reserved by request bodies being read and decoded (three times their decoded size), against services.ingest.decode_memory_bytes; over it requests get 503 (sluice_ingest_unavailable_total{cause=\"decode_memory\"}).",
		}, decodeMemory),
		hotServed: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_ingest_hot_route_requests_total", Help: "POST /v1/events requests read and answered by Sluice's own HTTP/1.1 connection loop (services.ingest.hot_route_max_body_bytes); the rest of sluice_ingest_requests_total went through net/http.",
		}, hotServed),
		hotHandedOff: prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_ingest_hot_route_handoffs_total", Help: "Connections handed to net/http at a request that was not the hot route's plain form (another path, chunked, larger body, Expect, Connection header, ...); their later requests all go through net/http.",
		}, hotHandedOff),
	}
	m.accepted = m.events.WithLabelValues("accepted")
	m.duplicates = m.events.WithLabelValues("duplicate")
	m.accepted202 = m.requests.WithLabelValues("202")
	m.collectors = []prometheus.Collector{m.requests, m.events, m.rejected, m.unavailable, m.batchSize,
		m.produceLatency, m.produceErrors, m.produceReqs, m.dedupHits, m.keyReloads, m.inflight, m.decodeMemory, m.hotServed, m.hotHandedOff}
	return m
}

// OnBrokerWrite counts produce requests (kgo.HookBrokerWrite).
func (m *metrics) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Produce) && err == nil {
		m.produceReqs.Inc()
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range m.collectors {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) unregister(r prometheus.Registerer) {
	for _, c := range m.collectors {
		r.Unregister(c)
	}
}

// RegisterMetrics registers ingest's collectors on reg as Run does,
// unconnected (they read zero): for what lists the series a Sluice process
// exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error {
	zero := func() float64 { return 0 }
	return newMetrics(zero, zero, zero, zero).register(reg)
}
