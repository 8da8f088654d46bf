package policy

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBuiltinCatalogIsValid: the shipped catalog parses, is dated and
// sourced, and every entry prices the token types it names within limits.
func TestBuiltinCatalogIsValid(t *testing.T) {
	c, err := ParseCatalog(builtinCatalog, BuiltinCatalogName)
	if err != nil {
		t.Fatal(err)
	}
	if c.AsOf.IsZero() || c.AsOf.After(time.Now()) {
		t.Errorf("as_of %v: want the past day the sources were read", c.AsOf)
	}
	for _, provider := range []string{"openai", "anthropic", "google"} {
		if !strings.HasPrefix(c.Sources[provider], "https://") {
			t.Errorf("sources.%s = %q, want the provider's pricing page", provider, c.Sources[provider])
		}
	}
	models := map[string]bool{}
	for _, p := range c.Prices() {
		models[p.Model] = true
		if p.EffectiveFrom.IsZero() || p.Currency != "USD" {
			t.Errorf("%s: effective_from %v, currency %q; want dated USD", p.Model, p.EffectiveFrom, p.Currency)
		}
		for name, x := range map[string]float64{"input": p.Prompt, "cached_input": p.Cached, "cache_write": p.CacheWrite,
			"output": p.Completion, "reasoning": p.Reasoning} {
			if x < 0 || x > MaxPricePerMillion {
				t.Errorf("%s.%s = %v, outside 0..%v", p.Model, name, x, MaxPricePerMillion)
			}
		}
		if p.Cached > p.Prompt {
			t.Errorf("%s: cached input %v above input %v", p.Model, p.Cached, p.Prompt)
		}
	}
	for _, m := range []string{"gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3", "claude-sonnet-4-5", "claude-haiku-4-5", "gemini-2.5-pro", "gemini-2.5-flash"} {
		if !models[m] {
			t.Errorf("catalog lacks %s", m)
		}
	}
}

