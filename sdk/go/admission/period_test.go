package admission

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
)

// movingHours is a calendar of hours read shift ahead: moving shift on by
// an hour makes the next period the current one, which is how a test gets
// past a period's end without waiting for it. (Its periods start after
// now, so the rule's period cache asks it every time.)
type movingHours struct{ shift atomic.Int64 }

func (c *movingHours) Bounds(t time.Time) (start, end time.Time) {
	s := t.Add(time.Duration(c.shift.Load())).Truncate(time.Hour)
	return s, s.Add(time.Hour)
}

func periodRule(c Calendar) Rule {
	return Rule{Name: "monthly", Scope: Scope{User: Each}, Unit: TotalTokens, Algorithm: CalendarPeriod, Limit: 1000, Calendar: c}
}

func periodFields(t *testing.T, c redis.UniversalClient, key string) map[string]string {
	t.Helper()
	h, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestCalendarPeriodQuotaPerUser: a per-user period quota keeps one
// counter per user (one hash field, expiring with the period), debits the
// estimate and settles it to the actual, refuses past the limit until the
// period ends, and starts again from zero in the next period, where the
// previous period's field is deleted and a late refund to it is dropped.
func TestCalendarPeriodQuotaPerUser(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	ctx := context.Background()
	cal := &movingHours{}
	cal.shift.Store(int64(time.Hour))
	// Without the refusal cache: it keeps a refusal no longer than its
	// retry-after, the period's real end, which the test's jump ignores.
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{periodRule(cal)}}}, WithPrefix(prefix), WithRefusalCache(0))
	bob := Request{Tenant: "acme", User: "bob", PromptTokens: 500, CompletionTokens: 100}
	key := tenantKey(prefix, periodRule(nil), "acme", Scope{User: "bob"})
	start, end := cal.Bounds(time.Now())
	id := start.UnixMilli()

	tk := mustAdmit(t, l, bob)
	if !tk.Allowed() {
		t.Fatalf("first request refused: %+v", tk.Decision)
	}
	if h := periodFields(t, c, key); len(h) != 1 || h[itoa(id)] != "600" {
		t.Fatalf("bob's counter after a 600-token estimate: %v, want {%d: 600}", h, id)
	}
	if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Until(end)+time.Second+100*time.Millisecond {
		t.Fatalf("bob's counter expires in %s, want by the period's end (+1 s), %s from now", ttl, time.Until(end))
	}
	if err := tk.Settle(ctx, Usage{PromptTokens: 250, CompletionTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if h := periodFields(t, c, key); h[itoa(id)] != "300" {
		t.Fatalf("bob's counter after settling 300 actual: %v, want 300", h)
	}
	big := bob
	big.PromptTokens, big.CompletionTokens = 600, 100
	late := mustAdmit(t, l, big)
	if !late.Allowed() {
		t.Fatalf("700 more tokens (1000 in all) refused: %+v", late.Decision)
	}
	d := mustAdmit(t, l, Request{Tenant: "acme", User: "bob", PromptTokens: 1}).Decision
	if d.Allowed || d.Rule != "monthly" || d.Scope.User != "bob" || d.Available != 0 || d.Algorithm != CalendarPeriod {
		t.Fatalf("bob past his quota: %+v, want refused by monthly with nothing available", d)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > time.Until(end)+time.Second {
		t.Fatalf("retry after %s, want by the period's end (%s)", d.RetryAfter, time.Until(end))
	}
	if tk := mustAdmit(t, l, Request{Tenant: "acme", User: "alice", PromptTokens: 900}); !tk.Allowed() {
		t.Fatalf("alice has a counter of her own: %+v", tk.Decision)
	}

	// The next period: the same key, a fresh count, the old field gone.
	cal.shift.Store(int64(2 * time.Hour))
	nextID, _ := cal.Bounds(time.Now())
	if tk := mustAdmit(t, l, Request{Tenant: "acme", User: "bob", PromptTokens: 1000}); !tk.Allowed() {
		t.Fatalf("the whole quota in the next period refused: %+v", tk.Decision)
	}
	if h := periodFields(t, c, key); len(h) != 1 || h[itoa(nextID.UnixMilli())] != "1000" {
		t.Fatalf("bob's counter in the next period: %v, want only {%d: 1000}", h, nextID.UnixMilli())
	}
	// The previous period's 700-token estimate settles at 100: its refund
	// belongs to a period that is over, and must not lift the new one.
	if err := late.Settle(ctx, Usage{PromptTokens: 100}); err != nil {
		t.Fatal(err)
	}
	if h := periodFields(t, c, key); len(h) != 1 || h[itoa(nextID.UnixMilli())] != "1000" {
		t.Fatalf("after a late refund to the previous period: %v, want {%d: 1000} untouched", h, nextID.UnixMilli())
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestCalendarPeriodFailsOpenLocallyThenReconciles: with Redis cut, a
// period quota is enforced by the local limiter at this gateway's share
// of what Redis last said was left, refusing until the period's end; once
// Redis is back the local debits are in the period's counter.
func TestCalendarPeriodFailsOpenLocallyThenReconciles(t *testing.T) {
	prefix := testPrefix(t)
	direct := testClient(t, "")
	proxy := itest.NewProxy(t, direct.Options().Addr)
	c := testClient(t, proxy.Addr())
	cal := &movingHours{}
	rule := periodRule(cal)
	rule.Limit = 10_000
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{rule}, FailMode: FailOpen}},
		WithPrefix(prefix), WithGatewayCount(2), WithMaxWait(time.Second))
	key := tenantKey(prefix, rule, "acme", Scope{User: "bob"})
	start, end := cal.Bounds(time.Now())
	req := Request{Tenant: "acme", User: "bob", PromptTokens: 1000}
	if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathRedis {
		t.Fatalf("before the cut: %+v", d)
	}
	proxy.Cut()
	// Redis said 9,000 were left: this gateway's share is 4,500.
	for i := range 4 {
		if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathLocal {
			t.Fatalf("local admission %d: %+v", i, d)
		}
	}
	d := mustAdmit(t, l, req).Decision
	if d.Allowed || d.Path != PathLocal || d.Rule != "monthly" || d.RetryAfter <= 0 || d.RetryAfter > time.Until(end)+time.Second {
		t.Fatalf("5th local admission: %+v, want the local limiter's refusal until the period's end", d)
	}
	proxy.Restore()
	field := itoa(start.UnixMilli())
	itest.Eventually(t, 10*time.Second, "the local debits reconciled into the period's counter", func() bool {
		return periodFields(t, direct, key)[field] == "5000" && !l.Stats().Down
	})
}

// TestCostRuleRefusesTheCallWhoseWorstCaseCrossesTheBudget: a key's
// monthly budget of $1 counted in Cost (millionths of the currency),
// exact. A call whose worst case is $0.60 passes; a second one of $0.60
// would cross the budget and is refused before it is made; once the
// first settles at what it really cost ($0.20), the second fits.
func TestCostRuleRefusesTheCallWhoseWorstCaseCrossesTheBudget(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	ctx := context.Background()
	budget := Rule{Name: "key-budget", Scope: Scope{Key: Each}, Unit: Cost, Algorithm: CalendarPeriod, Limit: 1 * CostScale,
		Calendar: &movingHours{}, Exact: true}
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{budget}}}, WithPrefix(prefix), WithRefusalCache(0))
	call := Request{Tenant: "acme", Key: "k1", PromptTokens: 1000, CompletionTokens: 4000, Cost: 600_000}

	first := mustAdmit(t, l, call)
	if !first.Allowed() {
		t.Fatalf("a $0.60 call against a $1 budget refused: %+v", first.Decision)
	}
	d := mustAdmit(t, l, call).Decision
	if d.Allowed || d.Rule != "key-budget" || d.Unit != Cost || d.Available != 400_000 {
		t.Fatalf("a second $0.60 call: %+v, want refused by key-budget with $0.40 (400000) available", d)
	}
	if tk := mustAdmit(t, l, Request{Tenant: "acme", Key: "k2", Cost: 900_000}); !tk.Allowed() {
		t.Fatalf("another key has a budget of its own: %+v", tk.Decision)
	}
	if err := first.Settle(ctx, Usage{PromptTokens: 1000, CompletionTokens: 500, Cost: 200_000}); err != nil {
		t.Fatal(err)
	}
	if tk := mustAdmit(t, l, call); !tk.Allowed() {
		t.Fatalf("$0.60 after the first settled at $0.20: %+v, want admitted ($0.80 of $1)", tk.Decision)
	}
}

