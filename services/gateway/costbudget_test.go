package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sdk/go/admission"
)

// TestCostBudgetRefusesTheCallWhoseMaxTokensWouldCrossIt: each key of
// acme may spend $1 a month (a limit counting cost). gpt-4o-mini costs
// $1,000 per million completion tokens here, and every answer uses 500
// of them ($0.50). The first call, whose max_tokens 700 could cost $0.70,
// passes and settles at its real $0.50; the second, whose worst case
// would take the key to $1.20, is refused before the upstream sees it,
// 429 naming the budget and what is left; one with max_tokens 400 fits
// ($0.90) and passes; the tenant's other key carries on with a budget
// of its own.
func TestCostBudgetRefusesTheCallWhoseMaxTokensWouldCrossIt(t *testing.T) {
	url, upstreamCalls := limitsGateway(t, 500, `
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0, completion: 1000}
tenants:
  acme:
    limits:
      key-budget: {scope: {key: "*"}, unit: cost, period: {every: month, limit: 1}}
`)
	call := func(key string, maxTokens string) (*http.Response, string) {
		return post(t, url, "/v1/chat/completions", key, `{"model":"gpt-4o-mini","max_tokens":`+maxTokens+`,"messages":[{"role":"user","content":"hi"}]}`)
	}

	if resp, b := call("sk-acme", "700"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a call of at most $0.70 against a $1 budget: %d %s", resp.StatusCode, b)
	}
	resp, b := call("sk-acme", "700")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(b, "key-budget") || !strings.Contains(b, "available 0.5,") {
		t.Fatalf("a call that could take the key to $1.20: %d %s; want 429 naming key-budget with 0.5 available", resp.StatusCode, b)
	}
	if n := upstreamCalls.Load(); n != 1 {
		t.Fatalf("the upstream saw %d calls; the refused one must not reach it", n)
	}
	if resp, b := call("sk-acme", "400"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a call of at most $0.40 with $0.50 left: %d %s", resp.StatusCode, b)
	}
	if resp, b := call("sk-boss", "700"); resp.StatusCode != http.StatusOK {
		t.Fatalf("acme's other key: %d %s; want its own budget", resp.StatusCode, b)
	}
}

// TestBudgetsAtEveryLevel: money budgets at five levels, each a limit
// counting cost — the organisation corp ($5, over its teams acme and
// trial together), the team acme ($4), each key ($3), each end user ($2)
// and each agent session ($1, X-Sluice-Session). Every call may cost $1
// and costs $1. Each level refuses at its own limit, 429 naming its
// budget, while its siblings carry on: another session of the same
// user, another user of the same key, another key of the same team, and
// the other team of the organisation until the organisation is spent.
func TestBudgetsAtEveryLevel(t *testing.T) {
	url, _ := limitsGateway(t, 1000, `
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0, completion: 1000}
limits:
  org-budget: {scope: {organization: "*"}, unit: cost, period: {every: month, limit: 5}}
defaults:
  limits:
    key-budget: {scope: {key: "*"}, unit: cost, period: {every: month, limit: 3}}
    user-budget: {scope: {user: "*"}, unit: cost, period: {every: month, limit: 2}}
    session-budget: {scope: {session: "*"}, unit: cost, period: {every: month, limit: 1}}
tenants:
  acme:
    organization: corp
    limits:
      team-budget: {unit: cost, period: {every: month, limit: 4}}
  trial:
    organization: corp
`)
	for i, step := range []struct {
		key, user, session string
		refusedBy          string // "" for 200
	}{
		{"sk-boss", "u1", "s1", ""},
		{"sk-boss", "u1", "s1", "session-budget"},
		{"sk-boss", "u1", "s2", ""}, // another session of u1
		{"sk-boss", "u1", "s3", "user-budget"},
		{"sk-boss", "u2", "s4", ""}, // another user of the key
		{"sk-boss", "u3", "s5", "key-budget"},
		{"sk-acme", "", "s6", ""}, // another key of the team (its user is batch)
		{"sk-acme", "", "s7", "team-budget"},
		{"sk-mini-only", "", "s8", ""}, // the organisation's other team
		{"sk-mini-only", "", "s9", "org-budget"},
	} {
		body := `{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]`
		if step.user != "" {
			body += `,"user":"` + step.user + `"`
		}
		resp, b := post(t, url, "/v1/chat/completions", step.key, body+"}", HeaderSession, step.session)
		wantBudget(t, fmt.Sprintf("call %d (%s, user %q, session %s)", i+1, step.key, step.user, step.session), resp, b, step.refusedBy)
	}
}

// wantBudget fails the test unless resp answered the call (refusedBy "")
// or refused it with a 429 naming the budget refusedBy.
func wantBudget(t *testing.T, call string, resp *http.Response, body, refusedBy string) {
	t.Helper()
	switch {
	case refusedBy == "" && resp.StatusCode != http.StatusOK:
		t.Fatalf("%s: %d %s; want 200", call, resp.StatusCode, body)
	case refusedBy != "" && (resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "rule "+refusedBy+" ")):
		t.Fatalf("%s: %d %s; want 429 naming %s", call, resp.StatusCode, body, refusedBy)
	}
}

