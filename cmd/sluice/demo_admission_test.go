package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/demo/loadgen"
	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/demo/refgateway"
	"github.com/sluicehq/sluice/gateway/admission"
	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/gateway/estimate"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// TestDemoAdmissionRefusesTrialOnly: with the demo policy, a minute of the
// demo's load (each tenant's requests per second × 60, estimated as the
// gateway does and settled with the mock upstream's usage) gets trial
// refused by its tokens-per-minute limit before the call, and nobody else;
// an edit of the policy file reaches the limiter while the demo runs.
func TestDemoAdmissionRefusesTrialOnly(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "demo", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polFile, src, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := demoConfig()
	cfg.PolicyFile = polFile
	cfg.Redis = itest.Redis(t)
	cfg.Services.Enforcer.KeyPrefix = itest.Unique(t, "sluice_test_demoadm:") + ":"
	cfg.Services.Enforcer.PolicyReload = 100 * time.Millisecond
	lim, follow, release, err := demoAdmission(&cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	stop := itest.Start(t, follow.Name, follow.Run)
	defer stop()
	defer cancel()

	est, err := estimate.New(estimate.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := estimate.EndpointOf("/v1/chat/completions")
	refused := map[string]int{}
	var trialTokens int64
	var trialRule string
	call := func(tn loadgen.Tenant) bool {
		body := loadgen.RequestBody(tn)
		e, err := est.Estimate(tn.Name, ep, body)
		if err != nil {
			t.Fatal(err)
		}
		tk, err := lim.Admit(ctx, admission.Request{Tenant: tn.Name, Model: tn.Model, Key: "key-" + tn.Name,
			Endpoint: "/v1/chat/completions", PromptTokens: e.Prompt, CompletionTokens: e.Completion})
		if err != nil {
			t.Fatal(err)
		}
		if !tk.Allowed() {
			refused[tn.Name]++
			if tn.Name == "trial" {
				trialRule = tk.Decision.Rule
			}
			return false
		}
		// What the mock upstream reports for the call.
		var req struct {
			MaxTokens int64 `json:"max_tokens"`
			Messages  []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.Unmarshal(body, &req); err != nil || len(req.Messages) != 1 {
			t.Fatalf("load generator body %s: %v", body, err)
		}
		u := admission.Usage{PromptTokens: mockllm.PromptTokens(req.Messages[0].Content), CompletionTokens: req.MaxTokens}
		if tn.Name == "trial" {
			trialTokens += u.PromptTokens + u.CompletionTokens
		}
		if err := tk.Settle(ctx, u); err != nil {
			t.Fatal(err)
		}
		return true
	}
	for _, tn := range demoTenants {
		for range int(tn.RequestsPerSecond * 60) {
			call(tn)
		}
	}
	if refused["trial"] == 0 || trialRule != "trial-tpm" {
		t.Fatalf("a minute of trial's load: %d refusals (last by %q), want refusals by trial-tpm", refused["trial"], trialRule)
	}
	if trialTokens > 6000 {
		t.Fatalf("trial was admitted %d tokens in a minute under a 6,000 tokens-per-minute rule", trialTokens)
	}
	if refused["acme"] != 0 || refused["runaway"] != 0 {
		t.Fatalf("refusals of the other tenants: %v; only trial's limit is meant to bite", refused)
	}

	// Raise trial's limit in the file: the running limiter takes it.
	raised := strings.Replace(string(src), "sliding_window: {length: 1m, limit: 6000}", "sliding_window: {length: 1m, limit: 1000000}", 1)
	if raised == string(src) {
		t.Fatal("the demo policy no longer holds trial-tpm's window as this test expects")
	}
	if err := os.WriteFile(polFile, []byte(raised), 0o644); err != nil {
		t.Fatal(err)
	}
	var trial loadgen.Tenant
	for _, tn := range demoTenants {
		if tn.Name == "trial" {
			trial = tn
		}
	}
	itest.Eventually(t, 10*time.Second, "trial admitted after its limit was raised in the policy file", func() bool {
		return call(trial)
	})
}

type allowAll struct{}

func (allowAll) Check(string, string, string) checker.Decision { return checker.Decision{} }

type discard struct{ n atomic.Int64 }

func (d *discard) Emit(*schemas.UsageEvent) error { d.n.Add(1); return nil }

// TestLiveViewCountsAdmissions: through the demo's gateway, the live
// view's per-tenant counts are the calls admission let through and those
// it refused (with the rule), and every event still reaches the emitter.
func TestLiveViewCountsAdmissions(t *testing.T) {
	cfg := demoConfig()
	cfg.PolicyFile = filepath.Join("..", "..", "deploy", "demo", "policy.yaml")
	cfg.Redis = itest.Redis(t)
	cfg.Services.Enforcer.KeyPrefix = itest.Unique(t, "sluice_test_demoview:") + ":"
	lim, _, release, err := demoAdmission(&cfg, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	up := httptest.NewServer(mockllm.Handler())
	defer up.Close()
	next := &discard{}
	counts := newAdmissionCounts(next)
	keys := map[string]refgateway.Caller{}
	for _, tn := range demoTenants {
		keys[tn.APIKey] = refgateway.Caller{Tenant: tn.Name, APIKeyID: "key-" + tn.Name}
	}
	gw := httptest.NewServer((&refgateway.Gateway{Upstream: up.URL, Keys: keys, Checker: allowAll{}, Emitter: counts, Name: "t", Admission: lim}).Handler())
	defer gw.Close()

	answers := map[string]map[int]int64{}
	for _, tn := range demoTenants {
		answers[tn.Name] = map[int]int64{}
		n := 60 // trial's minute; a few calls of the others
		if tn.Name != "trial" {
			n = 5
		}
		for range n {
			req, _ := http.NewRequest(http.MethodPost, gw.URL+"/v1/chat/completions", bytes.NewReader(loadgen.RequestBody(tn)))
			req.Header.Set("Authorization", "Bearer "+tn.APIKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			answers[tn.Name][resp.StatusCode]++
		}
	}
	for _, tn := range demoTenants {
		ok, refused := answers[tn.Name][http.StatusOK], answers[tn.Name][http.StatusTooManyRequests]
		// A settlement is emitted when the handler returns, which may be
		// just after the client read the answer.
		itest.Eventually(t, 5*time.Second, tn.Name+"'s admissions counted", func() bool {
			a, _, _ := counts.of(tn.Name)
			return a == ok
		})
		a, r, rule := counts.of(tn.Name)
		if a != ok || r != refused {
			t.Errorf("%s: view says %d admitted, %d refused; the gateway answered %v", tn.Name, a, r, answers[tn.Name])
		}
		if tn.Name == "trial" && (r == 0 || rule != "trial-tpm") {
			t.Errorf("trial: %d refusals, latest by %q; want trial-tpm to refuse", r, rule)
		}
	}
	if next.n.Load() == 0 {
		t.Fatal("no event reached the emitter behind the counts")
	}
}
