package admission

import (
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// sharedKey and tenantKey name the Redis key of a rule instance.
func sharedKey(prefix string, r Rule, s Scope) string {
	return instanceKey(prefix, &rule{Rule: r, shared: true}, s)
}

func tenantKey(prefix string, r Rule, tenant string, s Scope) string {
	s.Tenant = tenant
	return instanceKey(prefix, &rule{Rule: r}, s)
}

// windowUsed sums a sliding window's granules as Redis holds them.
func windowUsed(t testing.TB, c redis.UniversalClient, key string) int64 {
	t.Helper()
	h, err := c.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, v := range h {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s holds %q", key, v)
		}
		sum += n
	}
	return sum
}

func window(name string, unit Unit, limit int64, w time.Duration) Rule {
	return Rule{Name: name, Unit: unit, Algorithm: SlidingWindow, Limit: limit, Window: w, Exact: true}
}

func TestGlobalRuleRefusesBeforeTenantRuleDebits(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	global := window("platform-rpm", Requests, 3, time.Hour)
	tenantTPM := window("tpm", TotalTokens, 1_000_000, time.Hour)
	l := newTestLimiter(t, c, &Rules{
		Shared:  []Rule{global},
		Tenants: map[string]TenantRules{"acme": {Rules: []Rule{tenantTPM}}},
	}, WithPrefix(prefix))
	req := Request{Tenant: "acme", Model: "gpt-4o", PromptTokens: 100, CompletionTokens: 20}
	for i := range 3 {
		if tk := mustAdmit(t, l, req); !tk.Allowed() {
			t.Fatalf("admission %d refused: %+v", i, tk.Decision)
		}
	}
	tk := tenantKey(prefix, tenantTPM, "acme", Scope{})
	if got := windowUsed(t, c, tk); got != 360 {
		t.Fatalf("tenant window holds %d after 3 admissions of 120 tokens, want 360", got)
	}
	d := mustAdmit(t, l, req).Decision
	if d.Allowed || d.Rule != "platform-rpm" || !d.Scope.Global() || d.Limit != 3 || d.Unit != Requests || d.Path != PathRedis {
		t.Fatalf("4th admission: %+v, want a refusal by the global rule platform-rpm", d)
	}
	if d.RetryAfter <= 0 || d.RetryAfter > time.Hour+time.Minute {
		t.Fatalf("retry after %s, want within the hour window", d.RetryAfter)
	}
	if got := windowUsed(t, c, tk); got != 360 {
		t.Fatalf("tenant window holds %d after the global refusal, want 360 (no debit)", got)
	}
	// A tenant whose first request meets an exhausted global rule never
	// gets a counter at all.
	other := mustAdmit(t, l, Request{Tenant: "beta", Model: "gpt-4o", PromptTokens: 5}).Decision
	if other.Allowed || other.Rule != "platform-rpm" {
		t.Fatalf("beta: %+v", other)
	}
	if n, _ := c.Exists(context.Background(), tenantKey(prefix, tenantTPM, "beta", Scope{})).Result(); n != 0 {
		t.Fatal("a refused request created the tenant rule's counter")
	}
}

