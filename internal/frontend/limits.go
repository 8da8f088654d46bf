package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/middleware"
)

// LimiterAdmitter answers the gateway's admission hook with
// sdk/go/admission: the policy's limits (and its hard one-minute quotas)
// checked in one Redis round trip or from local leases before the call,
// the estimate settled with what the call used after it.
type LimiterAdmitter struct {
	L *admission.Limiter
	// Policy is the policy in force: its prices price calls for the rules
	// that count cost (CostOf), and its tenants' organizations fill the
	// organization dimension. Nil prices every call at 0 and knows no
	// organization.
	Policy func() *policy.Policy
}

// Admit implements Admitter.
func (a LimiterAdmitter) Admit(ctx context.Context, req AdmitRequest) Admission {
	// The worst case: the prompt's estimate and max_tokens (the
	// completion's estimate is the request's cap when it sets one).
	pol := a.policy()
	worst := CostOf(pol, req.Model, middleware.Usage{PromptTokens: req.EstimatePrompt, CompletionTokens: req.EstimateCompletion}, time.Now())
	// Acquire is Admit unless the refusing rule lets the request's class
	// wait (a limit's wait in the policy): then it waits, up to the
	// caller's deadline, for the rule to admit it.
	t, err := a.L.Acquire(ctx, admission.Request{ID: req.EventID, Tenant: req.Tenant, Model: req.Model, User: req.User,
		Key: req.APIKeyID, Endpoint: req.Endpoint, Upstream: req.Upstream, Priority: req.Priority,
		Session: req.Session, Organization: pol.OrganizationOf(req.Tenant),
		PromptTokens: req.EstimatePrompt, CompletionTokens: req.EstimateCompletion, Cost: worst, Deadline: req.Deadline})
	if err != nil {
		// A request the limiter cannot judge names the bound it broke.
		e := admission.Error(admission.Decision{})
		e.Type, e.Code, e.Message = "invalid_request_error", "admission_refused", err.Error()
		return Admission{Refused: &Refusal{Status: http.StatusBadRequest, Error: e}}
	}
	d := t.Decision
	if !d.Allowed {
		return Admission{Limits: admission.Headers(d), Refused: &Refusal{Status: admission.Status(d), Error: admission.Error(d), RetryAfter: admission.RetryAfter(d), Rule: d.Rule}}
	}
	return Admission{Limits: admission.Headers(d), Settle: func(s Settlement) {
		model := s.Model
		if model == "" {
			model = req.Model
		}
		// The client may be gone; the correction must still land.
		_ = t.Settle(context.WithoutCancel(ctx), admission.Usage{PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens,
			Cost: CostOf(a.policy(), model, s.Usage, time.Now())})
	}}
}

func (a LimiterAdmitter) policy() *policy.Policy {
	if a.Policy == nil {
		return nil
	}
	return a.Policy()
}

// CostOf is what a call of model that used u costs at p's price in force
// now (the unpriced_price for a model without one), in admission.Cost
// units, rounded up: the price lookup and formula the pipeline counts
// money with (policy.Policy.CostSpan, policy.Price.Cost).
func CostOf(p *policy.Policy, model string, u middleware.Usage, now time.Time) int64 {
	pr, _, _, _ := p.CostSpan(model, now.Unix())
	return int64(math.Ceil(pr.Cost(policy.Tokens{Prompt: u.PromptTokens, Completion: u.CompletionTokens, Cached: u.CachedTokens,
		CacheWrite: u.CacheWriteTokens, Reasoning: u.ReasoningTokens}) * admission.CostScale))
}

// AdmissionConfig tunes how a front end checks the policy's limits before
// each call: the `limits:` of the policy file and its hard
// tokens_per_minute and requests_per_minute quotas
// (policy.Policy.AdmissionRules), checked by sdk/go/admission on the
// deployment's Redis under redis.key_prefix. A front end runs them
// whenever the deployment has a policy file.
type AdmissionConfig struct {
	MaxWait  time.Duration `yaml:"max_wait" help:"longest an admission waits for Redis; past it the tenant's fail mode decides (open: a local limiter, closed: 503)"`
	Gateways int           `yaml:"gateways" help:"gateway processes sharing the limits: a fail-open tenant gets limit/gateways per process while Redis is away"`
	// MaxWaiters bounds the requests waiting for a limit whose policy
	// lets their class wait (a limit's wait); see admission.WithMaxWaiters.
	MaxWaiters int `yaml:"max_waiters" help:"requests this process holds at most while they wait for a limit whose policy lets their class wait (a limit's wait:); when that many wait, a refused request is answered 429 at once; 0: none waits"`
}

