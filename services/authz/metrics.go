package authz

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/sdk/go/metricset"
)

// metrics are the service's Prometheus series. Tenants are not labels (a
// deployment may have many thousands); the flags' and admission's own
// series (sluice_admission_*) say which limit refused.
type metrics struct {
	checks     *prometheus.CounterVec
	allowed    [2]prometheus.Counter  // checks{transport, 200, allowed}, looked up once: http, grpc
	duration   [2]prometheus.Observer // check_seconds{transport}: http, grpc
	keyReloads *prometheus.CounterVec
	all        metricset.Set
}

func newMetrics() *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_authz_checks_total",
			Help: "Forward-auth checks answered, by transport (http: the HTTP endpoint; grpc: Envoy's ext_authz gRPC service), by HTTP status and by what decided: allowed, flags, admission, key (unknown key, no tenant, model or priority not allowed), request (a header out of bounds).",
		}, []string{"transport", "status", "by"}),
		keyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_authz_key_reloads_total", Help: "Reloads of the tenant keys file, by result (ok, error).",
		}, []string{"result"}),
	}
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sluice_authz_check_seconds",
		Help:    "Time from reading a check's headers to its decision, by transport (admission's Redis round trip included, the network to the proxy not).",
		Buckets: []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2},
	}, []string{"transport"})
	for i, t := range []string{transportHTTP, transportGRPC} {
		m.allowed[i] = m.checks.WithLabelValues(t, "200", byAllowed)
		m.duration[i] = duration.WithLabelValues(t)
	}
	m.all = metricset.Set{m.checks, duration, m.keyReloads}
	return m
}

func (m *metrics) observe(transport string, status int, by string, took time.Duration) {
	i := 0
	if transport == transportGRPC {
		i = 1
	}
	if by == byAllowed {
		m.allowed[i].Inc()
	} else {
		m.checks.WithLabelValues(transport, strconv.Itoa(status), by).Inc()
	}
	m.duration[i].Observe(took.Seconds())
}

// keyReloaded counts a reload of the keys file.
func (s *Server) keyReloaded(err error) {
	if err != nil {
		s.m.keyReloads.WithLabelValues("error").Inc()
	} else {
		s.m.keyReloads.WithLabelValues("ok").Inc()
	}
}
