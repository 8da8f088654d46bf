package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/sdk/go/resource"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// fakeResources is a process whose CPU and memory use the test sets: each
// step is one sampling second at the given fractions of 2 cores and
// 1 GB.
type fakeResources struct {
	mu  sync.Mutex
	r   resource.Reading
	now time.Time
}

func newFakeResources() *fakeResources {
	return &fakeResources{r: resource.Reading{CPULimit: 2, MemoryLimit: 1 << 30}, now: time.Unix(1_700_000_000, 0)}
}

func (f *fakeResources) Read() (resource.Reading, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r, nil
}

func (f *fakeResources) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// step spends cpu of the cores over one second and holds mem of the
// memory, then samples.
func (f *fakeResources) step(t *testing.T, s *resource.Sampler, cpu, mem float64) {
	t.Helper()
	f.mu.Lock()
	f.r.CPUSeconds += cpu * f.r.CPULimit
	f.r.MemoryBytes = uint64(mem * float64(f.r.MemoryLimit))
	f.now = f.now.Add(time.Second)
	f.mu.Unlock()
	if err := s.Sample(); err != nil {
		t.Fatal(err)
	}
}

// resourceGuards are Guards of yaml's upstreams following f's CPU and
// memory. The sampler's own schedule is an hour: the test samples.
func resourceGuards(t *testing.T, yaml string, f *fakeResources) (*Guards, *resource.Sampler, *policy.Policy) {
	t.Helper()
	cfg := resource.DefaultConfig()
	cfg.Enabled, cfg.Interval = true, time.Minute
	s := resource.NewSampler(f, cfg, f.clock)
	f.step(t, s, 0, 0) // the baseline
	p, err := policy.Parse([]byte(yaml), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	guards := NewGuards(nil, "", "test", nil, nil)
	guards.FollowResources(s)
	t.Cleanup(guards.Close)
	if err := guards.Update(p); err != nil {
		t.Fatal(err)
	}
	return guards, s, p
}

// resourceDeps sets cfg's policy to yaml and returns the Deps of a
// gateway of cfg whose guards follow f, a process the test steps through
// s.
func resourceDeps(t *testing.T, cfg *testGateway, yaml string) (deps Deps, f *fakeResources, s *resource.Sampler) {
	t.Helper()
	cfg.policy = yaml
	f = newFakeResources()
	guards, s, p := resourceGuards(t, string(cfg.policyYAML(t)), f)
	return Deps{Policy: func() *policy.Policy { return p }, Guards: guards}, f, s
}

// TestResourceDegradationFollowsCPUAndMemoryWithHysteresis: with resource
// degradation on, an upstream with no calls in flight climbs its levels
// (50/70/90%) as the process's CPU — then, separately, its memory —
// climbs, and comes down only once the use is 5 points under each
// threshold: 87% keeps level 3, 84% leaves it; 67% keeps level 2, 64%
// leaves it; 47% keeps level 1, 44% leaves it. An upstream whose entry
// opts out (degradation.resources: false) stays at level 0 throughout.
func TestResourceDegradationFollowsCPUAndMemoryWithHysteresis(t *testing.T) {
	const yaml = `
upstreams:
  premium: {base_url: "http://127.0.0.1:1/v1", models: [gpt-4o]}
  economy: {base_url: "http://127.0.0.1:1/v1", models: [gpt-4o-mini], degradation: {resources: false}}
`
	path := []struct {
		use  float64
		want priority.Level
	}{
		{0.30, 0}, {0.55, 1}, {0.75, 2}, {0.95, 3}, {0.87, 3}, {0.84, 2}, {0.67, 2}, {0.64, 1}, {0.47, 1}, {0.44, 0},
	}
	for _, signal := range []string{"cpu", "memory"} {
		t.Run(signal, func(t *testing.T) {
			f := newFakeResources()
			guards, s, _ := resourceGuards(t, yaml, f)
			level := func(name string) priority.Level {
				// The level follows the load at each admission.
				g := guards.Of(name)
				p, d := g.Acquire(context.Background(), upstream.Request{Tenant: "t", Priority: schemas.PriorityCritical})
				if d.Admitted() {
					p.Release(0)
				}
				return g.Stats().Level
			}
			for _, step := range path {
				if signal == "cpu" {
					f.step(t, s, step.use, 0.1)
				} else {
					f.step(t, s, 0.1, step.use)
				}
				if got := level("premium"); got != step.want {
					t.Fatalf("%s at %.0f%%: premium at level %d, want %d (load %.3f)", signal, step.use*100, got, step.want, guards.Of("premium").Stats().Load)
				}
				if got := level("economy"); got != 0 {
					t.Fatalf("%s at %.0f%%: economy (resources: false) at level %d, want 0", signal, step.use*100, got)
				}
			}
		})
	}
}

// TestResourceDegradationActionsThroughTheGateway: the process's CPU at
// 55% puts premium at level 1, which admits high and critical only.
// premium's actions are [fallback, fallback, refuse]: a low-priority
// gpt-4o request is served by its fallback gpt-4o-mini on economy (which
// does not follow the resources), a high one by gpt-4o itself. At 95%
// (level 3, action refuse) even the high request is refused with 503
// degraded instead of falling back, and the refusal is counted in
// sluice_gateway_upstream_refusals_total and shown by
// sluice_gateway_degradation_level.
func TestResourceDegradationActionsThroughTheGateway(t *testing.T) {
	const yaml = `
tenants:
  acme: {priority: low}
upstreams:
  premium:
    degradation: {actions: [fallback, fallback, refuse]}
  economy:
    degradation: {resources: false}
fallbacks:
  gpt-4o: [gpt-4o-mini]
`
	base := mock(t, mockllm.Options{})
	cfg := testConfig(t,
		Upstream{Name: "premium", BaseURL: base, Models: []string{"gpt-4o"}},
		Upstream{Name: "economy", BaseURL: base, Models: []string{"gpt-4o-mini"}})
	deps, f, s := resourceDeps(t, &cfg, yaml)
	g := startGateway(t, cfg, deps)
	chat := func(key string) (*http.Response, string) {
		return post(t, g.url, "/v1/chat/completions", key, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	}

	f.step(t, s, 0.55, 0.1)
	resp, body := chat("sk-acme") // acme: low
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o-mini" {
		t.Fatalf("low at 55%% CPU: %d %s, served %q; want 200 from the fallback gpt-4o-mini", resp.StatusCode, body, resp.Header.Get(HeaderServedModel))
	}
	resp, body = chat("sk-boss") // boss: high
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderServedModel) != "gpt-4o" {
		t.Fatalf("high at 55%% CPU: %d %s, served %q; want 200 from gpt-4o", resp.StatusCode, body, resp.Header.Get(HeaderServedModel))
	}

	f.step(t, s, 0.95, 0.1)
	resp, body = chat("sk-boss")
	var e ratelimit.Body
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != priority.Degraded.String() {
		t.Fatalf("high at 95%% CPU with action refuse: %d %s served %q; want 503 degraded without the fallback", resp.StatusCode, body, resp.Header.Get(HeaderServedModel))
	}
	if got := testutil.ToFloat64(g.m.guardRefusals.WithLabelValues("premium", "degraded")); got != 2 {
		t.Errorf("degraded refusals counted on premium: %v, want 2 (the fallback one and the refused one)", got)
	}
	if got := guardGauge(t, g.m, "sluice_gateway_degradation_level", "premium"); got != 3 {
		t.Errorf("sluice_gateway_degradation_level{upstream=premium} = %v, want 3", got)
	}
}

