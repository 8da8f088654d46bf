package admission

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

func TestKeySlotMatchesRedisCluster(t *testing.T) {
	// Values from CLUSTER KEYSLOT.
	for key, want := range map[string]uint16{"foo": 12182, "bar": 5061, "123456789": 12739, "{foo}.x": 12182} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if keySlot("{user1000}.following") != keySlot("{user1000}.followers") {
		t.Error("keys with one hash tag must share a slot")
	}
	// An empty tag does not count: the whole key is hashed.
	if keySlot("{}a") == keySlot("{}b") && keySlot("{}c") == keySlot("{}a") {
		t.Error("empty hash tags must hash the whole key")
	}
}

func TestInstanceKeysAreDistinctAndTagged(t *testing.T) {
	perUser := &rule{Rule: Rule{Name: "per|user", Scope: Scope{Tenant: Each, User: Each}, Unit: TotalTokens, Algorithm: SlidingWindow}, shared: true}
	k1 := instanceKey("p:", perUser, Scope{Tenant: "a", User: "b|user=c"})
	k2 := instanceKey("p:", perUser, Scope{Tenant: "a|user=b", User: "c"})
	if k1 == k2 {
		t.Fatalf("two scopes share the key %s", k1)
	}
	if want := "p:{s:per%7Cuser|tenant=a|user=b%7Cuser%3Dc}:sliding_window:total_tokens"; k1 != want {
		t.Fatalf("key = %s, want %s", k1, want)
	}
	evil := instanceKey("p:", perUser, Scope{Tenant: "}{x", User: "y"})
	if strings.Count(evil, "{") != 1 || strings.Count(evil, "}") != 1 {
		t.Fatalf("braces in values must not move the hash tag: %s", evil)
	}
	own := &rule{Rule: Rule{Name: "tpm", Unit: Requests, Algorithm: TokenBucket}}
	if a, b := instanceKey("p:", own, Scope{Tenant: "acme"}), instanceKey("p:", own, Scope{Tenant: "beta"}); a == b || !strings.HasPrefix(a, "p:{t:acme:tpm}") {
		t.Fatalf("tenant rules: %s %s", a, b)
	}
	shared := &rule{Rule: Rule{Name: "tpm", Unit: Requests, Algorithm: TokenBucket}, shared: true}
	if instanceKey("p:", shared, Scope{}) == instanceKey("p:", own, Scope{Tenant: ""}) {
		t.Fatal("a shared rule and a tenant rule of the same name share a key")
	}
}

func TestRuleMatching(t *testing.T) {
	req := &Request{Tenant: "acme", Model: "gpt-4o", User: "bob", Endpoint: "/v1/chat/completions"}
	for _, tc := range []struct {
		scope Scope
		want  bool
	}{
		{Scope{}, true},
		{Scope{Upstream: "gpt-4o"}, true}, // no upstream: the model
		{Scope{Upstream: "openai-main"}, false},
		{Scope{User: Each}, true},
		{Scope{Key: Each}, false}, // the request has no key
		{Scope{Tenant: "acme", Model: "gpt-4o"}, true},
		{Scope{Tenant: "beta"}, false},
		{Scope{Endpoint: "/v1/embeddings"}, false},
	} {
		r := &rule{Rule: Rule{Scope: tc.scope}, shared: true}
		if got := r.appliesTo(req); got != tc.want {
			t.Errorf("scope %+v applies = %v, want %v", tc.scope, got, tc.want)
		}
	}
	r := &rule{Rule: Rule{Scope: Scope{User: Each, Model: "gpt-4o"}}, shared: true}
	if s := r.instanceScope(req, "acme"); s != (Scope{User: "bob", Model: "gpt-4o"}) {
		t.Fatalf("instance scope = %+v", s)
	}
}

func TestNeedIsAtLeastOne(t *testing.T) {
	for _, tc := range []struct {
		u          Unit
		p, c, cost int64
		want       int64
	}{{Requests, 500, 500, 7, 1}, {PromptTokens, 0, 9, 7, 1}, {CompletionTokens, 3, 9, 7, 9}, {TotalTokens, 3, 9, 7, 12},
		{Cost, 3, 9, 2_500_000, 2_500_000}, {Cost, 3, 9, 0, 1}} {
		if got := need(tc.u, amounts{tc.p, tc.c, tc.cost}); got != tc.want {
			t.Errorf("need(%s, %d, %d, cost %d) = %d, want %d", tc.u, tc.p, tc.c, tc.cost, got, tc.want)
		}
	}
}

