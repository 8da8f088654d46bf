package admission

import (
	"context"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestLeasesSpareRedisAndGiveTheRestBack: a busy rule instance is served
// from a lease most of the time, and once the lease expires Redis holds
// exactly what was admitted.
func TestLeasesSpareRedisAndGiveTheRestBack(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	busy := Rule{Name: "platform-tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: 10 * time.Minute}
	l := newTestLimiter(t, c, &Rules{Shared: []Rule{busy}}, WithPrefix(prefix), WithLeaseTTL(300*time.Millisecond))
	const n = 3000
	var admitted int64
	for i := range n {
		tk := mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 8, CompletionTokens: 2})
		if !tk.Allowed() {
			t.Fatalf("admission %d refused: %+v", i, tk.Decision)
		}
		admitted += 10
		if i == n-1 && (tk.Decision.Tokens.Limit != busy.Limit || tk.Decision.Tokens.Remaining <= 0) {
			t.Fatalf("tokens headroom on a lease hit: %+v", tk.Decision.Tokens)
		}
	}
	s := l.Stats()
	t.Logf("%d admissions: %d lease hits, %d Redis round trips", n, s.LeaseHits, s.RedisRoundTrips)
	if s.LeaseHits < n/2 || s.RedisRoundTrips > n/4 {
		t.Fatalf("a busy instance should be served by leases: %+v", s)
	}
	key := sharedKey(prefix, busy, Scope{})
	// Leases are debited before they are spent: Redis never holds less
	// than was admitted.
	if got := windowUsed(t, c, key); got < admitted {
		t.Fatalf("Redis holds %d, less than the %d admitted", got, admitted)
	}
	itest.Eventually(t, 10*time.Second, "the expired lease's rest back in Redis", func() bool {
		return windowUsed(t, c, key) == admitted
	})
}

// TestExactRuleTakesNoLease: an Exact rule goes to Redis on every admission.
func TestExactRuleTakesNoLease(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	money := Rule{Name: "budget", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: time.Hour, Exact: true}
	l := newTestLimiter(t, c, &Rules{Shared: []Rule{money}}, WithPrefix(prefix))
	for range 500 {
		mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 10})
	}
	if s := l.Stats(); s.LeaseHits != 0 || s.RedisRoundTrips < 500 {
		t.Fatalf("exact rule: %+v", s)
	}
	if got := windowUsed(t, c, sharedKey(prefix, money, Scope{})); got != 5000 {
		t.Fatalf("Redis holds %d, want exactly the 5000 admitted", got)
	}
}

