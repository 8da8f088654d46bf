package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// Config is the gateway service's section of the Sluice configuration
// (services.gateway).
type Config struct {
	Listen             string        `yaml:"listen" help:"address of the OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/models)"`
	Name               string        `yaml:"name" help:"the gateway field of the usage events this gateway emits (names the instance or fleet)"`
	KeysFile           string        `yaml:"keys_file" help:"YAML file of tenant API keys (id, sha256, tenant, user, models, priority, may_set_priority, class), re-read when it changes"`
	KeysReloadInterval time.Duration `yaml:"keys_reload_interval" help:"how often the keys file is checked for changes"`

	Upstreams []Upstream `yaml:"upstreams" help:"the providers, each serving the models it lists; several for one model balance by weight and fail over"`

	MaxBodyBytes        int64 `yaml:"max_body_bytes" help:"largest request body in bytes (413 above)"`
	MaxResponseBytes    int64 `yaml:"max_response_bytes" help:"largest non-streamed answer searched for usage, in bytes; a longer one is relayed whole and settled at its estimate"`
	MaxStreamEventBytes int   `yaml:"max_stream_event_bytes" help:"largest streamed (SSE) event held and searched for usage, in bytes; a longer one is relayed as it arrives"`
	MaxAttempts         int   `yaml:"max_attempts" help:"upstreams tried for one request: a connection failure, a timeout before the answer, 429 or 5xx moves on to the next upstream of the model"`
	RequestIDMemory     int   `yaml:"request_id_memory" help:"x-request-id values remembered per gateway to catch a client reusing one (its event then gets a fresh id, the request id an attribute); 0 remembers none"`

	// FrontEnd is the HTTP server, shutdown, flags, admission and usage
	// settings the gateway shares with services/authz; usage adds
	// estimate_events to the sink.
	frontend.FrontEnd[UsageConfig] `yaml:",inline"`

	SharedUpstreams SharedUpstreamsConfig `yaml:"shared_upstreams"`
	Deferred        deferred.Config       `yaml:"deferred"`
	// UsageAPI is GET /v1/usage for the callers' tenants.
	UsageAPI usageapi.Config `yaml:"usage_api"`
}

// Upstream is one provider endpoint.
type Upstream struct {
	Name       string   `yaml:"name" help:"names the upstream in usage events (provider), logs and metrics"`
	BaseURL    string   `yaml:"base_url" help:"the provider's OpenAI-compatible base URL with its version path, e.g. https://api.openai.com/v1"`
	APIKeyEnv  string   `yaml:"api_key_env" help:"environment variable holding the provider's API key (never the key itself in the configuration)"`
	APIKeyFile string   `yaml:"api_key_file" help:"file holding the provider's API key; read at start"`
	Models     []string `yaml:"models" help:"models this upstream serves: exact names, or patterns with * and ? (gpt-4o*); an exact name wins over a pattern"`
	Weight     int      `yaml:"weight" help:"share of the model's requests this upstream gets among the healthy ones (default 1)"`

	Timeout               time.Duration `yaml:"timeout" help:"the whole call, a stream to its end (default 10m)"`
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout" help:"time to the provider's answer headers, the first token of a stream (default 60s)"`
	ConnectTimeout        time.Duration `yaml:"connect_timeout" help:"time to connect, TLS included (default 5s)"`
}

// UsageConfig says where usage events go, and whether calls are metered
// with an estimate before they run.
type UsageConfig struct {
	frontend.EventSink `yaml:",inline"`
	EstimateEvents     bool `yaml:"estimate_events" help:"emit an estimate of each call before it runs (settled with the real usage after), so quotas see long calls while they run"`
}

// Defaults for an upstream's zero fields.
const (
	DefaultUpstreamTimeout        = 10 * time.Minute
	DefaultResponseHeaderTimeout  = 60 * time.Second
	DefaultUpstreamConnectTimeout = 5 * time.Second
)

// DefaultConfig returns the defaults. The write timeout covers a whole
// streamed answer, so it is as long as an upstream's default timeout.
func DefaultConfig() Config {
	fe := frontend.DefaultFrontEnd(UsageConfig{EventSink: frontend.DefaultEventSink(), EstimateEvents: true})
	fe.HTTP = httpserver.Timeouts{ReadHeader: 10 * time.Second, Read: time.Minute, Write: 11 * time.Minute, Idle: 2 * time.Minute}
	fe.ShutdownTimeout = 10 * time.Second
	return Config{
		Listen:              "127.0.0.1:8090",
		Name:                "sluice-gateway",
		KeysReloadInterval:  5 * time.Second,
		MaxBodyBytes:        4 << 20,
		MaxResponseBytes:    32 << 20,
		MaxStreamEventBytes: 1 << 20,
		MaxAttempts:         2,
		RequestIDMemory:     100_000,
		FrontEnd:            fe,
		SharedUpstreams:     defaultSharedUpstreams(),
		Deferred:            deferred.DefaultConfig(),
		UsageAPI:            usageapi.DefaultConfig(),
	}
}

