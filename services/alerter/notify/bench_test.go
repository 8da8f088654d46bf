package notify

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

// BenchmarkDeliver measures queueing plus a worker's hand-off to a sender
// that does nothing: the dispatcher's own overhead per message.
func BenchmarkDeliver(b *testing.B) {
	d, _ := newDispatcher(&testing.T{})
	var n atomic.Int64
	cfg := fastConfig()
	cfg.RatePerMinute, cfg.Burst = 1e12, 1_000_000
	cfg.QueueSize = 1_000_000
	_ = d.Set("x", senderFunc(func(context.Context, alert.Message) error { n.Add(1); return nil }), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx, time.Minute); close(done) }()
	m := msg("a")
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		d.Deliver("x", m)
	}
	cancel()
	<-done
	b.ReportMetric(float64(n.Load())/b.Elapsed().Seconds(), "msgs/s")
}
