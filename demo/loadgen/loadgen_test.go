package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestCountsHowTenantsWereAnswered: the generator's counters are what the
// demo shows, so a 429 must be counted as a quota refusal with its message.
func TestCountsHowTenantsWereAnswered(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer sk-blocked" {
			http.Error(w, `{"error":{"message":"monthly_tokens exhausted"}}`, http.StatusTooManyRequests)
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	g := &Generator{URL: srv.URL, Tenants: []Tenant{
		{Name: "ok", APIKey: "sk-ok", Model: "m", RequestsPerSecond: 200, PromptChars: 40, MaxTokens: 8},
		{Name: "blocked", APIKey: "sk-blocked", Model: "m", RequestsPerSecond: 200, PromptChars: 40, MaxTokens: 8},
	}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	before := time.Now()
	go func() { _ = g.Run(ctx); close(done) }()
	deadline := time.Now().Add(20 * time.Second)
	for g.Counts("ok").OK.Load() < 5 || g.Counts("blocked").Quota429.Load() < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("counts after 20s: ok=%d blocked429=%d", g.Counts("ok").OK.Load(), g.Counts("blocked").Quota429.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if g.Counts("ok").Quota429.Load() != 0 || g.Counts("blocked").OK.Load() != 0 {
		t.Fatal("answers were counted for the wrong tenant")
	}
	// The demo measures the first prediction from a tenant's first call.
	if s := g.Counts("ok").Started(); s.Before(before) || s.After(time.Now()) {
		t.Errorf("started %v, want the first call's time, after %v", s, before)
	}
	if !g.Counts("idle").Started().IsZero() {
		t.Error("a tenant that sent nothing has a start")
	}
	if got := g.Counts("blocked").LastRefusal(); got == "" {
		t.Fatal("the refusal message was not kept")
	}
}