// TestCloseReturnsLeases: a gateway that shuts down gives its leases back.
func TestCloseReturnsLeases(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	busy := Rule{Name: "rps", Unit: Requests, Algorithm: TokenBucket, Limit: 1_000_000, Rate: 1}
	l, err := New(c, &Rules{Shared: []Rule{busy}}, WithPrefix(prefix), WithMaxWait(2*time.Second), WithLeaseTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 {
		mustAdmit(t, l, Request{Tenant: "a", Model: "m"})
	}
	if l.Stats().LeaseHits == 0 {
		t.Fatal("no lease was taken")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	tokens, err := c.HGet(context.Background(), sharedKey(prefix, busy, Scope{}), "t").Float64()
	if err != nil {
		t.Fatal(err)
	}
	// 2000 admitted; the refill (1/s) may have added a few.
	if tokens < 1_000_000-2000 || tokens > 1_000_000-2000+60 {
		t.Fatalf("bucket holds %v after Close, want about %d", tokens, 1_000_000-2000)
	}
}

// TestSlotGroupsRefundOnPartialRefusal plays Redis Cluster's case on one
// Redis: the rules of a request live in different slots, so each slot group
// is its own script call; when one group refuses, the groups that debited
// are refunded and the request is refused. Settlement then carries one
// marker per group, so a retry is applied once in every slot.
func TestSlotGroupsRefundOnPartialRefusal(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	a := window("a-tokens", TotalTokens, 1_000_000, time.Hour)
	b := Rule{Name: "b-bucket", Unit: PromptTokens, Algorithm: TokenBucket, Limit: 1_000_000, Rate: 0.001, Exact: true}
	z := window("z-requests", Requests, 2, time.Hour)
	l := newTestLimiter(t, c, &Rules{Shared: []Rule{a, b, z}}, WithPrefix(prefix))
	l.cluster = true // group by slot as on a Cluster
	ka, kb, kz := sharedKey(prefix, a, Scope{}), sharedKey(prefix, b, Scope{}), sharedKey(prefix, z, Scope{})
	if keySlot(ka) == keySlot(kz) || keySlot(kb) == keySlot(kz) {
		t.Fatalf("the test needs rules in different slots: %d %d %d", keySlot(ka), keySlot(kb), keySlot(kz))
	}
	req := Request{ID: "r1", Tenant: "t", Model: "m", PromptTokens: 100, CompletionTokens: 50}
	tk := mustAdmit(t, l, req)
	mustAdmit(t, l, Request{ID: "r2", Tenant: "t", Model: "m", PromptTokens: 100, CompletionTokens: 50})
	if got := windowUsed(t, c, ka); got != 300 {
		t.Fatalf("a after two admissions: %d", got)
	}
	d := mustAdmit(t, l, Request{Tenant: "t", Model: "m", PromptTokens: 100, CompletionTokens: 50}).Decision
	if d.Allowed || d.Rule != "z-requests" {
		t.Fatalf("third admission: %+v, want z-requests to refuse", d)
	}
	if got := windowUsed(t, c, ka); got != 300 {
		t.Fatalf("a holds %d after a refusal in another slot, want 300 (refunded)", got)
	}
	tokens, _ := c.HGet(context.Background(), kb, "t").Float64()
	if tokens < 1_000_000-200-1 || tokens > 1_000_000-200+1 {
		t.Fatalf("b holds %v after a refusal in another slot, want about %d", tokens, 1_000_000-200)
	}
	copyOfTicket := tk
	for _, s := range []*Ticket{&tk, &copyOfTicket} {
		if err := s.Settle(context.Background(), Usage{PromptTokens: 40, CompletionTokens: 10}); err != nil {
			t.Fatal(err)
		}
	}
	if got := windowUsed(t, c, ka); got != 200 {
		t.Fatalf("a after settling (twice) 150 -> 50: %d, want 200", got)
	}
	tokens, _ = c.HGet(context.Background(), kb, "t").Float64()
	if tokens < 1_000_000-140-1 || tokens > 1_000_000-140+1 {
		t.Fatalf("b after settling (twice) 100 -> 40 prompt tokens: %v, want about %d", tokens, 1_000_000-140)
	}
}

// refusalCacheLimiter is the limiter of the refusal cache's tests —
// tenants' 100 tokens an hour, refusals remembered for a minute — and a
// request of acme's for n prompt tokens to it.
func refusalCacheLimiter(t *testing.T) (*Limiter, func(n int64) Decision) {
	t.Helper()
	tpm := window("tpm", TotalTokens, 100, time.Hour)
	l := newTestLimiter(t, testClient(t, ""), &Rules{Default: TenantRules{Rules: []Rule{tpm}}}, WithPrefix(testPrefix(t)), WithRefusalCache(time.Minute))
	return l, func(n int64) Decision {
		return mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: n}).Decision
	}
}

// TestRefusalCacheSparesRedis: right after Redis refused a request, one at
// least as large is refused from memory; a smaller one still asks Redis.
func TestRefusalCacheSparesRedis(t *testing.T) {
	l, req := refusalCacheLimiter(t)
	if d := req(90); !d.Allowed {
		t.Fatalf("90 of 100: %+v", d)
	}
	if d := req(50); d.Allowed || d.Path != PathRedis {
		t.Fatalf("50 more: %+v, want Redis to refuse", d)
	}
	trips := l.Stats().RedisRoundTrips
	if d := req(60); d.Allowed || d.Path != PathCached || d.Rule != "tpm" || d.RetryAfter <= 0 {
		t.Fatalf("60 more right after: %+v, want a refusal from memory", d)
	}
	if got := l.Stats().RedisRoundTrips; got != trips {
		t.Fatalf("a cached refusal cost %d round trips", got-trips)
	}
	if d := req(5); !d.Allowed || d.Path != PathRedis {
		t.Fatalf("5 more (smaller than the refused 50): %+v, want Redis to admit", d)
	}
}