// maxWaiters bounds admission.max_waiters: each waiter holds a request's
// goroutine and body in memory.
const maxWaiters = 100_000

// DefaultAdmission returns the admission defaults.
func DefaultAdmission() AdmissionConfig {
	return AdmissionConfig{MaxWait: 5 * time.Millisecond, Gateways: 1, MaxWaiters: admission.DefaultMaxWaiters}
}

// Validate checks c as the section at p (admission. for example), naming
// each field with it.
func (c AdmissionConfig) Validate(p string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.MaxWait <= 0 || c.MaxWait > time.Second {
		bad(p+"max_wait: %s is outside 1ns..1s (a request waits this long at most for Redis)", c.MaxWait)
	}
	if c.Gateways < 1 || c.Gateways > 10_000 {
		bad(p+"gateways: %d is outside 1..10000", c.Gateways)
	}
	if c.MaxWaiters < 0 || c.MaxWaiters > maxWaiters {
		bad(p+"max_waiters: %d is outside 0..%d", c.MaxWaiters, maxWaiters)
	}
	return errors.Join(errs...)
}

// Limits are the policy's limits a front end checks on the request path:
// the hard ones before each call (Admit) and, for a front end that routes
// (sluice gateway), the hard ones scoped by model or upstream once it has
// chosen where the call goes (Route), and the tenants' soft one-minute
// quotas (Soft), each on counters of its own. Apply keeps them in step
// with a reloaded policy.
type Limits struct {
	// Admit checks the hard limits — for a routing front end only those
	// not scoped by model or upstream; Route, when not nil, those, with
	// the model and upstream of each attempt; Soft, when not nil, the soft
	// quotas.
	Admit, Route, Soft Admitter

	hard, route, soft *admission.Limiter
	closers           []func()
	log               *slog.Logger
	// pol is the policy in force, whose prices and organizations the
	// admitters use (Apply replaces it).
	pol atomic.Pointer[policy.Policy]
}

// policy is the policy in force.
func (l *Limits) policy() *policy.Policy { return l.pol.Load() }

// RouteScoped reports whether a rule counts by model or upstream: a
// routing front end admits it only once it knows which model and upstream
// serve the call (a fallback model, another upstream), so that the rules
// of what is served are charged, not those of what was asked for.
func RouteScoped(r admission.Rule) bool { return r.Scope.Model != "" || r.Scope.Upstream != "" }

// UpstreamScoped names the rules of rs scoped by upstream, which only a
// routing front end can count: forward-auth never learns the upstream a
// call goes to, so it logs them at start as not applied.
func UpstreamScoped(rs *admission.Rules) []string {
	var out []string
	add := func(list []admission.Rule) {
		for _, r := range list {
			if r.Scope.Upstream != "" && !slices.Contains(out, r.Name) {
				out = append(out, r.Name)
			}
		}
	}
	add(rs.Shared)
	add(rs.Default.Rules)
	for _, id := range slices.Sorted(maps.Keys(rs.Tenants)) {
		add(rs.Tenants[id].Rules)
	}
	return out
}

// splitRules parts rs into the rules a routing front end admits before
// routing and those it admits per attempt (RouteScoped); each tenant keeps
// its fail mode in both.
func splitRules(rs *admission.Rules) (before, route *admission.Rules) {
	before = &admission.Rules{Tenants: make(map[string]admission.TenantRules, len(rs.Tenants))}
	route = &admission.Rules{Tenants: make(map[string]admission.TenantRules, len(rs.Tenants))}
	part := func(list []admission.Rule) (b, r []admission.Rule) {
		for _, x := range list {
			if RouteScoped(x) {
				r = append(r, x)
			} else {
				b = append(b, x)
			}
		}
		return b, r
	}
	before.Shared, route.Shared = part(rs.Shared)
	for id, tr := range rs.Tenants {
		b, r := part(tr.Rules)
		before.Tenants[id], route.Tenants[id] = admission.TenantRules{Rules: b, FailMode: tr.FailMode}, admission.TenantRules{Rules: r, FailMode: tr.FailMode}
	}
	b, r := part(rs.Default.Rules)
	before.Default, route.Default = admission.TenantRules{Rules: b, FailMode: rs.Default.FailMode}, admission.TenantRules{Rules: r, FailMode: rs.Default.FailMode}
	return before, route
}

