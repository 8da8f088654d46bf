// Package usageapi is GET /v1/usage, the tenants' own view of their quotas:
// each quota and limit with what the period used, what remains, when it
// resets and when it is predicted to run out, plus the flags stopping the
// tenant — what a tenant's developers need to pace themselves, without asking
// the platform team. `sluice gateway` serves it to callers with a tenant
// key, ingest to callers with an ingest key, each authenticating by its own
// keys file and naming the tenant (Authenticator).
//
// The answer is a quotastatus.Status in JSON, read through the same
// quotastatus.Service as the operators' console, so the two agree by
// construction; docs/usage-api.md documents it with examples.
//
// It never holds up the host service: ClickHouse is connected on the first
// call (chconn.Lazy), so a gateway starts and proxies while ClickHouse is
// down and only /v1/usage answers 503. Answers are cached per tenant for
// cache_ttl, and at most max_concurrent reads run at once (a call beyond
// them is answered 503 with Retry-After at once, never queued), so
// tenants polling it cannot load ClickHouse more than that.
package usageapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/quotastatus/chstate"
	"github.com/sluicehq/sluice/internal/quotastatus/redisflags"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// Path is the route of the usage API.
const Path = "/v1/usage"

// Config is the usage API's section of a service's configuration
// (services.gateway.usage_api, services.ingest.usage_api).
type Config struct {
	Enabled       bool          `yaml:"enabled" help:"serve GET /v1/usage: the caller's tenant's quotas, use, remaining, reset times and predicted exhaustion (docs/usage-api.md), read from ClickHouse and the Redis flags on demand"`
	CacheTTL      time.Duration `yaml:"cache_ttl" help:"how long an answer is reused for the same tenant (bounds the reads tenants polling the API cause)"`
	Timeout       time.Duration `yaml:"timeout" help:"deadline of the ClickHouse and Redis reads of one answer"`
	MaxConcurrent int           `yaml:"max_concurrent" help:"reads running at once; a call beyond them is answered 503 with Retry-After"`
}

// DefaultConfig returns the defaults: enabled, one-second cache.
func DefaultConfig() Config {
	return Config{Enabled: true, CacheTTL: time.Second, Timeout: 5 * time.Second, MaxConcurrent: 4}
}

// Validate names each bad field (under prefix, e.g. services.gateway.usage_api)
// and its limit.
func (c Config) Validate(prefix string) error {
	var errs []error
	if c.CacheTTL < 0 || c.CacheTTL > time.Minute {
		errs = append(errs, fmt.Errorf("%s.cache_ttl: %v is outside 0s..1m", prefix, c.CacheTTL))
	}
	if c.Timeout < 100*time.Millisecond || c.Timeout > time.Minute {
		errs = append(errs, fmt.Errorf("%s.timeout: %v is outside 100ms..1m", prefix, c.Timeout))
	}
	if c.MaxConcurrent < 1 || c.MaxConcurrent > 1000 {
		errs = append(errs, fmt.Errorf("%s.max_concurrent: %d is outside 1..1000", prefix, c.MaxConcurrent))
	}
	return errors.Join(errs...)
}

// Authenticator decides whose usage a request may read: the tenant, or a
// refusal to answer (status 401 or 403 and a message saying what to send).
type Authenticator func(r *http.Request) (tenant string, status int, message string)

// Reader is what the API reads a tenant's status from;
// *quotastatus.Service is the real one.
type Reader interface {
	Tenant(ctx context.Context, tenant string) (quotastatus.Status, error)
}

// API serves GET /v1/usage.
type API struct {
	cfg    Config
	reader Reader
	log    *slog.Logger
	sem    chan struct{}
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]cached
	// closers release what Open built.
	closers []func()
	follow  func(ctx context.Context) error
}

type cached struct {
	body []byte
	at   time.Time
}

// maxCached bounds the cache; when full it is emptied (answers are at most
// cache_ttl old anyway).
const maxCached = 10_000

// New returns an API reading through reader.
func New(cfg Config, reader Reader, log *slog.Logger) *API {
	log = cmp.Or(log, slog.Default())
	return &API{cfg: cfg, reader: reader, log: log, sem: make(chan struct{}, max(cfg.MaxConcurrent, 1)),
		now: time.Now, cache: map[string]cached{}}
}

// Open builds the API on the deployment's ClickHouse, Redis and policy
// (env: its flags under redis.key_prefix, the quotas a tenant has not used
// yet this period from the policy file, when there is one). Nothing is
// dialled until the first call; a policy file that does not parse is an
// error. Run follows the policy file; Close releases the connections.
func Open(cfg Config, env platform.Env, log *slog.Logger) (*API, error) {
	if env.Policy.File == "" {
		return OpenOn(cfg, env, nil, log), nil
	}
	pw, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log)
	if err != nil {
		return nil, fmt.Errorf("policy.file: %w", err)
	}
	a := OpenOn(cfg, env, pw, log)
	a.follow = pw.Run
	return a, nil
}

