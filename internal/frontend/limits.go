package frontend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

// LimiterAdmitter answers the gateway's admission hook with
// sdk/go/admission: the policy's limits (and its hard one-minute quotas)
// checked in one Redis round trip or from local leases before the call,
// the estimate settled with what the call used after it.
type LimiterAdmitter struct{ L *admission.Limiter }

// Admit implements Admitter.
func (a LimiterAdmitter) Admit(ctx context.Context, req AdmitRequest) Admission {
	t, err := a.L.Admit(ctx, admission.Request{ID: req.EventID, Tenant: req.Tenant, Model: req.Model, User: req.User,
		Key: req.APIKeyID, Endpoint: req.Endpoint, Priority: req.Priority,
		PromptTokens: req.EstimatePrompt, CompletionTokens: req.EstimateCompletion})
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
		// The client may be gone; the correction must still land.
		_ = t.Settle(context.WithoutCancel(ctx), admission.Usage{PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens})
	}}
}

// AdmissionConfig turns on the policy's limits before each call: the
// `limits:` of the policy file and its hard tokens_per_minute and
// requests_per_minute quotas (policy.Policy.AdmissionRules), checked by
// sdk/go/admission on the gateway's Redis.
type AdmissionConfig struct {
	PolicyFile   string        `yaml:"policy_file" help:"policy whose limits (and hard one-minute quotas) the gateway checks before each call, in one Redis round trip or from local leases; empty: no admission"`
	PolicyReload time.Duration `yaml:"policy_reload" help:"how often the admission policy file is checked for changes"`
	MaxWait      time.Duration `yaml:"max_wait" help:"longest an admission waits for Redis; past it the tenant's fail mode decides (open: a local limiter, closed: 503)"`
	KeyPrefix    string        `yaml:"key_prefix" help:"prefix of admission's Redis keys (counters of every gateway sharing this Redis and prefix are shared)"`
	Gateways     int           `yaml:"gateways" help:"gateway processes sharing the limits: a fail-open tenant gets limit/gateways per process while Redis is away"`
}

func DefaultAdmission() AdmissionConfig {
	return AdmissionConfig{PolicyReload: 2 * time.Second, MaxWait: 5 * time.Millisecond, KeyPrefix: admission.DefaultPrefix, Gateways: 1}
}

// Validate checks c as the section at p (services.gateway.admission. for
// example), naming each field with it.
func (c AdmissionConfig) Validate(p string) error {
	if c.PolicyFile == "" {
		return nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.PolicyReload < 100*time.Millisecond {
		bad(p+"policy_reload: %s is below the minimum 100ms", c.PolicyReload)
	}
	if c.MaxWait <= 0 || c.MaxWait > time.Second {
		bad(p+"max_wait: %s is outside 1ns..1s (a request waits this long at most for Redis)", c.MaxWait)
	}
	if c.KeyPrefix == "" {
		bad("%skey_prefix: is required", p)
	}
	if c.Gateways < 1 || c.Gateways > 10_000 {
		bad(p+"gateways: %d is outside 1..10000", c.Gateways)
	}
	return errors.Join(errs...)
}

// PolicyAdmitter builds the Limiter of c from its policy file and returns
// the Admitter, the loop that follows the policy file until ctx ends, and
// what closes both. The forward-auth service (services/authz) admits
// through it; sluice gateway follows the same file with one watcher for
// admission, classes, guards and fallbacks (RunWith).
//
// Its metrics are labelled with service (see serviceMetrics).
func PolicyAdmitter(c AdmissionConfig, service string, env platform.Env, log *slog.Logger) (Admitter, func(ctx context.Context) error, func(), error) {
	w, err := policy.NewWatcher(c.PolicyFile, c.PolicyReload, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("gateway: admission policy: %w", err)
	}
	lim, closeLim, err := NewLimiter(c, w.Current(), service, env, log)
	if err != nil {
		return nil, nil, nil, err
	}
	apply := ReloadRules(lim, (*policy.Policy).AdmissionRules, "admission", log.With("file", c.PolicyFile))
	follow := func(ctx context.Context) error { return w.Follow(ctx, apply) }
	return LimiterAdmitter{L: lim}, follow, closeLim, nil
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

// policyAdmitter builds the Limiter of c from the policy p on env's Redis
// (a client of its own: admission's wait bound needs context timeouts on
// the socket) and returns it and what closes both; its metrics are
// labelled with service.
func NewLimiter(c AdmissionConfig, p *policy.Policy, service string, env platform.Env, log *slog.Logger) (*admission.Limiter, func(), error) {
	return limiterOf(c, p.AdmissionRules(), env, log, admission.WithRegisterer(ServiceMetrics(env, service)))
}

// softAdmitter is policyAdmitter for the policy's soft per-minute quotas
// (policy.SoftLimitRules), under c's prefix; its metrics are not
// registered (admission's series would collide with the hard limits').
func NewSoftLimiter(c AdmissionConfig, p *policy.Policy, env platform.Env, log *slog.Logger) (*admission.Limiter, func(), error) {
	return limiterOf(c, p.SoftLimitRules(), env, log)
}

func limiterOf(c AdmissionConfig, rules *admission.Rules, env platform.Env, log *slog.Logger, opts ...admission.Option) (*admission.Limiter, func(), error) {
	rdb := redisconn.NewClient(env.Redis, redisconn.ContextTimeouts())
	lim, err := admission.New(rdb, rules, append([]admission.Option{admission.WithPrefix(c.KeyPrefix), admission.WithMaxWait(c.MaxWait),
		admission.WithGatewayCount(c.Gateways), admission.WithLogger(log)}, opts...)...)
	if err != nil {
		rdb.Close()
		return nil, nil, fmt.Errorf("gateway: admission: %w", err)
	}
	return lim, func() { _ = lim.Close(); _ = rdb.Close() }, nil
}
