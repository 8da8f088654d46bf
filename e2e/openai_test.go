package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// openAIPython returns the interpreter of the test virtualenv (`make
// chdb` installs the pinned openai client in it), skipping the test when
// it is missing — failing it under CI=true.
func openAIPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SLUICE_OPENAI_PYTHON")
	if py == "" {
		py = os.Getenv("SLUICE_CHDB_PYTHON")
	}
	if py == "" {
		py = filepath.Join("..", ".services", "venv", "bin", "python")
	}
	err := exec.Command(py, "-c", "import openai").Run()
	if err != nil {
		msg := fmt.Sprintf("python with the openai package (%s): %v; run `make chdb`", py, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}

// clientCall is what the Python client saw for one call.
type clientCall struct {
	Usage *struct {
		Prompt     int64 `json:"prompt"`
		Completion int64 `json:"completion"`
	} `json:"usage"`
	MaxTokens int64    `json:"max_tokens"`
	Contents  []string `json:"contents"`
}

// TestOfficialOpenAIClient: the official OpenAI Python client, unchanged,
// against `sluice gateway` (a process of the sluice binary) in front of
// the mock provider, metering into a real pipeline (ingest, Kafka, the
// aggregator, ClickHouse). Chat plain and streamed with and without
// include_usage, tool calls plain and streamed, embeddings, legacy
// completions and the Responses API plain and streamed all work as the
// client expects; a tenant the flags refuse raises RateLimitError naming
// the limit, after one retry that waited Retry-After; and for every call
// the tokens stored in ClickHouse equal the usage the client saw (or,
// where the client saw none, what the provider reported to the gateway).
func TestOfficialOpenAIClient(t *testing.T) {
	py := openAIPython(t)
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{"py-acme": 1_000_000})})
	s.startAll("ingest", "aggregator")

	up := httptest.NewServer(mockllm.New(mockllm.Options{StreamUsage: mockllm.UsageWhenAsked}))
	defer up.Close()

	// A rate flag on py-capped, as the enforcer writes it: Retry-After 2 s.
	layout := flags.Layout{Prefix: s.prefix}
	ctx := context.Background()
	f := &flags.Flag{State: flags.StateThrottle, Kind: flags.KindRate, Quota: "tokens_per_minute", Period: "minute",
		Limit: 1000, Used: 1400, RetryAfter: 2 * time.Second, Until: time.Now().Add(10 * time.Minute)}
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, layout.TenantKey("py-capped"), flags.VersionField, 1, flags.AllModels, flags.Encode(f))
		p.PExpire(ctx, layout.TenantKey("py-capped"), 10*time.Minute)
		p.Set(ctx, layout.VersionKey(), 1, 0)
		p.Publish(ctx, layout.Channel(), flags.FormatChange("py-capped", 1))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	keys := "keys:\n" + frontend.KeyLine("py-acme", "sk-py-acme", "py-acme", nil) +
		frontend.KeyLine("py-capped", "sk-py-capped", "py-capped", nil) +
		frontend.KeyLine("py-probe", "sk-py-probe", "py-capped", []string{"probe-model"})
	gwAddr := freeAddr(t)
	writeFileT(t, filepath.Join(s.dir, "gateway-keys.yaml"), keys)
	writeFileT(t, filepath.Join(s.dir, "ingest-key"), s.ingestKey)
	// The gateway's section goes into the stack's configuration file,
	// which only the gateway process reads it from.
	cfg := fmt.Sprintf(`
  gateway:
    listen: %q
    usage: {ingest_url: "http://%s", ingest_api_key_file: %q, flush_interval: 20ms}
`, gwAddr, s.ingestAddr, filepath.Join(s.dir, "ingest-key"))
	s.appendConfig(cfg)
	s.writePolicy(policyYAML(map[string]int{"py-acme": 1_000_000}) + fmt.Sprintf(`upstreams:
  mock: {base_url: "%s/v1", models: ["gpt-4o", "gpt-4o-mini", "o3-mini", "text-embedding-3-small", "gpt-3.5-turbo-instruct", "probe-model"]}
`, up.URL))
	s.start("gateway")
	// The refusal needs the gateway's Checker to have read the flag.
	itest.EventuallyNoError(t, waitTimeout, "the gateway refuses py-capped", func() error {
		code, body := postJSON(t, "http://"+gwAddr+"/v1/chat/completions", "sk-py-probe", `{"model":"probe-model","messages":[{"role":"user","content":"x"}]}`)
		if code != 429 {
			return fmt.Errorf("%d %s", code, body)
		}
		return nil
	})

	cmd := exec.Command(py, "testdata/openai_client.py")
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL=http://"+gwAddr+"/v1", "SLUICE_KEY=sk-py-acme", "SLUICE_CAPPED_KEY=sk-py-capped",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the OpenAI client script failed: %v\n%s\n%s", err, stderr.String(), out)
	}
	var res struct {
		Calls   map[string]clientCall `json:"calls"`
		Models  []string              `json:"models"`
		Reason  int64                 `json:"reasoning"`
		Refused struct {
			Status     int     `json:"status"`
			Message    string  `json:"message"`
			RetryAfter string  `json:"retry_after"`
			Elapsed    float64 `json:"elapsed"`
		} `json:"refused"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("script output %q: %v", out, err)
	}
	if len(res.Calls) != 10 || res.Reason != 5 {
		t.Errorf("calls %d (want 10), reasoning tokens %d (want 5 of o3-mini's 10)", len(res.Calls), res.Reason)
	}
	if strings.Join(res.Models, ",") != "gpt-3.5-turbo-instruct,gpt-4o,gpt-4o-mini,o3-mini,probe-model,text-embedding-3-small" {
		t.Errorf("models.list() = %v", res.Models)
	}
	r := res.Refused
	retry, _ := strconv.Atoi(r.RetryAfter)
	if r.Status != 429 || !strings.Contains(r.Message, "tokens_per_minute") || retry != 2 || r.Elapsed < float64(retry) {
		t.Errorf("refusal as the client saw it: %+v; want 429 naming tokens_per_minute, Retry-After 2 and a retry after at least 2 s", r)
	}

	// Every call's settlement in ClickHouse carries the tokens the client
	// saw; the stream that did not ask for usage carries the provider's.
	want := map[string][2]int64{}
	for id, c := range res.Calls {
		if c.Usage != nil {
			want[id] = [2]int64{c.Usage.Prompt, c.Usage.Completion}
		} else {
			want[id] = [2]int64{mockllm.PromptTokens(c.Contents...), c.MaxTokens}
		}
	}
	itest.EventuallyNoError(t, waitTimeout, "every call's usage stored in ClickHouse", func() error {
		got, err := s.settled(ctx, "py-acme")
		if err != nil {
			return err
		}
		for id, w := range want {
			if g, ok := got[id]; !ok || g != w {
				return fmt.Errorf("%s: stored %v (found %v), the client saw %v", id, g, ok, w)
			}
		}
		if len(got) != len(want) {
			return fmt.Errorf("%d calls stored for py-acme, %d made", len(got), len(want))
		}
		return nil
	})
	// The refused client's two attempts are two rejected events, the
	// second at least Retry-After after the first.
	itest.EventuallyNoError(t, waitTimeout, "the refusals stored", func() error {
		var n uint64
		var spread float64
		err := s.conn.QueryRow(ctx, `SELECT count(), (max(toUInt64(time) * 1000 + time_ms) - min(toUInt64(time) * 1000 + time_ms)) / 1000
FROM usage_events WHERE tenant = 'py-capped' AND api_key_id = 'py-capped' AND outcome = 'rejected'`).Scan(&n, &spread)
		if err != nil {
			return err
		}
		if n != 2 || spread < 2 {
			return fmt.Errorf("%d rejected events %.3f s apart; want the attempt and its retry, at least 2 s apart", n, spread)
		}
		return nil
	})
}

// settled returns tenant's settled calls (the latest event of each id,
// when it is not an estimate) by the x-request-id the client sent (the
// event's request_id attribute; its id is the gateway's) — by its id for
// producers that set no such attribute (the LiteLLM hook): prompt and
// completion tokens.
func (s *stack) settled(ctx context.Context, tenant string) (map[string][2]int64, error) {
	rows, err := s.conn.Query(ctx, `
SELECT argMax(if(has(attribute_keys, 'request_id'), attribute_values[indexOf(attribute_keys, 'request_id')], id), kafka_offset),
       argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset), argMax(estimated, kafka_offset)
FROM usage_events WHERE tenant = ? GROUP BY id`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][2]int64{}
	for rows.Next() {
		var id string
		var p, c uint64
		var est uint8
		if err := rows.Scan(&id, &p, &c, &est); err != nil {
			return nil, err
		}
		if est == 0 {
			out[id] = [2]int64{int64(p), int64(c)}
		}
	}
	return out, rows.Err()
}

func writeFileT(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func postJSON(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	code, b, err := httpPost(url, key, body)
	if err != nil {
		return 0, err.Error()
	}
	return code, b
}

func httpPost(url, key, body string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ingestClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