// NewLimits builds the Limits of policy p on env's Redis (clients of their
// own: admission's wait bound needs context timeouts on the socket); the
// hard limits' metrics are labelled with service (ServiceMetrics), the
// route and soft limiters' are not registered (their series would collide
// with the hard limits'). routed is for a front end that chooses the
// model and upstream of each call (sluice gateway): it gets Route and
// Soft too. opts go to every limiter (a test's admission.WithClock).
//
// The route rules count on the same Redis keys under the same prefix as
// they would in one limiter (a rule instance's key is its name and scope),
// so a gateway and a forward-auth endpoint sharing a policy share counts.
func NewLimits(c AdmissionConfig, p *policy.Policy, service string, routed bool, env platform.Env, log *slog.Logger, opts ...admission.Option) (*Limits, error) {
	l := &Limits{log: log}
	l.pol.Store(p)
	rules := p.AdmissionRules()
	var routeRules *admission.Rules
	if routed {
		rules, routeRules = splitRules(rules)
	}
	prefix := env.Redis.Prefix(redisconn.AdmissionKeys)
	hard, closeHard, err := newLimiter(c, rules, prefix, env, log, append(opts, admission.WithRegisterer(ServiceMetrics(env, service)))...)
	if err != nil {
		return nil, err
	}
	l.hard, l.Admit, l.closers = hard, LimiterAdmitter{L: hard, Policy: l.policy}, []func(){closeHard}
	if routed {
		route, closeRoute, err := newLimiter(c, routeRules, prefix, env, log, opts...)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.route, l.Route = route, LimiterAdmitter{L: route, Policy: l.policy}
		l.closers = append(l.closers, closeRoute)
		soft, closeSoft, err := newLimiter(c, p.SoftLimitRules(), env.Redis.Prefix(redisconn.SoftLimitKeys), env, log, opts...)
		if err != nil {
			l.Close()
			return nil, err
		}
		l.soft, l.Soft = soft, LimiterAdmitter{L: soft, Policy: l.policy}
		l.closers = append(l.closers, closeSoft)
	}
	return l, nil
}

// Apply gives the limiters the rules of a reloaded policy; rules that do
// not apply are logged and the previous ones stay.
func (l *Limits) Apply(p *policy.Policy) {
	l.pol.Store(p)
	if l.route != nil {
		before, route := splitRules(p.AdmissionRules())
		ReloadRules(l.hard, func(*policy.Policy) *admission.Rules { return before }, "admission", l.log)(p)
		ReloadRules(l.route, func(*policy.Policy) *admission.Rules { return route }, "admission (per route)", l.log)(p)
	} else {
		ReloadRules(l.hard, (*policy.Policy).AdmissionRules, "admission", l.log)(p)
	}
	if l.soft != nil {
		ReloadRules(l.soft, (*policy.Policy).SoftLimitRules, "soft quotas", l.log)(p)
	}
}

// Close closes the limiters and their clients.
func (l *Limits) Close() {
	for i := len(l.closers) - 1; i >= 0; i-- {
		l.closers[i]()
	}
}

// ReloadRules returns the policy-reload callback that gives lim the rules
// rules takes from each reloaded policy ((*policy.Policy).AdmissionRules
// or SoftLimitRules). Rules that do not apply are logged under what, and
// the previous ones stay.
func ReloadRules(lim *admission.Limiter, rules func(*policy.Policy) *admission.Rules, what string, log *slog.Logger) func(*policy.Policy) {
	return func(p *policy.Policy) {
		if err := lim.SetRules(rules(p)); err != nil {
			log.Error(what+": the reloaded policy's limits were not applied; the previous ones stay", "err", err)
		}
	}
}

func newLimiter(c AdmissionConfig, rules *admission.Rules, prefix string, env platform.Env, log *slog.Logger, opts ...admission.Option) (*admission.Limiter, func(), error) {
	rdb := redisconn.NewClient(env.Redis, redisconn.ContextTimeouts())
	lim, err := admission.New(rdb, rules, append([]admission.Option{admission.WithPrefix(prefix), admission.WithMaxWait(c.MaxWait),
		admission.WithGatewayCount(c.Gateways), admission.WithMaxWaiters(c.MaxWaiters), admission.WithLogger(log)}, opts...)...)
	if err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("admission: %w", err)
	}
	return lim, func() { _ = lim.Close(); _ = rdb.Close() }, nil
}
