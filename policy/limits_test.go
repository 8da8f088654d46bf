package policy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
)

func ruleNamed(t *testing.T, rules []admission.Rule, name string) admission.Rule {
	t.Helper()
	for _, r := range rules {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule %q in %+v", name, rules)
	return admission.Rule{}
}

func TestExampleLimitsAndPlans(t *testing.T) {
	p := mustLoad(t)
	rs := p.AdmissionRules()
	if err := rs.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(rs.Shared) != 3 || rs.Shared[0].Name != "platform-tpm" || !rs.Shared[0].Scope.Global() {
		t.Fatalf("shared rules, global first: %+v", rs.Shared)
	}
	perUser := ruleNamed(t, rs.Shared, "per-user-tpm")
	if perUser.Scope != (admission.Scope{Tenant: admission.Each, User: admission.Each}) || perUser.Window != time.Minute || perUser.Limit != 40000 {
		t.Fatalf("per-user-tpm = %+v", perUser)
	}
	acct := ruleNamed(t, rs.Shared, "openai-main-rpm")
	if acct.Scope.Upstream != "openai-main" || !acct.Exact || acct.Limit != 10000 || acct.Rate < 166.6 || acct.Rate > 166.7 {
		t.Fatalf("openai-main-rpm = %+v", acct)
	}
	// acme takes pro's rpm bucket and overrides its rate; the burst follows
	// acme's own burst_multiplier (1.5), not the plan's (1.2).
	acme := rs.Tenants["acme"]
	rpm := ruleNamed(t, acme.Rules, "rpm")
	if rpm.Algorithm != admission.TokenBucket || rpm.Unit != admission.Requests || rpm.Rate != 20 || rpm.Limit != 1800 {
		t.Fatalf("acme rpm = %+v, want 1200/min (20/s) with burst 1200 x 1.5", rpm)
	}
	if acme.FailMode != admission.FailClosed {
		t.Fatalf("acme fail mode %q", acme.FailMode)
	}
	tpm := ruleNamed(t, acme.Rules, "quota:tokens_per_minute")
	if tpm.Algorithm != admission.SlidingWindow || tpm.Window != time.Minute || tpm.Limit != 50000 || tpm.Unit != admission.TotalTokens {
		t.Fatalf("acme's tokens_per_minute as a window: %+v", tpm)
	}
	ruleNamed(t, acme.Rules, "quota:requests_per_minute")
	for _, r := range acme.Rules {
		if strings.HasSuffix(r.Name, ":gpt-4o") {
			t.Fatalf("gpt-4o is soft for acme; its quotas must not refuse: %+v", r)
		}
	}
	// free-trial takes the free plan: its per-key window, its fail mode,
	// and its requests_per_minute on top of the defaults' tokens_per_minute.
	free := rs.Tenants["free-trial"]
	pk := ruleNamed(t, free.Rules, "per-key-tpm")
	if pk.Scope != (admission.Scope{Key: admission.Each}) || !pk.Exact || pk.Limit != 5000 {
		t.Fatalf("free-trial per-key-tpm = %+v", pk)
	}
	if free.FailMode != admission.FailClosed || ruleNamed(t, free.Rules, "quota:requests_per_minute").Limit != 60 ||
		ruleNamed(t, free.Rules, "quota:tokens_per_minute").Limit != 20000 {
		t.Fatalf("free-trial = %+v", free)
	}
	if got := p.Tenant("internal").Priority; got != "critical" {
		t.Fatalf("internal's priority from the staff plan = %q", got)
	}
	if len(rs.Default.Rules) != 1 || rs.Default.Rules[0].Name != "quota:tokens_per_minute" {
		t.Fatalf("a tenant the file does not name: %+v", rs.Default.Rules)
	}
}

func TestBurstMultiplierSetsTheBurst(t *testing.T) {
	doc := `
defaults:
  limits:
    rps:
      unit: requests
      token_bucket: {rate: 10}
tenants:
  calm: {}
  bursty:
    burst_multiplier: 3
  fixed:
    burst_multiplier: 3
    limits:
      rps:
        token_bucket: {burst: 12}
`
	p, err := Parse([]byte(doc), "burst.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	for tenant, want := range map[string]int64{"calm": 10, "bursty": 30, "fixed": 12} {
		r := ruleNamed(t, rs.Tenants[tenant].Rules, "rps")
		if r.Limit != want || r.Rate != 10 {
			t.Errorf("%s: burst %d rate %v, want burst %d rate 10", tenant, r.Limit, r.Rate, want)
		}
	}
}

func TestLimitsMergeThroughPlans(t *testing.T) {
	doc := `
plans:
  gold:
    limits:
      tpm:
        scope: {model: "*"}
        unit: total_tokens
        sliding_window: {length: 1m, limit: 1000}
      rpm:
        unit: requests
        sliding_window: {length: 1m, limit: 10}
defaults:
  plan: gold
tenants:
  plain: {}
  longer:
    limits:
      tpm:
        sliding_window: {length: 5m}
  bucketed:
    plan: gold
    limits:
      tpm:
        token_bucket: {rate: 50, burst: 100}
      rpm: {disabled: true}
`
	p, err := Parse([]byte(doc), "plans.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	if r := ruleNamed(t, rs.Default.Rules, "tpm"); r.Limit != 1000 || r.Window != time.Minute {
		t.Fatalf("a tenant the file does not name gets the defaults' plan: %+v", r)
	}
	if p.Tenant("plain").Plan != "gold" || len(rs.Tenants["plain"].Rules) != 2 {
		t.Fatalf("plain: plan %q rules %+v", p.Tenant("plain").Plan, rs.Tenants["plain"].Rules)
	}
	if r := ruleNamed(t, rs.Tenants["longer"].Rules, "tpm"); r.Limit != 1000 || r.Window != 5*time.Minute || r.Scope.Model != admission.Each {
		t.Fatalf("longer's tpm keeps the plan's limit and scope: %+v", r)
	}
	b := rs.Tenants["bucketed"].Rules
	if len(b) != 1 || b[0].Algorithm != admission.TokenBucket || b[0].Limit != 100 || b[0].Unit != admission.TotalTokens {
		t.Fatalf("bucketed: %+v", b)
	}
}

func TestBrokenLimitsNameFileLineAndField(t *testing.T) {
	src := `limits:
  a:
    scope: {tenant: "*", colour: red}
    unit: tokens
    sliding_window: {length: 0s, limit: -1}
  b:
    unit: requests
    token_bucket: {rate: 0}
    sliding_window: {length: 1m, limit: 5}
  c:
    unit: requests
plans:
  gold:
    plan: silver
    limits:
      d:
        scope: {tenant: acme}
        unit: requests
        token_bucket: {rate: 1, burst: -3}
tenants:
  acme:
    plan: platinum
    limits:
      quota:x:
        unit: requests
        sliding_window: {limit: 3}
`
	_, err := Parse([]byte(src), "bad.yaml")
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("Parse = %v, want *Error", err)
	}
	for _, w := range []string{
		"bad.yaml:3: limits.a.scope.colour: unknown dimension",
		"bad.yaml:4: limits.a.unit: \"tokens\" is not one of requests",
		"bad.yaml:5: limits.a.sliding_window.length: length 0s is outside 1ms",
		"bad.yaml:5: limits.a.sliding_window.limit: limit -1 is outside 0..",
		"bad.yaml:6: limits.b: set token_bucket or sliding_window, not both",
		"bad.yaml:10: limits.c: needs token_bucket",
		"bad.yaml:14: plans.gold.plan: a plan cannot take another plan",
		"bad.yaml:17: plans.gold.limits.d.scope.tenant: a tenant's, plan's or the defaults' limits count per tenant already",
		"bad.yaml:19: plans.gold.limits.d.token_bucket.burst: burst -3 is outside",
		"bad.yaml:22: tenants.acme.plan: plan \"platinum\" is not defined under plans (defined: gold)",
		"bad.yaml:24: tenants.acme.limits.quota:x: names starting with \"quota:\" are reserved",
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestPlanLimitsApplyAtTheGateway: a tenant that names a plan is refused by
// the plan's limit before its call, through a real Limiter and Redis; a
// tenant's burst_multiplier is the burst it gets.
func TestPlanLimitsApplyAtTheGateway(t *testing.T) {
	doc := `
plans:
  starter:
    limits:
      rpm:
        unit: requests
        sliding_window: {length: 1h, limit: 3}
        exact: true
      burst:
        unit: total_tokens
        token_bucket: {rate: 100, per: 1h}
        exact: true
tenants:
  small: {plan: starter}
  big:
    plan: starter
    burst_multiplier: 2
    limits:
      rpm: {disabled: true}
  other: {}
`
	p, err := Parse([]byte(doc), "gw.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	prefix := itest.Unique(t, "sluice:adm:") + ":"
	itest.DropKeysAtEnd(t, c, prefix) // the counters would live until the month ends
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	l, err := admission.New(c, p.AdmissionRules(), admission.WithPrefix(prefix), admission.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	admit := func(tenant string, tokens int64) admission.Decision {
		t.Helper()
		tk, err := l.Admit(context.Background(), admission.Request{Tenant: tenant, Model: "gpt-4o", PromptTokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		return tk.Decision
	}
	for i := range 3 {
		if d := admit("small", 1); !d.Allowed {
			t.Fatalf("small request %d: %+v", i, d)
		}
	}
	if d := admit("small", 1); d.Allowed || d.Rule != "rpm" || d.Scope.Tenant != "small" || d.Limit != 3 {
		t.Fatalf("small's 4th request: %+v, want the plan's rpm to refuse", d)
	}
	for i := range 5 {
		if d := admit("other", 1); !d.Allowed {
			t.Fatalf("a tenant without the plan: %+v (request %d)", d, i)
		}
	}
	// The bucket: rate 100 an hour; burst 100 for a multiplier of 1, 200
	// for big's 2.
	if d := admit("big", 200); !d.Allowed {
		t.Fatalf("big's burst of 200 (100 x 2): %+v", d)
	}
	if d := admit("big", 5); d.Allowed || d.Rule != "burst" || d.Limit != 200 {
		t.Fatalf("big after its burst: %+v", d)
	}
	// A multiplier of 1 gives the rate as the burst: a tenant on the plan
	// alone (the rules swapped as on a policy reload).
	p2, err := Parse([]byte("plans:\n  starter:\n    limits:\n      burst:\n        unit: total_tokens\n        token_bucket: {rate: 100, per: 1h}\n        exact: true\ntenants:\n  tiny: {plan: starter}\n"), "gw2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetRules(p2.AdmissionRules()); err != nil {
		t.Fatal(err)
	}
	if d := admit("tiny", 150); d.Allowed || !d.Never || d.Limit != 100 {
		t.Fatalf("150 tokens against a burst of 100 (multiplier 1): %+v", d)
	}
	if d := admit("tiny", 100); !d.Allowed {
		t.Fatalf("100 tokens against a burst of 100: %+v", d)
	}
}

// TestLimitWaitMergesByClass: a limit's wait names the classes that may
// wait and for how long, a tenant overriding one class keeps the plan's
// others, and a class or a duration out of range names its line.
func TestLimitWaitMergesByClass(t *testing.T) {
	doc := `
plans:
  batch:
    limits:
      rpm:
        unit: requests
        token_bucket: {rate: 60, per: 1m}
        wait: {low: 30s, normal: 2s}
tenants:
  acme:
    plan: batch
    limits:
      rpm:
        wait: {normal: 0s, high: 1s}
`
	p, err := Parse([]byte(doc), "wait.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := ruleNamed(t, p.AdmissionRules().Tenants["acme"].Rules, "rpm")
	want := [schemas.NumPriorities]time.Duration{30 * time.Second, 0, time.Second, 0} // low, normal, high, critical
	if r.Wait != want {
		t.Fatalf("acme's rpm waits %v, want %v (low from the plan, normal and high its own)", r.Wait, want)
	}
	_, err = Parse([]byte(`limits:
  rpm:
    unit: requests
    token_bucket: {rate: 1}
    wait:
      batch: 1s
      low: 2h
`), "badwait.yaml")
	for _, w := range []string{
		"badwait.yaml:6: limits.rpm.wait.batch: is not a priority class",
		"badwait.yaml:7: limits.rpm.wait.low: 2h0m0s is outside 0..1h0m0s",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestPeriodLimitPerUserInTheTenantsZone: a period limit is a calendar
// period rule whose periods are the tenant's (PeriodBounds in its zone),
// and through a real Limiter each user has a quota of their own.
func TestPeriodLimitPerUserInTheTenantsZone(t *testing.T) {
	doc := `
tenants:
  acme:
    timezone: America/New_York
    limits:
      user-monthly:
        scope: {user: "*"}
        unit: total_tokens
        period: {every: month, limit: 1000}
`
	p, err := Parse([]byte(doc), "period.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	r := ruleNamed(t, rs.Tenants["acme"].Rules, "user-monthly")
	if r.Algorithm != admission.CalendarPeriod || r.Limit != 1000 || r.Scope.User != admission.Each || r.Calendar == nil {
		t.Fatalf("user-monthly: %+v", r)
	}
	ny, _ := time.LoadLocation("America/New_York")
	at := time.Date(2026, 3, 31, 23, 30, 0, 0, ny) // April already in UTC
	s, e := r.Calendar.Bounds(at)
	ws, we := PeriodBounds(schemas.PeriodMonth, at, ny)
	if !s.Equal(ws) || !e.Equal(we) || s.Month() != time.March {
		t.Fatalf("periods %s..%s, want New York's March %s..%s", s, e, ws, we)
	}

	rc := itest.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: rc.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	prefix := itest.Unique(t, "sluice:adm:") + ":"
	itest.DropKeysAtEnd(t, c, prefix) // the counters would live until the month ends
	l, err := admission.New(c, rs, admission.WithPrefix(prefix), admission.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for _, step := range []struct {
		user   string
		tokens int64
		ok     bool
	}{{"bob", 800, true}, {"bob", 300, false}, {"alice", 1000, true}, {"bob", 200, true}} {
		tk, err := l.Admit(ctx, admission.Request{Tenant: "acme", User: step.user, PromptTokens: step.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if tk.Allowed() != step.ok {
			t.Fatalf("%s asking %d tokens: %+v, want allowed %v", step.user, step.tokens, tk.Decision, step.ok)
		}
	}

	_, err = Parse([]byte(`limits:
  m:
    unit: total_tokens
    period: {every: fortnight, limit: 5}
  n:
    unit: requests
    period: {every: day, limit: 5}
    sliding_window: {length: 1m, limit: 5}
`), "badperiod.yaml")
	for _, w := range []string{
		"badperiod.yaml:4: limits.m.period.every: \"fortnight\" is not hour, day, week, month or once",
		"badperiod.yaml:5: limits.n: set one of token_bucket, sliding_window or period",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

// TestCostLimitIsInCurrencyAndExact: a limit counting cost states its
// amounts in currency and becomes a rule counting millionths of it, run
// exactly (no leases) unless the file says otherwise; an amount past
// what the millionths can hold is refused naming the field.
func TestCostLimitIsInCurrencyAndExact(t *testing.T) {
	p, err := Parse([]byte(`
limits:
  team-hourly: {scope: {tenant: "*"}, unit: cost, sliding_window: {length: 1h, limit: 20}}
  team-bucket: {scope: {tenant: "*"}, unit: cost, token_bucket: {rate: 2, per: 1m, burst: 5}, exact: false}
tenants:
  acme:
    limits:
      key-monthly: {scope: {key: "*"}, unit: cost, period: {every: month, limit: 50}}
`), "cost.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs := p.AdmissionRules()
	if r := ruleNamed(t, rs.Tenants["acme"].Rules, "key-monthly"); r.Unit != admission.Cost || r.Limit != 50*admission.CostScale || !r.Exact {
		t.Fatalf("key-monthly: %+v, want cost, limit 50,000,000 millionths, exact", r)
	}
	if r := ruleNamed(t, rs.Shared, "team-hourly"); r.Limit != 20*admission.CostScale || !r.Exact {
		t.Fatalf("team-hourly: %+v, want limit 20,000,000, exact", r)
	}
	if r := ruleNamed(t, rs.Shared, "team-bucket"); r.Limit != 5*admission.CostScale || r.Rate != 2.0/60*admission.CostScale || r.Exact {
		t.Fatalf("team-bucket: %+v, want burst 5,000,000, rate %v per second, leased as the file says", r, 2.0/60*admission.CostScale)
	}
	_, err = Parse([]byte(`
limits:
  huge: {unit: cost, sliding_window: {length: 1h, limit: 2000000000}}
`), "huge.yaml")
	if err == nil || !strings.Contains(err.Error(), "limits.huge.sliding_window.limit: limit 2000000000 is outside 0..1125899906") {
		t.Fatalf("a cost limit past the millionths' range: %v", err)
	}
}

// TestSessionAndOrganizationScopes: a top-level limit scoped by
// organization counts the tenants that name that organization together,
// a session scope counts each agent session, and a tenant's own limit
// cannot be scoped by organization (a tenant belongs to one).
func TestSessionAndOrganizationScopes(t *testing.T) {
	p, err := Parse([]byte(`
limits:
  org: {scope: {organization: "*"}, unit: requests, sliding_window: {limit: 10}}
defaults:
  limits:
    per-session: {scope: {session: "*"}, unit: total_tokens, sliding_window: {limit: 1000}}
tenants:
  acme: {organization: corp}
  beta: {organization: corp}
`), "org.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if r := ruleNamed(t, p.AdmissionRules().Shared, "org"); r.Scope.Organization != admission.Each {
		t.Fatalf("org: %+v", r)
	}
	if r := ruleNamed(t, p.AdmissionRules().Tenants["acme"].Rules, "per-session"); r.Scope.Session != admission.Each {
		t.Fatalf("per-session: %+v", r)
	}
	if o := p.OrganizationOf("beta"); o != "corp" || p.OrganizationOf("nobody") != "" {
		t.Fatalf("beta's organization %q, an unnamed tenant's %q; want corp and none", o, p.OrganizationOf("nobody"))
	}
	_, err = Parse([]byte(`
tenants:
  acme:
    limits:
      x: {scope: {organization: corp}, unit: requests, sliding_window: {limit: 1}}
`), "bad.yaml")
	if err == nil || !strings.Contains(err.Error(), "tenants.acme.limits.x.scope.organization: a tenant belongs to one organization") {
		t.Fatalf("an organization scope in a tenant's limits: %v", err)
	}
}
