package refgateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/gateway/flags"
	"github.com/sluicehq/sluice/schemas"
)

type recorder struct {
	mu     sync.Mutex
	events []schemas.UsageEvent
}

func (r *recorder) Emit(ev *schemas.UsageEvent) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, *ev)
	return nil
}

type decider map[string]checker.Decision

func (d decider) Check(tenant, _, _ string) checker.Decision { return d[tenant] }

func setup(t *testing.T, d decider) (*httptest.Server, *recorder) {
	t.Helper()
	up := httptest.NewServer(mockllm.Handler())
	t.Cleanup(up.Close)
	rec := &recorder{}
	g := &Gateway{Upstream: up.URL, Checker: d, Emitter: rec, Name: "ref-1",
		Keys: map[string]Caller{"sk-a": {Tenant: "acme", APIKeyID: "key-a"}, "sk-b": {Tenant: "blocked", APIKeyID: "key-b"}}}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return srv, rec
}

func call(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestServedCallIsMeteredWithUpstreamUsage(t *testing.T) {
	srv, rec := setup(t, decider{})
	for _, stream := range []string{"false", "true"} {
		resp, body := call(t, srv.URL, "sk-a", `{"model":"gpt-4o","max_tokens":7,"stream":`+stream+`,"messages":[{"role":"user","content":"hi there"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	if len(rec.events) != 2 {
		t.Fatalf("emitted %d events, want 2", len(rec.events))
	}
	for _, ev := range rec.events {
		if ev.Tenant != "acme" || ev.APIKeyID != "key-a" || ev.Model != "gpt-4o" ||
			ev.PromptTokens != mockllm.PromptTokens("hi there") || ev.CompletionTokens != 7 || ev.Outcome != schemas.OutcomeOK {
			t.Errorf("event %+v does not carry the upstream's usage", ev)
		}
		if err := ev.Validate(); err != nil {
			t.Errorf("emitted event is invalid: %v", err)
		}
	}
	if rec.events[0].ID == rec.events[1].ID {
		t.Error("two calls share an event id")
	}
}

// TestRefusedCallNamesTheLimitAndIsCounted: a refused call is answered
// with the limit and emitted as a rejected event with zero tokens, so the
// refusal is visible in Sluice (it used to emit nothing).
func TestRefusedCallNamesTheLimitAndIsCounted(t *testing.T) {
	resets := time.Now().Add(30 * time.Minute)
	srv, rec := setup(t, decider{"blocked": {Outcome: checker.Refused, Scope: "*",
		Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "hourly_tokens", Period: "hour",
			Limit: 1000, Used: 1000, ResetsAt: resets}}})
	resp, body := call(t, srv.URL, "sk-b", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "hourly_tokens") {
		t.Fatalf("status %d Retry-After %q body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if len(rec.events) != 1 {
		t.Fatalf("a refused call emitted %d events, want 1: %+v", len(rec.events), rec.events)
	}
	if ev := rec.events[0]; ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 || ev.Status != http.StatusTooManyRequests ||
		ev.Tenant != "blocked" || ev.APIKeyID != "key-b" || ev.Model != "gpt-4o" || ev.Gateway != "ref-1" || ev.Validate() != nil {
		t.Fatalf("refusal event %+v (validate: %v)", ev, ev.Validate())
	}
	if resp, _ := call(t, srv.URL, "sk-nope", `{}`); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown key: status %d, want 401", resp.StatusCode)
	}
}