// TestSetRulesReturnsLeasesAndKeepsCounters: a policy reload hands the
// old rules' leases back, and a rule whose identity did not change keeps
// counting in the same Redis key.
func TestSetRulesReturnsLeasesAndKeepsCounters(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	busy := Rule{Name: "platform-tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: 10 * time.Minute}
	l := newTestLimiter(t, c, &Rules{Shared: []Rule{busy}}, WithPrefix(prefix), WithLeaseTTL(time.Hour))
	var admitted int64
	for range 3000 {
		mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 10})
		admitted += 10
	}
	if l.Stats().LeaseHits == 0 {
		t.Fatal("no lease was taken")
	}
	key := sharedKey(prefix, busy, Scope{})
	raised := busy
	raised.Limit = 20_000_000
	if err := l.SetRules(&Rules{Shared: []Rule{raised}}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 10*time.Second, "the old rules' lease back in Redis", func() bool {
		return windowUsed(t, c, key) == admitted
	})
	d := mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 10}).Decision
	if !d.Allowed || d.Tokens.Limit != 20_000_000 {
		t.Fatalf("after the reload: %+v", d)
	}
	if got := windowUsed(t, c, key); got < admitted+10 {
		t.Fatalf("the same rule counts on in its key: %d, want at least %d", got, admitted+10)
	}
}

// TestCachedRefusalKeepsRedisRetryAfter: a refusal answered from memory
// tells the client what Redis told it, when the request fits again (not
// when the cache entry ends, which is sooner), and how much is available,
// so Retry-After does not invite retries that are sure to fail.
func TestCachedRefusalKeepsRedisRetryAfter(t *testing.T) {
	_, req := refusalCacheLimiter(t)
	if d := req(90); !d.Allowed {
		t.Fatalf("90 of 100: %+v", d)
	}
	fromRedis := req(50)
	if fromRedis.Allowed || fromRedis.Path != PathRedis || fromRedis.RetryAfter < 59*time.Minute {
		t.Fatalf("50 more: %+v, want Redis to refuse until the hour's first granule leaves", fromRedis)
	}
	cached := req(60)
	if cached.Allowed || cached.Path != PathCached {
		t.Fatalf("60 more right after: %+v, want a refusal from memory", cached)
	}
	if cached.RetryAfter > fromRedis.RetryAfter || cached.RetryAfter < fromRedis.RetryAfter-time.Minute {
		t.Fatalf("cached refusal: retry after %s, Redis said %s", cached.RetryAfter, fromRedis.RetryAfter)
	}
	if cached.Available != fromRedis.Available || cached.Tokens.Remaining != fromRedis.Available {
		t.Fatalf("cached refusal: available %d (headroom %+v), Redis said %d", cached.Available, cached.Tokens, fromRedis.Available)
	}
	rec := httptest.NewRecorder()
	WriteRefusal(rec, cached)
	if secs, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || secs < 3500 {
		t.Fatalf("Retry-After %q for a refusal Redis gave about an hour", rec.Header().Get("Retry-After"))
	}
}

// TestRecentMatchSets: a lease hit finds its request shape's match set in
// generation.recent, without the shard's lock; a set the idle sweep
// removed is not handed out from there again, and two shapes that share a
// recent slot each get their own set.
func TestRecentMatchSets(t *testing.T) {
	l := newTestLimiter(t, testClient(t, ""), benchRules(false), WithPrefix(testPrefix(t)))
	g := l.gen.Load()
	now := l.now()
	req := Request{Tenant: "tenant-a", Model: "gpt-4o"}
	first, err := l.lookup(g, &req, now)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := l.lookup(g, &req, now); again != first {
		t.Fatal("the same shape got another match set")
	}
	var k reqKey
	g.shape(&req, &k)
	h := g.hash(&k)
	if g.recent[(h>>32)&(recentSlots-1)].Load() != first {
		t.Fatal("the match set is not in recent")
	}
	// A set in the same recent slot with another shape is not taken for it.
	other := Request{Tenant: "tenant-b", Model: "gpt-4o"}
	g.recent[(h>>32)&(recentSlots-1)].Store(first)
	if s, _ := l.lookup(g, &other, now); s == first {
		t.Fatal("another shape's match set was handed out from recent")
	}
	// Swept as idle: gone from the shard, and not handed out from recent.
	g.recent[(h>>32)&(recentSlots-1)].Store(first)
	l.sweep(now + int64(time.Hour))
	if !first.gone.Load() {
		t.Fatal("a swept match set is not marked gone")
	}
	if s, _ := l.lookup(g, &req, now+int64(time.Hour)); s == first || s == nil {
		t.Fatal("a swept match set was handed out from recent")
	}
}
