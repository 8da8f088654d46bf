package refgateway

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// settled waits until n settlements were emitted (they are emitted when
// the handler returns, which may be after the client read the answer) and
// returns every event.
func settled(t *testing.T, r *emittertest.Recorder, n int) []schemas.UsageEvent {
	t.Helper()
	itest.Eventually(t, 5*time.Second, "settlements", func() bool {
		k := 0
		for _, ev := range r.Events() {
			if !ev.Estimated {
				k++
			}
		}
		return k >= n
	})
	return r.Events()
}

type decider map[string]checker.Decision

func (d decider) Check(tenant, _, _ string) checker.Decision { return d[tenant] }

func setup(t *testing.T, d decider) (*httptest.Server, *emittertest.Recorder) {
	t.Helper()
	up := httptest.NewServer(mockllm.Handler())
	t.Cleanup(up.Close)
	return setupWith(t, d, up.URL, nil)
}

func setupWith(t *testing.T, d decider, upstream string, adjust func(*Gateway)) (*httptest.Server, *emittertest.Recorder) {
	t.Helper()
	rec := &emittertest.Recorder{}
	g := &Gateway{Upstream: upstream, Checker: d, Emitter: rec, Name: "ref-1",
		Keys: map[string]Caller{"sk-a": {Tenant: "acme", APIKeyID: "key-a"}, "sk-b": {Tenant: "blocked", APIKeyID: "key-b"}}}
	if adjust != nil {
		adjust(g)
	}
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(srv.Close)
	return srv, rec
}

func call(t *testing.T, url, key, body string) (*http.Response, string) {
	t.Helper()
	return itest.Send(t, http.MethodPost, url+"/v1/chat/completions", body, "Authorization", "Bearer "+key)
}

// TestServedCallIsEstimatedThenSettled: each call, streamed or not, is
// emitted as its estimate before the upstream call and settled with the
// upstream's usage after it, under one id per call.
func TestServedCallIsEstimatedThenSettled(t *testing.T) {
	srv, rec := setup(t, decider{})
	const body = `{"model":"gpt-4o","max_tokens":7,"stream":%s,"messages":[{"role":"user","content":"hi there"}]}`
	for _, stream := range []string{"false", "true"} {
		resp, answer := call(t, srv.URL, "sk-a", strings.Replace(body, "%s", stream, 1))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, answer)
		}
		settled(t, rec, 1)
		if stream == "false" {
			checkPair(t, rec.Take(), false)
		} else {
			checkPair(t, rec.Events(), true)
		}
	}
}

func checkPair(t *testing.T, events []schemas.UsageEvent, stream bool) {
	t.Helper()
	if len(events) != 2 {
		t.Fatalf("stream %v: %d events, want the estimate and the settlement: %+v", stream, len(events), events)
	}
	est, settled := events[0], events[1]
	e, _ := estimate.New(estimate.DefaultConfig())
	want, _ := e.Estimate("acme", estimate.ChatCompletions, []byte(`{"model":"gpt-4o","max_tokens":7,"messages":[{"role":"user","content":"hi there"}]}`))
	if !est.Estimated || est.ID != settled.ID || est.PromptTokens != want.Prompt || est.CompletionTokens != 7 {
		t.Errorf("stream %v: estimate %+v, want %d + 7 tokens under the settlement's id", stream, est, want.Prompt)
	}
	if settled.Estimated || settled.Tenant != "acme" || settled.APIKeyID != "key-a" || settled.Model != "gpt-4o" || settled.Provider != "mock" ||
		settled.PromptTokens != mockllm.PromptTokens("hi there") || settled.CompletionTokens != 7 || settled.Outcome != schemas.OutcomeOK ||
		settled.Status != 200 || settled.Gateway != "ref-1" {
		t.Errorf("stream %v: settlement %+v does not carry the upstream's usage", stream, settled)
	}
	for _, ev := range events {
		if err := ev.Validate(); err != nil {
			t.Errorf("emitted event is invalid: %v", err)
		}
	}
}

// slowStream is an upstream that streams one chunk, waits for release (or
// the caller to go away), then sends the usage chunk.
func slowStream(t *testing.T, release <-chan struct{}, gone chan<- struct{}) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok \"}}]}\n\n")
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			gone <- struct{}{}
			return
		}
		_, _ = io.WriteString(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	return up.URL
}

func openStream(t *testing.T, url string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer sk-a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.Contains(line, `"ok `) {
		t.Fatalf("first chunk %q %v", line, err)
	}
	return resp, rd
}

// TestStreamIsRelayedAndSettledAtItsEnd: the gateway passes a stream on
// as it arrives (the client reads the first chunk while the upstream still
// holds the rest) and settles only at its end, with the usage chunk's
// numbers.
func TestStreamIsRelayedAndSettledAtItsEnd(t *testing.T) {
	release, gone := make(chan struct{}), make(chan struct{}, 1)
	srv, rec := setupWith(t, decider{}, slowStream(t, release, gone), nil)
	resp, rd := openStream(t, srv.URL)
	defer resp.Body.Close()
	if ev := rec.Events(); len(ev) != 1 || !ev[0].Estimated {
		t.Fatalf("events while the stream is open: %+v", ev)
	}
	close(release)
	rest, _ := io.ReadAll(rd)
	if !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("rest of the stream %q", rest)
	}
	ev := settled(t, rec, 1)
	if len(ev) != 2 || ev[1].PromptTokens != 12 || ev[1].CompletionTokens != 3 || ev[1].ID != ev[0].ID || ev[1].Outcome != schemas.OutcomeOK {
		t.Fatalf("events %+v", ev)
	}
}

