package middleware

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// admissionLimiter is a limiter on the real Redis, under a prefix of the
// test's own, with a tenant rule of two requests per minute (exact: no
// leases, so every admission is a Redis decision).
func admissionLimiter(t *testing.T) *admission.Limiter {
	t.Helper()
	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	rules := &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{{Name: "rpm", Unit: admission.Requests,
		Algorithm: admission.SlidingWindow, Limit: 2, Window: time.Minute, Exact: true}}}}
	l, err := admission.New(c, rules, admission.WithPrefix(itest.Unique(t, "sluice_test_mwadm:")), admission.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestAdmissionBeforeTheCall: admitted requests carry OpenAI's rate-limit
// headers and are metered; the request over the rule is refused before the
// handler runs with 429, Retry-After and a body naming the rule, and is
// emitted as one refusal event; a request the flags refuse never reaches
// admission (it costs no Redis call).
func TestAdmissionBeforeTheCall(t *testing.T) {
	s, est, l := &emittertest.Recorder{}, newEstimator(t), admissionLimiter(t)
	calls := 0
	h := metered(t, fixed{"blocked": {Outcome: checker.Refused, Scope: flags.AllModels,
		Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: now.Add(time.Hour)}}}, est, s,
		func(w http.ResponseWriter, r *http.Request) {
			calls++
			CallFrom(r.Context()).Report(Usage{PromptTokens: 10, CompletionTokens: 5})
		}, WithAdmission(l))

	for i := 1; i <= 2; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, chatRequest(context.Background(), "acme"))
		if rec.Code != http.StatusOK || rec.Header().Get("x-ratelimit-limit-requests") != "2" ||
			rec.Header().Get("x-ratelimit-remaining-requests") != []string{"", "1", "0"}[i] || rec.Header().Get("x-ratelimit-reset-requests") == "" {
			t.Fatalf("request %d: %d, headers %v", i, rec.Code, rec.Header())
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, chatRequest(context.Background(), "acme"))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("third request: %d, headers %v", rec.Code, rec.Header())
	}
	var body struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || !strings.Contains(body.Error.Message, "rpm") {
		t.Fatalf("refusal body %s (%v): must name the rule", rec.Body.String(), err)
	}
	if calls != 2 {
		t.Fatalf("the handler ran %d times, want 2: a refused request must not reach the upstream", calls)
	}
	evs := s.Events()
	if len(evs) != 5 {
		t.Fatalf("%d events, want 2 estimates, 2 settlements and 1 refusal: %+v", len(evs), evs)
	}
	last := evs[4]
	if last.Outcome != schemas.OutcomeRejected || last.Status != http.StatusTooManyRequests || last.Attributes["rule"] != "rpm" || last.PromptTokens != 0 {
		t.Fatalf("refusal event %+v", last)
	}
	if err := last.Validate(); err != nil {
		t.Fatalf("refusal event invalid: %v", err)
	}

	before := l.Stats().RedisRoundTrips
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, chatRequest(context.Background(), "blocked"))
	if rec.Code != http.StatusForbidden {
		t.Fatalf("blacklisted tenant: %d", rec.Code)
	}
	if got := l.Stats().RedisRoundTrips; got != before {
		t.Fatalf("a flag refusal made %d Redis round trips; it must make none", got-before)
	}
}

