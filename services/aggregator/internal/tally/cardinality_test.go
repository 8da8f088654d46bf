package tally

import (
	"fmt"
	"math"
	"testing"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// TestModelCardinalityIsCapped: one tenant sending 10,000 distinct model
// names with max_models 100 gets 100 model series plus the "other" bucket;
// its "*" totals (tokens, requests, cost at each real model's price) stay
// exact; a model its policy names still gets its own series (and quota)
// past the cap; the aggregator hears of every fold and of the first once.
func TestModelCardinalityIsCapped(t *testing.T) {
	const models, maxModels = 10_000, 100
	pol := mustPolicy(t, `
defaults:
  timezone: UTC
tenants:
  acme:
    max_models: 100
    models:
      "*": {daily_tokens: 100000000}
      gpt-4o: {daily_tokens: 1000}
prices:
  - {model: m-09999, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1000000, completion: 2000000}
`)
	var folds, firsts int
	opt := DefaultOptions()
	opt.OnFold = func(tenant, model string, max int, first bool) {
		folds++
		if first {
			firsts++
			if tenant != "acme" || max != maxModels || model != fmt.Sprintf("m-%05d", maxModels) {
				t.Errorf("first fold reported as %s %s %d", tenant, model, max)
			}
		}
	}
	p := New(0, opt)
	p.SetPolicy(pol)
	for i := range models {
		e := &schemas.UsageEvent{ID: fmt.Sprintf("e%d", i), Time: t0, Tenant: "acme", Model: fmt.Sprintf("m-%05d", i), PromptTokens: 10, CompletionTokens: 5}
		if r := p.Apply(e, int64(i)); r != Accepted {
			t.Fatalf("event %d: %v", i, r)
		}
	}
	ten := p.tenants["acme"]
	if n := len(ten.models); n != maxModels+1 {
		t.Fatalf("%d model series for %d distinct models with max_models %d, want %d", n, models, maxModels, maxModels+1)
	}
	if series, _ := p.Entries(); series != maxModels+2 {
		t.Errorf("Entries() = %d series, want %d (models, other, *)", series, maxModels+2)
	}
	if folds != models-maxModels || firsts != 1 {
		t.Errorf("OnFold called %d times (%d first), want %d (1 first)", folds, firsts, models-maxModels)
	}
	if p.Stats.Folded != int64(models-maxModels) {
		t.Errorf("Stats.Folded = %d", p.Stats.Folded)
	}

	tok, req, cost, _, ok := p.Totals("acme", policy.AllModels, "day")
	// m-09999 (folded) costs 10 prompt tokens at 1e6/M and 5 at 2e6/M.
	if !ok || tok != models*15 || req != models || math.Abs(cost-20) > 1e-9 {
		t.Fatalf("tenant totals: %d tokens, %d requests, cost %v; want %d, %d, 20", tok, req, cost, models*15, models)
	}
	if tok, req, cost, _, ok := p.Totals("acme", policy.OtherModel, "day"); !ok || tok != (models-maxModels)*15 || req != models-maxModels || math.Abs(cost-20) > 1e-9 {
		t.Fatalf("other: %d tokens, %d requests, cost %v", tok, req, cost)
	}
	if tok, _, _, _, ok := p.Totals("acme", "m-00099", "day"); !ok || tok != 15 {
		t.Fatalf("a model within the cap is counted on its own: %d %v", tok, ok)
	}

	// A retry of a folded event is still a duplicate.
	if r := p.Apply(&schemas.UsageEvent{ID: "e9999", Time: t0, Tenant: "acme", Model: "m-09999", PromptTokens: 10, CompletionTokens: 5}, models); r != Duplicate {
		t.Fatalf("retry of a folded event: %v", r)
	}
	// The policy names gpt-4o: it gets its own series and its quota past the cap.
	p.TakeSignals()
	if r := p.Apply(&schemas.UsageEvent{ID: "g", Time: t0, Tenant: "acme", Model: "gpt-4o", PromptTokens: 900, CompletionTokens: 100}, models+1); r != Accepted {
		t.Fatal(r)
	}
	if _, ok := ten.models["gpt-4o"]; !ok || ten.models["gpt-4o"].other {
		t.Fatal("a model the policy names was folded")
	}
	var hit bool
	for _, s := range kinds(p.TakeSignals(), schemas.SignalTierCrossed) {
		hit = hit || (s.Model == "gpt-4o" && s.Tier == 100)
	}
	if !hit {
		t.Error("gpt-4o's own quota did not reach 100% past the cap")
	}
	if tok := totals(t, p, policy.AllModels, "day"); tok != models*15+1000 {
		t.Errorf("tenant day total %d", tok)
	}
}
