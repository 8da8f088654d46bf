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