func TestRuleValidationNamesFieldAndLimit(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{Rule{Name: "w", Unit: Requests, Algorithm: SlidingWindow, Limit: 5, Window: 0}, `rule "w": window: 0s is outside 1ms..744h0m0s`},
		{Rule{Name: "b", Unit: Requests, Algorithm: TokenBucket, Limit: 5, Rate: -1}, `rule "b": rate: -1 is outside (0, 1e+12]`},
		{Rule{Name: "l", Unit: Requests, Algorithm: TokenBucket, Limit: -1, Rate: 1}, `rule "l": limit: -1 is outside 0..1125899906842624`},
		{Rule{Name: "u", Algorithm: TokenBucket, Limit: 1, Rate: 1}, `rule "u": unit: must be`},
		{Rule{Name: "r", Unit: Requests, Algorithm: TokenBucket, Limit: 1, Rate: 1, Reserve: 1}, `rule "r": reserve: 1 is outside 0..0.9`},
	} {
		err := tc.r.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.r, err, tc.want)
		}
	}
	rs := &Rules{Tenants: map[string]TenantRules{"acme": {Rules: []Rule{
		{Name: "x", Unit: Requests, Algorithm: TokenBucket, Limit: 1, Rate: 1, Scope: Scope{Tenant: "beta"}},
		{Name: "x", Unit: Requests, Algorithm: TokenBucket, Limit: 1, Rate: 1},
	}, FailMode: "sideways"}}}
	err := rs.Validate()
	for _, want := range []string{`tenant acme: rule "x": scope.tenant`, `rule "x": name is used twice`, `fail mode "sideways"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Rules.Validate = %v, want %q", err, want)
		}
	}
}

func TestHeadersOnAllowedAnswer(t *testing.T) {
	h := http.Header{}
	WriteHeaders(h, Decision{Allowed: true,
		Requests: Headroom{Limit: 60, Remaining: 59, Reset: time.Second},
		Tokens:   Headroom{Limit: 150000, Remaining: 149984, Reset: 6 * time.Minute}})
	want := map[string]string{
		"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "1s",
		"x-ratelimit-limit-tokens": "150000", "x-ratelimit-remaining-tokens": "149984", "x-ratelimit-reset-tokens": "6m0s",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	only := http.Header{}
	WriteHeaders(only, Decision{Allowed: true, Tokens: Headroom{Limit: 10, Remaining: 3}})
	if only.Get("x-ratelimit-limit-requests") != "" || only.Get("x-ratelimit-limit-tokens") != "10" {
		t.Fatalf("only a tokens rule applied: %v", only)
	}
}

func TestRefusalAnswerNamesTheRule(t *testing.T) {
	d := Decision{Path: PathRedis, Rule: "tenant-tpm", Scope: Scope{Tenant: "acme", Model: "gpt-4o"}, Unit: TotalTokens,
		Algorithm: SlidingWindow, Limit: 100000, Window: time.Minute, Requested: 5000, Available: 1200,
		RetryAfter: 3200 * time.Millisecond, Tokens: Headroom{Limit: 100000, Remaining: 1200, Reset: 3200 * time.Millisecond}}
	rec := httptest.NewRecorder()
	WriteRefusal(rec, d)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "4" ||
		rec.Header().Get("x-ratelimit-remaining-tokens") != "1200" || rec.Header().Get("x-ratelimit-reset-tokens") != "3.2s" {
		t.Fatalf("answer: %d %v", rec.Code, rec.Header())
	}
	var body refusalBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	e := body.Error
	if e.Type != "tokens" || e.Code != "rate_limit_exceeded" || e.Sluice == nil || e.Sluice.Rule != "tenant-tpm" ||
		e.Sluice.Scope["tenant"] != "acme" || e.Sluice.Scope["model"] != "gpt-4o" || e.Sluice.Limit != 100000 ||
		e.Sluice.Unit != "total_tokens" || e.Sluice.WindowSeconds != 60 || e.Sluice.RetryAfterSeconds != 4 {
		t.Fatalf("body: %s", rec.Body)
	}
	if !strings.Contains(e.Message, "tenant-tpm (tenant=acme, model=gpt-4o)") || !strings.Contains(e.Message, "try again in 3.2s") {
		t.Fatalf("message: %s", e.Message)
	}
	if !strings.Contains(rec.Body.String(), `"param":null`) {
		t.Fatalf("OpenAI's error object has param: null: %s", rec.Body)
	}

	tooBig := d
	tooBig.Never, tooBig.RetryAfter = true, 0
	rec = httptest.NewRecorder()
	WriteRefusal(rec, tooBig)
	if rec.Header().Get("Retry-After") != "" || !strings.Contains(rec.Body.String(), "Request too large") {
		t.Fatalf("a request that can never fit: %v %s", rec.Header(), rec.Body)
	}
}

// refusalBody is the 429 body with its sluice member decoded.
type refusalBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    string  `json:"code"`
		Sluice  *Detail `json:"sluice"`
	} `json:"error"`
}

// localLimiter returns a Limiter with no Redis, for the local limiter.
func localLimiter(gateways int) *Limiter {
	o := defaultOptions()
	o.gateways = gateways
	m, _ := newMetrics(nil) // nothing to register: cannot fail
	l := &Limiter{o: o, m: m, leased: map[*instance]struct{}{}}
	l.pend.init(o.maxPending)
	return l
}

func TestLocalLimiterDividesByGatewayCount(t *testing.T) {
	l := localLimiter(4)
	win := newInstance(&rule{Rule: Rule{Name: "w", Unit: Requests, Algorithm: SlidingWindow, Limit: 100, Window: time.Minute}, gran: 1000}, "k", Scope{}, 0)
	now := int64(time.Hour)
	for i := range 25 {
		if ok, _, _ := win.localTake(l, 1, now); !ok {
			t.Fatalf("take %d of 25 refused", i)
		}
	}
	ok, avail, retry := win.localTake(l, 1, now)
	if ok || avail != 0 || retry <= 0 || retry > time.Minute+time.Second {
		t.Fatalf("26th take: ok %v avail %d retry %s, want a refusal at 100/4", ok, avail, retry)
	}
	if p := win.takePending(); p != 25 {
		t.Fatalf("pending %d, want the 25 local debits", p)
	}

	bucket := newInstance(&rule{Rule: Rule{Name: "b", Unit: TotalTokens, Algorithm: TokenBucket, Limit: 1000, Rate: 100}}, "k2", Scope{}, 0)
	if ok, _, _ := bucket.localTake(l, 250, now); !ok {
		t.Fatal("a bucket of 1000/4 refused 250")
	}
	if ok, _, retry := bucket.localTake(l, 25, now); ok || retry != time.Second {
		t.Fatalf("empty local bucket: ok %v retry %s, want refusal with 1s (25 at 100/4 per second)", ok, retry)
	}
	if ok, _, _ := bucket.localTake(l, 25, now+int64(time.Second)); !ok {
		t.Fatal("the local bucket did not refill")
	}
	bucket.localAdjust(l, -100, now+int64(time.Second))
	if p := bucket.takePending(); p != 250+25-100 {
		t.Fatalf("pending %d, want 175", p)
	}
}

func TestLocalLimiterStartsFromRedisWord(t *testing.T) {
	l := localLimiter(2)
	in := newInstance(&rule{Rule: Rule{Name: "w", Unit: Requests, Algorithm: SlidingWindow, Limit: 100, Window: time.Minute}, gran: 1000}, "k", Scope{}, 0)
	in.noteReply(10, 1000, 0) // Redis: 10 left
	n := 0
	for {
		ok, _, _ := in.localTake(l, 1, int64(time.Hour))
		if !ok {
			break
		}
		n++
	}
	if n != 5 {
		t.Fatalf("admitted %d locally, want 5 (Redis's 10 left shared by 2 gateways)", n)
	}
}

// A second Limiter registering on the same registry is refused with an
// error that says how to tell the two apart, instead of panicking the
// process that builds it; wrapped with a label of their own (as a gateway
// and authz in one process are), both register.
func TestSecondLimiterOnOneRegistryIsAnError(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer client.Close()
	rules := &Rules{Default: TenantRules{Rules: []Rule{{Name: "rpm", Unit: Requests, Algorithm: TokenBucket, Limit: 60, Rate: 1}}}}
	reg := prometheus.NewRegistry()
	as := func(service string) Option {
		return WithRegisterer(prometheus.WrapRegistererWith(prometheus.Labels{"service": service}, reg))
	}
	first, err := New(client, rules, as("gateway"))
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	second, err := New(client, rules, as("gateway"))
	if err == nil {
		second.Close()
		t.Fatal("a second Limiter registered the same series on one registry")
	}
	if !strings.Contains(err.Error(), "WrapRegistererWith") {
		t.Errorf("error %q does not say how to register two Limiters", err)
	}
	other, err := New(client, rules, as("authz"))
	if err != nil {
		t.Fatalf("a Limiter with a label of its own: %v", err)
	}
	other.Close()
}

// leaseAtPace feeds an instance of r admissions of n units at perSecond
// (on the instance's own clock, no waiting) as the Redis path does, and
// returns the lease the last one would ask for.
func leaseAtPace(l *Limiter, r Rule, n int64, perSecond float64) int64 {
	c := compileRule(r, true, l.o.leaseFraction, l.m)
	in := newInstance(c, "k", Scope{}, 1)
	now := int64(1)
	var want int64
	for range 50 {
		now += int64(float64(time.Second) / perSecond)
		want = in.leaseWant(l, n, now)
		in.units.Add(n)
	}
	return want
}

// TestLeasesAtAFewRequestsPerSecond: an instance a gateway admits a few
// requests a second on, too slow to fill a lease in the 100 ms horizon,
// still takes one, sized from the lease's life; slower ones run exact.
func TestLeasesAtAFewRequestsPerSecond(t *testing.T) {
	l := localLimiter(1)
	rpm := Rule{Name: "rpm", Unit: Requests, Algorithm: SlidingWindow, Limit: 60_000, Window: time.Minute}
	tpm := Rule{Name: "tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: time.Minute}
	for _, tc := range []struct {
		what      string
		r         Rule
		n         int64
		perSecond float64
		lease     bool
	}{
		{"requests rule, 3/s", rpm, 1, 3, false},
		{"requests rule, 5/s", rpm, 1, 5, true},
		{"requests rule, 12/s", rpm, 1, 12, true},
		{"tokens rule, 1/s of 500", tpm, 500, 1, false},
		{"tokens rule, 3/s of 500", tpm, 500, 3, true},
		{"tokens rule, 12/s of 500", tpm, 500, 12, true},
	} {
		w := leaseAtPace(l, tc.r, tc.n, tc.perSecond)
		if (w > 0) != tc.lease {
			t.Errorf("%s: lease of %d, want a lease: %v", tc.what, w, tc.lease)
		}
		if w > 0 && w < 2*tc.n {
			t.Errorf("%s: lease of %d holds less than two requests of %d", tc.what, w, tc.n)
		}
	}
}

// TestLocalLimiterLastsUntilRedisSpeaksAgain: handing the local debits to
// a flush does not refill the local limiter; a new word from Redis (an
// admission it answered) is what the next outage starts from.
func TestLocalLimiterLastsUntilRedisSpeaksAgain(t *testing.T) {
	l := localLimiter(2)
	in := newInstance(&rule{Rule: Rule{Name: "w", Unit: Requests, Algorithm: SlidingWindow, Limit: 100, Window: time.Minute}, gran: 1000}, "k", Scope{}, 0)
	in.noteReply(10, 1000, 0)
	now := int64(time.Hour)
	take := func() (n int) {
		for {
			if ok, _, _ := in.localTake(l, 1, now); !ok {
				return n
			}
			n++
		}
	}
	if n := take(); n != 5 {
		t.Fatalf("admitted %d locally, want 5", n)
	}
	for range 3 {
		in.takePending() // a flush that Redis refused
		if n := take(); n != 0 {
			t.Fatalf("admitted %d more after a flush was tried, want 0", n)
		}
	}
	in.noteReply(40, 1000, now) // Redis answered an admission: 40 left
	if n := take(); n != 20 {
		t.Fatalf("admitted %d from Redis's new word, want 20", n)
	}
}
