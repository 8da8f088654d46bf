package middleware

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

type fixed map[string]checker.Decision

func (f fixed) Check(tenant, model, key string) checker.Decision { return f[tenant] }

var now = time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)

func serve(t *testing.T, d Decider, tenant string) *httptest.ResponseRecorder {
	t.Helper()
	h := New(d, HeaderIdentify("X-Tenant", "X-Model", "X-Key"), WithClock(func() time.Time { return now }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	req.Header.Set("X-Model", "gpt-4o")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func body(t *testing.T, rec *httptest.ResponseRecorder) ErrorBody {
	t.Helper()
	var b ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
		t.Fatalf("body %q: %v", rec.Body.String(), err)
	}
	return b
}

func TestQuotaRefusalNamesTheLimitAndTheReset(t *testing.T) {
	resets := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	d := fixed{"acme": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota,
		Quota: "monthly_tokens", Period: "month", Limit: 10_000_000, Used: 10_000_450, ResetsAt: resets, Until: now.Add(time.Minute)}}}
	rec := serve(t, d, "acme")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", rec.Code)
	}
	// OpenAI's headers: Retry-After in seconds, the tokens trio with the
	// reset as a duration, and no Unix time anywhere in the headers.
	h := rec.Header()
	if h.Get("Retry-After") != "7200" || h.Get("x-ratelimit-limit-tokens") != "10000000" || h.Get("x-ratelimit-remaining-tokens") != "0" ||
		h.Get("x-ratelimit-reset-tokens") != "2h0m0s" || h.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("headers %v", h)
	}
	for k, v := range h {
		if strings.Contains(strings.Join(v, ","), "1796083200") || k == "X-Ratelimit-Reset" {
			t.Errorf("header %s: %v carries a Unix time", k, v)
		}
	}
	b := body(t, rec)
	e := b.Error
	if e.Type != "insufficient_quota" || e.Code != "insufficient_quota" || e.Param != nil {
		t.Fatalf("error %+v", e)
	}
	// used is what the enforcer wrote at the crossing: calls in flight go
	// on adding to it, so the message says "at least" rather than under-
	// report what Sluice counted since.
	for _, want := range []string{"acme", "monthly_tokens", "used at least 10000450 of 10000000", "month", "2026-12-01T00:00:00Z", "7200s"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q does not name %q", e.Message, want)
		}
	}
	if s := e.Sluice; s == nil || s.Quota != "monthly_tokens" || s.Limit != 10_000_000 || s.ResetsAt == nil || !s.ResetsAt.Equal(resets) || s.RetryAfterSeconds != 7200 {
		t.Fatalf("sluice detail %+v", e.Sluice)
	}
}

func TestRateRefusalRetriesAfterTheWindow(t *testing.T) {
	end := now.Add(25 * time.Second)
	d := fixed{"acme": {Outcome: checker.Refused, Scope: "gpt-4o", Flag: &flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate,
		Quota: "requests_per_minute", Period: "minute", Limit: 600, Used: 640, ResetsAt: end, Until: end}}}
	rec := serve(t, d, "acme")
	b := body(t, rec)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "25" || b.Error.Type != "requests" ||
		b.Error.Code != "rate_limit_exceeded" || !strings.Contains(b.Error.Message, "model gpt-4o") ||
		!strings.Contains(b.Error.Message, "requests_per_minute") || b.Error.Sluice.Quota != "requests_per_minute" {
		t.Fatalf("%d %v %+v", rec.Code, rec.Header(), b.Error)
	}
	h := rec.Header()
	if h.Get("x-ratelimit-limit-requests") != "600" || h.Get("x-ratelimit-remaining-requests") != "0" || h.Get("x-ratelimit-reset-requests") != "25s" {
		t.Fatalf("headers %v", h)
	}
}

