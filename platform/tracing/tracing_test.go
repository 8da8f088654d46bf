package tracing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/tracing"

	"github.com/sluicehq/sluice/platform/tracing/tracingtest"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// TestValidateNamesFieldAndLimit: every bad setting is refused at start
// with its name and limit; the endpoint only matters once tracing is on.
func TestValidateNamesFieldAndLimit(t *testing.T) {
	if err := tracing.Defaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	off := tracing.Defaults()
	off.Endpoint = "not a url"
	if err := off.Validate(); err != nil {
		t.Errorf("an endpoint is checked while tracing is off: %v", err)
	}
	for _, tc := range []struct {
		set  func(*tracing.Config)
		want string
	}{
		{func(c *tracing.Config) { c.Enabled, c.Endpoint = true, "collector:4318" }, "tracing.endpoint"},
		{func(c *tracing.Config) { c.Enabled, c.Endpoint = true, "grpc://collector:4317" }, "tracing.endpoint"},
		{func(c *tracing.Config) { c.SampleRatio = 1.5 }, "tracing.sample_ratio: 1.5 is outside 0..1"},
		{func(c *tracing.Config) { c.SampleRatio = -0.1 }, "tracing.sample_ratio"},
		{func(c *tracing.Config) { c.ServiceName = "" }, "tracing.service_name"},
		{func(c *tracing.Config) { c.QueueSize = 0 }, "tracing.queue_size: 0 is outside 1..1048576"},
		{func(c *tracing.Config) { c.Interval = 0 }, "tracing.interval"},
		{func(c *tracing.Config) { c.Timeout = 2 * time.Minute }, "tracing.timeout"},
	} {
		c := tracing.Defaults()
		tc.set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
	}
}

// TestOffIsNoop: off (the default), the provider is OpenTelemetry's no-op
// one, which the services recognise and skip; on, spans reach the
// collector with the configured service name, and a ratio of 0 records
// no new trace but follows a sampled parent.
func TestOffIsNoop(t *testing.T) {
	p, err := tracing.New(tracing.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	if traceprop.On(p.TracerProvider) {
		t.Error("tracing off gave a recording provider")
	}
	rcv := tracingtest.NewReceiver(t)
	c := tracing.Defaults()
	c.Enabled, c.Endpoint, c.ServiceName, c.SampleRatio = true, rcv.URL, "svc-x", 0
	p, err = tracing.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if !traceprop.On(p.TracerProvider) {
		t.Fatal("tracing on gave the no-op provider")
	}
	tr := p.Tracer("test")
	_, root := tr.Start(context.Background(), "unsampled-root")
	root.End()
	parent := traceprop.FromHTTP(context.Background(), map[string][]string{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}})
	_, child := tr.Start(parent, "child-of-sampled")
	child.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := rcv.Spans()
	if len(spans) != 1 || spans[0].Name != "child-of-sampled" || spans[0].Service != "svc-x" || spans[0].ParentID != "00f067aa0ba902b7" {
		t.Errorf("exported %+v, want only the sampled parent's child, of service svc-x", spans)
	}
}
