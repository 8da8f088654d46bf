package middleware_test

import (
	"log/slog"
	"net/http"

	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/gateway/middleware"
	"github.com/sluicehq/sluice/platform/redisconn"
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
