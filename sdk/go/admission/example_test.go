package admission_test

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/admission"
)

// A gateway handler: admit before the call, answer a refusal with a 429
// naming the rule, put the rate-limit headers on the answer, settle the
// estimate with the real usage.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	rules := &admission.Rules{
		Shared: []admission.Rule{{Name: "platform-tpm", Unit: admission.TotalTokens,
			Algorithm: admission.SlidingWindow, Limit: 5_000_000, Window: time.Minute}},
		Default: admission.TenantRules{FailMode: admission.FailOpen, Rules: []admission.Rule{{Name: "rpm",
			Unit: admission.Requests, Algorithm: admission.TokenBucket, Limit: 60, Rate: 1}}},
	}
	limiter, err := admission.New(client, rules, admission.WithRegisterer(prometheus.DefaultRegisterer), admission.WithGatewayCount(4))
	if err != nil {
		panic(err)
	}
	defer limiter.Close()

	http.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		ticket, err := limiter.Admit(r.Context(), admission.Request{
			ID: r.Header.Get("X-Request-Id"), Tenant: r.Header.Get("X-Tenant"), Model: "gpt-4o",
			Key: r.Header.Get("X-Key-Id"), Endpoint: r.URL.Path, PromptTokens: 900, CompletionTokens: 256,
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !ticket.Allowed() {
			admission.WriteRefusal(w, ticket.Decision)
			return
		}
		admission.WriteHeaders(w.Header(), ticket.Decision)
		// ... call the upstream, stream the answer ...
		_ = ticket.Settle(context.WithoutCancel(r.Context()), admission.Usage{PromptTokens: 870, CompletionTokens: 198})
	})
}
