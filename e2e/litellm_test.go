package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// litellmPython returns the test virtualenv's interpreter when it has
// LiteLLM and the Python SDK (`make pyenv` installs both: LiteLLM pinned
// with hashes, the SDK editable), skipping the test when it does not —
// failing it under CI=true.
func litellmPython(t testing.TB) string {
	t.Helper()
	py := os.Getenv("SLUICE_OPENAI_PYTHON")
	if py == "" {
		py = filepath.Join("..", ".services", "venv", "bin", "python")
	}
	if out, err := exec.Command(py, "-c", "import litellm, openai, sluice_metering.admission").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("python with litellm, openai and sluice (%s): %v %s; run `make pyenv`", py, err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	abs, err := filepath.Abs(py)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// litellmRun says how startLiteLLM runs a proxy.
type litellmRun struct {
	// hook makes Sluice's hook (sluice_metering.litellm) the proxy's
	// callback, configured by env.
	hook bool
	env  []string
	// production runs the proxy as LiteLLM's production guide
	// (docs.litellm.ai/docs/proxy/prod) says for throughput: workers
	// (--num_workers) one per core of this machine, debug logging off
	// (set_verbose: false, json_logs: true, LITELLM_LOG=ERROR) and
	// request_timeout 600; and a worker health check of 60 s instead of
	// uvicorn's 5 s (startLiteLLM says why). Without it: one worker and
	// the default logging,
	// whose log the tests show when they fail.
	production bool
}

// litellmConfig is the proxy configuration docs/litellm.md shows (its
// first yaml block), so that the documented configuration is the one that
// runs: its models pointed at upstream with gpt-4o beside gpt-4o-mini,
// the test's custom_auth, the Sluice callback only with run.hook, and
// the production guide's litellm_settings with run.production.
func litellmConfig(t testing.TB, upstream string, run litellmRun) []byte {
	t.Helper()
	doc, err := os.ReadFile("../docs/litellm.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("docs/litellm.md shows no yaml block")
	}
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(block), &cfg); err != nil {
		t.Fatalf("docs/litellm.md's configuration: %v", err)
	}
	models, _ := cfg["model_list"].([]any)
	if len(models) != 1 {
		t.Fatalf("docs/litellm.md's configuration lists %d models, want its one gpt-4o-mini", len(models))
	}
	mini := models[0].(map[string]any)
	params := mini["litellm_params"].(map[string]any)
	params["api_base"] = upstream + "/v1"
	big := map[string]any{"model_name": "gpt-4o", "litellm_params": map[string]any{"model": "openai/gpt-4o", "api_base": upstream + "/v1", "api_key": params["api_key"]}}
	cfg["model_list"] = append(models, big)
	general, _ := cfg["general_settings"].(map[string]any)
	if general == nil {
		general = map[string]any{}
	}
	general["custom_auth"] = "custom_auth.user_api_key_auth"
	cfg["general_settings"] = general
	if !run.hook {
		delete(cfg, "litellm_settings")
	}
	if run.production {
		settings, _ := cfg["litellm_settings"].(map[string]any)
		if settings == nil {
			settings = map[string]any{}
		}
		settings["set_verbose"], settings["json_logs"], settings["request_timeout"] = false, true, 600
		cfg["litellm_settings"] = settings
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// litellmProxy is one LiteLLM proxy process in front of the mock provider.
type litellmProxy struct {
	addr string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startLiteLLM runs the real LiteLLM proxy (the `litellm` command of the
// virtualenv) with its local model-cost map, so it needs no network, in
// front of upstream, as run says. Keys come from
// testdata/litellm/custom_auth.py.
func startLiteLLM(t testing.TB, py, dir, upstream string, run litellmRun) *litellmProxy {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile("testdata/litellm/custom_auth.py")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "custom_auth.py"), auth, 0o600); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, litellmConfig(t, upstream, run), 0o600); err != nil {
		t.Fatal(err)
	}
	// The documented master key's variable: LiteLLM refuses to start
	// without a strong one. The test's clients use custom_auth.py's keys.
	env := append(slices.Clip(run.env), "LITELLM_MASTER_KEY="+randomKey()+randomKey()[7:], "OPENAI_API_KEY=sk-mock")
	workers := 1
	if run.production {
		// TIMEOUT_WORKER_HEALTHCHECK is --timeout_worker_healthcheck:
		// uvicorn kills a worker that misses its health check for 5 s,
		// and one still importing LiteLLM on a loaded 2-core machine (load
		// average 20) missed it, was restarted, and missed it again.
		workers = runtime.NumCPU()
		env = append(env, "LITELLM_LOG=ERROR", "TIMEOUT_WORKER_HEALTHCHECK=60")
	}
	p := &litellmProxy{addr: freeAddr(t), log: filepath.Join(dir, "litellm.log"), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(p.addr, ":")
	p.cmd = exec.Command(filepath.Join(filepath.Dir(py), "litellm"), "--config", cfgPath, "--host", host, "--port", port, "--num_workers", strconv.Itoa(workers))
	p.cmd.Dir = dir
	p.cmd.Env = append(os.Environ(), append([]string{"LITELLM_LOCAL_MODEL_COST_MAP=True", "LITELLM_TELEMETRY=False",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}, env...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		// The proxy's own group only: it may fork a server process.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- LiteLLM log (%s):\n%s", p.log, tail(p.log))
		}
	})
	itest.EventuallyNoError(t, readyTimeout, "LiteLLM answers /health/liveliness", func() error {
		select {
		case <-p.done:
			t.Fatalf("LiteLLM exited before it was ready:\n%s", tail(p.log))
		default:
		}
		code, _, err := httpGet(context.Background(), "http://"+p.addr+"/health/liveliness")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("liveliness %d", code)
		}
		return nil
	})
	return p
}

// sluiceHookEnv is the environment that configures sluice_metering.litellm for
// stack s (docs/litellm.md lists every variable).
// The admission rules come from rulesJSON, or, when it is empty, from the
// stack's own policy file, as the Go services read it.
func sluiceHookEnv(t testing.TB, s *stack, rulesJSON string) []string {
	t.Helper()
	files := map[string]string{"ingest-key": s.ingestKey}
	rules := "SLUICE_POLICY_FILE=" + s.policyPath
	if rulesJSON != "" {
		files["admission-rules.json"] = rulesJSON
		rules = "SLUICE_ADMISSION_RULES_FILE=" + filepath.Join(s.dir, "admission-rules.json")
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(s.dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []string{
		"SLUICE_INGEST_URL=http://" + s.ingestAddr,
		"SLUICE_INGEST_API_KEY_FILE=" + filepath.Join(s.dir, "ingest-key"),
		"SLUICE_REDIS_URL=redis://" + s.redisAddr + "/0",
		"SLUICE_FLAGS_PREFIX=" + s.prefix,
		"SLUICE_ADMISSION_PREFIX=" + s.redisPrefix + redisconn.AdmissionKeys,
		rules,
		"SLUICE_GATEWAY_NAME=" + s.prefix + "litellm",
	}
}

// TestLiteLLMProxy: the real LiteLLM proxy, with Sluice's hook as its
// callback, in front of the mock provider, driven by the official OpenAI
// client, metering into a real pipeline (ingest, Kafka, the aggregator,
// ClickHouse). A tenant pushed over its admission limit gets LiteLLM's 429
// naming the rule; a tenant a flag refuses gets a 429 naming the quota;
// and the tokens stored in ClickHouse equal what LiteLLM reported to the
// client, call for call.
func TestLiteLLMProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	py := litellmPython(t)
	// One policy file for the pipeline and the hook's admission rules: a
	// default tokens-per-minute window for every tenant and a small one
	// for ll-capped.
	s := newStack(t, stackOptions{Policy: policyYAML(nil) + `  ll-capped:
    limits:
      capped-tpm:
        unit: total_tokens
        sliding_window: {length: 1m, limit: 150}
`})
	s.startAll("ingest", "aggregator")
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	defer up.Close()

	// ll-flagged is throttled by a rate flag, as the enforcer writes it.
	layout := flags.Layout{Prefix: s.prefix}
	ctx := context.Background()
	f := &flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate, Quota: "tokens_per_minute", Period: "minute",
		Limit: 1000, Used: 1400, RetryAfter: 20 * time.Second, Until: time.Now().Add(10 * time.Minute)}
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, layout.TenantKey("ll-flagged"), flags.VersionField, 1, flags.AllModels, flags.Encode(f))
		p.PExpire(ctx, layout.TenantKey("ll-flagged"), 10*time.Minute)
		p.Set(ctx, layout.VersionKey(), 1, 0)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	proxy := startLiteLLM(t, py, filepath.Join(s.dir, "litellm"), up.URL, litellmRun{hook: true, env: sluiceHookEnv(t, s, "")})

	cmd := exec.Command(py, "testdata/litellm/client.py")
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL=http://"+proxy.addr+"/v1", "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the OpenAI client script failed: %v\n%s\n%s", err, stderr.String(), out)
	}
	var res struct {
		Acme []struct {
			Prompt     int64 `json:"prompt"`
			Completion int64 `json:"completion"`
		} `json:"acme"`
		CappedAllowed int `json:"capped_allowed"`
		Capped        *struct {
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"capped"`
		Flagged *struct {
			Status  int    `json:"status"`
			Message string `json:"message"`
		} `json:"flagged"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("script output %q: %v", out, err)
	}
	t.Logf("as the client saw them: %d ll-acme calls %+v; ll-capped refused after %d calls: %+v; ll-flagged: %+v", len(res.Acme), res.Acme, res.CappedAllowed, res.Capped, res.Flagged)
	if c := res.Capped; c == nil || c.Status != 429 || !strings.Contains(c.Message, "Rate limit reached for rule capped-tpm (tenant=ll-capped): limit 150 total_tokens per 1m0s") || res.CappedAllowed < 1 {
		t.Errorf("ll-capped: %d calls allowed, then %+v; want at least one allowed, then a 429 naming rule capped-tpm", res.CappedAllowed, c)
	}
	if f := res.Flagged; f == nil || f.Status != 429 || !strings.Contains(f.Message, "Tenant ll-flagged has reached its tokens_per_minute limit on all models: used at least 1400 of 1000 this minute") {
		t.Errorf("ll-flagged: %+v; want a 429 naming tokens_per_minute", f)
	}

	// What LiteLLM reported to the client is what ClickHouse holds.
	var want [2]int64
	for _, c := range res.Acme {
		want[0] += c.Prompt
		want[1] += c.Completion
	}
	itest.EventuallyNoError(t, waitTimeout, "ll-acme's usage stored in ClickHouse", func() error {
		got, err := s.settled(ctx, "ll-acme")
		if err != nil {
			return err
		}
		var sum [2]int64
		for _, v := range got {
			sum[0] += v[0]
			sum[1] += v[1]
		}
		if len(got) != len(res.Acme) || sum != want {
			return fmt.Errorf("%d events with tokens %v stored; the client made %d calls and saw %v", len(got), sum, len(res.Acme), want)
		}
		return nil
	})
	// Each carries the cost LiteLLM computed from its local cost map.
	var priced uint64
	if err := s.conn.QueryRow(ctx, `SELECT count() FROM usage_events WHERE tenant = 'll-acme' AND outcome = 'ok'
AND toFloat64OrZero(attribute_values[indexOf(attribute_keys, 'cost_usd')]) > 0`).Scan(&priced); err != nil || priced != uint64(len(res.Acme)) {
		t.Errorf("%d of ll-acme's %d events carry a cost_usd attribute (%v)", priced, len(res.Acme), err)
	}
	// Every refusal is metered as a rejected event: ll-capped's one and
	// ll-flagged's one.
	itest.EventuallyNoError(t, waitTimeout, "the refusals and ll-capped's calls stored", func() error {
		var rejected, ok uint64
		err := s.conn.QueryRow(ctx, `SELECT countIf(outcome = 'rejected'), countIf(outcome = 'ok')
FROM (SELECT id, argMax(outcome, kafka_offset) AS outcome FROM usage_events WHERE tenant IN ('ll-capped', 'll-flagged') GROUP BY id)`).Scan(&rejected, &ok)
		if err != nil {
			return err
		}
		if rejected != 2 || ok != uint64(res.CappedAllowed) {
			return fmt.Errorf("%d rejected and %d ok events; want 2 and %d", rejected, ok, res.CappedAllowed)
		}
		return nil
	})
}