// TestClientLeavingMidStreamSettlesOnce: a client that hangs up during a
// stream cancels the upstream call, and the call is settled exactly once,
// marked cancelled, not as an upstream error.
func TestClientLeavingMidStreamSettlesOnce(t *testing.T) {
	release, gone := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	srv, rec := setupWith(t, decider{}, slowStream(t, release, gone), nil)
	resp, _ := openStream(t, srv.URL)
	_ = resp.Body.Close()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream call was not cancelled when the client left")
	}
	ev := settled(t, rec, 1)
	if len(ev) != 2 || ev[1].ID != ev[0].ID || ev[1].Outcome == schemas.OutcomeError || ev[1].Attributes["cancelled"] != "client" || ev[1].Validate() != nil {
		t.Fatalf("events %+v", ev)
	}
}

// TestNoEstimatesAndUpstreamDown: with NoEstimates each call is one event,
// and a call the upstream never answered settles as a 502 error with no
// tokens.
func TestNoEstimatesAndUpstreamDown(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	srv, rec := setupWith(t, decider{}, down.URL, func(g *Gateway) { g.NoEstimates = true })
	resp, body := call(t, srv.URL, "sk-a", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	ev := settled(t, rec, 1)
	if len(ev) != 1 || ev[0].Estimated || ev[0].Status != 502 || ev[0].Outcome != schemas.OutcomeError || ev[0].TotalTokens() != 0 {
		t.Fatalf("events %+v", ev)
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
	evs := rec.Events()
	if len(evs) != 1 {
		t.Fatalf("a refused call emitted %d events, want 1: %+v", len(evs), evs)
	}
	if ev := evs[0]; ev.Outcome != schemas.OutcomeRejected || ev.TotalTokens() != 0 || ev.Status != http.StatusTooManyRequests ||
		ev.Tenant != "blocked" || ev.APIKeyID != "key-b" || ev.Model != "gpt-4o" || ev.Gateway != "ref-1" || ev.Validate() != nil {
		t.Fatalf("refusal event %+v (validate: %v)", ev, ev.Validate())
	}
	if resp, _ := call(t, srv.URL, "sk-nope", `{}`); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown key: status %d, want 401", resp.StatusCode)
	}
}

// TestAdmissionRefusesBeforeTheUpstream: with a Limiter built from the
// policy, a tenant over its tokens-per-minute rule is answered 429 naming
// the rule, with Retry-After, and its call never reaches the upstream;
// another tenant is still served. Against the real Redis.
func TestAdmissionRefusesBeforeTheUpstream(t *testing.T) {
	pol, err := policy.Parse([]byte(`
tenants:
  small:
    limits:
      small-tpm:
        unit: total_tokens
        sliding_window: {length: 1m, limit: 300}
        exact: true
`), "gateway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redisconn.NewClient(itest.Redis(t), redisconn.ContextTimeouts())
	t.Cleanup(func() { rdb.Close() })
	lim, err := admission.New(rdb, pol.AdmissionRules(), admission.WithPrefix(itest.Unique(t, "sluice_test_refgw:")+":"),
		admission.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })

	var upstreamCalls atomic.Int64
	mock := mockllm.Handler()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamCalls.Add(1)
		mock.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	srv, rec := setupWith(t, decider{}, up.URL, func(g *Gateway) {
		g.Keys["sk-s"] = Caller{Tenant: "small", APIKeyID: "key-s"}
		g.Admission = lim
	})
	const body = `{"model":"gpt-4o","max_tokens":60,"messages":[{"role":"user","content":"say something"}]}`

	served := int64(0)
	var refusal *http.Response
	var refusalBody string
	for range 20 {
		resp, answer := call(t, srv.URL, "sk-s", body)
		if resp.StatusCode == http.StatusOK {
			served++
			if resp.Header.Get("x-ratelimit-limit-tokens") != "300" {
				t.Fatalf("admitted answer without the rule's headers: %v", resp.Header)
			}
			continue
		}
		refusal, refusalBody = resp, answer
		break
	}
	if refusal == nil {
		t.Fatalf("20 calls of about 80 tokens were all served under a 300 tokens-per-minute rule")
	}
	if served == 0 {
		t.Fatalf("the first call was refused: %d %s", refusal.StatusCode, refusalBody)
	}
	if refusal.StatusCode != http.StatusTooManyRequests || refusal.Header.Get("Retry-After") == "" {
		t.Fatalf("refusal: %d, headers %v, body %s", refusal.StatusCode, refusal.Header, refusalBody)
	}
	var e struct {
		Error struct{ Message, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(refusalBody), &e); err != nil || e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, "small-tpm") {
		t.Fatalf("refusal body %s (%v): want rate_limit_exceeded naming small-tpm", refusalBody, err)
	}
	if got := upstreamCalls.Load(); got != served {
		t.Fatalf("the upstream was called %d times for %d served calls: the refused call reached it", got, served)
	}
	// The refusal is metered as one rejected event.
	settled(t, rec, int(served))
	var rejected int
	for _, ev := range rec.Events() {
		if ev.Tenant == "small" && ev.Outcome == schemas.OutcomeRejected {
			rejected++
		}
	}
	if rejected != 1 {
		t.Fatalf("%d rejected events for small, want 1", rejected)
	}
	// The rule is small's own: acme is served.
	if resp, answer := call(t, srv.URL, "sk-a", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("acme after small's refusal: %d %s", resp.StatusCode, answer)
	}
	if got := upstreamCalls.Load(); got != served+1 {
		t.Fatalf("upstream calls %d, want %d", got, served+1)
	}
}
