// Package platform is the runtime every Sluice service shares, so that none of
// them copies it: configuration from flags, environment and YAML (config),
// structured logging (logging), Kafka, ClickHouse and Redis client
// construction (kafkaconn, chconn, redisconn) with one TLS and password
// setting shared by all three (tlsconfig), Prometheus metrics with
// /healthz and /readyz (ops), OpenTelemetry tracing (tracing), graceful shutdown of a group of services
// (lifecycle), and access to the real backing services from integration
// tests (itest).
//
// Env bundles what a service's Run function receives from the process that
// hosts it, so one `sluice` binary can run any or all services in one process
// and share one metrics registry, one health endpoint and one logger.
package platform

import (
	"cmp"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
)

// Env is what the hosting process hands each service's Run function.
type Env struct {
	// Logger is the process logger; services add their own "service" attribute.
	Logger *slog.Logger
	// Metrics registers the service's collectors on the process registry.
	Metrics prometheus.Registerer
	// Health receives the service's readiness checks.
	Health *ops.Health
	// Tracing is the process's tracer provider (the root tracing
	// section, platform/tracing): OpenTelemetry's no-op one when tracing
	// is off, which services detect (sdk/go/traceprop.On) to skip
	// tracing altogether.
	Tracing trace.TracerProvider
	// Kafka, ClickHouse and Redis say where the shared backing services are.
	Kafka      kafkaconn.Config
	ClickHouse chconn.Config
	Redis      redisconn.Config
	// Topics names the Kafka topics the services share (the root topics
	// section); a service reads its topics here, not from its own section.
	Topics Topics
	// Policy is the quota policy file every service follows (the root
	// policy section): tenants, quotas, limits, upstreams, channels.
	Policy FileSource
	// TenantKeys is the file of tenant API keys the request-path services
	// (sluice gateway, authz) authenticate callers with (the root
	// tenant_keys section).
	TenantKeys FileSource
	// SignalAuth is how the records of the signals, admin and alerter
	// state topics are signed and verified (the root-level signal_auth
	// setting): their producers sign with it, their consumers refuse what
	// it does not verify.
	SignalAuth signalauth.Config

	// service is the name Named tagged the logger with, so that a service
	// calling Named on an env its host already named does not tag twice.
	service string
}

// Named returns a copy of env whose logger is tagged with the service name,
// so one process running several services keeps their logs apart, and whose
// nil fields are filled so a service can run standalone. Naming twice with
// the same name tags once.
func (env Env) Named(service string) Env {
	env.Logger = cmp.Or(env.Logger, slog.Default())
	if env.service != service {
		env.Logger = env.Logger.With("service", service)
		env.service = service
	}
	if env.Metrics == nil {
		env.Metrics = prometheus.NewRegistry()
	}
	if env.Health == nil {
		env.Health = ops.NewHealth()
	}
	if env.Tracing == nil {
		env.Tracing = noop.NewTracerProvider()
	}
	return env
}
