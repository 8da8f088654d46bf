package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
)

func TestUpstreamsFallbacksAndClasses(t *testing.T) {
	p, err := Parse([]byte(`
tenants:
  vip: {priority: critical}
  plain: {}
upstreams:
  openai:
    base_url: https://api.openai.com/v1/
    api_key_env: OPENAI_API_KEY
    models: [gpt-4o, "gpt-4o-mini*"]
    weight: 3
    timeout: 2m
    shared: true
    concurrency: {mode: threshold, limit: 40, min: 5, max: 200}
    tenant_share: 0.5
    queue: {max_waiting: 200, max_wait: 5s}
    degradation: {levels: [0.6, 0.8, 0.95], retry_after: 10s, hysteresis: 0.1, actions: [fallback, refuse, refuse], resources: false}
    breaker: {consecutive_failures: 10, open_for: 30s}
    reserved: {unit: requests, capacity: 600, saturation: 0.7, shares: {critical: 0.5, high: 0.2}}
  local: {base_url: "http://10.0.0.5:8000/v1", models: ["*"]}
  claude: {base_url: "https://api.anthropic.com/v1", dialect: anthropic, models: ["claude-*"]}
  azure: {base_url: "https://acme.openai.azure.com/openai", dialect: azure, models: [gpt-4o], deployments: {gpt-4o: prod-4o}}
  google: {base_url: "https://generativelanguage.googleapis.com/v1beta/", dialect: gemini, models: ["gemini-*"]}
fallbacks:
  gpt-4o: [gpt-4o-mini, gpt-4.1-nano]
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Tenant("vip").Class() != schemas.PriorityCritical || p.Tenant("plain").Class() != schemas.PriorityNormal || p.Tenant("new").Class() != schemas.PriorityNormal {
		t.Errorf("classes: vip %v, plain %v, unnamed %v", p.Tenant("vip").Class(), p.Tenant("plain").Class(), p.Tenant("new").Class())
	}
	u, ok := p.Upstream("openai")
	if !ok || u.BaseURL != "https://api.openai.com/v1" || u.APIKeyEnv != "OPENAI_API_KEY" || len(u.Models) != 2 || u.Weight != 3 ||
		u.Timeout != 2*time.Minute || u.ResponseHeaderTimeout != time.Minute || u.ConnectTimeout != 5*time.Second {
		t.Fatalf("openai's route: %+v", u)
	}
	if !u.Shared || u.Mode != ModeThreshold || u.Limit != 40 || u.MaxWaiting != 200 || u.MaxWait != 5*time.Second ||
		u.Levels != [3]float64{0.6, 0.8, 0.95} || u.Reserved == nil || u.Reserved.Shares[schemas.PriorityCritical] != 0.5 || u.Reserved.Capacity != 600 {
		t.Fatalf("openai: %+v", u)
	}
	if alg, err := u.Algorithm(); err != nil || alg.Limit() != 40 {
		t.Fatalf("threshold algorithm: %v %v", alg, err)
	} else if _, ok := alg.(*concurrency.Threshold); !ok {
		t.Errorf("mode threshold built %T", alg)
	}
	if opts, err := u.GuardOptions(); err != nil || len(opts) < 5 {
		t.Errorf("guard options: %d, %v", len(opts), err)
	}
	if u.Hysteresis != 0.1 || u.DegradedAction(1) != DegradeFallback || u.DegradedAction(2) != DegradeRefuse || u.FollowResources {
		t.Errorf("openai's degradation: hysteresis %v, actions %v, resources %v", u.Hysteresis, u.DegradedActions, u.FollowResources)
	}
	if claude, _ := p.Upstream("claude"); claude.Dialect != DialectAnthropic || u.Dialect != DialectOpenAI {
		t.Errorf("dialects: claude %q, openai %q (the default)", claude.Dialect, u.Dialect)
	}
	if az, _ := p.Upstream("azure"); az.Dialect != DialectAzure || az.APIVersion != DefaultAzureAPIVersion || az.Deployments["gpt-4o"] != "prod-4o" {
		t.Errorf("azure: %+v", az)
	}
	if g, _ := p.Upstream("google"); g.Dialect != DialectGemini || g.BaseURL != "https://generativelanguage.googleapis.com/v1beta" {
		t.Errorf("gemini: %+v", g)
	}
	local, _ := p.Upstream("local")
	if local.Hysteresis != 0.05 || local.DegradedActions != [3]string{DegradeFallback, DegradeFallback, DegradeFallback} || !local.FollowResources {
		t.Errorf("default degradation: hysteresis %v, actions %v, resources %v", local.Hysteresis, local.DegradedActions, local.FollowResources)
	}
	if local.Weight != 1 || local.Timeout != 10*time.Minute || local.Mode != ModeFixed || local.Limit != UnlimitedConcurrency ||
		local.ConsecutiveFailures != 10 || local.OpenFor != 30*time.Second || local.Reserved != nil {
		t.Errorf("an entry that says only where it is gets no concurrency limit and the default breaker: %+v", local)
	}
	if _, ok := p.Upstream("other"); ok || len(p.UpstreamNames()) != 5 {
		t.Errorf("names: %v", p.UpstreamNames())
	}
	if fb := p.Fallbacks("gpt-4o"); len(fb) != 2 || fb[0] != "gpt-4o-mini" || p.Fallbacks("gpt-4o-mini") != nil {
		t.Errorf("fallbacks: %v", fb)
	}
}

func TestUpstreamsBadInputNamesFieldAndLimit(t *testing.T) {
	_, err := Parse([]byte(`
upstreams:
  u:
    base_url: ftp://x
    dialect: vertex
    api_version: "2024-10-21"
    api_key_env: A
    api_key_file: /a
    models: ["["]
    weight: 2000
    timeout: 1s
    response_header_timeout: 2s
    concurrency: {mode: adaptive, limit: 500, max: 100}
    tenant_share: 2
    degradation: {levels: [0.9, 0.5, 0.7], hysteresis: 0.6, actions: [fallback, later, refuse], max_tokens: 0}
    reserved: {unit: tokens, saturation: 0, shares: {vip: 0.5, critical: 0.7, high: 0.6}}
fallbacks:
  gpt-4o: [gpt-4o]
  o3: []
`), "bad.yaml")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		"upstreams.u.base_url: \"ftp://x\" is not an http(s) URL", "upstreams.u.dialect: \"vertex\" is not one of openai", "upstreams.u: api_version and deployments are an azure upstream's", "upstreams.u: set api_key_env or api_key_file, not both",
		"upstreams.u.models.0: \"[\" is not a valid pattern", "upstreams.u.weight: 2000 is outside 0..1000",
		"upstreams.u.response_header_timeout: 2s is longer than its timeout (1s)",
		"upstreams.u.concurrency.mode", "upstreams.u.concurrency: limit 500", "upstreams.u.tenant_share", "upstreams.u.degradation.levels",
		"upstreams.u.degradation.hysteresis: 0.6 is outside 0..the first level (0.5)", `upstreams.u.degradation.actions.1: "later" is not one of fallback`,
		"upstreams.u.degradation.max_tokens: 0 is outside 1..1000000",
		"upstreams.u.reserved.unit", "upstreams.u.reserved.saturation", "upstreams.u.reserved.shares.vip", "upstreams.u.reserved.shares: the shares add up to 1.3",
		"fallbacks.gpt-4o.0", "fallbacks.o3: lists 0 models",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q:\n%v", want, err)
		}
	}
}

// TestUpstreamScopeNamesAnUpstream: in a policy that defines upstreams,
// a limit scoped by upstream must name one of them (or "*"): the gateway
// admits it with the upstream it chose, so a typo or a model name would
// never count a call. Without upstreams (a forward-auth deployment) the
// scope is the model, as before.
func TestUpstreamScopeNamesAnUpstream(t *testing.T) {
	ups := "upstreams:\n  openai-main: {base_url: \"http://x/v1\", models: [\"*\"]}\n"
	_, err := Parse([]byte(ups+`
limits:
  typo: {scope: {upstream: openai-mian}, unit: requests, token_bucket: {rate: 1}}
  each: {scope: {upstream: "*"}, unit: requests, token_bucket: {rate: 1}}
  fine: {scope: {upstream: openai-main}, unit: requests, token_bucket: {rate: 1}}
tenants:
  acme:
    limits:
      model-name: {scope: {upstream: gpt-4o}, unit: requests, token_bucket: {rate: 1}}
`), "p.yaml")
	for _, want := range []string{"limits.typo.scope.upstream: \"openai-mian\" is no upstream of upstreams (openai-main)", "tenants.acme.limits.model-name.scope.upstream: \"gpt-4o\""} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
	if err != nil && (strings.Contains(err.Error(), "limits.each") || strings.Contains(err.Error(), "limits.fine")) {
		t.Errorf("a good scope refused: %v", err)
	}
	if _, err := Parse([]byte("limits:\n  m: {scope: {upstream: gpt-4o}, unit: requests, token_bucket: {rate: 1}}\n"), "p.yaml"); err != nil {
		t.Errorf("without upstreams, an upstream scope (the model) refused: %v", err)
	}
}

// TestAlertTiersAndPriceSpan: the tiers a view filters by are every
// tenant's and the defaults', once each, ascending; a price is in force
// from its effective date until the next one's, and the span says so.
func TestAlertTiersAndPriceSpan(t *testing.T) {
	p, err := Parse([]byte(`
tenants:
  a: {alert_tiers: [50, 100]}
  b: {alert_tiers: [80, 95]}
prices:
  - {model: m, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1, completion: 2}
  - {model: m, currency: USD, effective_from: 2026-06-01T00:00:00Z, prompt: 3, completion: 4}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := p.AlertTiers(); fmt.Sprint(got) != "[50 70 80 90 95 100]" {
		t.Errorf("tiers %v", got)
	}
	if got := (*Policy)(nil).AlertTiers(); fmt.Sprint(got) != "[70 90 100]" {
		t.Errorf("tiers without a policy %v", got)
	}
	jan, jun := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC).Unix()
	if _, ok, _, until := p.PriceSpan("m", jan-1); ok || until != jan {
		t.Errorf("before the first price: ok %v until %d", ok, until)
	}
	if pr, ok, from, until := p.PriceSpan("m", jan+5); !ok || pr.Prompt != 1 || from != jan || until != jun {
		t.Errorf("in the first span: %+v %v [%d, %d)", pr, ok, from, until)
	}
	if pr, ok, from, _ := p.PriceSpan("m", jun); !ok || pr.Prompt != 3 || from != jun {
		t.Errorf("at the second price's date: %+v %v from %d", pr, ok, from)
	}
	if pr, ok := p.Price("m", time.Unix(jun+1, 0)); !ok || pr.Completion != 4 {
		t.Errorf("Price: %+v %v", pr, ok)
	}
}
