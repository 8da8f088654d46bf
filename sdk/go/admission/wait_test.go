package admission

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// scriptCounter counts the admission scripts a client sends on keys
// under prefix (EVALSHA and EVAL, alone or pipelined).
type scriptCounter struct {
	prefix string
	n      atomic.Int64
}

func (h *scriptCounter) count(cmd redis.Cmder) {
	name := strings.ToLower(cmd.Name())
	if name != "evalsha" && name != "eval" {
		return
	}
	args := cmd.Args()
	if len(args) > 3 {
		if k, ok := args[3].(string); ok && strings.HasPrefix(k, h.prefix) {
			h.n.Add(1)
		}
	}
}

func (h *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	}
}

// waitBucket is an exact bucket of burst 1 refilling one request per
// every, on which low priority requests may wait up to lowWait and high
// ones up to highWait.
func waitBucket(every, lowWait, highWait time.Duration) Rule {
	r := Rule{Name: "rpm", Unit: Requests, Algorithm: TokenBucket, Limit: 1, Rate: 1 / every.Seconds(), Exact: true}
	r.Wait[schemas.PriorityLow.Index()] = lowWait
	r.Wait[schemas.PriorityHigh.Index()] = highWait
	return r
}

func drain(t *testing.T, l *Limiter, req Request) {
	t.Helper()
	if tk := mustAdmit(t, l, req); !tk.Allowed() {
		t.Fatalf("the first request was refused: %+v", tk.Decision)
	}
	if tk := mustAdmit(t, l, req); tk.Allowed() {
		t.Fatalf("the bucket of one admitted a second request at once")
	}
}

// acquireInBackground runs l.Acquire(req) in a goroutine: the channel
// delivers its ticket, and cancel is the caller giving up on the wait.
func acquireInBackground(l *Limiter, req Request) (<-chan Ticket, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan Ticket, 1)
	go func() {
		tk, _ := l.Acquire(ctx, req)
		done <- tk
	}()
	return done, cancel
}

// queuedWaiters returns how many requests wait in l's queue, read under its
// lock since the waiting goroutines change it.
func queuedWaiters(l *Limiter) int {
	l.wq.mu.Lock()
	defer l.wq.mu.Unlock()
	return l.wq.n
}

