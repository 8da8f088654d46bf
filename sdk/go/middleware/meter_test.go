package middleware

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

const chatBody = `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a concise assistant."},` +
	`{"role":"user","content":"Summarise the incident: the nightly batch job exhausted the tenant's tokens-per-minute quota."}],"max_tokens":120}`

func newEstimator(t *testing.T) *estimate.Estimator {
	t.Helper()
	e, err := estimate.New(estimate.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func metered(t *testing.T, d Decider, est *estimate.Estimator, s Emitter, h http.HandlerFunc, opts ...Option) http.Handler {
	t.Helper()
	opts = append([]Option{WithClock(func() time.Time { return now }), WithEmitter(s, "gw-1"), WithEstimates(est)}, opts...)
	return New(d, HeaderIdentify("X-Tenant", "X-Model", "X-Key"), opts...)(h)
}

func chatRequest(ctx context.Context, tenant string) *http.Request {
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)).WithContext(ctx)
	req.Header.Set("X-Tenant", tenant)
	req.Header.Set("X-Model", "gpt-4o-mini")
	req.Header.Set("X-Key", "key-1")
	return req
}

// pair checks that events are an estimate and its settlement: same id,
// the estimate first, both valid.
func pair(t *testing.T, events []schemas.UsageEvent) (est, settled schemas.UsageEvent) {
	t.Helper()
	if len(events) != 2 {
		t.Fatalf("%d events, want an estimate and a settlement: %+v", len(events), events)
	}
	est, settled = events[0], events[1]
	if !est.Estimated || settled.Estimated || est.ID != settled.ID || est.ID == "" {
		t.Fatalf("not an estimate and its settlement: %+v / %+v", est, settled)
	}
	for _, ev := range events {
		if err := ev.Validate(); err != nil {
			t.Fatalf("invalid event %+v: %v", ev, err)
		}
		if ev.Tenant != "acme" || ev.Model != "gpt-4o-mini" || ev.APIKeyID != "key-1" || ev.Gateway != "gw-1" || ev.Endpoint != "/v1/chat/completions" {
			t.Fatalf("event %+v", ev)
		}
	}
	return est, settled
}

// TestEstimateThenSettle: a served request is emitted as its estimate
// before the handler runs and as the settlement with the reported usage
// after; the handler reads the body unchanged; the usage teaches the
// estimator the completion ratio.
func TestEstimateThenSettle(t *testing.T) {
	s, est := &emittertest.Recorder{}, newEstimator(t)
	var seenBeforeCall int
	h := metered(t, fixed{}, est, s, func(w http.ResponseWriter, r *http.Request) {
		seenBeforeCall = len(s.Events())
		b, _ := io.ReadAll(r.Body)
		if string(b) != chatBody {
			t.Errorf("handler read %q", b)
		}
		c := CallFrom(r.Context())
		if e, ok := c.Estimate(); !ok || e.MaxOutputTokens != 120 {
			t.Errorf("estimate in the context: %+v %v", e, ok)
		}
		c.SetProvider("openai")
		c.Report(Usage{PromptTokens: 31, CompletionTokens: 57, CachedTokens: 8})
		w.WriteHeader(http.StatusOK)
	})
	h.ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "acme"))
	if seenBeforeCall != 1 {
		t.Fatalf("%d events before the handler ran, want the estimate", seenBeforeCall)
	}
	e, settled := pair(t, s.Events())
	want, _ := est.Estimate("acme", estimate.ChatCompletions, []byte(chatBody))
	if e.PromptTokens != want.Prompt || e.CompletionTokens != 120 || e.Outcome != "" {
		t.Errorf("estimate event %+v, want %d + 120 tokens", e, want.Prompt)
	}
	if settled.PromptTokens != 31 || settled.CompletionTokens != 57 || settled.CachedTokens != 8 || settled.Status != 200 ||
		settled.Outcome != schemas.OutcomeOK || settled.Provider != "openai" || settled.Attributes != nil {
		t.Errorf("settlement %+v", settled)
	}
	if r, ok := est.Ratio("acme", "gpt-4o-mini"); !ok || r != 57.0/31 {
		t.Errorf("ratio %v %v not learned from the settlement", r, ok)
	}
}