// TestRefusalHeadersFollowTheQuotasUnit: a tokens-per-minute window sends
// the tokens trio (type "tokens"), a budget none (it counts money), and
// the reset is the time to the end of the window, to the millisecond.
func TestRefusalHeadersFollowTheQuotasUnit(t *testing.T) {
	end := now.Add(12*time.Second + 340*time.Millisecond)
	d := fixed{
		"tpm": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate,
			Quota: "tokens_per_minute", Period: "minute", Limit: 30000, Used: 29000.5, ResetsAt: end, Until: end}},
		"money": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota,
			Quota: "budget", Period: "month", Limit: 500, Used: 512.3, ResetsAt: now.Add(time.Hour), Until: now.Add(time.Hour)}},
	}
	rec := serve(t, d, "tpm")
	h := rec.Header()
	if e := body(t, rec).Error; e.Type != "tokens" || e.Code != "rate_limit_exceeded" || h.Get("Retry-After") != "13" ||
		h.Get("x-ratelimit-limit-tokens") != "30000" || h.Get("x-ratelimit-remaining-tokens") != "999" || h.Get("x-ratelimit-reset-tokens") != "12.34s" {
		t.Fatalf("tpm: %v %+v", h, e)
	}
	rec = serve(t, d, "money")
	h = rec.Header()
	if e := body(t, rec).Error; e.Code != "insufficient_quota" || h.Get("Retry-After") != "3600" ||
		h.Get("x-ratelimit-limit-tokens") != "" || h.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("budget: %v %+v", h, e)
	}
}

func TestBreakersBlacklistAndStaleViews(t *testing.T) {
	d := fixed{
		"broken": {Outcome: checker.Refused, Scope: "gpt-4o", Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindErrorRatio,
			RetryAfter: 30 * time.Second, Until: now.Add(30 * time.Second), Reason: "error ratio 0.62"}},
		"banned": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist,
			Until: now.Add(time.Hour), Reason: "fraud"}},
		"strict": {Outcome: checker.RefusedStale, Stale: true},
		"probe":  {Outcome: checker.Probe, Flag: &flags.Flag{State: flags.StateHalfOpen, Kind: flags.KindSlowCall}},
		"fine":   {},
	}
	if rec := serve(t, d, "broken"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "30" ||
		body(t, rec).Error.Code != "breaker_error_ratio" {
		t.Fatalf("breaker: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := serve(t, d, "banned"); rec.Code != http.StatusForbidden || !strings.Contains(body(t, rec).Error.Message, "blocked") {
		t.Fatalf("blacklist: %d %s", rec.Code, rec.Body)
	}
	if rec := serve(t, d, "strict"); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("stale fail-closed: %d %v", rec.Code, rec.Header())
	}
	for _, tenant := range []string{"probe", "fine", ""} {
		if rec := serve(t, d, tenant); rec.Code != http.StatusTeapot {
			t.Fatalf("%q not passed through: %d", tenant, rec.Code)
		}
	}
}

// TestRefusalsAreEmitted: with an Emitter given, every refused request
// becomes a valid usage event (outcome rejected, zero tokens, the status
// answered); allowed requests emit nothing here (the gateway meters them
// after the upstream call); WithRefusalEvents(false) turns it off.
func TestRefusalsAreEmitted(t *testing.T) {
	d := fixed{
		"acme":   {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Reason: "leaked"}},
		"strict": {Outcome: checker.RefusedStale, Stale: true},
	}
	run := func(opts ...Option) []schemas.UsageEvent {
		s := &emittertest.Recorder{}
		opts = append([]Option{WithClock(func() time.Time { return now })}, opts...)
		h := New(d, HeaderIdentify("X-Tenant", "X-Model", "X-Key"), append(opts, WithEmitter(s, "gw-1"))...)(
			http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
		for _, tenant := range []string{"acme", "strict", "fine"} {
			req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			req.Header.Set("X-Tenant", tenant)
			req.Header.Set("X-Model", "gpt-4o")
			req.Header.Set("X-Key", "key-1")
			h.ServeHTTP(httptest.NewRecorder(), req)
		}
		return s.Events()
	}
	evs := run()
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2 (one per refusal): %+v", len(evs), evs)
	}
	want := map[string]struct {
		status int
		by     string
	}{"acme": {http.StatusForbidden, "blacklist"}, "strict": {http.StatusServiceUnavailable, "fail_closed"}}
	for _, ev := range evs {
		w := want[ev.Tenant]
		if ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 || ev.Status != w.status || ev.Model != "gpt-4o" ||
			ev.APIKeyID != "key-1" || ev.Gateway != "gw-1" || ev.Endpoint != "/v1/chat/completions" || ev.Attributes["refused_by"] != w.by ||
			!ev.Time.Equal(now) {
			t.Errorf("event %+v", ev)
		}
		if err := ev.Validate(); err != nil {
			t.Errorf("refusal event invalid: %v", err)
		}
	}
	if evs[0].ID == evs[1].ID {
		t.Error("two refusals share an id")
	}
	if evs := run(WithRefusalEvents(false)); len(evs) != 0 {
		t.Fatalf("WithRefusalEvents(false): %d events", len(evs))
	}
}