func TestAcquireWaitsForTheBucketToRefill(t *testing.T) {
	prefix := testPrefix(t)
	l := newTestLimiter(t, testClient(t, ""), &Rules{Default: TenantRules{Rules: []Rule{waitBucket(300*time.Millisecond, time.Minute, 0)}}}, WithPrefix(prefix))
	low := Request{Tenant: "acme", Priority: schemas.PriorityLow}
	drain(t, l, low)

	tk, err := l.Acquire(context.Background(), low)
	if err != nil {
		t.Fatal(err)
	}
	if !tk.Allowed() || tk.Decision.Path != PathRedis {
		t.Fatalf("a low priority request that may wait a minute was not admitted when the bucket refilled: %+v", tk.Decision)
	}
	if err := tk.Settle(context.Background(), Usage{}); err != nil {
		t.Fatal(err)
	}
	// Interactive traffic does not wait: the rule gives normal no wait.
	normal := Request{Tenant: "acme", Priority: schemas.PriorityNormal}
	tk, err = l.Acquire(context.Background(), normal)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Allowed() || tk.Decision.Rule != "rpm" {
		t.Fatalf("a normal request on the emptied bucket: %+v, want refused at once", tk.Decision)
	}
	if n := l.wq.n; n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

func TestAcquireRefusesAtOnceWhenTheDeadlineComesFirstOrTheQueueIsFull(t *testing.T) {
	prefix := testPrefix(t)
	l := newTestLimiter(t, testClient(t, ""), &Rules{Default: TenantRules{Rules: []Rule{waitBucket(10*time.Minute, 50*time.Minute, 0)}}},
		WithPrefix(prefix), WithMaxWaiters(1))
	low := Request{Tenant: "acme", Priority: schemas.PriorityLow}
	drain(t, l, low)

	// The caller's deadline is before the bucket's retry-after (10 min).
	soon := low
	soon.Deadline = time.Now().Add(time.Minute)
	tk, err := l.Acquire(context.Background(), soon)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Allowed() || tk.Decision.RetryAfter < 9*time.Minute {
		t.Fatalf("a request due in a minute on a bucket that refills in 10 minutes: %+v, want refused at once", tk.Decision)
	}
	// One waits (the queue holds one); the next is refused at once.
	first, cancel := acquireInBackground(l, low)
	itest.Eventually(t, 10*time.Second, "the first request waits", func() bool { return queuedWaiters(l) == 1 })
	tk, err = l.Acquire(context.Background(), low)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Allowed() {
		t.Fatalf("a second waiter past WithMaxWaiters(1) was admitted")
	}
	// The caller giving up ends its wait with the refusal.
	cancel()
	if tk := <-first; tk.Allowed() || tk.Decision.Rule != "rpm" {
		t.Fatalf("a cancelled waiter: %+v, want the refusal", tk.Decision)
	}
	if n := l.wq.n; n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// A high priority waiter that came second is admitted first; the low one,
// whose deadline is before the next refill, is refused at that wake-up.
func TestAcquireWakesHigherPriorityFirstAndRefusesAtTheDeadline(t *testing.T) {
	prefix := testPrefix(t)
	every := 1500 * time.Millisecond
	l := newTestLimiter(t, testClient(t, ""), &Rules{Default: TenantRules{Rules: []Rule{waitBucket(every, time.Minute, time.Minute)}}}, WithPrefix(prefix))
	low := Request{Tenant: "acme", Priority: schemas.PriorityLow}
	drain(t, l, low)

	low.Deadline = time.Now().Add(every + every/2) // before the second refill
	results := map[schemas.Priority]chan Ticket{schemas.PriorityLow: make(chan Ticket, 1), schemas.PriorityHigh: make(chan Ticket, 1)}
	acquire := func(req Request) {
		tk, err := l.Acquire(context.Background(), req)
		if err != nil {
			t.Error(err)
		}
		results[req.Priority] <- tk
	}
	go acquire(low)
	itest.Eventually(t, every/2, "the low request waits", func() bool { return queuedWaiters(l) == 1 })
	go acquire(Request{Tenant: "acme", Priority: schemas.PriorityHigh})
	itest.Eventually(t, every/2, "the high request waits", func() bool { return queuedWaiters(l) == 2 })
	high := <-results[schemas.PriorityHigh]
	if !high.Allowed() {
		t.Fatalf("the high priority waiter: %+v, want admitted by the first refill", high.Decision)
	}
	lowTk := <-results[schemas.PriorityLow]
	if lowTk.Allowed() {
		t.Fatal("the low priority waiter took the refill ahead of the high one")
	}
	if lowTk.Decision.Rule != "rpm" || lowTk.Decision.RetryAfter <= 0 {
		t.Fatalf("the low waiter's refusal: %+v, want rpm's with a retry-after", lowTk.Decision)
	}
	// It was refused at the first wake-up, not held to the second refill.
	if tk := mustAdmit(t, l, Request{Tenant: "acme"}); tk.Allowed() {
		t.Fatal("the bucket had a request left after the first refill went to the high waiter")
	}
}

// Waiting costs Redis one call per wake-up plus one per admission, never
// one per waiter per tick: five waiters on a bucket refilling one request
// every 200 ms are all admitted with about 5 (first tries) + 5
// (admissions) + 5 (one refusal per wake-up) script calls, at most 20
// (a wake-up that comes a millisecond early costs one more); polling each
// waiter every 10 ms cost 83.
func TestAcquireCostsNoRedisCallPerWaiterPerTick(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	counter := &scriptCounter{prefix: prefix}
	c.AddHook(counter)
	// Without the refusal cache, which would hide retries from Redis.
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{waitBucket(200*time.Millisecond, time.Minute, 0)}}}, WithPrefix(prefix), WithRefusalCache(0))
	low := Request{Tenant: "acme", Priority: schemas.PriorityLow}
	drain(t, l, low)
	before := counter.n.Load()

	const waiters = 5
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range waiters {
		wg.Go(func() {
			tk, err := l.Acquire(context.Background(), low)
			if err != nil {
				t.Error(err)
			}
			if tk.Allowed() {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != waiters {
		t.Fatalf("%d of %d waiters admitted, want all as the bucket refilled", got, waiters)
	}
	calls := counter.n.Load() - before
	t.Logf("%d script calls", calls)
	if calls > 4*waiters {
		t.Fatalf("%d script calls for %d waiters, want at most %d", calls, waiters, 4*waiters)
	}
}

// A waiter that a wake-up finds refused by another rule waits for that
// one, and its caller giving up still ends its wait at once.
func TestAcquireFollowsTheRuleThatRefusesAndStopsWhenTheCallerLeaves(t *testing.T) {
	prefix := testPrefix(t)
	bucket := waitBucket(300*time.Millisecond, time.Minute, 0)
	// Its retry-after (40 s) is within the deadline the first refusal set
	// (the bucket's wait, a minute).
	daily := Rule{Name: "daily", Unit: Requests, Algorithm: SlidingWindow, Limit: 1, Window: 40 * time.Second, Exact: true}
	daily.Wait[schemas.PriorityLow.Index()] = time.Hour
	l := newTestLimiter(t, testClient(t, ""), &Rules{Default: TenantRules{Rules: []Rule{bucket, daily}}}, WithPrefix(prefix))
	low := Request{Tenant: "acme", Priority: schemas.PriorityLow}
	if tk := mustAdmit(t, l, low); !tk.Allowed() {
		t.Fatalf("first request refused: %+v", tk.Decision)
	}
	done, cancel := acquireInBackground(l, low)
	dailyKey := tenantKey(prefix, daily, "acme", Scope{})
	itest.Eventually(t, 10*time.Second, "the waiter moves to the daily window once the bucket refilled", func() bool {
		l.wq.mu.Lock()
		defer l.wq.mu.Unlock()
		k := l.wq.keys[dailyKey]
		return k != nil && len(k.ws) == 1
	})
	cancel()
	select {
	case tk := <-done:
		if tk.Allowed() || tk.Decision.Rule != "daily" {
			t.Fatalf("the cancelled waiter: %+v, want daily's refusal", tk.Decision)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled waiter is still held (until daily's wake-up, 40 s away)")
	}
}
