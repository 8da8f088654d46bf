// Package tracing builds the process's OpenTelemetry tracer provider from
// configuration (the root tracing section): off by default, when on it
// samples parent-based at a ratio and exports over OTLP/HTTP in batches.
// Every service gets the provider through platform.Env.Tracing; what the
// spans say and how their context crosses Kafka is docs/tracing.md and
// sdk/go/traceprop.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config is the tracing section of the Sluice configuration.
type Config struct {
	Enabled     bool          `yaml:"enabled" help:"export OpenTelemetry traces of the gateway's calls and of the usage events, signals and flags they cause (docs/tracing.md); off, tracing costs nothing"`
	Endpoint    string        `yaml:"endpoint" help:"OTLP/HTTP traces URL of the collector (http:// or https://, with its path, usually /v1/traces)"`
	SampleRatio float64       `yaml:"sample_ratio" help:"share of new traces recorded, 0 to 1; a span whose parent came with the request or the record follows the parent's decision"`
	ServiceName string        `yaml:"service_name" help:"service.name of the process's spans (each service's spans also carry the tracer named after the service)"`
	Interval    time.Duration `yaml:"interval" help:"how long finished spans wait to be exported together"`
	QueueSize   int           `yaml:"queue_size" help:"finished spans held for export; when full, new spans are dropped (never the request waits)"`
	Timeout     time.Duration `yaml:"timeout" help:"how long one export to the collector may take"`
}

// Defaults returns tracing off, aimed at a local collector's OTLP/HTTP
// port, recording every trace once turned on.
func Defaults() Config {
	return Config{Endpoint: "http://127.0.0.1:4318/v1/traces", SampleRatio: 1, ServiceName: "sluice",
		Interval: 5 * time.Second, QueueSize: 2048, Timeout: 10 * time.Second}
}

// Limits of the settings.
const (
	maxQueue    = 1 << 20
	maxInterval = time.Minute
)

// Validate checks every field, naming it and its limit. An endpoint is
// checked only when tracing is on.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("tracing."+format, args...)) }
	if c.Enabled {
		u, err := url.Parse(c.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("endpoint: %q is not an http:// or https:// URL with a host", c.Endpoint)
		}
	}
	if !(c.SampleRatio >= 0 && c.SampleRatio <= 1) {
		bad("sample_ratio: %v is outside 0..1", c.SampleRatio)
	}
	if c.ServiceName == "" || len(c.ServiceName) > 255 {
		bad("service_name: must be 1..255 bytes")
	}
	if c.Interval <= 0 || c.Interval > maxInterval {
		bad("interval: %v is outside (0, %v]", c.Interval, maxInterval)
	}
	if c.QueueSize < 1 || c.QueueSize > maxQueue {
		bad("queue_size: %d is outside 1..%d", c.QueueSize, maxQueue)
	}
	if c.Timeout <= 0 || c.Timeout > maxInterval {
		bad("timeout: %v is outside (0, %v]", c.Timeout, maxInterval)
	}
	return errors.Join(errs...)
}

// Provider is the process's tracer provider and how to stop it.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider // nil when off
}

// New returns the provider c asks for: a no-op one when tracing is off
// (no span is recorded, no context is carried), else one exporting over
// OTLP/HTTP. c must have passed Validate.
func New(c Config) (*Provider, error) {
	if !c.Enabled {
		return &Provider{TracerProvider: noop.NewTracerProvider()}, nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing.endpoint: %w", err)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u.String()), otlptracehttp.WithTimeout(c.Timeout)}
	exp, err := otlptracehttp.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", c.ServiceName))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(c.Interval), sdktrace.WithMaxQueueSize(c.QueueSize),
			sdktrace.WithExportTimeout(c.Timeout)),
	)
	return &Provider{TracerProvider: tp, sdk: tp}, nil
}

// Shutdown exports the spans still held and stops the exporter, within
// ctx. Harmless when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}
