package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/demo/loadgen"
	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/middleware"
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
	cfg.Policy = platform.FileSource{File: polFile, Reload: 100 * time.Millisecond}
	lim := demoLimits(t, &cfg)
	ctx := context.Background()

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

// TestLiveViewCountsAdmissions: the demo gateway's Admitter counts, per
// tenant, the calls admission let through and those it refused (with the
// rule), exactly as it answered them.
func TestLiveViewCountsAdmissions(t *testing.T) {
	cfg := demoConfig()
	cfg.Policy.File = filepath.Join("..", "..", "deploy", "demo", "policy.yaml")
	counts := newAdmissionCounts()
	counts.wrap(frontend.LimiterAdmitter{L: demoLimits(t, &cfg)})
	est, err := estimate.New(estimate.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := estimate.EndpointOf("/v1/chat/completions")
	answers := map[string][2]int64{}
	for _, tn := range demoTenants {
		n := 60 // trial's minute; a few calls of the others
		if tn.Name != "trial" {
			n = 5
		}
		for i := range n {
			e, err := est.Estimate(tn.Name, ep, loadgen.RequestBody(tn))
			if err != nil {
				t.Fatal(err)
			}
			a := counts.Admit(context.Background(), frontend.AdmitRequest{Tenant: tn.Name, Model: tn.Model, APIKeyID: "key-" + tn.Name,
				Endpoint: "/v1/chat/completions", EstimatePrompt: e.Prompt, EstimateCompletion: e.Completion, Estimated: true,
				EventID: fmt.Sprintf("%s-%d", tn.Name, i)})
			v := answers[tn.Name]
			if a.Refused == nil {
				v[0]++
				a.Settle(frontend.Settlement{Usage: middleware.Usage{PromptTokens: e.Prompt, CompletionTokens: e.Completion}, Status: http.StatusOK})
			} else {
				v[1]++
			}
			answers[tn.Name] = v
		}
	}
	for _, tn := range demoTenants {
		a, r, rule := counts.of(tn.Name)
		if a != answers[tn.Name][0] || r != answers[tn.Name][1] {
			t.Errorf("%s: view says %d admitted, %d refused; admission answered %v", tn.Name, a, r, answers[tn.Name])
		}
		if tn.Name == "trial" && (r == 0 || rule != "trial-tpm") {
			t.Errorf("trial: %d refusals, latest by %q; want trial-tpm to refuse", r, rule)
		}
	}
}

// demoLimits builds the hard limits of the demo gateway's admission, as
// the gateway builds them from cfg's policy (frontend.NewLimits), on the
// real Redis under a prefix of the test's own, and follows the policy
// file until the test ends.
func demoLimits(t *testing.T, cfg *sluiceconfig.Config) *admission.Limiter {
	t.Helper()
	cfg.Redis = itest.Redis(t)
	log := slog.New(slog.DiscardHandler)
	w, err := policy.NewWatcher(cfg.Policy.File, cfg.Policy.Reload, log)
	if err != nil {
		t.Fatal(err)
	}
	env := platform.Env{Logger: log, Metrics: prometheus.NewRegistry(), Redis: cfg.Redis}
	limits, err := frontend.NewLimits(cfg.Services.Gateway.Admission, w.Current(), "gateway", false, env, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(limits.Close)
	itest.Start(t, "policy", func(ctx context.Context) error { return w.Follow(ctx, limits.Apply) })
	return limits.Admit.(frontend.LimiterAdmitter).L
}
