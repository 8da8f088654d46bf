package upstream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/internal/manualclock"
)

// fleetPair returns two gateway processes' breakers of one upstream,
// sharing its state in the real Redis, on one manual clock. Each has its
// own Fleet on its own Redis client, as two processes would: nothing but
// Redis connects them. A failed Redis call fails the test.
func fleetPair(t *testing.T, opts ...BreakerOpt) (*manualclock.Clock, *Breaker, *Breaker) {
	t.Helper()
	clock, mk := fleetGateways(t)
	fail := OnFleetError(func(err error) { t.Errorf("fleet error: %v", err) })
	a, _ := mk(append([]BreakerOpt{fail}, opts...)...)
	b, _ := mk(append([]BreakerOpt{fail}, opts...)...)
	return clock, a, b
}

// fleetGateways returns a manual clock and a maker of gateway processes'
// breakers of one upstream on it, sharing the upstream's state in the
// real Redis under a prefix of the test's own; each breaker comes with
// its own Redis client, which the test may close to cut it off.
func fleetGateways(t *testing.T) (*manualclock.Clock, func(opts ...BreakerOpt) (*Breaker, redis.UniversalClient)) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Redis")
	}
	return fleetGatewaysOn(t, itest.Redis(t))
}

// fleetGatewaysOn is fleetGateways on the Redis (or Redis Cluster) cfg.
func fleetGatewaysOn(t *testing.T, cfg redisconn.Config) (*manualclock.Clock, func(opts ...BreakerOpt) (*Breaker, redis.UniversalClient)) {
	t.Helper()
	prefix := itest.Unique(t, "sluice:test:")
	t.Cleanup(func() {
		rdb := redisconn.NewClient(cfg)
		defer rdb.Close()
		// By name: KEYS on a Cluster client would ask one node only.
		key := prefix + "{acct-1}:breaker"
		rdb.Del(context.Background(), key, key+":probes")
	})
	clock := manualclock.New(t0)
	return clock, func(opts ...BreakerOpt) (*Breaker, redis.UniversalClient) {
		rdb := redisconn.NewClient(cfg)
		t.Cleanup(func() { rdb.Close() })
		// Each Redis call may take up to 5 s, not the default 100 ms: these
		// tests check what the fleet decides, and a 2-core CI machine busy
		// with other packages once took longer than 100 ms for one call.
		f, err := NewFleet(rdb, prefix, "acct-1", 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return newBreaker(t, clock, append([]BreakerOpt{FleetWide(f, 0)}, opts...)...), rdb
	}
}

func probes(t *testing.T, b *Breaker, n int) {
	t.Helper()
	for i := range n {
		if p, ok, _ := b.Allow(); !ok || !p {
			t.Fatalf("probe %d of %d refused", i+1, n)
		}
	}
}

// probesSucceed reports n of b's probes as successes.
func probesSucceed(b *Breaker, n int) {
	for range n {
		b.Record(true, time.Millisecond, concurrency.Success)
	}
}

// probesClose sends n probes through b, reports them all successes and
// checks that this closed b with its open time back at the default 30 s.
func probesClose(t *testing.T, b *Breaker, n int) {
	t.Helper()
	probes(t, b, n)
	probesSucceed(b, n)
	wantState(t, b, Closed, 30*time.Second)
}

func wantState(t *testing.T, b *Breaker, st State, openFor time.Duration) {
	t.Helper()
	if s := b.Stats(); s.State != st || s.OpenFor != openFor {
		t.Fatalf("breaker %+v, want %s with open time %v", s, st, openFor)
	}
}

// TestFleetBreakerCountsProbesAcrossGateways: nine consecutive failures
// in gateway A leave the upstream's breaker closed; the tenth (the
// default ConsecutiveFailures) opens it for the fleet; gateway B, which saw none, follows. After the open time the fleet sends 5 probes in
// all, whichever gateway sends them; one failed probe reopens both for
// twice as long, twice in a row (30 s, 60 s, 120 s); 5 successful probes
// from both gateways close it for both and reset the open time.
func TestFleetBreakerCountsProbesAcrossGateways(t *testing.T) {
	clock, a, b := fleetPair(t)
	for range 9 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	b.sync()
	wantState(t, a, Closed, 30*time.Second)
	wantState(t, b, Closed, 30*time.Second)
	call(a, time.Millisecond, concurrency.Failure) // the 10th in a row
	wantState(t, a, Open, 30*time.Second)
	b.sync()
	wantState(t, b, Open, 30*time.Second)
	if _, ok, retry := b.Allow(); ok || retry != 30*time.Second {
		t.Fatalf("gateway B: allowed %v, retry %v; want refused for 30s", ok, retry)
	}

	for _, want := range []time.Duration{60 * time.Second, 120 * time.Second} {
		clock.Advance(b.Stats().OpenFor)
		probes(t, a, 3)
		probes(t, b, 2)
		for _, g := range []*Breaker{a, b} {
			if p, ok, _ := g.Allow(); ok || p {
				t.Fatal("a sixth probe was handed out: probes are not counted fleet-wide")
			}
		}
		b.Record(true, time.Millisecond, concurrency.Failure) // one probe fails
		wantState(t, b, Open, want)
		a.Record(true, time.Millisecond, concurrency.Success) // a success of the round that failed counts for nothing
		wantState(t, a, Open, want)
	}

	clock.Advance(120 * time.Second)
	probes(t, a, 3)
	probes(t, b, 2)
	probesSucceed(a, 3)
	b.Record(true, time.Millisecond, concurrency.Success)
	wantState(t, b, HalfOpen, 120*time.Second)
	b.Record(true, time.Millisecond, concurrency.Success)
	wantState(t, b, Closed, 30*time.Second)
	a.sync()
	wantState(t, a, Closed, 30*time.Second)
	if p, ok, _ := a.Allow(); !ok || p {
		t.Fatal("gateway A does not pass calls after the fleet closed")
	}
}

// TestFleetBreakerWorksAloneWithoutRedis: with Redis unreachable the
// breaker still opens, probes and closes on its own, and counts the
// failed Redis calls.
func TestFleetBreakerWorksAloneWithoutRedis(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	f, err := NewFleet(rdb, "p:", "u", 0)
	if err != nil {
		t.Fatal(err)
	}
	clock := manualclock.New(t0)
	b := newBreaker(t, clock, FleetWide(f, 0))
	for range 10 {
		call(b, time.Millisecond, concurrency.Failure)
	}
	wantState(t, b, Open, 30*time.Second)
	clock.Advance(30 * time.Second)
	probesClose(t, b, 5)
	if b.Stats().FleetErrors == 0 {
		t.Fatal("failed Redis calls were not counted")
	}
}

// TestFleetBreakerDeadProbeHolderDoesNotWedgeIt: gateway A takes every
// probe of the fleet's half-open breaker and dies without reporting any.
// Gateway B is refused while those probes may still be running, and
// once their deadline (the default probe timeout and its margin) has
// passed it probes itself and closes the breaker for the fleet; it is
// never refused forever. On a Redis Cluster too, where the state and the
// probes in flight must share a slot.
func TestFleetBreakerDeadProbeHolderDoesNotWedgeIt(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	for name, cfg := range map[string]func(testing.TB) redisconn.Config{"redis": itest.Redis, "cluster": itest.RedisCluster} {
		t.Run(name, func(t *testing.T) {
			clock, mk := fleetGatewaysOn(t, cfg(t))
			fail := OnFleetError(func(err error) { t.Errorf("fleet error: %v", err) })
			a, _ := mk(fail)
			b, _ := mk(fail)
			deadProbeHolder(t, clock, a, b)
		})
	}
}

func deadProbeHolder(t *testing.T, clock *manualclock.Clock, a, b *Breaker) {
	t.Helper()
	for range 10 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	b.sync()
	wantState(t, b, Open, 30*time.Second)
	clock.Advance(30 * time.Second)
	probes(t, a, 5) // and gateway A is gone: no result ever comes

	for _, after := range []time.Duration{time.Second, time.Minute, 9 * time.Minute} {
		clock.Advance(after) // 10m1s in all: the probes may still run
		if _, ok, _ := b.Allow(); ok {
			t.Fatalf("gateway B was let through while A's probes may still run")
		}
	}
	clock.Advance(time.Minute) // 11m1s after A took them: past their deadline
	for i := range 5 {
		if p, ok, retry := b.Allow(); !ok || !p {
			t.Fatalf("probe %d of gateway B refused (retry %v) 11 minutes after a dead gateway took the probes: the breaker is wedged half-open", i+1, retry)
		}
	}
	probesSucceed(b, 5)
	wantState(t, b, Closed, 30*time.Second)
	if p, ok, _ := b.Allow(); !ok || p {
		t.Fatal("gateway B does not pass calls after its probes closed the fleet's breaker")
	}
}

// TestFleetBreakerFreesAProbeAtItsDeadline: with a probe timeout of 1 min,
// the probes gateway A took and never reported are free again exactly
// 1 min + ProbeMargin after A took them, not a millisecond sooner; A's
// successes reported after that count for nothing (their places are
// gateway B's now), and B's close the breaker.
func TestFleetBreakerFreesAProbeAtItsDeadline(t *testing.T) {
	clock, a, b := fleetPair(t, ProbeTimeout(time.Minute))
	for range 10 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	b.sync()
	clock.Advance(30 * time.Second)
	probes(t, a, 5)
	clock.Advance(time.Minute + ProbeMargin - time.Millisecond)
	if _, ok, _ := a.Allow(); ok { // asks the fleet
		t.Fatal("a probe was handed out again before its deadline")
	}
	clock.Advance(time.Millisecond)
	probes(t, b, 5) // B asks the fleet for the first time
	if _, ok, _ := a.Allow(); ok {
		t.Fatal("a sixth probe was handed out")
	}
	probesSucceed(a, 5) // too late
	b.sync()
	wantState(t, b, HalfOpen, 30*time.Second)
	probesSucceed(b, 5)
	wantState(t, b, Closed, 30*time.Second)
	a.sync()
	wantState(t, a, Closed, 30*time.Second)
}

// TestFleetBreakerProbeWhoseResultIsLost: gateway A takes every probe and
// its calls reporting them to Redis fail (A is cut off from Redis; it
// decides on its own meanwhile, as documented). The fleet does not wait
// for those reports forever: after the probes' deadline gateway B probes
// and closes the fleet's breaker.
func TestFleetBreakerProbeWhoseResultIsLost(t *testing.T) {
	clock, mk := fleetGateways(t)
	a, rdbA := mk(OnFleetError(func(error) {}), ProbeTimeout(time.Minute))
	b, _ := mk(OnFleetError(func(err error) { t.Errorf("gateway B: fleet error: %v", err) }), ProbeTimeout(time.Minute))
	for range 10 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	b.sync()
	clock.Advance(30 * time.Second)
	probes(t, a, 5)
	_ = rdbA.Close()
	probesSucceed(a, 5)
	if a.Stats().FleetErrors == 0 {
		t.Fatal("gateway A's reports reached Redis; the test needs them lost")
	}
	if _, ok, _ := b.Allow(); ok {
		t.Fatal("gateway B probed while A's probes were within their deadline")
	}
	clock.Advance(time.Minute + ProbeMargin)
	probesClose(t, b, 5)
}

// TestFleetBreakerSendsALostResultAgain: gateway A holds every probe of
// the fleet's half-open breaker, and its calls reporting their results
// fail (Redis answered too late). Until A reaches Redis again the fleet
// stays half-open; then A's next poll sends the results it could not,
// without a new call: a failed probe reopens the fleet's breaker for
// twice the open time, and in the next round A's successful probes close
// it — gateway B follows both, instead of refusing every call until the
// probes' deadline frees their places.
func TestFleetBreakerSendsALostResultAgain(t *testing.T) {
	clock, mk := fleetGateways(t)
	a, rdbA := mk(OnFleetError(func(error) {}))
	b, _ := mk(OnFleetError(func(err error) { t.Errorf("gateway B: fleet error: %v", err) }))
	cut := &cutHook{}
	rdbA.AddHook(cut)
	for range 10 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	for round, want := range []State{Open, Closed} {
		clock.Advance(b.Stats().OpenFor)
		probes(t, a, 5)
		cut.set(true)
		outcome := concurrency.Failure
		if want == Closed {
			outcome = concurrency.Success
		}
		for range 5 {
			a.Record(true, time.Millisecond, outcome)
		}
		b.sync()
		wantState(t, b, HalfOpen, 30*time.Second*time.Duration(1+round))
		if _, ok, _ := b.Allow(); ok {
			t.Fatalf("round %d: gateway B probed while A's probes were within their deadline", round)
		}
		cut.set(false)
		a.sync()
		b.sync()
		if want == Open {
			wantState(t, b, Open, 60*time.Second)
		} else {
			wantState(t, b, Closed, 30*time.Second)
		}
	}
}

// cutHook fails every Redis call of a client while it is set, as a Redis
// that answers after the caller's timeout would.
type cutHook struct{ cut atomic.Bool }

func (h *cutHook) set(v bool) { h.cut.Store(v) }

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.cut.Load() {
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return next(ctx, cmd)
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFleetBreakerAloneAfterRedisIsLostInHalfOpen: gateway B follows the
// fleet's half-open breaker, whose probes gateway A holds, when B loses
// Redis. B cannot learn what became of those probes, so it waits for
// their deadline and then probes on its own, as a breaker without Redis
// does, instead of refusing the upstream for as long as Redis is away.
func TestFleetBreakerAloneAfterRedisIsLostInHalfOpen(t *testing.T) {
	clock, mk := fleetGateways(t)
	a, _ := mk(OnFleetError(func(err error) { t.Errorf("gateway A: fleet error: %v", err) }), ProbeTimeout(time.Minute))
	b, rdbB := mk(OnFleetError(func(error) {}), ProbeTimeout(time.Minute))
	for range 10 {
		call(a, time.Millisecond, concurrency.Failure)
	}
	clock.Advance(30 * time.Second)
	probes(t, a, 5)
	b.sync()
	wantState(t, b, HalfOpen, 30*time.Second)
	_ = rdbB.Close()
	clock.Advance(time.Minute + ProbeMargin - time.Millisecond)
	if _, ok, _ := b.Allow(); ok {
		t.Fatal("gateway B probed alone while the fleet's probes were within their deadline")
	}
	clock.Advance(time.Millisecond)
	probesClose(t, b, 5)
	if b.Stats().FleetErrors == 0 {
		t.Fatal("gateway B reached Redis; the test needs it cut off")
	}
}