// limiterWith is a limiter on the real Redis, under a prefix of the
// test's own, with rules for every tenant.
func limiterWith(t *testing.T, rules ...admission.Rule) *admission.Limiter {
	t.Helper()
	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	l, err := admission.New(c, &admission.Rules{Default: admission.TenantRules{Rules: rules}},
		admission.WithPrefix(itest.Unique(t, "sluice_test_mwadm:")), admission.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// callerIdentity reads the caller from the test's headers, user and
// priority included.
var callerIdentity = IdentityHeaders{Tenant: "X-Tenant", Model: "X-Model", Key: "X-Key", User: "X-User", Priority: "X-Priority"}.Identify()

func callerRequest(user string, prio schemas.Priority, body string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-Model", "gpt-4o-mini")
	req.Header.Set("X-Key", "key-1")
	req.Header.Set("X-User", user)
	req.Header.Set("X-Priority", string(prio))
	return req
}

// TestAdmissionCountsTheCallersUserAndPriority: the user and priority the
// gateway's Identify returns reach admission, so a rule scoped to each
// user limits each user apart, and a rule's reserve is open to high
// requests and closed to normal ones; the events carry both.
func TestAdmissionCountsTheCallersUserAndPriority(t *testing.T) {
	serve := func(t *testing.T, l *admission.Limiter, s *emittertest.Recorder, calls *int) func(user string, prio schemas.Priority) *httptest.ResponseRecorder {
		h := New(fixed{}, callerIdentity, WithClock(func() time.Time { return now }), WithEmitter(s, "gw-1"),
			WithEstimates(newEstimator(t)), WithAdmission(l))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			*calls++
			CallFrom(r.Context()).Report(Usage{PromptTokens: 10, CompletionTokens: 5})
		}))
		return func(user string, prio schemas.Priority) *httptest.ResponseRecorder {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, callerRequest(user, prio, chatBody))
			return rec
		}
	}
	t.Run("user-scoped rule", func(t *testing.T) {
		s, calls := &emittertest.Recorder{}, 0
		do := serve(t, limiterWith(t, admission.Rule{Name: "per-user-rpm", Scope: admission.Scope{User: admission.Each},
			Unit: admission.Requests, Algorithm: admission.SlidingWindow, Limit: 1, Window: time.Minute, Exact: true}), s, &calls)
		if rec := do("alice", ""); rec.Code != http.StatusOK {
			t.Fatalf("alice's first call: %d %s", rec.Code, rec.Body)
		}
		if rec := do("alice", ""); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "per-user-rpm") {
			t.Fatalf("alice's second call in the minute: %d %s; want 429 naming per-user-rpm", rec.Code, rec.Body)
		}
		if rec := do("bob", ""); rec.Code != http.StatusOK {
			t.Fatalf("bob's first call: %d %s; alice's limit is not his", rec.Code, rec.Body)
		}
		if calls != 2 {
			t.Fatalf("the handler ran %d times, want 2", calls)
		}
		for _, ev := range s.Events() {
			if ev.User != "alice" && ev.User != "bob" {
				t.Errorf("event without its user: %+v", ev)
			}
		}
	})
	t.Run("reserve", func(t *testing.T) {
		s, calls := &emittertest.Recorder{}, 0
		// 4 a minute, half of them reserved for high and critical.
		do := serve(t, limiterWith(t, admission.Rule{Name: "rpm", Unit: admission.Requests, Algorithm: admission.SlidingWindow,
			Limit: 4, Window: time.Minute, Exact: true, Reserve: 0.5}), s, &calls)
		for i, c := range []struct {
			prio schemas.Priority
			want int
		}{{"", 200}, {schemas.PriorityNormal, 200}, {schemas.PriorityLow, 429}, {"", 429},
			{schemas.PriorityHigh, 200}, {schemas.PriorityCritical, 200}, {schemas.PriorityHigh, 429}} {
			if rec := do("", c.prio); rec.Code != c.want {
				t.Fatalf("call %d (priority %q): %d %s, want %d", i+1, c.prio, rec.Code, rec.Body, c.want)
			}
		}
		evs := s.Events()
		if last := evs[len(evs)-1]; last.Priority != schemas.PriorityHigh || last.Outcome != schemas.OutcomeRejected {
			t.Errorf("the last refusal event %+v, want priority high", last)
		}
	})
}

