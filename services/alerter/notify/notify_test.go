package notify

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

// senderFunc adapts a function to Sender.
type senderFunc func(ctx context.Context, m alert.Message) error

func (f senderFunc) Send(ctx context.Context, m alert.Message) error { return f(ctx, m) }

func msg(tenant string) alert.Message {
	return alert.Message{Alerts: []alert.Alert{{Key: alert.Key{Tenant: tenant}}}}
}

func fastConfig() ChannelConfig {
	c := DefaultChannelConfig()
	c.RatePerMinute, c.Burst = 600000, 1000
	c.InitialBackoff, c.MaxBackoff = time.Millisecond, 5*time.Millisecond
	c.Timeout = 5 * time.Second
	return c
}

func newDispatcher(t *testing.T) (*Dispatcher, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return NewDispatcher(slog.New(slog.NewTextHandler(io.Discard, nil)), m), m
}

func start(t *testing.T, d *Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx, 10*time.Second); close(done) }()
	return func() { cancel(); <-done }
}

func TestRetriesUntilSuccessAndGivesUpOnPermanentErrors(t *testing.T) {
	d, m := newDispatcher(t)
	var mu sync.Mutex
	calls := map[string]int{}
	flaky := senderFunc(func(_ context.Context, am alert.Message) error {
		mu.Lock()
		defer mu.Unlock()
		tenant := am.Alerts[0].Key.Tenant
		calls[tenant]++
		switch {
		case tenant == "bad":
			return Permanent(errors.New("400 invalid payload"))
		case calls[tenant] < 3:
			return errors.New("500")
		}
		return nil
	})
	if err := d.Set("x", flaky, fastConfig()); err != nil {
		t.Fatal(err)
	}
	stop := start(t, d)
	defer stop()
	d.Deliver("x", msg("ok"))
	d.Deliver("x", msg("bad"))
	itest.Eventually(t, 30*time.Second, "one sent and one failed", func() bool {
		return testutil.ToFloat64(m.Sent.WithLabelValues("x")) == 1 && testutil.ToFloat64(m.Failed.WithLabelValues("x")) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if calls["ok"] != 3 || calls["bad"] != 1 {
		t.Fatalf("calls %v: want 3 tries for the 500s and 1 for the permanent error", calls)
	}
	if got := testutil.ToFloat64(m.Retries.WithLabelValues("x")); got != 2 {
		t.Fatalf("retries %v", got)
	}
}

func TestAFailingChannelDoesNotDelayTheOthers(t *testing.T) {
	d, m := newDispatcher(t)
	release := make(chan struct{})
	stuck := senderFunc(func(ctx context.Context, _ alert.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return errors.New("down")
	})
	fine := senderFunc(func(context.Context, alert.Message) error { return nil })
	cfg := fastConfig()
	if err := d.Set("stuck", stuck, cfg); err != nil {
		t.Fatal(err)
	}
	if err := d.Set("fine", fine, cfg); err != nil {
		t.Fatal(err)
	}
	stop := start(t, d)
	defer stop()
	for i := 0; i < 20; i++ {
		d.Deliver("stuck", msg("a"))
		d.Deliver("fine", msg("a"))
	}
	// Wait for the count the dispatcher keeps, not for the sender's calls:
	// the dispatcher counts a send after the sender returns, so a test that
	// waits for the calls and then reads the count races it.
	itest.Eventually(t, 30*time.Second, "all 20 sent on the healthy channel while the other is stuck", func() bool {
		return testutil.ToFloat64(m.Sent.WithLabelValues("fine")) == 20
	})
	close(release)
}

func TestAFullQueueDropsTheOldest(t *testing.T) {
	d, m := newDispatcher(t)
	var mu sync.Mutex
	var sent []string
	gate := make(chan struct{})
	s := senderFunc(func(_ context.Context, am alert.Message) error {
		<-gate
		mu.Lock()
		sent = append(sent, am.Alerts[0].Key.Tenant)
		mu.Unlock()
		return nil
	})
	cfg := fastConfig()
	cfg.QueueSize = 3
	if err := d.Set("q", s, cfg); err != nil {
		t.Fatal(err)
	}
	// Queued before Run, so the worker cannot take one early.
	for _, tnt := range []string{"1", "2", "3", "4", "5"} {
		d.Deliver("q", msg(tnt))
	}
	close(gate)
	stop := start(t, d)
	itest.Eventually(t, 30*time.Second, "three sent", func() bool { return testutil.ToFloat64(m.Sent.WithLabelValues("q")) == 3 })
	stop()
	if strings.Join(sent, ",") != "3,4,5" || testutil.ToFloat64(m.Dropped.WithLabelValues("q")) != 2 {
		t.Fatalf("sent %v, dropped %v: want the newest three and two drops", sent, testutil.ToFloat64(m.Dropped.WithLabelValues("q")))
	}
}

func TestUnknownChannelIsCountedNotFatal(t *testing.T) {
	d, m := newDispatcher(t)
	d.Deliver("slack:typo", msg("a"))
	if testutil.ToFloat64(m.Dropped.WithLabelValues("slack:typo")) != 1 {
		t.Fatal("not counted")
	}
}

func TestShutdownDrainsQueuedMessages(t *testing.T) {
	d, m := newDispatcher(t)
	n := 0
	var mu sync.Mutex
	s := senderFunc(func(context.Context, alert.Message) error { mu.Lock(); n++; mu.Unlock(); return nil })
	cfg := fastConfig()
	cfg.RatePerMinute, cfg.Burst = 60*200, 1 // 200/s: the queue outlives ctx
	if err := d.Set("s", s, cfg); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		d.Deliver("s", msg("a"))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Run(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if n != 50 || testutil.ToFloat64(m.Sent.WithLabelValues("s")) != 50 {
		t.Fatalf("sent %d of 50 queued before shutdown", n)
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	d, _ := newDispatcher(t)
	var first, second time.Time
	var mu sync.Mutex
	s := senderFunc(func(context.Context, alert.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
			return RetryAfter(errors.New("429"), 200*time.Millisecond)
		}
		second = time.Now()
		return nil
	})
	if err := d.Set("r", s, fastConfig()); err != nil {
		t.Fatal(err)
	}
	stop := start(t, d)
	defer stop()
	d.Deliver("r", msg("a"))
	itest.Eventually(t, 30*time.Second, "the retry", func() bool { mu.Lock(); defer mu.Unlock(); return !second.IsZero() })
	// A lower bound only: a loaded machine can make it later, never sooner.
	if gap := second.Sub(first); gap < 200*time.Millisecond {
		t.Fatalf("retried after %v, before the 200ms Retry-After", gap)
	}
}

func TestRateLimitHasBurstAndSurvivesAReset(t *testing.T) {
	cfg := fastConfig()
	cfg.RatePerMinute, cfg.Burst = 60, 2 // 1/s, burst 2
	c := newChannel("x", slog.New(slog.NewTextHandler(io.Discard, nil)), nil, cfg)
	c.setSender(senderFunc(func(context.Context, alert.Message) error { return nil }), cfg)
	now := time.Now()
	// Two reservations in a row: each one must find a token of the burst.
	first := c.limiter.ReserveN(now, 1).DelayFrom(now)
	second := c.limiter.ReserveN(now, 1).DelayFrom(now)
	if first != 0 || second != 0 {
		t.Fatalf("burst not available: waits %v and %v", first, second)
	}
	// A policy reload sets the channel again with the same settings: the
	// bucket must stay empty, not refill.
	c.setSender(senderFunc(func(context.Context, alert.Message) error { return nil }), cfg)
	if w := c.limiter.ReserveN(now, 1).DelayFrom(now); w != time.Second {
		t.Fatalf("third token waits %v, want 1s", w)
	}
	if w := c.limiter.ReserveN(now.Add(10*time.Second), 1).DelayFrom(now.Add(10 * time.Second)); w != 0 {
		t.Fatalf("after a long pause the bucket must have refilled, wait %v", w)
	}
}

func TestChannelConfigValidate(t *testing.T) {
	c := DefaultChannelConfig()
	c.QueueSize = 0
	c.MaxBackoff = time.Millisecond
	err := c.Validate("alerter.slack")
	if err == nil || !strings.Contains(err.Error(), "alerter.slack.queue_size: 0 is outside 1..1000000") || !strings.Contains(err.Error(), "max_backoff") {
		t.Fatalf("got %v", err)
	}
}