// TestInternalReasonNeverReachesTheClient: the flag's Reason is the
// operator's note (here a fraud case); whatever the kind, the response body
// and headers must not contain it, while the message still says what
// happened and the gateway's log (WithLogger) gets the reason.
func TestInternalReasonNeverReachesTheClient(t *testing.T) {
	const secret = "fraud ring #4411"
	resets := now.Add(time.Hour)
	d := fixed{
		"banned": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist,
			Until: now.Add(time.Hour), Reason: secret}},
		"keyban": {Outcome: checker.Refused, Scope: flags.KeyField("key-9"), Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist,
			Reason: secret}},
		"paused": {Outcome: checker.Refused, Scope: "gpt-4o", Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindManual,
			RetryAfter: time.Minute, Until: now.Add(time.Minute), Reason: secret}},
		"broken": {Outcome: checker.Refused, Scope: "gpt-4o", Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindErrorRatio,
			RetryAfter: 30 * time.Second, Until: now.Add(30 * time.Second), Reason: secret}},
		"spent": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota,
			Quota: "hourly_tokens", Period: "hour", Limit: 1000, Used: 1050, ResetsAt: resets, Until: resets, Reason: secret}},
	}
	want := map[string]struct {
		status int
		says   string
	}{
		"banned": {http.StatusForbidden, "blocked on all models"},
		"keyban": {http.StatusForbidden, "blocked on API key key-9"},
		"paused": {http.StatusServiceUnavailable, "paused"},
		"broken": {http.StatusServiceUnavailable, "failing"},
		"spent":  {http.StatusTooManyRequests, "hourly_tokens"},
	}
	var logs bytes.Buffer
	h := New(d, HeaderIdentify("X-Tenant", "X-Model", "X-Key"), WithClock(func() time.Time { return now }),
		WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for tenant, w := range want {
		req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
		req.Header.Set("X-Tenant", tenant)
		req.Header.Set("X-Model", "gpt-4o")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != w.status {
			t.Errorf("%s: status %d, want %d", tenant, rec.Code, w.status)
		}
		raw := rec.Body.String()
		if strings.Contains(raw, "fraud") || strings.Contains(raw, "4411") {
			t.Errorf("%s: body shows the internal reason: %s", tenant, raw)
		}
		for k, v := range rec.Header() {
			if strings.Contains(strings.Join(v, " "), "4411") {
				t.Errorf("%s: header %s shows the internal reason", tenant, k)
			}
		}
		if m := body(t, rec).Error.Message; !strings.Contains(m, tenant) || !strings.Contains(m, w.says) {
			t.Errorf("%s: message %q does not say %q", tenant, m, w.says)
		}
	}
	if n := strings.Count(logs.String(), secret); n != len(want) {
		t.Errorf("gateway log carries the reason %d times, want %d: %s", n, len(want), logs.String())
	}
}