// TestPathModelsLearnTheirOwnRatio: a body that names no model (Gemini's,
// whose model is in the path) is estimated with the ratio learned for the
// identity's model, and its usage teaches that model's ratio, not one
// shared by every such body.
func TestPathModelsLearnTheirOwnRatio(t *testing.T) {
	const path, body = "/v1beta/models/gemini-2.5-pro:generateContent", `{"contents":[{"role":"user","parts":[{"text":"hello there, how are you?"}]}]}`
	s, est := &emittertest.Recorder{}, newEstimator(t)
	h := metered(t, fixed{}, est, s, func(w http.ResponseWriter, r *http.Request) {
		CallFrom(r.Context()).Report(Usage{PromptTokens: 10, CompletionTokens: 400})
		w.WriteHeader(http.StatusOK)
	})
	send := func(model string) schemas.UsageEvent {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("X-Tenant", "acme")
		req.Header.Set("X-Model", model)
		n := len(s.Events())
		h.ServeHTTP(httptest.NewRecorder(), req)
		return s.Events()[n]
	}
	first := send("gemini-2.5-pro")
	if r, ok := est.Ratio("acme", "gemini-2.5-pro"); !ok {
		t.Fatalf("ratio %v %v; want one learned for gemini-2.5-pro", r, ok)
	}
	if _, ok := est.Ratio("acme", ""); ok {
		t.Error("the ratio was learned for the empty model, shared by every body without one")
	}
	again, other := send("gemini-2.5-pro"), send("gemini-2.5-flash")
	if !again.Estimated || again.CompletionTokens <= first.CompletionTokens || other.CompletionTokens != first.CompletionTokens {
		t.Errorf("estimated completions: %d at first, %d after the ratio was learned, %d for another model; want the learned ratio read for its model only",
			first.CompletionTokens, again.CompletionTokens, other.CompletionTokens)
	}
}

// TestSettlementOnEveryEnding: errors, a client that went away, a panic
// and a handler that reports nothing all settle exactly once, with the
// tokens and outcome documented on WithEstimates.
func TestSettlementOnEveryEnding(t *testing.T) {
	est := newEstimator(t)
	want, _ := est.Estimate("acme", estimate.ChatCompletions, []byte(chatBody))
	cases := []struct {
		name     string
		handler  http.HandlerFunc
		cancel   bool
		status   int
		outcome  schemas.Outcome
		tokens   int64
		attrs    map[string]string
		panicked bool
	}{
		{name: "upstream error", handler: func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadGateway) },
			status: 502, outcome: schemas.OutcomeError, tokens: 0, attrs: map[string]string{"usage": "none"}},
		{name: "error with usage", handler: func(w http.ResponseWriter, r *http.Request) {
			CallFrom(r.Context()).Report(Usage{PromptTokens: 40})
			w.WriteHeader(http.StatusInternalServerError)
		}, status: 500, outcome: schemas.OutcomeError, tokens: 40},
		{name: "client went away", cancel: true, handler: func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			status: statusClientClosed, outcome: "", tokens: 0, attrs: map[string]string{"usage": "none", "cancelled": "client"}},
		{name: "client went away mid-answer", cancel: true, handler: func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			CallFrom(r.Context()).Report(Usage{PromptTokens: 30, CompletionTokens: 4})
			<-r.Context().Done()
		}, status: 200, outcome: schemas.OutcomeOK, tokens: 34},
		{name: "no usage reported", handler: func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("{}")) },
			status: 200, outcome: schemas.OutcomeOK, tokens: want.Total(), attrs: map[string]string{"usage": "estimate"}},
		{name: "panic", panicked: true, handler: func(w http.ResponseWriter, r *http.Request) { panic(http.ErrAbortHandler) },
			status: 500, outcome: schemas.OutcomeError, tokens: 0, attrs: map[string]string{"usage": "none"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &emittertest.Recorder{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			handler := c.handler
			if c.cancel {
				inner := handler
				handler = func(w http.ResponseWriter, r *http.Request) { cancel(); inner(w, r) }
			}
			h := metered(t, fixed{}, est, s, handler)
			func() {
				defer func() {
					if p := recover(); (p != nil) != c.panicked {
						t.Fatalf("panic %v", p)
					}
				}()
				h.ServeHTTP(httptest.NewRecorder(), chatRequest(ctx, "acme"))
			}()
			_, settled := pair(t, s.Events())
			if settled.Status != c.status || settled.Outcome != c.outcome || settled.TotalTokens() != c.tokens {
				t.Errorf("settlement status %d outcome %q tokens %d, want %d %q %d", settled.Status, settled.Outcome, settled.TotalTokens(),
					c.status, c.outcome, c.tokens)
			}
			if len(settled.Attributes) != len(c.attrs) {
				t.Errorf("attributes %v, want %v", settled.Attributes, c.attrs)
			}
			for k, v := range c.attrs {
				if settled.Attributes[k] != v {
					t.Errorf("attributes %v, want %v", settled.Attributes, c.attrs)
				}
			}
		})
	}
}

