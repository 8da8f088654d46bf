package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
)

// TestNoBrokersIsAnErrorNotADevelopmentBroker: with kafka.brokers empty
// (the default, or a typo in SLUICE_KAFKA_BROKERS) a service that uses
// Kafka refuses to start naming the setting; the in-memory development
// broker runs only when embedded_kafka.enabled asks for it. A service
// that needs no Kafka (a gateway metering to ingest) starts without one.
func TestNoBrokersIsAnErrorNotADevelopmentBroker(t *testing.T) {
	cfg := sluiceconfig.Defaults()
	cfg.Services.Ingest.AllowAnonymous = true
	cfg.Migrate = false
	_, err := preparePipeline(context.Background(), &cfg, []string{"ingest"}, &hostOptions{}, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "kafka.brokers: empty") || !strings.Contains(err.Error(), "embedded_kafka.enabled") {
		t.Fatalf("sluice run ingest without brokers: %v, want an error naming kafka.brokers", err)
	}
}

// TestTracingOffMeansNoSpans: with tracing off (the default) the services
// are given the no-op provider itself, so they skip starting spans per
// event; with a wrapper they took the traced path at every event.
func TestTracingOffMeansNoSpans(t *testing.T) {
	cfg := sluiceconfig.Defaults()
	cfg.Services.Ingest.AllowAnonymous = true
	cfg.Migrate = false
	cfg.Kafka.Brokers = []string{"127.0.0.1:1"} // not dialled: nothing starts
	p, err := preparePipeline(context.Background(), &cfg, []string{"ingest"}, &hostOptions{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if traceprop.On(p.env.Tracing) {
		t.Fatalf("tracing.enabled is false, but the services' provider %T counts as on", p.env.Tracing)
	}
}