// TestAdmissionRefusesAnEstimateNearTheLargestCount: a max_tokens near
// 2^63 (alone, times n, or beyond int64) is an estimate above any rule's
// limit, refused before the handler runs, never a wrapped-around debit
// of a token or so; and it debits nothing, so the next ordinary call is
// admitted.
func TestAdmissionRefusesAnEstimateNearTheLargestCount(t *testing.T) {
	s, calls := &emittertest.Recorder{}, 0
	l := limiterWith(t, admission.Rule{Name: "tpm", Unit: admission.TotalTokens, Algorithm: admission.SlidingWindow,
		Limit: 100_000, Window: time.Minute, Exact: true})
	h := New(fixed{}, callerIdentity, WithClock(func() time.Time { return now }), WithEmitter(s, "gw-1"),
		WithEstimates(newEstimator(t)), WithAdmission(l))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		CallFrom(r.Context()).Report(Usage{PromptTokens: 10, CompletionTokens: 5})
	}))
	const msgs = `"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{` + msgs + `,"max_tokens":9223372036854775807}`,
		`{` + msgs + `,"max_tokens":9223372036854775807,"n":128}`,
		`{` + msgs + `,"max_completion_tokens":9223372036854775806,"n":2}`,
		`{` + msgs + `,"max_tokens":18446744073709551617}`,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, callerRequest("", "", body))
		if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "tpm") {
			t.Fatalf("%s: %d %s; want 429 naming tpm", body, rec.Code, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, callerRequest("", "", chatBody))
	if rec.Code != http.StatusOK || calls != 1 {
		t.Fatalf("an ordinary call after the refusals: %d %s, handler ran %d times; want 200 and once", rec.Code, rec.Body, calls)
	}
}

// TestAdmissionUserFromEventFields: a gateway whose Identify names no
// user but whose WithEventFields sets one (as gateways did before the
// Identity had a user) gets that user counted by admission too; when the
// Identity names one, the Identity's wins in admission and in the events.
func TestAdmissionUserFromEventFields(t *testing.T) {
	s := &emittertest.Recorder{}
	l := limiterWith(t, admission.Rule{Name: "per-user-rpm", Scope: admission.Scope{User: admission.Each},
		Unit: admission.Requests, Algorithm: admission.SlidingWindow, Limit: 1, Window: time.Minute, Exact: true})
	h := New(fixed{}, callerIdentity, WithClock(func() time.Time { return now }), WithEmitter(s, "gw-1"), WithEstimates(newEstimator(t)),
		WithAdmission(l), WithEventFields(func(r *http.Request, ev *schemas.UsageEvent) { ev.User = "carol" }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i, c := range []struct {
		user string
		want int
	}{{"", 200}, {"", 429}, {"dave", 200}} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, callerRequest(c.user, "", chatBody))
		if rec.Code != c.want {
			t.Fatalf("call %d (identity user %q): %d %s, want %d", i+1, c.user, rec.Code, rec.Body, c.want)
		}
	}
	evs := s.Events()
	if first, last := evs[0], evs[len(evs)-1]; first.User != "carol" || last.User != "dave" {
		t.Fatalf("events' users %q … %q, want carol (WithEventFields) … dave (the Identity)", first.User, last.User)
	}
}

// TestAdmissionPricesCallsForACostRule: with WithCost, a rule counting
// cost ($0.15 here, in millionths) is debited each call's worst case —
// its max_tokens at the price — and settled at what the answer cost, so
// two calls that could each cost $0.10 pass (each really cost $0.0005),
// and a third whose worst case would cross what is left is refused
// before the handler runs, naming the rule.
func TestAdmissionPricesCallsForACostRule(t *testing.T) {
	l := limiterWith(t, admission.Rule{Name: "key-budget", Scope: admission.Scope{Key: admission.Each}, Unit: admission.Cost,
		Algorithm: admission.SlidingWindow, Limit: 150_000, Window: time.Hour, Exact: true})
	perCompletionToken := func(model string, u Usage) int64 { return u.CompletionTokens * 100 } // $100 per million
	calls := 0
	h := New(fixed{}, callerIdentity, WithClock(func() time.Time { return now }), WithEmitter(&emittertest.Recorder{}, "gw-1"),
		WithEstimates(newEstimator(t)), WithAdmission(l), WithCost(perCompletionToken))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		CallFrom(r.Context()).Report(Usage{PromptTokens: 10, CompletionTokens: 5})
	}))
	do := func(maxTokens string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, callerRequest("", "", `{"model":"gpt-4o-mini","max_tokens":`+maxTokens+`,"messages":[{"role":"user","content":"hi"}]}`))
		return rec
	}
	for i := range 2 {
		if rec := do("1000"); rec.Code != http.StatusOK {
			t.Fatalf("call %d of at most $0.10: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	if rec := do("1500"); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "key-budget") {
		t.Fatalf("a call of at most $0.15 with $0.149 left: %d %s; want 429 naming key-budget", rec.Code, rec.Body)
	}
	if calls != 2 {
		t.Fatalf("the handler ran %d times, want 2", calls)
	}
}