// TestStreamSettlesAtItsEnd: over a real connection, a streamed answer
// reaches the client chunk by chunk through the middleware, and the
// settlement is emitted only once the stream ended, with the usage of its
// last chunk.
func TestStreamSettlesAtItsEnd(t *testing.T) {
	s, est := &emittertest.Recorder{}, newEstimator(t)
	release := make(chan struct{})
	h := metered(t, fixed{}, est, s, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n")
		http.NewResponseController(w).Flush()
		<-release
		CallFrom(r.Context()).Report(Usage{PromptTokens: 30, CompletionTokens: 2})
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-Model", "gpt-4o-mini")
	req.Header.Set("X-Key", "key-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first chunk %q %v", line, err)
	}
	// The stream is open: only the estimate has been emitted.
	if ev := s.Events(); len(ev) != 1 || !ev[0].Estimated {
		t.Fatalf("events while streaming: %+v", ev)
	}
	close(release)
	if _, err := io.ReadAll(rd); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 5*time.Second, "settlement after the stream", func() bool { return len(s.Events()) == 2 })
	_, settled := pair(t, s.Events())
	if settled.PromptTokens != 30 || settled.CompletionTokens != 2 || settled.Outcome != schemas.OutcomeOK || settled.Status != 200 {
		t.Fatalf("settlement %+v", settled)
	}
}

func TestEstimateEventsCanBeTurnedOff(t *testing.T) {
	s := &emittertest.Recorder{}
	h := metered(t, fixed{}, newEstimator(t), s, func(w http.ResponseWriter, r *http.Request) {
		CallFrom(r.Context()).Report(Usage{PromptTokens: 31, CompletionTokens: 57})
	}, WithEstimateEvents(false))
	h.ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "acme"))
	ev := s.Events()
	if len(ev) != 1 || ev[0].Estimated || ev[0].TotalTokens() != 88 || ev[0].Validate() != nil {
		t.Fatalf("events %+v, want the settlement alone", ev)
	}
	// Without WithEstimates nothing is metered by the middleware.
	s = &emittertest.Recorder{}
	h = New(fixed{}, HeaderIdentify("X-Tenant", "X-Model", "X-Key"), WithEmitter(s, "gw-1"))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if CallFrom(r.Context()) != nil {
			t.Error("a call without WithEstimates")
		}
	}))
	h.ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "acme"))
	if len(s.Events()) != 0 {
		t.Fatalf("events without WithEstimates: %+v", s.Events())
	}
}