func TestCatalogProblemsNameFieldAndLimit(t *testing.T) {
	cases := []struct {
		name, doc string
		want      []string
	}{
		{"negative", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nsources: {x: https://x}\nprices:\n  - {model: m, input: 1, output: -2}\n",
			[]string{"prices.0.output", "-2", "0..1e+09"}},
		{"too high", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nsources: {x: https://x}\nprices:\n  - {model: m, input: 2e9, output: 1}\n",
			[]string{"prices.0.input", "0..1e+09"}},
		{"undated", "version: 1\ncurrency: USD\nsources: {x: https://x}\nprices:\n  - {model: m, input: 1, output: 1}\n",
			[]string{"as_of", "YYYY-MM-DD"}},
		{"unsourced", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nprices:\n  - {model: m, input: 1, output: 1}\n",
			[]string{"sources", "required"}},
		{"missing output", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nsources: {x: https://x}\nprices:\n  - {model: m, input: 1}\n",
			[]string{"prices.0.output", "required"}},
		{"unknown token type", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nsources: {x: https://x}\nprices:\n  - {model: m, input: 1, output: 1, thinking: 3}\n",
			[]string{"thinking", "input, cached_input, cache_write, output, reasoning"}},
		{"two on one date", "version: 1\ncurrency: USD\nas_of: 2026-12-01\nsources: {x: https://x}\nprices:\n  - {model: m, input: 1, output: 1}\n  - {model: m, input: 2, output: 2}\n",
			[]string{"model m has two prices"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCatalog([]byte(tc.doc), "p.yaml")
			if err == nil {
				t.Fatal("parsed; want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

const testPricesFile = `version: 1
currency: USD
as_of: 2026-11-01
sources: {contract: "our provider contract"}
prices:
  - {model: gpt-4o, input: 2.00, output: 8.00}
  - {model: gpt-4o-mini, input: 0.10, output: 0.50}
  - {model: house-model, input: 1, cached_input: 0.5, output: 2}
`

const testPricesPolicy = `prices_file: prices.yaml
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0.01, completion: 0.02, cached: 0.005}
`

func writePolicyWithPrices(t *testing.T, pol, prices string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prices.yaml"), []byte(prices), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPricesPrecedence: per model, prices: beats prices_file beats the
// built-in catalog, each layer replacing the lower ones' entries for the
// models it names and leaving the others.
func TestPricesPrecedence(t *testing.T) {
	p, err := Load(writePolicyWithPrices(t, testPricesPolicy, testPricesFile))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)
	builtin := BuiltinCatalog()
	want := map[string]float64{
		"gpt-4o":            2.00, // prices_file over the catalog's list price
		"gpt-4o-mini":       0.01, // prices: over both
		"house-model":       1,    // added by prices_file
		"claude-sonnet-4-5": builtin.prices["claude-sonnet-4-5"][0].Prompt,
	}
	for model, prompt := range want {
		pr, ok := p.Price(model, at)
		if !ok || pr.Prompt != prompt {
			t.Errorf("%s: price %+v (%v), want prompt %v", model, pr, ok, prompt)
		}
	}
	// The prices_file's gpt-4o entry replaces the catalog's whole: before
	// its date the model is unpriced, not priced by the catalog.
	if pr, ok := p.Price("gpt-4o", time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)); ok {
		t.Errorf("gpt-4o before the prices file's entry priced at %+v; want unpriced", pr)
	}
	if p.PricesFile() == "" {
		t.Error("PricesFile empty")
	}

	none, err := Load(writePolicyWithPrices(t, "price_catalog: none\n", testPricesFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := none.Price("claude-sonnet-4-5", at); ok {
		t.Error("price_catalog: none still prices a catalog model")
	}
}

func TestPricesFileProblemsFailThePolicy(t *testing.T) {
	_, err := Load(writePolicyWithPrices(t, "prices_file: prices.yaml\n", strings.Replace(testPricesFile, "input: 2.00", "input: -1", 1)))
	var pe *Error
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "prices_file") || !strings.Contains(err.Error(), "prices.0.input") {
		t.Fatalf("err = %v; want a policy problem at prices_file naming prices.0.input", err)
	}
	_, err = Load(writePolicyWithPrices(t, "prices_file: missing.yaml\n", testPricesFile))
	if err == nil || !strings.Contains(err.Error(), "prices_file") {
		t.Fatalf("err = %v; want prices_file cannot be read", err)
	}
}

// TestWatcherReloadsWhenPricesFileChanges: an import rewrites only the
// prices file, and the services follow it like an edit of the policy.
func TestWatcherReloadsWhenPricesFileChanges(t *testing.T) {
	path := writePolicyWithPrices(t, testPricesPolicy, testPricesFile)
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := w.Current().Fingerprint()
	if w.Reload() {
		t.Fatal("reloaded with nothing changed")
	}
	changed := strings.Replace(testPricesFile, "input: 2.00", "input: 3.00", 1)
	if err := os.WriteFile(w.Current().PricesFile(), []byte(changed), 0o644); err != nil {
		t.Fatal(err)
	}
	if !w.Reload() {
		t.Fatal("a changed prices file did not reload the policy")
	}
	pr, _ := w.Current().Price("gpt-4o", time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC))
	if pr.Prompt != 3 || w.Current().Fingerprint() == before {
		t.Errorf("after reload gpt-4o prompt %v, fingerprint changed %v; want 3, true", pr.Prompt, w.Current().Fingerprint() != before)
	}
}

// TestUnpricedFallbackAndRefuse: an unpriced model counts at
// unpriced_price and is refused only for a refuse tenant with a budget.
func TestUnpricedFallbackAndRefuse(t *testing.T) {
	p, err := Parse([]byte(`price_catalog: none
unpriced_price: {currency: USD, prompt: 10, completion: 30, cached: 10}
prices:
  - {model: priced, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1, completion: 2}
tenants:
  strict: {unpriced: refuse, budget: {amount: 100, currency: USD}}
  nobudget: {unpriced: refuse}
  lenient: {budget: {amount: 100, currency: USD}}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Unix()
	pr, priced, _, _ := p.CostSpan("mystery", ts)
	if c := pr.Cost(Tokens{Prompt: 1e6, Completion: 1e6}); priced || c != 40 {
		t.Errorf("unpriced model: priced %v, cost of 1M+1M %v; want false, 40 (the unpriced_price)", priced, c)
	}
	for _, c := range []struct {
		tenant, model string
		refused       bool
	}{{"strict", "mystery", true}, {"strict", "priced", false}, {"nobudget", "mystery", false}, {"lenient", "mystery", false}, {"unnamed", "mystery", false}} {
		if got := p.Refuses(c.tenant, c.model, ts); got != c.refused {
			t.Errorf("Refuses(%s, %s) = %v, want %v", c.tenant, c.model, got, c.refused)
		}
	}
	if _, err := Parse([]byte("defaults: {unpriced: maybe}\n"), "p.yaml"); err == nil || !strings.Contains(err.Error(), "defaults.unpriced") {
		t.Errorf("err = %v; want defaults.unpriced named", err)
	}
	if _, err := Parse([]byte("unpriced_price: {currency: USD, prompt: -1}\n"), "p.yaml"); err == nil || !strings.Contains(err.Error(), "unpriced_price.prompt") {
		t.Errorf("err = %v; want unpriced_price.prompt named", err)
	}
}

// TestWatcherReloadsWhenAMissingPricesFileAppears: a policy edited to
// name a prices file not written yet fails to reload (the old policy
// stays); writing the file then reloads it without touching the policy.
func TestWatcherReloadsWhenAMissingPricesFileAppears(t *testing.T) {
	path := writePolicyWithPrices(t, "tenants: {}\n", testPricesFile)
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("prices_file: later.yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if w.Reload() || w.LastError() == "" {
		t.Fatal("a policy naming a missing prices file was installed")
	}
	if w.Reload() {
		t.Fatal("reloaded with nothing changed")
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "later.yaml"), []byte(testPricesFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if !w.Reload() {
		t.Fatalf("the prices file appeared but the policy did not reload (last error %s)", w.LastError())
	}
	if _, ok := w.Current().Price("house-model", time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC)); !ok {
		t.Error("house-model unpriced after the reload")
	}
}

// TestCostChargesEachTokenType: an event with every token type costs
// exactly the sum of each type times its own price, whichever layer the
// price came from; a layer that leaves cache_write or reasoning out bills
// them at input and output, and parts larger than what contains them are
// clamped.
func TestCostChargesEachTokenType(t *testing.T) {
	dir := t.TempDir()
	cat := `version: 1
currency: USD
as_of: 2026-12-01
sources: {test: here}
prices:
  - {model: full, input: 3, cached_input: 0.3, cache_write: 3.75, output: 15, reasoning: 20}
  - {model: plain, input: 2, output: 8}
`
	if err := os.WriteFile(filepath.Join(dir, "prices.yaml"), []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Parse([]byte(`price_catalog: none
prices_file: prices.yaml
unpriced_price: {currency: USD, prompt: 10, completion: 30, cached: 1, cache_write: 12, reasoning: 40}
prices:
  - {model: inline, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1, completion: 4, cached: 0.1, cache_write: 1.25, reasoning: 6}
  - {model: inline-plain, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 1, completion: 4, cached: 0.1}
`), filepath.Join(dir, "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 uncached input, 2,000 cached reads, 3,000 cache writes, 4,000
	// plain output and 5,000 reasoning tokens.
	tok := Tokens{Prompt: 6000, Cached: 2000, CacheWrite: 3000, Completion: 9000, Reasoning: 5000}
	ts := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC).Unix()
	for _, c := range []struct {
		model string
		want  float64
	}{
		{"full", (1000*3 + 2000*0.3 + 3000*3.75 + 4000*15 + 5000*20) / 1e6},
		{"plain", (1000*2 + 2000*2 + 3000*2 + 4000*8 + 5000*8) / 1e6},
		{"inline", (1000*1 + 2000*0.1 + 3000*1.25 + 4000*4 + 5000*6) / 1e6},
		{"inline-plain", (1000*1 + 2000*0.1 + 3000*1 + 4000*4 + 5000*4) / 1e6},
		{"mystery", (1000*10 + 2000*1 + 3000*12 + 4000*30 + 5000*40) / 1e6},
	} {
		pr, _, _, _ := p.CostSpan(c.model, ts)
		if got := pr.Cost(tok); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%s: cost %v, want %v (%+v)", c.model, got, c.want, pr)
		}
	}
	full, _, _, _ := p.CostSpan("full", ts)
	// More cached and written than prompt, more reasoning than completion:
	// reads first, writes get what is left, reasoning at most the output.
	over := Tokens{Prompt: 100, Cached: 80, CacheWrite: 50, Completion: 10, Reasoning: 30}
	if got, want := full.Cost(over), (0*3+80*0.3+20*3.75+0*15+10*20)/1e6; math.Abs(got-want) > 1e-15 {
		t.Errorf("clamped parts: cost %v, want %v", got, want)
	}
}

// TestBilledEquivalentQuotas: count: billed makes an entry's hourly,
// daily and monthly token quotas count billed-equivalent tokens (each
// type weighted by its price over the input price), never
// tokens_per_minute; count merges like mode and is validated at load.
func TestBilledEquivalentQuotas(t *testing.T) {
	p, err := Parse([]byte(`price_catalog: none
defaults:
  models:
    "*": {monthly_tokens: 1000, tokens_per_minute: 100, count: billed}
tenants:
  acme:
    models:
      "*": {daily_tokens: 500}
      gpt-x: {monthly_tokens: 10}
  plain:
    models:
      "*": {count: total}
prices:
  - {model: gpt-x, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 2, completion: 8, cached: 0.5, cache_write: 2.5, reasoning: 8}
`), "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	billed := func(tenant, model string) map[string]bool {
		out := map[string]bool{}
		for _, q := range p.Tenant(tenant).Quotas(model) {
			out[string(q.Name)] = q.Billed
		}
		return out
	}
	if got := billed("acme", "*"); !got["monthly_tokens"] || !got["daily_tokens"] || got["tokens_per_minute"] {
		t.Errorf("acme *: billed %v; want monthly and daily billed (inherited count), tokens_per_minute not", got)
	}
	if got := billed("acme", "gpt-x"); got["monthly_tokens"] {
		t.Errorf("acme gpt-x: billed %v; want total (the entry does not inherit from *)", got)
	}
	if got := billed("plain", "*"); got["monthly_tokens"] {
		t.Errorf("plain *: billed %v; want total (count: total overrides the defaults)", got)
	}
	pr, _ := p.Price("gpt-x", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	// 1,000 plain input + 2,000 reads at 0.25 + 3,000 writes at 1.25 +
	// 4,000 output and 5,000 reasoning at 4.
	tok := Tokens{Prompt: 6000, Cached: 2000, CacheWrite: 3000, Completion: 9000, Reasoning: 5000}
	if got, want := pr.BilledTokens(tok), 1000+2000*0.25+3000*1.25+9000*4.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("billed-equivalent tokens %v, want %v", got, want)
	}
	if got := (Price{}).BilledTokens(tok); got != 15000 {
		t.Errorf("billed-equivalent tokens without an input price %v, want the 15000 total", got)
	}
	_, err = Parse([]byte("tenants:\n  acme:\n    models:\n      \"*\": {monthly_tokens: 1, count: weighted}\n"), "bad.yaml")
	if err == nil || !strings.Contains(err.Error(), "tenants.acme.models.*.count") || !strings.Contains(err.Error(), "total, billed") {
		t.Errorf("count: weighted: error %v, want one naming tenants.acme.models.*.count and total, billed", err)
	}
}
