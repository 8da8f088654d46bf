package gateway

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/policy"
)

// openUsageAPI builds GET /v1/usage (internal/usageapi) when it is
// enabled, on the gateway's own policy pw: the quotas of a tenant without
// use yet are those the gateway admits under, the admin API's records
// laid over the file when it follows them. It returns a nil API when
// disabled.
func openUsageAPI(cfg Config, env platform.Env, pw *policy.Watcher) (api *usageapi.API, closeAPI func()) {
	if !cfg.UsageAPI.Enabled {
		return nil, func() {}
	}
	a := usageapi.OpenOn(cfg.UsageAPI, env, pw, env.Logger.With("component", "usage-api"))
	return a, a.Close
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