// TestMeteringLeavesOtherRequestsAlone: a refused request gets its
// rejected event and no estimate; a path that is not an OpenAI endpoint
// and a body that is not JSON are handled as documented; a body over the
// limit is answered 413 before the handler runs.
func TestMeteringLeavesOtherRequestsAlone(t *testing.T) {
	d := fixed{"banned": {Outcome: checker.Refused, Scope: flags.AllModels, Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist}}}
	s := &emittertest.Recorder{}
	calls := 0
	est, err := estimate.New(estimate.Config{Limits: estimate.Limits{MaxBodyBytes: 1024}})
	if err != nil {
		t.Fatal(err)
	}
	h := metered(t, d, est, s, func(w http.ResponseWriter, r *http.Request) { calls++ })

	h.ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "banned"))
	if ev := s.Events(); len(ev) != 1 || ev[0].Outcome != schemas.OutcomeRejected || ev[0].Estimated {
		t.Fatalf("refusal: %+v", ev)
	}

	s.Take()
	req := httptest.NewRequest(http.MethodGet, "/v1/models", nil)
	req.Header.Set("X-Tenant", "acme")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if len(s.Events()) != 0 || calls != 1 {
		t.Fatalf("/v1/models: %d calls, events %+v", calls, s.Events())
	}

	req = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`not json`))
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set("X-Model", "gpt-4o")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if ev := s.Events(); len(ev) != 1 || ev[0].Estimated || ev[0].Model != "gpt-4o" || ev[0].TotalTokens() != 0 || calls != 2 {
		t.Fatalf("invalid body: %d calls, events %+v", calls, ev)
	}

	s.Take()
	req = httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"`+strings.Repeat("x", 2000)+`"}]}`))
	req.Header.Set("X-Tenant", "acme")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "1024 bytes") || calls != 2 || len(s.Events()) != 0 {
		t.Fatalf("large body: %d %s, %d calls, events %+v", rec.Code, rec.Body, calls, s.Events())
	}
}

// TestEventFieldsAndCallDetails: WithEventFields gives the estimate and
// the settlement the gateway's id, user and priority (the refusal event
// its user but a fresh id); the handler's outcome, attributes, reasoning
// tokens and counted usage reach the settlement; a rejected call is
// settled at zero tokens.
func TestEventFieldsAndCallDetails(t *testing.T) {
	fields := WithEventFields(func(r *http.Request, ev *schemas.UsageEvent) {
		ev.ID = r.Header.Get("X-Request-Id")
		ev.User, ev.Priority = "u-7", schemas.PriorityHigh
		ev.Attributes = map[string]string{"team": "search"}
		ev.Tenant, ev.PromptTokens = "someone-else", 99 // the middleware's fields are not the gateway's to set
	})
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		check   func(settled schemas.UsageEvent) bool
	}{
		{"reasoning and counted", func(w http.ResponseWriter, r *http.Request) {
			c := CallFrom(r.Context())
			c.SetAttribute("attempts", "2")
			c.Report(Usage{PromptTokens: 40, CompletionTokens: 30, CachedTokens: 10, CacheWriteTokens: 35, ReasoningTokens: 12, Counted: true})
		}, func(s schemas.UsageEvent) bool {
			// The cache write is held to what the cache read leaves of the prompt.
			return s.PromptTokens == 40 && s.CompletionTokens == 30 && s.Outcome == schemas.OutcomeOK &&
				s.CachedTokens == 10 && s.CacheWriteTokens == 30 &&
				s.ReasoningTokens == 12 && s.Attributes["usage"] == "counted" &&
				s.Attributes["attempts"] == "2" && s.Attributes["team"] == "search"
		}},
		{"upstream timeout", func(w http.ResponseWriter, r *http.Request) {
			c := CallFrom(r.Context())
			c.SetOutcome(schemas.OutcomeTimeout)
			w.WriteHeader(http.StatusGatewayTimeout)
		}, func(s schemas.UsageEvent) bool {
			return s.Outcome == schemas.OutcomeTimeout && s.Status == 504 && s.TotalTokens() == 0
		}},
		{"rejected after the estimate", func(w http.ResponseWriter, r *http.Request) {
			c := CallFrom(r.Context())
			c.SetOutcome(schemas.OutcomeRejected)
			c.Report(Usage{PromptTokens: 5})
			w.WriteHeader(http.StatusTooManyRequests)
		}, func(s schemas.UsageEvent) bool {
			return s.Outcome == schemas.OutcomeRejected && s.Status == 429 && s.TotalTokens() == 0 && s.Attributes["usage"] == "none"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &emittertest.Recorder{}
			h := metered(t, fixed{}, newEstimator(t), s, tc.handler, fields)
			req := chatRequest(context.Background(), "acme")
			req.Header.Set("X-Request-Id", "req-"+strings.ReplaceAll(tc.name, " ", "-"))
			h.ServeHTTP(httptest.NewRecorder(), req)
			e, settled := pair(t, s.Events())
			if e.ID != req.Header.Get("X-Request-Id") || e.User != "u-7" || settled.User != "u-7" || settled.Priority != schemas.PriorityHigh ||
				e.Attributes["team"] != "search" {
				t.Errorf("event fields not applied: %+v / %+v", e, settled)
			}
			if !tc.check(settled) {
				t.Errorf("settlement %+v", settled)
			}
		})
	}

	s := &emittertest.Recorder{}
	refused := fixed{"acme": {Outcome: checker.Refused, Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindManual}}}
	h := metered(t, refused, newEstimator(t), s, func(http.ResponseWriter, *http.Request) { t.Error("refused request reached the handler") }, fields)
	req := chatRequest(context.Background(), "acme")
	req.Header.Set("X-Request-Id", "req-refused")
	h.ServeHTTP(httptest.NewRecorder(), req)
	evs := s.Events()
	if len(evs) != 1 || evs[0].ID == "req-refused" || evs[0].User != "u-7" || evs[0].Attributes["refused_by"] != "manual" ||
		evs[0].Attributes["team"] != "search" || evs[0].Tenant != "acme" {
		t.Fatalf("refusal events %+v: want one with a fresh id, the gateway's user and refused_by", evs)
	}
}

// TestProbeSettlementIsMarked: a request a half-open flag let through as
// a probe settles with attribute breaker_probe naming the flag's kind
// (the aggregator judges the half-open breaker by it), even when the
// handler sets an attribute of the same name; its estimate and an
// ordinary call's settlement carry none.
func TestProbeSettlementIsMarked(t *testing.T) {
	s, est := &emittertest.Recorder{}, newEstimator(t)
	probe := fixed{"acme": {Outcome: checker.Probe, Flag: &flags.Flag{State: flags.StateHalfOpen, Kind: flags.KindErrorRatio}}}
	h := metered(t, probe, est, s, func(w http.ResponseWriter, r *http.Request) {
		CallFrom(r.Context()).SetAttribute(flags.ProbeAttribute, "forged")
		w.WriteHeader(http.StatusBadGateway)
	})
	h.ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "acme"))
	e, settled := pair(t, s.Events())
	if got := settled.Attributes[flags.ProbeAttribute]; got != string(flags.KindErrorRatio) || settled.Outcome != schemas.OutcomeError {
		t.Fatalf("probe settlement %+v, want outcome error and %s=%s", settled, flags.ProbeAttribute, flags.KindErrorRatio)
	}
	if _, ok := e.Attributes[flags.ProbeAttribute]; ok {
		t.Fatalf("the estimate is marked as a probe: %+v", e)
	}

	s2 := &emittertest.Recorder{}
	metered(t, fixed{}, est, s2, func(w http.ResponseWriter, r *http.Request) {}).ServeHTTP(httptest.NewRecorder(), chatRequest(context.Background(), "acme"))
	if _, settled := pair(t, s2.Events()); settled.Attributes[flags.ProbeAttribute] != "" {
		t.Fatalf("an ordinary call is marked as a probe: %+v", settled)
	}
}
