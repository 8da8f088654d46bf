package frontend

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// TestLimiterAdmitterRefusesBeforeTheCall: the gateway's admission hook
// backed by sdk/go/admission on the real Redis admits within a
// tokens-per-minute window, refuses the request that does not fit with
// 429, the rule named and Retry-After, and a settlement refunds what the
// estimate over-debited so the next request fits again.
func TestLimiterAdmitterRefusesBeforeTheCall(t *testing.T) {
	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	rules := &admission.Rules{Default: admission.TenantRules{Rules: []admission.Rule{{Name: "tpm", Unit: admission.TotalTokens,
		Algorithm: admission.SlidingWindow, Limit: 1000, Window: time.Minute, Exact: true}}}}
	l, err := admission.New(c, rules, admission.WithPrefix(itest.Unique(t, "sluice_test_gwadm:")), admission.WithMaxWait(2*time.Second),
		admission.WithRefusalCache(0)) // every decision from Redis: the refund must be seen at once
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	a := LimiterAdmitter{L: l}
	req := func(id string) AdmitRequest {
		return AdmitRequest{Tenant: "acme", Model: "gpt-4o-mini", APIKeyID: "k1", Endpoint: "/v1/chat/completions",
			EstimatePrompt: 500, EstimateCompletion: 200, Estimated: true, EventID: id}
	}
	first := a.Admit(context.Background(), req("c1"))
	if first.Refused != nil || first.Settle == nil || len(first.Limits) == 0 {
		t.Fatalf("first call: %+v", first)
	}
	second := a.Admit(context.Background(), req("c2"))
	if second.Refused == nil || second.Refused.Status != http.StatusTooManyRequests || second.Refused.RetryAfter <= 0 {
		t.Fatalf("second call (700 + 700 > 1000 tokens) not refused with 429 and Retry-After: %+v", second)
	}
	if msg := second.Refused.Error.Message; msg == "" || !strings.Contains(msg, "tpm") {
		t.Fatalf("refusal %q does not name the rule", msg)
	}
	// The first call used 100 tokens, not 700: settled, 900 are free.
	first.Settle(Settlement{Usage: middleware.Usage{PromptTokens: 80, CompletionTokens: 20}, Status: 200})
	if third := a.Admit(context.Background(), req("c3")); third.Refused != nil {
		t.Fatalf("after the settlement refunded 600 tokens the next call is still refused: %+v", third.Refused)
	}
}