// OpenOn is Open on the host's own policy watcher pw (nil: none), which
// the host follows: a gateway that lays the admin API's tenants and plans
// over its policy answers with their quotas too. Run does nothing.
func OpenOn(cfg Config, env platform.Env, pw *policy.Watcher, log *slog.Logger) *API {
	ch := chconn.NewLazy(env.ClickHouse)
	rdb := redisconn.NewClient(env.Redis)
	svc := NewService(ch, rdb, env.Redis.Prefix(redisconn.FlagKeys), pw)
	a := New(cfg, svc, log)
	a.closers = []func(){ch.Close, func() { _ = rdb.Close() }}
	return a
}

// NewService returns the quotastatus.Service of a deployment: quota state
// from ClickHouse through ch, flags from rdb under keyPrefix, the policy
// of pw (nil: none). The console builds its own the same way.
func NewService(ch *chconn.Lazy, rdb redis.UniversalClient, keyPrefix string, pw *policy.Watcher) *quotastatus.Service {
	var cur func() *policy.Policy
	if pw != nil {
		cur = pw.Current
	}
	return quotastatus.New(LazyState{ch}, redisflags.New(rdb, keyPrefix), cur)
}

// LazyState is the ClickHouse StateStore on a connection opened on first
// use.
type LazyState struct{ CH *chconn.Lazy }

// Quotas implements quotastatus.StateStore.
func (l LazyState) Quotas(ctx context.Context, tenant string, now time.Time) ([]quotastatus.TenantQuota, error) {
	conn, err := l.CH.Get(ctx)
	if err != nil {
		return nil, err
	}
	return chstate.New(conn).Quotas(ctx, tenant, now)
}

// Refused implements quotastatus.StateStore.
func (l LazyState) Refused(ctx context.Context, tenant string, since time.Time) (map[string]int64, error) {
	conn, err := l.CH.Get(ctx)
	if err != nil {
		return nil, err
	}
	return chstate.New(conn).Refused(ctx, tenant, since)
}

// Run follows the policy file until ctx ends (nothing to do without one).
func (a *API) Run(ctx context.Context) error {
	if a.follow == nil {
		<-ctx.Done()
		return nil
	}
	return a.follow(ctx)
}

// Close releases the connections Open made.
func (a *API) Close() {
	for _, c := range a.closers {
		c()
	}
}

// Handler returns the handler of GET Path, authenticating with auth.
func (a *API) Handler(auth Authenticator) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "GET "+Path+" is the only method of the usage API.", 0)
			return
		}
		tenant, status, msg := auth(r)
		if status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			}
			writeError(w, status, "invalid_request_error", "invalid_api_key", msg, 0)
			return
		}
		body, err := a.answer(r.Context(), tenant)
		switch {
		case errors.Is(err, errBusy):
			writeError(w, http.StatusServiceUnavailable, "server_error", "busy",
				fmt.Sprintf("The usage API is answering %d calls at once (usage_api.max_concurrent); retry in a second.", a.cfg.MaxConcurrent), time.Second)
			return
		case errors.Is(err, quotastatus.ErrBadTenant):
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_tenant", err.Error(), 0)
			return
		case err != nil:
			a.log.Warn("usage API: reading the quota status failed", "tenant", tenant, "err", err)
			writeError(w, http.StatusServiceUnavailable, "server_error", "usage_unavailable",
				"Usage figures are unavailable right now (the quota store did not answer); retry in a few seconds.", 5*time.Second)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(body)
	})
}

var errBusy = errors.New("usage API busy")

// answer returns the JSON status of tenant, from the cache when fresh.
func (a *API) answer(ctx context.Context, tenant string) ([]byte, error) {
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[tenant]
	a.mu.Unlock()
	if ok && now.Sub(c.at) < a.cfg.CacheTTL {
		return c.body, nil
	}
	select {
	case a.sem <- struct{}{}:
		defer func() { <-a.sem }()
	default:
		return nil, errBusy
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	st, err := a.reader.Tenant(ctx, tenant)
	if err != nil {
		return nil, err
	}
	body, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	body = append(body, '\n')
	if a.cfg.CacheTTL > 0 {
		a.mu.Lock()
		if len(a.cache) >= maxCached {
			clear(a.cache)
		}
		a.cache[tenant] = cached{body: body, at: now}
		a.mu.Unlock()
	}
	return body, nil
}

func writeError(w http.ResponseWriter, status int, typ, code, msg string, retryAfter time.Duration) {
	ratelimit.WriteError(w, status, ratelimit.Error{Type: typ, Code: code, Message: msg}, retryAfter)
}
