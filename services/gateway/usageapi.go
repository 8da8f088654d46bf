package gateway

import (
	"context"
	"net/http"

	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
)

// openUsageAPI builds GET /v1/usage (internal/usageapi) when it
// is enabled, and follows the policy file until ctx ends or closeAPI is
// called. It returns a nil API when disabled.
func openUsageAPI(ctx context.Context, cfg Config, env platform.Env) (api *usageapi.API, closeAPI func(), err error) {
	if !cfg.UsageAPI.Enabled {
		return nil, func() {}, nil
	}
	a, err := usageapi.Open(cfg.UsageAPI, env, env.Logger.With("component", "usage-api"))
	if err != nil {
		return nil, nil, err
	}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(fctx) }()
	return a, func() { stop(); <-done; a.Close() }, nil
}

// usageTenant authenticates a usage API call by tenant key: a caller reads
// its own tenant's usage, and no other.
func (s *Server) usageTenant(r *http.Request) (string, int, string) {
	c := s.callerOf(r)
	if c == nil {
		return "", http.StatusUnauthorized, badKeyMessage
	}
	return c.Tenant, 0, ""
}
