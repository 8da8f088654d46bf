package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// policyYAML is a test policy: every tenant gets a huge monthly quota, and
// the named tenants a tiny hourly one, so one request crosses a tier.
func policyYAML(hourly map[string]int) string {
	var b strings.Builder
	b.WriteString(`defaults:
  timezone: UTC
  mode: hard
  fail_mode: open
  alert_tiers: [70, 90, 100]
  channels: [alertmanager]
  models:
    "*":
      monthly_tokens: 1000000000
tenants:
`)
	for tn, limit := range hourly {
		fmt.Fprintf(&b, "  %s:\n    models:\n      \"*\":\n        hourly_tokens: %d\n        monthly_tokens: 1000000000\n", tn, limit)
	}
	return b.String()
}

// startAll starts the services in parallel and waits for each to be ready.
func (s *stack) startAll(names ...string) {
	s.t.Helper()
	ps := make([]*proc, len(names))
	for i, n := range names {
		ps[i] = s.spawn(n)
	}
	for _, p := range ps {
		s.waitReady(p)
	}
}

// clockShift keeps a test's events clear of an hour boundary on the wall
// clock: near the end of an hour it moves the gateway into the next one.
func clockShift() time.Duration {
	now := time.Now().UTC()
	if now.Minute() >= 55 {
		return now.Truncate(time.Hour).Add(time.Hour + time.Minute).Sub(now)
	}
	return 0
}

// oneTenantStack is the set-up of a test of one tenant against the real
// services, run beside the other such tests: a tenant of its own (named
// prefix and a random part) with an hourly quota of hourlyTokens, a stack
// with the extra flags running services, and the reference gateway for
// the tenant, moved clear of an hour boundary.
func oneTenantStack(t *testing.T, prefix string, hourlyTokens int, extra []string, services ...string) (*stack, *referenceGateway, string) {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	t.Parallel()
	tenant := prefix + randomKey()[7:15]
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{tenant: hourlyTokens}), Extra: extra})
	s.startAll(services...)
	g := newGateway(t, s, tenant)
	g.shift.Store(int64(clockShift()))
	return s, g, tenant
}

// TestEndToEnd drives one tenant through the reference gateway past 70, 90
// and 100% of an hourly quota and checks what a user depends on: the alerts
// in Alertmanager, the quota flag in Redis, a 429 with Retry-After naming
// the limit at the gateway, counters equal to the raw events, and that the
// next hour's usage lifts the block.
func TestEndToEnd(t *testing.T) {
	s, g, tenant := oneTenantStack(t, "e2e-happy-", 1000, nil, "ingest", "aggregator", "enforcer", "alerter")
	const model = "gpt-4o-mini"
	ctx := context.Background()

	step := func(tokens int64, wantUsed float64, tier string) {
		t.Helper()
		if a := g.chat(t, tenant, model, tokens); a.status != http.StatusOK {
			t.Fatalf("chat of %d tokens: status %d: %s", tokens, a.status, a.body)
		}
		g.flush(t)
		itest.EventuallyNoError(t, waitTimeout, fmt.Sprintf("hourly counter reaches %.0f", wantUsed), func() error {
			used, err := s.counter(ctx, tenant, "hourly_tokens")
			if err != nil {
				return err
			}
			if used != wantUsed {
				return fmt.Errorf("hourly_tokens used %.0f", used)
			}
			return nil
		})
		s.waitAlert(t, tenant, "SluiceQuotaTier", tier)
	}
	step(750, 750, "70")
	step(200, 950, "90")
	step(100, 1050, "100")

	itest.EventuallyNoError(t, waitTimeout, "quota flag in Redis", func() error {
		f, err := s.flag(ctx, tenant, flags.AllModels)
		if err != nil {
			return err
		}
		if f == nil {
			return fmt.Errorf("no flag on field %q", flags.AllModels)
		}
		if f.Kind != flags.KindQuota || f.State != flags.StateOpen || f.Quota != "hourly_tokens" || f.Limit != 1000 {
			t.Fatalf("flag is %+v, want an open hourly_tokens quota breaker with limit 1000", *f) // a wrong flag does not become right
		}
		return nil
	})
	g.waitRefused(t, tenant, model)
	a := g.chat(t, tenant, model, 10)
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("over quota: gateway answered %d, want 429: %s", a.status, a.body)
	}
	retry, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 3600+int(clockShift().Seconds())+60 {
		t.Fatalf("Retry-After %q: want whole seconds up to the end of the hour", a.header.Get("Retry-After"))
	}
	if !strings.Contains(string(a.body), "hourly_tokens") {
		t.Fatalf("429 body does not name the limit hourly_tokens: %s", a.body)
	}
	s.countersMatchTruthTokens(t, tenant, 1050)

	// Next hour: the first event of the new period resets the quota.
	g.shift.Add(int64(time.Hour))
	next := time.Now().Add(time.Duration(g.shift.Load())).UTC()
	if err := g.emitter.Emit(&schemas.UsageEvent{ID: "reset-" + randomKey(), Time: next, Tenant: tenant, Model: model,
		PromptTokens: 5, CompletionTokens: 5, Outcome: schemas.OutcomeOK}); err != nil {
		t.Fatal(err)
	}
	g.flush(t)
	itest.EventuallyNoError(t, waitTimeout, "gateway serves again after the period reset", func() error {
		if d := g.checker.Check(tenant, model, "key-"+tenant); !d.Allowed() {
			return fmt.Errorf("still refused: %+v", d.Flag)
		}
		return nil
	})
	if a := g.chat(t, tenant, model, 10); a.status != http.StatusOK {
		t.Fatalf("after the period reset: gateway answered %d: %s", a.status, a.body)
	}
	s.requireAlive()
}

// countersMatchTruthTokens waits until tenant's monthly counter and its
// ground truth both equal want tokens.
func (s *stack) countersMatchTruthTokens(t testing.TB, tenant string, want uint64) {
	t.Helper()
	itest.EventuallyNoError(t, waitTimeout, "monthly counter equals the ground truth", func() error {
		ctx := context.Background()
		_, tok, err := s.truth(ctx, tenant)
		if err != nil {
			return err
		}
		c, err := s.counter(ctx, tenant, "monthly_tokens")
		if err != nil {
			return err
		}
		if tok != want || math.Abs(c-float64(want)) > 0.5 {
			return fmt.Errorf("ground truth %d, counter %.0f, want %d", tok, c, want)
		}
		return nil
	})
}