// TestOneOffBudgetExpires: each key of acme may spend $2 once, until an
// hour from now (period every: once, expires_at), and $3 in any day (a
// sliding window). Calls cost $1. The key's third call is refused, 429
// naming the one-off budget, while another key carries on. Once the
// gateway's admission clock passes expires_at (moved, not waited for) the
// one-off budget no longer applies: the key's calls follow the daily
// limit alone, which refuses in turn.
func TestOneOffBudgetExpires(t *testing.T) {
	var shift atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	expires := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	url, upstreamCalls := limitsGateway(t, 1000, `
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0, completion: 1000}
tenants:
  acme:
    limits:
      promo: {scope: {key: "*"}, unit: cost, period: {every: once, limit: 2, expires_at: "`+expires+`"}}
      daily: {scope: {key: "*"}, unit: cost, sliding_window: {length: 24h, limit: 3}}
`, WithAdmissionOptions(admission.WithClock(clock)))
	call := func(key string) (*http.Response, string) {
		return post(t, url, "/v1/chat/completions", key, `{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`)
	}
	for i, step := range []struct {
		key       string
		refusedBy string // "" for 200
		after     bool   // the clock past expires_at
	}{
		{"sk-acme", "", false},
		{"sk-acme", "", false},
		{"sk-acme", "promo", false},
		{"sk-boss", "", false}, // another key's budget
		{"sk-acme", "", true},  // the one-off budget is over: $3 a day left to follow
		{"sk-acme", "daily", true},
		{"sk-boss", "", true},
	} {
		if step.after {
			shift.Store(int64(2 * time.Hour))
		}
		resp, b := call(step.key)
		wantBudget(t, fmt.Sprintf("call %d (%s)", i+1, step.key), resp, b, step.refusedBy)
	}
	if n := upstreamCalls.Load(); n != 5 {
		t.Fatalf("the upstream saw %d calls, want the 5 admitted", n)
	}
}

// TestBudgetsResetAtTheirInstantsInThreeZones: each key of acme may
// spend $2 a week (from Monday), a billing month (from the 15th) or any
// seven days (a sliding_window of 168h: a rolling budget), in New York,
// whose clocks spring forward on March 8th, in Kolkata and in London.
// Calls cost $1. Two dollars spent from Tuesday March 3rd, a third call is
// refused with a Retry-After naming the budget's reset, refused still a
// second before it, and admitted at it: midnight of Monday the 9th and of
// the 15th, local time, for the week and the month, whose next period
// then holds the whole $2; for the rolling budget, the moment the first
// dollar leaves: 168 hours after it was spent, at the end of its granule
// (1/60 of the window, 2.8 h), while the second dollar still counts. That
// is elapsed time, not the same local time a week on (167 hours later in
// New York). The gateway's and the scripts' clock is moved, not waited for
// (and refusals are not cached: the cache keeps them by the real clock).
func TestBudgetsResetAtTheirInstantsInThreeZones(t *testing.T) {
	t0 := time.Date(2026, 3, 3, 15, 0, 0, 0, time.UTC)
	const length, gran = 168 * time.Hour, 168 * time.Hour / admission.Granules
	rollingReset := time.UnixMilli((t0.UnixMilli()/gran.Milliseconds() + 1) * gran.Milliseconds()).Add(length)
	for _, zone := range []string{"America/New_York", "Asia/Kolkata", "Europe/London"} {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range []struct {
			name, limit string
			reset       time.Time
			periodic    bool // the next period holds the whole budget
		}{
			{"weekly", "period: {every: week, limit: 2}", time.Date(2026, 3, 9, 0, 0, 0, 0, loc), true},
			{"billing", "period: {every: month, anchor_day: 15, limit: 2}", time.Date(2026, 3, 15, 0, 0, 0, 0, loc), true},
			{"rolling", "sliding_window: {length: 168h, limit: 2}", rollingReset, false},
		} {
			t.Run(zone+"/"+b.name, func(t *testing.T) {
				var at atomic.Int64
				clock := func() time.Time { return time.Unix(0, at.Load()) }
				url, _ := limitsGateway(t, 1000, `
prices:
  - {model: gpt-4o-mini, currency: USD, effective_from: 2026-01-01T00:00:00Z, prompt: 0, completion: 1000}
tenants:
  acme:
    timezone: `+zone+`
    limits:
      `+b.name+`: {scope: {key: "*"}, unit: cost, `+b.limit+`}
`, WithAdmissionOptions(admission.WithClock(clock), admission.WithScriptClock(clock), admission.WithRefusalCache(0)))
				after := b.name // the call a second after the reset
				if b.periodic {
					after = ""
				}
				for i, step := range []struct {
					at        time.Time
					refusedBy string // "" for 200
				}{
					{t0, ""},
					{t0.Add(24 * time.Hour), ""},
					{t0.Add(48 * time.Hour), b.name},
					{b.reset.Add(-time.Second), b.name},
					{b.reset, ""},
					{b.reset.Add(time.Second), after},
				} {
					at.Store(step.at.UnixNano())
					resp, body := post(t, url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o-mini","max_tokens":1000,"messages":[{"role":"user","content":"hi"}]}`)
					wantBudget(t, fmt.Sprintf("call %d at %s", i+1, step.at.In(loc)), resp, body, step.refusedBy)
					if i != 2 {
						continue
					}
					retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
					if named := step.at.Add(time.Duration(retry) * time.Second); err != nil || named.Before(b.reset) || named.After(b.reset.Add(time.Second)) {
						t.Fatalf("Retry-After %q at %s names %s; want the reset, %s", resp.Header.Get("Retry-After"), step.at, named, b.reset)
					}
				}
			})
		}
	}
	ny, _ := time.LoadLocation("America/New_York")
	if weekOn := t0.In(ny).AddDate(0, 0, 7); weekOn.Sub(t0) != 167*time.Hour || !weekOn.Before(rollingReset.Add(-time.Second)) {
		t.Fatalf("New York's same local time a week on is %s later; the rolling case means it to be 167h, before the reset", weekOn.Sub(t0))
	}
}