// TestRefusalLeavesNoDebitAnywhere: whichever rule refuses, every other
// rule's state in Redis is byte for byte what it was.
func TestRefusalLeavesNoDebitAnywhere(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	bucket := Rule{Name: "upstream-tpm", Scope: Scope{Upstream: "openai-main"}, Unit: TotalTokens, Algorithm: TokenBucket, Limit: 10_000, Rate: 0.001, Exact: true}
	perUser := window("per-user", PromptTokens, 1000, time.Hour)
	perUser.Scope = Scope{User: Each}
	keyRule := window("per-key-rpm", Requests, 2, time.Hour)
	keyRule.Scope = Scope{Key: Each}
	l := newTestLimiter(t, c, &Rules{
		Shared:  []Rule{bucket},
		Tenants: map[string]TenantRules{"acme": {Rules: []Rule{perUser, keyRule}}},
	}, WithPrefix(prefix))
	base := Request{Tenant: "acme", Model: "gpt-4o", Upstream: "openai-main", User: "bob", Key: "k1", PromptTokens: 300, CompletionTokens: 100}
	keys := []string{
		sharedKey(prefix, bucket, Scope{Upstream: "openai-main"}),
		tenantKey(prefix, perUser, "acme", Scope{User: "bob"}),
		tenantKey(prefix, keyRule, "acme", Scope{Key: "k1"}),
	}
	snapshot := func() []map[string]string {
		var out []map[string]string
		for _, k := range keys {
			h, err := c.HGetAll(context.Background(), k).Result()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, h)
		}
		return out
	}
	same := func(a, b []map[string]string) bool {
		for i := range a {
			if !maps.Equal(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	for range 2 {
		if d := mustAdmit(t, l, base).Decision; !d.Allowed {
			t.Fatalf("refused: %+v", d)
		}
	}
	cases := []struct {
		name string
		req  Request
		rule string
	}{
		{"last rule (per key) refuses", base, "per-key-rpm"},
		{"middle rule (per user) refuses", func() Request { r := base; r.Key = "k2"; r.PromptTokens = 500; return r }(), "per-user"},
		{"first rule (upstream bucket) refuses", func() Request { r := base; r.Key = "k3"; r.User = "carol"; r.CompletionTokens = 9_500; return r }(), "upstream-tpm"},
	}
	for _, tc := range cases {
		before := snapshot()
		d := mustAdmit(t, l, tc.req).Decision
		if d.Allowed || d.Rule != tc.rule {
			t.Fatalf("%s: %+v", tc.name, d)
		}
		if after := snapshot(); !same(before, after) {
			t.Fatalf("%s: Redis changed on a refusal:\nbefore %v\nafter  %v", tc.name, before, after)
		}
	}
}

func TestSettleChargesAndRefundsExactlyOnce(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	tpm := window("tpm", TotalTokens, 100_000, time.Hour)
	bucket := Rule{Name: "bucket", Unit: CompletionTokens, Algorithm: TokenBucket, Limit: 100_000, Rate: 0.0001, Exact: true}
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{tpm, bucket}}}, WithPrefix(prefix))
	wk := tenantKey(prefix, tpm, "acme", Scope{})
	bk := tenantKey(prefix, bucket, "acme", Scope{})
	tokens := func() float64 {
		v, err := c.HGet(context.Background(), bk, "t").Float64()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	ctx := context.Background()

	tk := mustAdmit(t, l, Request{ID: "req-1", Tenant: "acme", Model: "m", PromptTokens: 100, CompletionTokens: 400})
	if got := windowUsed(t, c, wk); got != 500 {
		t.Fatalf("window after admission = %d, want the 500 estimated", got)
	}
	copyOfTicket := tk // a second holder of the same request id
	if err := tk.Settle(ctx, Usage{PromptTokens: 100, CompletionTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if got := windowUsed(t, c, wk); got != 150 {
		t.Fatalf("window after refund = %d, want 150", got)
	}
	afterRefund := tokens()
	if afterRefund < 100_000-50-1 || afterRefund > 100_000-50+1 {
		t.Fatalf("bucket after refund = %v, want about %d", afterRefund, 100_000-50)
	}
	if err := tk.Settle(ctx, Usage{PromptTokens: 100, CompletionTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if err := copyOfTicket.Settle(ctx, Usage{PromptTokens: 100, CompletionTokens: 50}); err != nil {
		t.Fatal(err)
	}
	if got := windowUsed(t, c, wk); got != 150 {
		t.Fatalf("window after settling twice more = %d, want still 150", got)
	}

	// A charge: the call spent more than estimated.
	tk2 := mustAdmit(t, l, Request{ID: "req-2", Tenant: "acme", Model: "m", PromptTokens: 100, CompletionTokens: 100})
	retry := tk2
	if err := tk2.Settle(ctx, Usage{PromptTokens: 120, CompletionTokens: 880}); err != nil {
		t.Fatal(err)
	}
	if err := retry.Settle(ctx, Usage{PromptTokens: 120, CompletionTokens: 880}); err != nil {
		t.Fatal(err)
	}
	if got := windowUsed(t, c, wk); got != 150+1000 {
		t.Fatalf("window after charge = %d, want %d", got, 150+1000)
	}
	if got := tokens(); got > afterRefund-880+1 || got < afterRefund-880-1 {
		t.Fatalf("bucket after charge = %v, want about %v", got, afterRefund-880)
	}
	// A refused ticket settles to nothing.
	var refused Ticket
	if err := refused.Settle(ctx, Usage{PromptTokens: 5}); err != nil {
		t.Fatal(err)
	}
}

func TestNewRequiresContextTimeouts(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := New(c, &Rules{}); err == nil {
		t.Fatal("New accepted a client that ignores context deadlines")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := New(ring, &Rules{}); err == nil {
		t.Fatal("New accepted a Ring")
	}
}

func TestInvalidRulesAreRejected(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	_, err := New(c, &Rules{Shared: []Rule{{Name: "x", Unit: Requests, Algorithm: TokenBucket, Limit: 5}}})
	if err == nil || !strings.Contains(err.Error(), `rule "x": rate`) {
		t.Fatalf("New = %v, want an error naming the rate", err)
	}
}

// TestReserveIsForCriticalAndHigh: normal and low priority requests leave a
// rule's reserve alone; high priority ones may use it. The decisions carry
// the headroom the rate-limit headers are written from.
func TestReserveIsForCriticalAndHigh(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	rpm := window("rpm", Requests, 10, time.Hour)
	rpm.Exact = false
	rpm.Reserve = 0.2
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{rpm}}}, WithPrefix(prefix))
	var last Decision
	for i := range 8 {
		last = mustAdmit(t, l, Request{Tenant: "acme", Model: "m", Priority: schemas.PriorityLow}).Decision
		if !last.Allowed {
			t.Fatalf("low priority request %d refused: %+v", i, last)
		}
	}
	if last.Requests.Limit != 10 || last.Requests.Remaining != 2 || last.Requests.Reset <= 0 {
		t.Fatalf("headroom after 8 of 10: %+v", last.Requests)
	}
	d := mustAdmit(t, l, Request{Tenant: "acme", Model: "m"}).Decision
	if d.Allowed || d.Rule != "rpm" || d.Available != 0 {
		t.Fatalf("normal priority into the reserve: %+v", d)
	}
	h := http.Header{}
	WriteHeaders(h, d)
	if h.Get(ratelimit.HeaderLimitRequests) != "10" || h.Get(ratelimit.HeaderRemainingRequests) != "0" || h.Get(ratelimit.HeaderResetRequests) == "0s" {
		t.Fatalf("headers of the refusal: %v", h)
	}
	for i := range 2 {
		if d := mustAdmit(t, l, Request{Tenant: "acme", Model: "m", Priority: schemas.PriorityHigh}).Decision; !d.Allowed {
			t.Fatalf("high priority request %d refused: %+v", i, d)
		}
	}
	if d := mustAdmit(t, l, Request{Tenant: "acme", Model: "m", Priority: schemas.PriorityCritical}).Decision; d.Allowed {
		t.Fatalf("an 11th request of 10 was admitted: %+v", d)
	}
}
