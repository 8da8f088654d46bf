package upstream

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/internal/manualclock"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newBreaker(t *testing.T, clock *manualclock.Clock, opts ...BreakerOpt) *Breaker {
	t.Helper()
	b, err := NewBreaker(append([]BreakerOpt{BreakerClock(clock.Now)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// call runs one call through b with the given outcome; it reports whether
// the breaker let it through.
func call(b *Breaker, latency time.Duration, o concurrency.Outcome) bool {
	probe, ok, _ := b.Allow()
	if ok {
		b.Record(probe, latency, o)
	}
	return ok
}

// TestBreakerOpensAfterTenConsecutiveFailures: by default ten failures in
// a row open the breaker for 30 s; nine do not, and a success in between
// starts the count again.
func TestBreakerOpensAfterTenConsecutiveFailures(t *testing.T) {
	clock := manualclock.New(t0)
	var transitions []string
	b := newBreaker(t, clock, OnStateChange(func(from, to State, why string) {
		transitions = append(transitions, from.String()+"→"+to.String()+": "+why)
	}))
	for range 9 {
		call(b, 10*time.Millisecond, concurrency.Failure)
	}
	call(b, 10*time.Millisecond, concurrency.Success)
	for range 9 {
		call(b, 10*time.Millisecond, concurrency.Failure)
	}
	if s := b.Stats(); s.State != Closed || s.InRow != 9 {
		t.Fatalf("after 9 + success + 9 failures: %+v, want closed with 9 in a row", s)
	}
	call(b, 10*time.Millisecond, concurrency.Failure)
	_, ok, retry := b.Allow()
	if ok || retry != 30*time.Second {
		t.Fatalf("after the 10th consecutive failure: allowed %v, retry after %v; want refused for 30s", ok, retry)
	}
	if len(transitions) != 1 || transitions[0] != "closed→open: 10 consecutive failures; open for 30s" {
		t.Fatalf("transitions %q", transitions)
	}
}

// TestBreakerOpensOnRatios: half of at least 20 calls failing in the
// window opens it (the default ErrorRatio), as do half of them being slow; fewer
// than 20 calls never do.
func TestBreakerOpensOnRatios(t *testing.T) {
	t.Run("errors", func(t *testing.T) {
		b := newBreaker(t, manualclock.New(t0))
		for i := range 19 {
			o := concurrency.Success
			if i%2 == 0 {
				o = concurrency.Failure
			}
			call(b, time.Millisecond, o)
		}
		if b.Stats().State != Closed {
			t.Fatal("opened with 19 calls, below the minimum of 20")
		}
		call(b, time.Millisecond, concurrency.Success) // 10 of 20 failed
		if b.Stats().State != Open {
			t.Fatalf("10 of 20 calls failed: %+v, want open", b.Stats())
		}
	})
	t.Run("slow", func(t *testing.T) {
		b := newBreaker(t, manualclock.New(t0))
		for i := range 20 {
			lat := time.Second
			if i%2 == 0 {
				lat = 10 * time.Second
			}
			call(b, lat, concurrency.Success)
		}
		if b.Stats().State != Open {
			t.Fatalf("10 of 20 calls took 10 s: %+v, want open", b.Stats())
		}
	})
	t.Run("old calls leave the window", func(t *testing.T) {
		clock := manualclock.New(t0)
		b := newBreaker(t, clock)
		for range 9 {
			call(b, time.Millisecond, concurrency.Failure)
			call(b, time.Millisecond, concurrency.Success)
		}
		clock.Advance(2 * time.Minute)
		for range 19 {
			call(b, time.Millisecond, concurrency.Success)
		}
		call(b, time.Millisecond, concurrency.Failure)
		if b.Stats().State != Closed {
			t.Fatal("failures older than the window counted")
		}
	})
}

// TestBreakerProbesAndBackOff: after the open time, 5 probes go through
// and no other call; a failed probe reopens for twice as long, up to the
// cap; 5 successful probes close the breaker and reset the open time.
func TestBreakerProbesAndBackOff(t *testing.T) {
	clock := manualclock.New(t0)
	b := newBreaker(t, clock, OpenTime(30*time.Second, 100*time.Second))
	trip := func() {
		for range 10 {
			call(b, time.Millisecond, concurrency.Failure)
		}
	}
	trip()
	for i, want := range []time.Duration{60 * time.Second, 100 * time.Second, 100 * time.Second} {
		clock.Advance(b.Stats().OpenFor - time.Millisecond)
		if _, ok, _ := b.Allow(); ok {
			t.Fatalf("round %d: allowed before the open time ended", i)
		}
		clock.Advance(time.Millisecond)
		probe, ok, _ := b.Allow()
		if !ok || !probe {
			t.Fatalf("round %d: the first call after the open time is not a probe", i)
		}
		b.Record(true, time.Millisecond, concurrency.Failure)
		if s := b.Stats(); s.State != Open || s.OpenFor != want {
			t.Fatalf("round %d: after a failed probe %+v, want open for %v", i, s, want)
		}
	}
	clock.Advance(100 * time.Second)
	var probes []bool
	for range 5 {
		p, ok, _ := b.Allow()
		if !ok || !p {
			t.Fatalf("half-open refused probe %d", len(probes)+1)
		}
		probes = append(probes, p)
	}
	if _, ok, _ := b.Allow(); ok {
		t.Fatal("a sixth call went through a half-open breaker with 5 probes")
	}
	b.Record(true, 0, concurrency.Ignored) // one probe's caller went away: its probe is handed out again
	if p, ok, _ := b.Allow(); !ok || !p {
		t.Fatal("an ignored probe was not handed out again")
	}
	probesSucceed(b, 5)
	if s := b.Stats(); s.State != Closed || s.OpenFor != 30*time.Second || s.Trips != 4 {
		t.Fatalf("after 5 good probes: %+v, want closed, open time reset to 30s, 4 trips", s)
	}
	trip()
	if s := b.Stats(); s.OpenFor != 30*time.Second {
		t.Fatalf("next opening lasts %v, want the reset 30s", s.OpenFor)
	}
}

func TestBreakerOptionsAreValidated(t *testing.T) {
	_, err := NewBreaker(Probes(0), OpenTime(time.Minute, time.Second), ErrorRatio(2), ProbeTimeout(time.Millisecond))
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"Probes: 0 is outside 1..1000", "OpenTime: 1m0s must be positive and at most the cap 1s", "ErrorRatio: 2 is outside 0..1",
		"ProbeTimeout: 1ms is outside 1s..24h"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}
