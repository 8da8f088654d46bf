package gateway

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/resource"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// Config is the gateway service's section of the Sluice configuration
// (services.gateway).
type Config struct {
	Listen string `yaml:"listen" help:"address of the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models)"`
	Name   string `yaml:"name" help:"the gateway field of the usage events this gateway emits (names the instance or fleet)"`

	MaxBodyBytes        int64 `yaml:"max_body_bytes" help:"largest request body in bytes (413 above)"`
	MaxResponseBytes    int64 `yaml:"max_response_bytes" help:"largest non-streamed answer searched for usage, in bytes; a longer one is relayed whole and settled at its estimate"`
	MaxStreamEventBytes int   `yaml:"max_stream_event_bytes" help:"largest streamed (SSE) event held and searched for usage, in bytes; a longer one is relayed as it arrives"`
	MaxAttempts         int   `yaml:"max_attempts" help:"upstreams tried for one request: a connection failure, a timeout before the answer, 429 or 5xx moves on to the next upstream of the model"`

	// FollowAdmin makes the gateway follow the admin topic (topics.admin)
	// for the API keys, tenants and plans made through the enforcer's
	// admin API, beside tenant_keys.file and policy.file
	// (docs/controlplane.md).
	FollowAdmin bool `yaml:"follow_admin" help:"follow the admin topic (topics.admin) for the API keys (accepted beside tenant_keys.file), tenants and plans (laid over policy.file) managed through the enforcer's admin API; needs kafka and signal_auth. Off: tenant_keys.file and policy.file only"`

	// FrontEnd is the HTTP server, shutdown, flags, admission and usage
	// settings the gateway shares with services/authz; usage adds
	// estimate_events to the sink.
	frontend.FrontEnd[UsageConfig] `yaml:",inline"`

	SharedUpstreams SharedUpstreamsConfig `yaml:"shared_upstreams"`
	Deferred        deferred.Config       `yaml:"deferred"`
	// ResourceDegradation adds the process's CPU and memory to what the
	// upstreams' degradation levels follow (docs/priority.md).
	ResourceDegradation resource.Config `yaml:"resource_degradation"`
	// UsageAPI is GET /v1/usage for the callers' tenants.
	UsageAPI usageapi.Config `yaml:"usage_api"`
}

// UsageConfig says where usage events go, and whether calls are metered
// with an estimate before they run.
type UsageConfig struct {
	frontend.EventSink `yaml:",inline"`
	EstimateEvents     bool `yaml:"estimate_events" help:"emit an estimate of each call before it runs (settled with the real usage after), so quotas see long calls while they run"`
}

// DefaultConfig returns the defaults. The write timeout covers a whole
// streamed answer, so it is as long as an upstream's default timeout.
func DefaultConfig() Config {
	fe := frontend.DefaultFrontEnd(UsageConfig{EventSink: frontend.DefaultEventSink(), EstimateEvents: true})
	fe.HTTP = httpserver.Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Write: 11 * time.Minute, Idle: 2 * time.Minute}
	fe.ShutdownTimeout = 10 * time.Second
	return Config{
		Listen:              "127.0.0.1:8090",
		Name:                "sluice-gateway",
		MaxBodyBytes:        4 << 20,
		MaxResponseBytes:    32 << 20,
		MaxStreamEventBytes: 1 << 20,
		MaxAttempts:         2,
		FrontEnd:            fe,
		SharedUpstreams:     defaultSharedUpstreams(),
		Deferred:            deferred.DefaultConfig(),
		ResourceDegradation: resource.DefaultConfig(),
		UsageAPI:            usageapi.DefaultConfig(),
	}
}

// Validate checks every field and names the limit it crossed. It also
// checks that each upstream's credential is where it says, without
// keeping it.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen: %q is not host:port", c.Listen)
	}
	if c.Name == "" || len(c.Name) > schemas.MaxStringLen {
		bad("name: must be 1..%d bytes", schemas.MaxStringLen)
	}
	if err := c.SharedUpstreams.Validate("shared_upstreams."); err != nil {
		errs = append(errs, err)
	}
	if c.UsageAPI.Enabled {
		if err := c.UsageAPI.Validate("usage_api"); err != nil {
			errs = append(errs, err)
		}
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 1<<30 {
		bad("max_body_bytes: %d is outside 1024..1073741824", c.MaxBodyBytes)
	}
	if c.MaxResponseBytes < 1024 || c.MaxResponseBytes > 1<<30 {
		bad("max_response_bytes: %d is outside 1024..1073741824", c.MaxResponseBytes)
	}
	if c.MaxStreamEventBytes < 1024 || c.MaxStreamEventBytes > 64<<20 {
		bad("max_stream_event_bytes: %d is outside 1024..67108864", c.MaxStreamEventBytes)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 10 {
		bad("max_attempts: %d is outside 1..10", c.MaxAttempts)
	}
	if err := c.FrontEnd.Validate(""); err != nil {
		errs = append(errs, err)
	}
	if err := c.Deferred.Validate("deferred."); err != nil {
		errs = append(errs, err)
	}
	if err := c.ResourceDegradation.Validate("resource_degradation."); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
