package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

type discard struct{}

func (discard) Deliver(string, alert.Message) {}

// BenchmarkObserve measures applying tier signals spread over 10,000
// tenants, the alerter's per-record cost.
func BenchmarkObserve(b *testing.B) {
	e, err := New(DefaultConfig(), func(string) Route { return Route{Channels: []string{AlertmanagerChannel, "slack:x"}} }, discard{})
	if err != nil {
		b.Fatal(err)
	}
	sigs := make([]*schemas.Signal, 10000)
	for i := range sigs {
		sigs[i] = tier(fmt.Sprintf("tenant-%05d", i), 70, 90, t0)
		sigs[i].ID = "" // measure the state machine, not the dedup set's eviction
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		e.Observe(sigs[i%len(sigs)], t0)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "signals/s")
}

// BenchmarkTick10kFiring measures one Tick over 10,000 firing alerts, the
// alerter's steady-state cost per second during a fleet-wide incident.
func BenchmarkTick10kFiring(b *testing.B) {
	cfg := DefaultConfig()
	cfg.ResendInterval = 24 * time.Hour
	e, err := New(cfg, func(string) Route { return Route{Channels: []string{AlertmanagerChannel, "slack:x"}} }, discard{})
	if err != nil {
		b.Fatal(err)
	}
	e.lastResend = t0
	for i := 0; i < 10000; i++ {
		e.Observe(tier(fmt.Sprintf("tenant-%05d", i), 70, 90, t0), t0)
	}
	e.Tick(t0.Add(2 * time.Minute))
	now := t0.Add(3 * time.Minute)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		now = now.Add(time.Second)
		e.Tick(now)
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/tick")
}
