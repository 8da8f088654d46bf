package policy

import (
	"fmt"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// This file is the policy's upstreams section, the one definition of each
// upstream sluice gateway calls: where it is and which models it serves
// (base URL, credential, models, weight, timeouts), and how the request
// path protects it (sdk/go/upstream): its concurrency limit (fixed, the
// threshold rule or the gradient, or none), whether the fleet shares it,
// its queue, degradation levels, breaker — the upstream's one health
// mechanism — and reserved shares per priority class. The fallbacks
// section names the cheaper models a request may be served by instead;
// the tenant's priority class (Tenant.Class) is the third input.

// Concurrency limit modes of an upstream.
const (
	ModeFixed     = "fixed"
	ModeThreshold = "threshold"
	ModeGradient  = "gradient"
)

// Dialects an upstream speaks: the API its base URL serves, which decides
// the gateway routes it is called from. A request is routed, and fails
// over or falls back, only to upstreams of its route's dialect.
const (
	// DialectOpenAI is OpenAI's API (chat completions, completions,
	// embeddings, responses), and every provider compatible with it.
	DialectOpenAI = "openai"
	// DialectAnthropic is Anthropic's Messages API (/v1/messages), called
	// with x-api-key and anthropic-version.
	DialectAnthropic = "anthropic"
	// DialectAzure is Azure OpenAI: OpenAI's API under deployment URLs
	// (<base_url>/deployments/<deployment>/chat/completions?api-version=),
	// called with api-key. It serves OpenAI's routes: its requests and
	// answers are OpenAI's.
	DialectAzure = "azure"
	// DialectGemini is Google's Gemini API
	// (<base_url>/models/<model>:generateContent and
	// :streamGenerateContent), called with x-goog-api-key; its base URL
	// carries the version (https://generativelanguage.googleapis.com/v1beta).
	DialectGemini = "gemini"
)

// DefaultAzureAPIVersion is the api-version of an azure upstream that
// names none: a generally available version of Azure OpenAI's data plane.
const DefaultAzureAPIVersion = "2024-10-21"

// Units a reserved share counts in.
const (
	ReserveConcurrency = "concurrency"
	ReserveRequests    = "requests"
	ReserveTokens      = "total_tokens"
)

// Upstream is one upstream (upstreams.<name>): a provider endpoint and its
// request-path protection.
type Upstream struct {
	// Name names the upstream in usage events (provider), logs and metrics.
	Name string
	// BaseURL is the provider's base URL with its version path
	// (https://api.openai.com/v1, https://api.anthropic.com/v1).
	BaseURL string
	// Dialect is the API BaseURL speaks: DialectOpenAI (the default),
	// DialectAnthropic, DialectAzure or DialectGemini.
	Dialect string
	// APIVersion and Deployments are an azure upstream's: the api-version
	// of its calls, and the deployment serving each model (a model it does
	// not name is served by the deployment of the same name).
	APIVersion  string
	Deployments map[string]string
	// APIKeyEnv or APIKeyFile names where the provider's API key is: an
	// environment variable or a file of the gateway's host (never the key
	// itself); neither is an upstream that needs none.
	APIKeyEnv, APIKeyFile string
	// Models are the models it serves: exact names, or patterns with * and
	// ? (gpt-4o*); an exact name wins over a pattern.
	Models []string
	// Weight is its share of a model's requests among the upstreams of
	// that model that are not broken.
	Weight int
	// Timeout bounds the whole call (a stream to its end),
	// ResponseHeaderTimeout the time to the answer's headers (a stream's
	// first token), ConnectTimeout the connection, TLS included.
	Timeout, ResponseHeaderTimeout, ConnectTimeout time.Duration
	// Shared counts the upstream's calls in flight across every gateway
	// process through Redis (concurrency.Shared) and shares its breaker
	// (upstream.Fleet); otherwise each process counts alone.
	Shared bool
	// Mode is ModeFixed, ModeThreshold or ModeGradient; Limit is the fixed
	// limit or the adaptive modes' initial one, within Min..Max. An entry
	// without a concurrency section is not limited (UnlimitedConcurrency).
	Mode            string
	Limit, Min, Max int
	// TenantShare caps each tenant at this share of the limit (0: none).
	TenantShare float64
	// MaxWaiting and MaxWait bound the priority queue.
	MaxWaiting int
	MaxWait    time.Duration
	// Levels are the loads above which degradation levels 1, 2 and 3
	// apply; DegradedRetryAfter is a degraded refusal's Retry-After.
	Levels             [3]float64
	DegradedRetryAfter time.Duration
	// Hysteresis is how far below a level's threshold the load must fall
	// before the level is left.
	Hysteresis float64
	// DegradedActions say what a request a level refuses gets, per level
	// 1, 2, 3: DegradeFallback, DegradeRefuse, DegradeDefer or
	// DegradeShorten.
	DegradedActions [3]string
	// ShortenTo is the output cap (max_tokens) of a request a level with
	// DegradeShorten serves shortened.
	ShortenTo int64
	// FollowResources: when the gateway samples its CPU and memory
	// (services.gateway.resource_degradation), this upstream's levels
	// follow them too. Off for a fallback upstream that must stay open
	// while the process is busy.
	FollowResources bool
	// The upstream breaker.
	ConsecutiveFailures int
	ErrorRatio          float64
	OpenFor, MaxOpenFor time.Duration
	Probes              int
	// Reserved, when not nil, holds each class to its share above the
	// saturation threshold.
	Reserved *Reserved
}

// Reserved is an upstream's reserved shares per priority class: while the
// fleet's use of the upstream is below Saturation × Capacity any class
// may use idle capacity; above it each class is held to its share, and
// the part no class reserves is common to all.
type Reserved struct {
	// Unit is ReserveConcurrency (calls in flight), ReserveRequests
	// (requests per minute) or ReserveTokens (tokens per minute).
	Unit string
	// Capacity is the upstream's capacity in Unit (per minute for the
	// rates); for concurrency 0 means the upstream's Max limit.
	Capacity   int64
	Saturation float64
	// Shares by class; they add up to at most 1.
	Shares map[schemas.Priority]float64
}

type rawUpstream struct {
	BaseURL               string            `yaml:"base_url"`
	Dialect               string            `yaml:"dialect"`
	APIVersion            string            `yaml:"api_version"`
	Deployments           map[string]string `yaml:"deployments"`
	APIKeyEnv             string            `yaml:"api_key_env"`
	APIKeyFile            string            `yaml:"api_key_file"`
	Models                []string          `yaml:"models"`
	Weight                int               `yaml:"weight"`
	Timeout               *time.Duration    `yaml:"timeout"`
	ResponseHeaderTimeout *time.Duration    `yaml:"response_header_timeout"`
	ConnectTimeout        *time.Duration    `yaml:"connect_timeout"`

	Shared      *bool `yaml:"shared"`
	Concurrency *struct {
		Mode  string `yaml:"mode"`
		Limit *int   `yaml:"limit"`
		Min   *int   `yaml:"min"`
		Max   *int   `yaml:"max"`
	} `yaml:"concurrency"`
	TenantShare *float64 `yaml:"tenant_share"`
	Queue       struct {
		MaxWaiting *int           `yaml:"max_waiting"`
		MaxWait    *time.Duration `yaml:"max_wait"`
	} `yaml:"queue"`
	Degradation struct {
		Levels     []float64      `yaml:"levels"`
		RetryAfter *time.Duration `yaml:"retry_after"`
		Hysteresis *float64       `yaml:"hysteresis"`
		Actions    []string       `yaml:"actions"`
		MaxTokens  *int64         `yaml:"max_tokens"`
		Resources  *bool          `yaml:"resources"`
	} `yaml:"degradation"`
	Breaker struct {
		ConsecutiveFailures *int           `yaml:"consecutive_failures"`
		ErrorRatio          *float64       `yaml:"error_ratio"`
		OpenFor             *time.Duration `yaml:"open_for"`
		MaxOpenFor          *time.Duration `yaml:"max_open_for"`
		Probes              *int           `yaml:"probes"`
	} `yaml:"breaker"`
	Reserved *struct {
		Unit       string             `yaml:"unit"`
		Capacity   int64              `yaml:"capacity"`
		Saturation *float64           `yaml:"saturation"`
		Shares     map[string]float64 `yaml:"shares"`
	} `yaml:"reserved"`
}

// defaultUpstream is what an upstreams entry gets for what it does not
// say: weight 1; a 10-minute call, 60 s to the first token, 5 s to
// connect; no concurrency limit (a concurrency section without a limit
// starts at 100 within 1..1000); a priority queue of 1,000 waiting for at
// most 30 s; degradation levels at 50/70/90% load, retry after 30 s,
// shortened outputs capped at 512 tokens; a
// breaker that opens for 30 s on 10 failures in a row or half of the
// calls failing, then lets 5 probes through (docs/priority.md).
var defaultUpstream = Upstream{Dialect: DialectOpenAI, Weight: 1, Timeout: 10 * time.Minute, ResponseHeaderTimeout: 60 * time.Second, ConnectTimeout: 5 * time.Second,
	Mode: ModeFixed, Limit: UnlimitedConcurrency, Min: 1, Max: UnlimitedConcurrency, MaxWaiting: 1000, MaxWait: 30 * time.Second,
	Levels: [3]float64{0.5, 0.7, 0.9}, DegradedRetryAfter: 30 * time.Second, Hysteresis: 0.05,
	DegradedActions: [3]string{DegradeFallback, DegradeFallback, DegradeFallback}, ShortenTo: 512, FollowResources: true,
	ConsecutiveFailures: 10, ErrorRatio: 0.5, OpenFor: 30 * time.Second, MaxOpenFor: 10 * time.Minute, Probes: 5}

// What a request a degradation level refuses gets (degradation.actions).
const (
	// DegradeFallback serves it with the asked model's fallback models
	// (fallbacks:) when it has any, else refuses it.
	DegradeFallback = "fallback"
	// DegradeRefuse refuses it (429, or 503 at level 3) without trying
	// the fallback models; another upstream of the model may still serve
	// it.
	DegradeRefuse = "refuse"
	// DegradeDefer queues it as a deferred task (202 with the task, run
	// when capacity allows, as Prefer: respond-async does) when the
	// gateway takes deferred requests, it does not stream and every
	// upstream of its model is at a level refusing its class with this
	// action; otherwise it is refused.
	DegradeDefer = "defer"
	// DegradeShorten serves it with its output capped at the entry's
	// degradation.max_tokens (lowered, or set where the request sets
	// none): a shorter answer costs the upstream less time and the
	// tenant fewer tokens than a refusal costs the caller (seed 003).
	// The answer says so in its X-Sluice-Max-Tokens header.
	DegradeShorten = "shorten"
)

// DegradedAction is the action of degradation level l (1..3); level 0
// refuses nothing and reads as DegradeFallback.
func (u Upstream) DegradedAction(l int) string {
	if l < 1 || l > 3 {
		return DegradeFallback
	}
	return u.DegradedActions[l-1]
}

// UnlimitedConcurrency is the concurrency limit of an upstream whose entry
// sets none: in effect no limit, so that its queue never fills and its
// load never degrades it; its breaker still applies.
const UnlimitedConcurrency = 1_000_000

// MaxFallbacks bounds the fallback models of one model.
const MaxFallbacks = 8

func (v *validator) upstreams(raw map[string]rawUpstream) map[string]Upstream {
	out := make(map[string]Upstream, len(raw))
	for _, name := range sortedKeys(raw) {
		r := raw[name]
		p := "upstreams." + name
		if name == "" || len(name) > 128 {
			v.fail(p, "upstream name must be 1..128 bytes (the name in services.gateway.upstreams)")
		}
		u := defaultUpstream
		u.Name = name
		v.upstreamRoute(p, r, &u)
		set := func(dst *int, src *int) {
			if src != nil {
				*dst = *src
			}
		}
		if r.Shared != nil {
			u.Shared = *r.Shared
		}
		if c := r.Concurrency; c != nil {
			u.Limit, u.Max = 100, 1000
			if m := c.Mode; m != "" {
				if m != ModeFixed && m != ModeThreshold && m != ModeGradient {
					v.fail(p+".concurrency.mode", "%q is not one of fixed, threshold (step on latency and error thresholds), gradient", m)
				}
				u.Mode = m
			}
			set(&u.Limit, c.Limit)
			set(&u.Min, c.Min)
			set(&u.Max, c.Max)
			if u.Min < 1 || u.Max > UnlimitedConcurrency || u.Min > u.Max || u.Limit < u.Min || u.Limit > u.Max {
				v.fail(p+".concurrency", "limit %d, min %d, max %d: need 1 <= min <= limit <= max <= 1000000", u.Limit, u.Min, u.Max)
			}
		}
		if r.TenantShare != nil {
			u.TenantShare = *r.TenantShare
			if !(u.TenantShare > 0 && u.TenantShare <= 1) {
				v.fail(p+".tenant_share", "%v is outside (0, 1] (each tenant's share of the upstream's limit)", u.TenantShare)
			}
		}
		set(&u.MaxWaiting, r.Queue.MaxWaiting)
		if r.Queue.MaxWait != nil {
			u.MaxWait = *r.Queue.MaxWait
		}
		if u.MaxWaiting < 0 || u.MaxWaiting > 1_000_000 {
			v.fail(p+".queue.max_waiting", "%d is outside 0..1000000", u.MaxWaiting)
		}
		if u.MaxWait < time.Millisecond || u.MaxWait > time.Hour {
			v.fail(p+".queue.max_wait", "%s is outside 1ms..1h", u.MaxWait)
		}
		if l := r.Degradation.Levels; l != nil {
			if len(l) != 3 || !(l[0] > 0 && l[0] < l[1] && l[1] < l[2] && l[2] <= 1) {
				v.fail(p+".degradation.levels", "%v: want three loads increasing strictly within (0, 1], e.g. [0.5, 0.7, 0.9]", l)
			} else {
				u.Levels = [3]float64{l[0], l[1], l[2]}
			}
		}
		if r.Degradation.RetryAfter != nil {
			u.DegradedRetryAfter = *r.Degradation.RetryAfter
			if u.DegradedRetryAfter < time.Second || u.DegradedRetryAfter > time.Hour {
				v.fail(p+".degradation.retry_after", "%s is outside 1s..1h", u.DegradedRetryAfter)
			}
		}
		v.degradation(p, r, &u)
		b := r.Breaker
		set(&u.ConsecutiveFailures, b.ConsecutiveFailures)
		set(&u.Probes, b.Probes)
		if b.ErrorRatio != nil {
			u.ErrorRatio = *b.ErrorRatio
		}
		if b.OpenFor != nil {
			u.OpenFor = *b.OpenFor
		}
		if b.MaxOpenFor != nil {
			u.MaxOpenFor = *b.MaxOpenFor
		}
		if u.ConsecutiveFailures < 0 || u.ConsecutiveFailures > 1_000_000 {
			v.fail(p+".breaker.consecutive_failures", "%d is outside 0..1000000 (0 turns this trigger off)", u.ConsecutiveFailures)
		}
		if u.ErrorRatio < 0 || u.ErrorRatio > 1 {
			v.fail(p+".breaker.error_ratio", "%v is outside 0..1 (0 turns this trigger off)", u.ErrorRatio)
		}
		if u.OpenFor < time.Second || u.MaxOpenFor < u.OpenFor {
			v.fail(p+".breaker.open_for", "open_for %s must be at least 1s and at most max_open_for %s", u.OpenFor, u.MaxOpenFor)
		}
		if u.Probes < 1 || u.Probes > 1000 {
			v.fail(p+".breaker.probes", "%d is outside 1..1000", u.Probes)
		}
		if rr := r.Reserved; rr != nil {
			u.Reserved = v.reserved(p+".reserved", rr.Unit, rr.Capacity, rr.Saturation, rr.Shares)
			if rr.Unit == ReserveConcurrency && rr.Capacity == 0 && r.Concurrency == nil {
				v.fail(p+".reserved.capacity", "0 means the concurrency section's max, and this upstream has none; give the capacity in calls in flight, or a concurrency section")
			}
		}
		out[name] = u
	}
	return out
}

// upstreamRoute checks and sets where upstream entry r is and what it
// serves.
func (v *validator) upstreamRoute(p string, r rawUpstream, u *Upstream) {
	if b, err := url.Parse(r.BaseURL); err != nil || (b.Scheme != "http" && b.Scheme != "https") || b.Host == "" {
		v.fail(p+".base_url", "%q is not an http(s) URL; give the provider's base URL with its version path, e.g. https://api.openai.com/v1", r.BaseURL)
	}
	u.BaseURL = strings.TrimRight(r.BaseURL, "/")
	switch r.Dialect {
	case "":
	case DialectOpenAI, DialectAnthropic, DialectAzure, DialectGemini:
		u.Dialect = r.Dialect
	default:
		v.fail(p+".dialect", "%q is not one of openai (the default: OpenAI's API and those compatible with it), anthropic (Anthropic's Messages API), azure (Azure OpenAI's deployment URLs), gemini (Google's Gemini API)", r.Dialect)
	}
	if (r.APIVersion != "" || len(r.Deployments) > 0) && u.Dialect != DialectAzure {
		v.fail(p, "api_version and deployments are an azure upstream's (dialect: azure), not %s's", u.Dialect)
	}
	if u.Dialect == DialectAzure {
		u.APIVersion = DefaultAzureAPIVersion
		if r.APIVersion != "" {
			u.APIVersion = r.APIVersion
		}
		if len(u.APIVersion) > 32 || strings.ContainsAny(u.APIVersion, "&#?/ ") {
			v.fail(p+".api_version", "%q is not an api-version (at most 32 bytes, e.g. 2024-10-21)", u.APIVersion)
		}
		for m, d := range r.Deployments {
			if d == "" || len(d) > 64 || strings.ContainsAny(d, "/?#%& ") {
				v.fail(p+".deployments."+m, "%q is not a deployment name (1..64 bytes, no /?#%%& or spaces)", d)
			}
		}
		u.Deployments = maps.Clone(r.Deployments)
	}
	if r.APIKeyEnv != "" && r.APIKeyFile != "" {
		v.fail(p, "set api_key_env or api_key_file, not both")
	}
	u.APIKeyEnv, u.APIKeyFile = r.APIKeyEnv, r.APIKeyFile
	if len(r.Models) == 0 {
		v.fail(p+".models", `list the models this upstream serves (models: [gpt-4o, "gpt-4o-mini*"]), or ["*"] for every model`)
	}
	for j, m := range r.Models {
		if m == "" || len(m) > schemas.MaxModelLen {
			v.fail(fmt.Sprintf("%s.models.%d", p, j), "must be 1..%d bytes", schemas.MaxModelLen)
		} else if _, err := path.Match(m, ""); err != nil {
			v.fail(fmt.Sprintf("%s.models.%d", p, j), "%q is not a valid pattern: %v", m, err)
		}
	}
	u.Models = slices.Clone(r.Models)
	if r.Weight < 0 || r.Weight > 1000 {
		v.fail(p+".weight", "%d is outside 0..1000 (0 means 1)", r.Weight)
	} else if r.Weight > 0 {
		u.Weight = r.Weight
	}
	for _, d := range []struct {
		name     string
		src      *time.Duration
		dst      *time.Duration
		min, max time.Duration
	}{
		{"timeout", r.Timeout, &u.Timeout, time.Second, time.Hour},
		{"response_header_timeout", r.ResponseHeaderTimeout, &u.ResponseHeaderTimeout, 100 * time.Millisecond, time.Hour},
		{"connect_timeout", r.ConnectTimeout, &u.ConnectTimeout, 10 * time.Millisecond, time.Minute},
	} {
		if d.src == nil {
			continue
		}
		if *d.src < d.min || *d.src > d.max {
			v.fail(p+"."+d.name, "%s is outside %s..%s", *d.src, d.min, d.max)
		}
		*d.dst = *d.src
	}
	if r.ResponseHeaderTimeout == nil {
		u.ResponseHeaderTimeout = min(u.ResponseHeaderTimeout, u.Timeout)
	} else if u.ResponseHeaderTimeout > u.Timeout {
		v.fail(p+".response_header_timeout", "%s is longer than its timeout (%s)", u.ResponseHeaderTimeout, u.Timeout)
	}
}

func (v *validator) reserved(p, unit string, capacity int64, saturation *float64, shares map[string]float64) *Reserved {
	r := &Reserved{Unit: unit, Capacity: capacity, Saturation: 0.8, Shares: map[schemas.Priority]float64{}}
	switch unit {
	case ReserveConcurrency:
		if capacity < 0 || capacity > 1_000_000 {
			v.fail(p+".capacity", "%d is outside 0..1000000 (calls in flight; 0: the upstream's concurrency max)", capacity)
		}
	case ReserveRequests, ReserveTokens:
		if capacity < 1 || capacity > 1<<40 {
			v.fail(p+".capacity", "%d is outside 1..%d (the upstream's %s per minute)", capacity, int64(1)<<40, unit)
		}
	default:
		v.fail(p+".unit", "%q is not one of concurrency, requests, total_tokens", unit)
	}
	if saturation != nil {
		r.Saturation = *saturation
	}
	if !(r.Saturation > 0 && r.Saturation <= 1) {
		v.fail(p+".saturation", "%v is outside (0, 1] (the share of capacity above which classes are held to their shares)", r.Saturation)
	}
	sum := 0.0
	for _, name := range sortedKeys(shares) {
		c, err := schemas.ParsePriority(name)
		if err != nil {
			v.fail(p+".shares."+name, "%q is not one of %s", name, schemas.PriorityNames)
			continue
		}
		s := shares[name]
		if !(s >= 0 && s <= 1) {
			v.fail(p+".shares."+name, "%v is outside 0..1", s)
		}
		r.Shares[c] = s
		sum += s
	}
	if sum > 1+1e-9 {
		v.fail(p+".shares", "the shares add up to %.3g, more than 1", sum)
	}
	return r
}

func (v *validator) fallbacks(raw map[string][]string) map[string][]string {
	out := make(map[string][]string, len(raw))
	for _, model := range sortedKeys(raw) {
		list := raw[model]
		p := "fallbacks." + model
		if model == "" || len(model) > 128 {
			v.fail(p, "model name must be 1..128 bytes")
		}
		if len(list) == 0 || len(list) > MaxFallbacks {
			v.fail(p, "lists %d models; give 1..%d cheaper models, in the order to try them", len(list), MaxFallbacks)
		}
		for i, m := range list {
			if m == "" || len(m) > 128 || m == model || slices.Index(list, m) != i {
				v.fail(fmt.Sprintf("%s.%d", p, i), "%q must be a model name of 1..128 bytes, not %s itself and not repeated", m, model)
			}
		}
		out[model] = slices.Clone(list)
	}
	return out
}

// Upstream returns the upstream called name; ok is false when the file
// names none.
func (p *Policy) Upstream(name string) (Upstream, bool) {
	u, ok := p.upstreams[name]
	return u, ok
}

// UpstreamNames lists the upstreams the file names, sorted.
func (p *Policy) UpstreamNames() []string { return sortedKeys(p.upstreams) }

// Fallbacks returns the cheaper models model may be served by, in the
// order to try them; nil when the file names none.
func (p *Policy) Fallbacks(model string) []string { return p.fallbacks[model] }

// Class is the tenant's priority class (schemas.PriorityNormal when the
// policy names none).
func (t *Tenant) Class() schemas.Priority { return t.Priority.OrDefault() }

// Algorithm returns the concurrency algorithm u's mode names, starting at
// u.Limit within u.Min..u.Max.
func (u Upstream) Algorithm() (concurrency.Algorithm, error) {
	bounds := []concurrency.Opt{concurrency.InitialLimit(u.Limit), concurrency.MinLimit(u.Min), concurrency.MaxLimit(u.Max)}
	switch u.Mode {
	case ModeThreshold:
		opts := make([]concurrency.ThresholdOpt, len(bounds))
		for i, o := range bounds {
			opts[i] = o
		}
		return concurrency.NewThreshold(opts...)
	case ModeGradient:
		opts := make([]concurrency.GradientOpt, len(bounds))
		for i, o := range bounds {
			opts[i] = o
		}
		return concurrency.NewGradient(opts...)
	}
	return concurrency.Fixed(u.Limit), nil
}

// GuardOptions are the upstream.Guard options of u other than the ones
// that need Redis (a shared gate and a fleet-wide breaker, which the
// gateway adds for a Shared upstream, and reserved shares, which always
// count fleet-wide): the algorithm, the tenant
// share, the queue bounds, the degradation levels and the breaker (whose
// probes are timed by the upstream's timeout).
func (u Upstream) GuardOptions() ([]upstream.Opt, error) {
	alg, err := u.Algorithm()
	if err != nil {
		return nil, fmt.Errorf("upstreams.%s.concurrency: %w", u.Name, err)
	}
	opts := []upstream.Opt{
		upstream.Limit(alg),
		upstream.QueueOptions(priority.MaxWaiting(u.MaxWaiting), priority.MaxWait(u.MaxWait)),
		upstream.DegraderOptions(priority.Thresholds(u.Levels[0], u.Levels[1], u.Levels[2]), priority.DegradedRetryAfter(u.DegradedRetryAfter),
			priority.Hysteresis(u.Hysteresis)),
		// A probe is one attempt, bounded by the upstream's timeout: past
		// it (and a margin) a fleet-wide breaker hands the probe out again.
		upstream.BreakerOptions(upstream.ConsecutiveFailures(u.ConsecutiveFailures), upstream.ErrorRatio(u.ErrorRatio),
			upstream.OpenTime(u.OpenFor, u.MaxOpenFor), upstream.Probes(u.Probes), upstream.ProbeTimeout(u.Timeout)),
	}
	if u.TenantShare > 0 {
		opts = append(opts, upstream.TenantShare(u.TenantShare))
	}
	var shorten []priority.Level
	for i, act := range u.DegradedActions {
		if act == DegradeShorten {
			shorten = append(shorten, priority.Level(i+1))
		}
	}
	if shorten != nil {
		opts = append(opts, upstream.ShortenAt(shorten...))
	}
	return opts, nil
}

// degradation reads an entry's degradation hysteresis and actions (its
// levels and retry_after are read with the rest).
func (v *validator) degradation(p string, r rawUpstream, u *Upstream) {
	if r.Degradation.Resources != nil {
		u.FollowResources = *r.Degradation.Resources
	}
	if h := r.Degradation.Hysteresis; h != nil {
		u.Hysteresis = *h
		if !(u.Hysteresis >= 0 && u.Hysteresis < u.Levels[0]) {
			v.fail(p+".degradation.hysteresis", "%v is outside 0..the first level (%v): a level is left only below its threshold by this much", u.Hysteresis, u.Levels[0])
		}
	}
	if a := r.Degradation.Actions; a != nil {
		if len(a) != 3 {
			v.fail(p+".degradation.actions", "%v: want one action per level 1, 2, 3, e.g. [fallback, fallback, refuse]", a)
			return
		}
		for i, act := range a {
			if act != DegradeFallback && act != DegradeRefuse && act != DegradeDefer && act != DegradeShorten {
				v.fail(fmt.Sprintf("%s.degradation.actions.%d", p, i), "%q is not one of fallback (the model's fallbacks serve it), refuse, defer (queued as a deferred task), shorten (served with max_tokens capped)", act)
			}
			u.DegradedActions[i] = act
		}
	}
	if m := r.Degradation.MaxTokens; m != nil {
		u.ShortenTo = *m
		if u.ShortenTo < 1 || u.ShortenTo > MaxShortenTo {
			v.fail(p+".degradation.max_tokens", "%d is outside 1..%d", u.ShortenTo, MaxShortenTo)
		}
	}
}

// MaxShortenTo bounds degradation.max_tokens.
const MaxShortenTo = 1_000_000
