package middleware_test

import (
	"log/slog"
	"net/http"

	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// A gateway keeps one Checker running and wraps its proxy handler.
func ExampleNew() {
	rdb := redisconn.NewClient(redisconn.Defaults())
	c, err := checker.New(rdb, checker.DefaultConfig(), slog.Default())
	if err != nil {
		panic(err)
	}
	// In a real gateway: go c.Run(ctx), and c.Ready on the readiness probe.
	proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { /* forward to the LLM provider */ })
	handler := middleware.New(c, middleware.HeaderIdentify("X-Sluice-Tenant", "X-Sluice-Model", "X-Sluice-Key"))(proxy)
	_ = handler
}

// With an Estimator the middleware emits an estimate of each call before
// the proxy runs and its settlement after; the proxy reports the usage the
// provider answered with.
func ExampleWithEstimates() {
	rdb := redisconn.NewClient(redisconn.Defaults())
	c, err := checker.New(rdb, checker.DefaultConfig(), slog.Default())
	if err != nil {
		panic(err)
	}
	est, err := estimate.New(estimate.DefaultConfig())
	if err != nil {
		panic(err)
	}
	var em middleware.Emitter // an *emitter.Emitter in a real gateway
	proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ... forward r to the provider, relay its answer, read its usage ...
		if call := middleware.CallFrom(r.Context()); call != nil {
			call.SetProvider("openai")
			call.Report(middleware.Usage{PromptTokens: 812, CompletionTokens: 145})
		}
	})
	handler := middleware.New(c, middleware.HeaderIdentify("X-Sluice-Tenant", "X-Sluice-Model", "X-Sluice-Key"),
		middleware.WithEmitter(em, "gw-1"), middleware.WithEstimates(est))(proxy)
	_ = handler
}