// until is a one-off calendar: one period from the epoch to end.
type until struct{ end time.Time }

func (c until) Bounds(time.Time) (start, end time.Time) { return time.UnixMilli(0), c.end }

// TestOneOffRuleExpires: a key's one-off budget of $2 (Expires an hour
// ahead) counts until its expiry: it refuses the call that would cross it,
// with a retry-after by the expiry, and its counter expires with it in
// Redis. Once the Limiter's clock passes the expiry the rule applies to
// no call, and the key's calls follow its other limit (a day's sliding
// window of $4), which refuses in turn.
func TestOneOffRuleExpires(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	ctx := context.Background()
	var shift atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	expires := time.Now().Add(time.Hour)
	once := Rule{Name: "key-once", Scope: Scope{Key: Each}, Unit: Cost, Algorithm: CalendarPeriod, Limit: 2 * CostScale,
		Calendar: until{expires}, Expires: expires, Exact: true}
	daily := Rule{Name: "key-daily", Scope: Scope{Key: Each}, Unit: Cost, Algorithm: SlidingWindow, Limit: 4 * CostScale, Window: 24 * time.Hour, Exact: true}
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{once, daily}}}, WithPrefix(prefix), WithRefusalCache(0), WithClock(clock))
	call := Request{Tenant: "acme", Key: "k1", Cost: CostScale}

	for i := range 2 {
		if tk := mustAdmit(t, l, call); !tk.Allowed() {
			t.Fatalf("call %d of $1 against a $2 one-off budget: %+v", i+1, tk.Decision)
		}
	}
	d := mustAdmit(t, l, call).Decision
	if d.Allowed || d.Rule != "key-once" || d.RetryAfter <= 0 || d.RetryAfter > time.Hour {
		t.Fatalf("a third $1: %+v, want refused by key-once until its expiry", d)
	}
	key := tenantKey(prefix, once, "acme", Scope{Key: "k1"})
	if ttl := c.PTTL(ctx, key).Val(); ttl < 59*time.Minute || ttl > time.Hour+time.Second {
		t.Fatalf("the one-off counter expires in %s, want with the budget (an hour, + 1 s)", ttl)
	}
	if tk := mustAdmit(t, l, Request{Tenant: "acme", Key: "k2", Cost: 2 * CostScale}); !tk.Allowed() {
		t.Fatalf("another key has a budget of its own: %+v", tk.Decision)
	}

	shift.Store(int64(2 * time.Hour))
	for i := range 2 {
		if tk := mustAdmit(t, l, call); !tk.Allowed() {
			t.Fatalf("call %d after the expiry: %+v, want the one-off budget no longer applied", i+1, tk.Decision)
		}
	}
	if d := mustAdmit(t, l, call).Decision; d.Allowed || d.Rule != "key-daily" {
		t.Fatalf("a fifth $1 of the day: %+v, want refused by key-daily", d)
	}
	if h := periodFields(t, c, key); h["0"] != "2000000" {
		t.Fatalf("the one-off counter after its expiry: %v, want its $2 untouched (no call counted)", h)
	}
}