// Validate checks every field and names the limit it crossed. It also
// checks that each upstream's credential is where it says, without
// keeping it.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	const p = "services.gateway."
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad(p+"listen: %q is not host:port", c.Listen)
	}
	if c.Name == "" || len(c.Name) > schemas.MaxStringLen {
		bad(p+"name: must be 1..%d bytes", schemas.MaxStringLen)
	}
	if err := c.SharedUpstreams.Validate(p + "shared_upstreams."); err != nil {
		errs = append(errs, err)
	}
	if c.UsageAPI.Enabled {
		if err := c.UsageAPI.Validate(p + "usage_api"); err != nil {
			errs = append(errs, err)
		}
	}
	if c.KeysFile == "" {
		bad(p + "keys_file: is required (the tenants' API keys; see services/gateway/README.md)")
	}
	if c.KeysReloadInterval < 100*time.Millisecond {
		bad(p+"keys_reload_interval: %s is below the minimum 100ms", c.KeysReloadInterval)
	}
	if len(c.Upstreams) == 0 {
		bad(p + "upstreams: at least one upstream is required (name, base_url, models)")
	}
	names := map[string]bool{}
	for i, u := range c.Upstreams {
		where := fmt.Sprintf(p+"upstreams[%d]", i)
		if u.Name == "" || len(u.Name) > schemas.MaxStringLen {
			bad("%s.name: must be 1..%d bytes", where, schemas.MaxStringLen)
		} else if names[u.Name] {
			bad("%s.name: %q appears twice; names must be unique", where, u.Name)
		}
		names[u.Name] = true
		if b, err := url.Parse(u.BaseURL); err != nil || (b.Scheme != "http" && b.Scheme != "https") || b.Host == "" {
			bad("%s.base_url: %q is not an http(s) URL", where, u.BaseURL)
		}
		if u.APIKeyEnv != "" && u.APIKeyFile != "" {
			bad("%s: set api_key_env or api_key_file, not both", where)
		}
		if _, err := u.credential(); err != nil {
			bad("%s.%w", where, err)
		}
		if len(u.Models) == 0 {
			bad(`%s.models: list the models this upstream serves (models: [gpt-4o, "gpt-4o-mini*"]), or ["*"] for every model`, where)
		}
		for j, m := range u.Models {
			if m == "" || len(m) > schemas.MaxModelLen {
				bad("%s.models[%d]: must be 1..%d bytes", where, j, schemas.MaxModelLen)
			} else if _, err := path.Match(m, ""); err != nil {
				bad("%s.models[%d]: %q is not a valid pattern: %v", where, j, m, err)
			}
		}
		if u.Weight < 0 || u.Weight > 1000 {
			bad("%s.weight: %d is outside 0..1000 (0 means 1)", where, u.Weight)
		}
		if u.Timeout < 0 || u.Timeout > time.Hour || u.ResponseHeaderTimeout < 0 || u.ConnectTimeout < 0 {
			bad("%s: timeouts must be 0 (default) or positive, timeout at most 1h", where)
		}
		if t := u.withDefaults(); t.ResponseHeaderTimeout > t.Timeout {
			bad("%s.response_header_timeout: %s is longer than its timeout (%s)", where, t.ResponseHeaderTimeout, t.Timeout)
		}
	}
	if c.MaxBodyBytes < 1024 || c.MaxBodyBytes > 1<<30 {
		bad(p+"max_body_bytes: %d is outside 1024..1073741824", c.MaxBodyBytes)
	}
	if c.MaxResponseBytes < 1024 || c.MaxResponseBytes > 1<<30 {
		bad(p+"max_response_bytes: %d is outside 1024..1073741824", c.MaxResponseBytes)
	}
	if c.MaxStreamEventBytes < 1024 || c.MaxStreamEventBytes > 64<<20 {
		bad(p+"max_stream_event_bytes: %d is outside 1024..67108864", c.MaxStreamEventBytes)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > 10 {
		bad(p+"max_attempts: %d is outside 1..10", c.MaxAttempts)
	}
	if c.RequestIDMemory < 0 || c.RequestIDMemory > 10_000_000 {
		bad(p+"request_id_memory: %d is outside 0..10000000", c.RequestIDMemory)
	}
	if err := c.FrontEnd.Validate(p); err != nil {
		errs = append(errs, err)
	}
	if err := c.Deferred.Validate(p + "deferred."); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// withDefaults fills an upstream's zero fields.
func (u Upstream) withDefaults() Upstream {
	if u.Weight == 0 {
		u.Weight = 1
	}
	if u.Timeout == 0 {
		u.Timeout = DefaultUpstreamTimeout
	}
	if u.ResponseHeaderTimeout == 0 {
		u.ResponseHeaderTimeout = min(DefaultResponseHeaderTimeout, u.Timeout)
	}
	if u.ConnectTimeout == 0 {
		u.ConnectTimeout = DefaultUpstreamConnectTimeout
	}
	return u
}

// credential reads the upstream's API key from its environment variable
// or file; none configured is an empty key (an upstream on a private
// network that needs none).
func (u Upstream) credential() (string, error) {
	return frontend.Secret("api_key_env", u.APIKeyEnv, "api_key_file", u.APIKeyFile)
}
