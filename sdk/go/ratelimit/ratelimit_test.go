package ratelimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestFormatResetReadsBackAsADuration: what OpenAI clients do with the
// header is time.ParseDuration (go-openai) or an equivalent; the value
// must parse, never be earlier than the real reset, and look like
// OpenAI's own values.
func TestFormatResetReadsBackAsADuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Second, "0s"},
		{time.Nanosecond, "1ms"},
		{12 * time.Millisecond, "12ms"},
		{999 * time.Microsecond, "1ms"},
		{time.Second, "1s"},
		{1500*time.Millisecond + time.Microsecond, "1.501s"},
		{6 * time.Minute, "6m0s"},
		{17*time.Second + 280*time.Millisecond, "17.28s"},
		{2 * time.Hour, "2h0m0s"},
	} {
		got := FormatReset(c.d)
		if got != c.want {
			t.Errorf("FormatReset(%v) = %q, want %q", c.d, got, c.want)
		}
		back, err := time.ParseDuration(got)
		if err != nil || back < c.d {
			t.Errorf("%q parses as %v (%v), earlier than %v", got, back, err, c.d)
		}
	}
}

func TestRetryAfterRoundsUpToAWholeSecond(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, 2 * time.Hour: 7200} {
		if got := RetryAfter(d); got != want {
			t.Errorf("RetryAfter(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestWriteTooManyRequests(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteTooManyRequests(rec, Error{Message: "Rate limit reached for gpt-4o on tokens per min: Limit 30000, Used 29937, Requested 385.",
		Type: TypeTokens, Code: CodeRateLimitExceeded, Sluice: map[string]any{"rule": "tpm"}}, 644*time.Millisecond,
		Limit{Unit: Tokens, Limit: 30000, Remaining: -322, Reset: 644 * time.Millisecond},
		Limit{Unit: Requests, Limit: 500, Remaining: 499, Reset: 120 * time.Millisecond})
	h := rec.Header()
	want := map[string]string{
		"Retry-After": "1", "Content-Type": "application/json",
		"x-ratelimit-limit-tokens": "30000", "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "644ms",
		"x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "499", "x-ratelimit-reset-requests": "120ms",
	}
	for k, v := range want {
		if got := h.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", rec.Code)
	}
	var raw map[string]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	e := raw["error"]
	if e["type"] != "tokens" || e["code"] != "rate_limit_exceeded" || e["param"] != nil || e["message"] == "" {
		t.Fatalf("body %s", rec.Body)
	}
	if _, ok := e["param"]; !ok {
		t.Fatal("param missing: OpenAI sends it as null")
	}
	if s, _ := e["sluice"].(map[string]any); s["rule"] != "tpm" {
		t.Fatalf("sluice member %v", e["sluice"])
	}
	// Nothing sends a Unix time.
	if h.Get("X-RateLimit-Reset") != "" {
		t.Fatal("a Unix-time reset header was sent")
	}
}

func TestWriteErrorWithoutRetry(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusForbidden, Error{Message: "blocked", Type: "permission_denied", Code: "blacklisted"}, 0)
	if rec.Code != http.StatusForbidden || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("%d %v", rec.Code, rec.Header())
	}
	var b Body
	if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.Error.Code != "blacklisted" || b.Error.Sluice != nil {
		t.Fatalf("%s %v", rec.Body, err)
	}
}