// guardGauge is the value of the guards' gauge name for upstream (and,
// for the queue length, class).
func guardGauge(t *testing.T, m *metrics, name, upstream string, class ...string) float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(guardCollector{m})
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["upstream"] == upstream && (len(class) == 0 || labels["class"] == class[0]) {
				return s.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{upstream=%q} %v", name, upstream, class)
	return 0
}

// TestResourceDegradationDefersLowPriority: premium's level-1 action is
// defer. At 55% CPU a low-priority request sent without Prefer:
// respond-async is answered 202 with a task instead of a refusal, while a
// high one is served at once. The task's run meets the degraded upstream
// (a run is never deferred again) and is retried; once the CPU falls
// under the level, it runs and succeeds on gpt-4o, metered as an
// ordinary call.
func TestResourceDegradationDefersLowPriority(t *testing.T) {
	const yaml = `
tenants:
  acme: {priority: low}
upstreams:
  premium:
    degradation: {actions: [defer, defer, refuse], retry_after: 1s}
`
	cfg := deferredConfig(t, testConfig(t, Upstream{Name: "premium", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o"}}))
	deps, f, s := resourceDeps(t, &cfg, yaml)
	g, w := deferredGateway(t, cfg, deps)

	f.step(t, s, 0.55, 0.1)
	// No call has met premium's guard since the CPU rose: the deferral
	// reads the level from the load now.
	resp, b := post(t, g.url, "/v1/chat/completions", "sk-acme", `{"model":"gpt-4o","messages":[{"role":"user","content":"later"}]}`)
	var task struct{ ID, Status string }
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal([]byte(b), &task) != nil || task.ID == "" || task.Status != "queued" {
		t.Fatalf("low at 55%% CPU with action defer: %d %s; want 202 with a queued task", resp.StatusCode, b)
	}
	if resp, b := post(t, g.url, "/v1/chat/completions", "sk-boss", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("high at 55%% CPU: %d %s; want 200 at once", resp.StatusCode, b)
	}
	itest.Start(t, "deferred worker", w.Run)
	itest.EventuallyNoError(t, time.Minute, "the task's first run refused by the degraded upstream", func() error {
		if _, st := getTask(t, g.url, "sk-acme", task.ID); st["runs"] == nil || st["runs"].(float64) < 1 || st["status"] != "queued" {
			return fmt.Errorf("%v", st)
		}
		return nil
	})
	f.step(t, s, 0.30, 0.1)
	itest.EventuallyNoError(t, time.Minute, "the task done once the CPU fell", func() error {
		if code, st := getTask(t, g.url, "sk-acme", task.ID); st["status"] != "succeeded" {
			return fmt.Errorf("%d %v", code, st)
		}
		return nil
	})
	if ev := g.settlement(t, task.ID+"-"+strconv.Itoa(lastRun(t, g, task.ID))); ev.Model != "gpt-4o" || ev.Outcome != schemas.OutcomeOK || ev.Priority != schemas.PriorityLow {
		t.Fatalf("settlement of the deferred run: %+v", ev)
	}
}

// lastRun is the number of task id's last run.
func lastRun(t *testing.T, g *gw, id string) int {
	t.Helper()
	_, st := getTask(t, g.url, "sk-acme", id)
	n, _ := st["runs"].(float64)
	return int(n)
}

// TestResourceDegradationShortensLowPriority: premium's level-1 action
// is shorten with degradation.max_tokens 16. At 55% CPU a low-priority
// request asking for 200 tokens is served by gpt-4o itself, not refused
// and not sent to a fallback, with its output capped at 16 (the mock
// answers as many completion tokens as it is allowed), the cap named in
// X-Sluice-Max-Tokens and counted in sluice_gateway_shortened_total; a
// high one at the same load is served whole.
func TestResourceDegradationShortensLowPriority(t *testing.T) {
	const yaml = `
tenants:
  acme: {priority: low}
upstreams:
  premium:
    degradation: {actions: [shorten, refuse, refuse], max_tokens: 16}
`
	cfg := testConfig(t, Upstream{Name: "premium", BaseURL: mock(t, mockllm.Options{}), Models: []string{"gpt-4o"}})
	deps, f, s := resourceDeps(t, &cfg, yaml)
	g := startGateway(t, cfg, deps)
	chat := func(key string) (*http.Response, int64) {
		t.Helper()
		resp, body := post(t, g.url, "/v1/chat/completions", key, `{"model":"gpt-4o","max_tokens":200,"messages":[{"role":"user","content":"hi"}]}`)
		var ans struct {
			Usage struct {
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &ans) != nil {
			t.Fatalf("%s at 55%% CPU: %d %s; want 200", key, resp.StatusCode, body)
		}
		return resp, ans.Usage.CompletionTokens
	}

	f.step(t, s, 0.55, 0.1)
	resp, completion := chat("sk-acme") // acme: low
	if completion != 16 || resp.Header.Get(HeaderMaxTokens) != "16" || resp.Header.Get(HeaderServedModel) != "gpt-4o" {
		t.Fatalf("low at level 1 (shorten): %d completion tokens, %s %q, served %q; want 16, capped at 16 by gpt-4o",
			completion, HeaderMaxTokens, resp.Header.Get(HeaderMaxTokens), resp.Header.Get(HeaderServedModel))
	}
	resp, completion = chat("sk-boss") // boss: high
	if completion != 200 || resp.Header.Get(HeaderMaxTokens) != "" {
		t.Fatalf("high at level 1: %d completion tokens, %s %q; want 200, not capped", completion, HeaderMaxTokens, resp.Header.Get(HeaderMaxTokens))
	}
	if got := testutil.ToFloat64(g.m.shortened.WithLabelValues("premium")); got != 1 {
		t.Errorf("sluice_gateway_shortened_total{upstream=premium} = %v, want 1", got)
	}
}
