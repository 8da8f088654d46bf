package redisconn

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Up is the collector of sluice_redis_up for one component's Redis
// client. The ping runs at scrape time, not on the request path: a scrape
// every 15 s costs one round trip, and a Redis that stops answering shows
// at the next scrape rather than after the first request fails.
type Up struct {
	desc *prometheus.Desc
	ping func(context.Context) error
}

// NewUp returns the collector of client's Redis, checked by ping (Ready of
// the component's client). With a nil ping it exports nothing: a
// component running without Redis has no health to report, and a 0 would
// page someone.
func NewUp(client string, ping func(context.Context) error) *Up {
	// The client is a constant label, so that the components of one
	// process (the demo runs them all) register a collector each on the
	// same registry: one series per component, never per key or tenant.
	d := prometheus.NewDesc("sluice_redis_up",
		"1 when the component's Redis answered a readiness check (a ping, every master of a cluster) at this scrape within 1 s, else 0.",
		nil, prometheus.Labels{"client": client})
	return &Up{desc: d, ping: ping}
}

// Describe implements prometheus.Collector.
func (u *Up) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

// Collect implements prometheus.Collector.
func (u *Up) Collect(ch chan<- prometheus.Metric) {
	if u.ping == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v := 1.0
	if u.ping(ctx) != nil {
		v = 0
	}
	ch <- prometheus.MustNewConstMetric(u.desc, prometheus.GaugeValue, v)
}
