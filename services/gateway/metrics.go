package gateway

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/metricset"
)

// metrics are the gateway's Prometheus series. Tenants are not labels (a
// deployment may have many thousands): requests are labelled by the key's
// class, and models by their route (the configured name or pattern), so
// that no caller can create series by inventing model names.
type metrics struct {
	requests   *prometheus.CounterVec
	upstream   *prometheus.HistogramVec
	ttfb       *prometheus.HistogramVec
	tokens     *prometheus.CounterVec
	usage      *prometheus.CounterVec
	failovers  *prometheus.CounterVec
	inflight   prometheus.Gauge
	keyReloads *prometheus.CounterVec
	// The upstream guards and fallbacks.
	guardRefusals *prometheus.CounterVec
	fallbacks     *prometheus.CounterVec
	shortened     *prometheus.CounterVec
	softOver      prometheus.Counter
	// view is the flag view the staleness gauges read (the Checker); nil
	// reads as fresh (a Decider without a view, or none).
	view flagView
	// guards are the upstreams' Guards whose queues and levels are read
	// at scrape time (nil: none).
	guards *Guards
	redis  *redisconn.Up
	all    metricset.Set
}

// flagView is what the gateway's flag-staleness gauges read from its
// Checker (sdk/go/checker.Checker implements it).
type flagView interface {
	Age() time.Duration
	Stale() bool
}

// newMetrics returns the gateway's series; redisPing (nil: none) checks
// its Redis for sluice_redis_up.
func newMetrics(redisPing func(context.Context) error) *metrics {
	latency := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_requests_total",
			Help: "Requests answered, by the key's tenant class, model route, endpoint and HTTP status (499: the client went away first).",
		}, []string{"class", "model", "endpoint", "status"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_gateway_upstream_seconds",
			Help:    "Time from sending a request to an upstream to its answer's headers, by upstream and result (ok, error, timeout, status_4xx, status_5xx, status_429).",
			Buckets: latency,
		}, []string{"upstream", "result"}),
		ttfb: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_gateway_time_to_first_byte_seconds",
			Help:    "Time from a request's arrival to the first byte of its answer's body sent to the client (the first token of a stream), by endpoint and stream.",
			Buckets: latency,
		}, []string{"endpoint", "stream"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_tokens_total",
			Help: "Tokens settled, by tenant class, model route and kind (prompt, completion, cached, cache_write, reasoning; cached and cache_write are parts of prompt, reasoning of completion).",
		}, []string{"class", "model", "kind"}),
		usage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_usage_source_total",
			Help: "Calls settled, by where their tokens came from: reported (the provider's usage), counted (the gateway counted the text, the provider reported none), none (no call was billed).",
		}, []string{"source"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_failovers_total",
			Help: "Attempts that failed on an upstream and moved on to the next, by the upstream that failed.",
		}, []string{"upstream"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_gateway_inflight_requests",
			Help: "Requests being served, streams included.",
		}),
		keyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_key_reloads_total", Help: "Reloads of the tenant keys file, by result (ok, error).",
		}, []string{"result"}),
		guardRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_upstream_refusals_total",
			Help: "Attempts an upstream's guard refused before the call, by upstream and reason (queue_full, shed, deadline, expired, tenant_concurrency, degraded, breaker_open, class_share).",
		}, []string{"upstream", "reason"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_fallbacks_total",
			Help: "Calls served by a cheaper fallback model than the one asked for, by the asked model's route and the model that served.",
		}, []string{"model", "served"}),
		shortened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_gateway_shortened_total",
			Help: "Calls a degradation level served with their output capped (degradation action shorten), by upstream.",
		}, []string{"upstream"}),
		softOver: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_gateway_soft_limit_fallbacks_total",
			Help: "Requests of tenants past a soft quota (a period quota or budget through the enforcer's soft flag, a per-minute one checked here), sent to the fallback model first.",
		}),
	}
	for _, s := range []string{"reported", "counted", "none"} {
		m.usage.WithLabelValues(s)
	}
	flagsAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_gateway_flags_age_seconds",
		Help: "Seconds since the flag view last showed a live enforcer (heartbeat, flag change or resync); past the checker's max_staleness each tenant's fail mode applies.",
	}, func() float64 {
		if m.view == nil {
			return 0
		}
		return m.view.Age().Seconds()
	})
	flagsStale := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_gateway_flags_stale",
		Help: "1 while the flag view is older than the checker's max_staleness (tenants get their fail mode), else 0.",
	}, func() float64 {
		if m.view != nil && m.view.Stale() {
			return 1
		}
		return 0
	})
	m.redis = redisconn.NewUp("gateway", redisPing)
	m.all = metricset.Set{m.requests, m.upstream, m.ttfb, m.tokens, m.usage, m.failovers, m.inflight, m.keyReloads, m.guardRefusals, m.fallbacks, m.shortened, m.softOver, flagsAge, flagsStale,
		guardCollector{m}, m.redis}
	return m
}

// The upstream guards' state, one series per guarded upstream (the
// policy's upstreams: a bounded set the operator names).
var (
	queueDesc = prometheus.NewDesc("sluice_gateway_upstream_queue_length",
		"Requests waiting in an upstream's priority queue in this gateway, by upstream and priority class.", []string{"upstream", "class"}, nil)
	levelDesc = prometheus.NewDesc("sluice_gateway_degradation_level",
		"An upstream's degradation level in this gateway (0: every class admitted; 1: high and critical only; 2: critical only; 3: nothing), by upstream.", []string{"upstream"}, nil)
	loadDesc = prometheus.NewDesc("sluice_gateway_upstream_load",
		"The load an upstream's degradation level follows (0-1: its calls in flight and waiting against its room, or the process's CPU or memory when resource degradation is on and higher), by upstream.", []string{"upstream"}, nil)
)

// guardCollector reads the Guards' Stats at scrape time: nothing is
// counted on the request path for it.
type guardCollector struct{ m *metrics }

func (c guardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDesc
	ch <- levelDesc
	ch <- loadDesc
}

func (c guardCollector) Collect(ch chan<- prometheus.Metric) {
	gs := c.m.guards
	for _, name := range gs.Names() {
		g := gs.Of(name)
		if g == nil {
			continue // dropped by a reload since Names
		}
		st := g.Stats()
		for i, class := range schemas.Priorities {
			ch <- prometheus.MustNewConstMetric(queueDesc, prometheus.GaugeValue, float64(st.Queue.Waiting[i]), name, string(class))
		}
		ch <- prometheus.MustNewConstMetric(levelDesc, prometheus.GaugeValue, float64(st.Level), name)
		ch <- prometheus.MustNewConstMetric(loadDesc, prometheus.GaugeValue, st.Load, name)
	}
}

func (m *metrics) register(r prometheus.Registerer) error { return m.all.Register(r) }

func (m *metrics) unregister(r prometheus.Registerer) { m.all.Unregister(r) }

// RegisterMetrics registers the gateway's collectors on reg as New does,
// with no flag view (they read zero): for what lists the series a Sluice
// process exports, such as the check of deploy/'s dashboards and rules.
func RegisterMetrics(reg prometheus.Registerer) error { return newMetrics(nil).register(reg) }
