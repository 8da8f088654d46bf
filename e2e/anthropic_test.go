package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
)

// nativeCall is one call to a native route of `sluice gateway`: its
// x-request-id, path, headers (the tenant's key as the provider's
// clients send it) and body.
type nativeCall struct {
	id, path, body string
	header         []string
}

// stored is a usage row's token types: prompt, completion, cached (cache
// read), cache write, reasoning.
type stored [5]uint64

// nativeStack runs ingest, the aggregator and `sluice gateway` (a process
// of the sluice binary) with tenant's key sk-<tenant> and one upstream,
// the mock provider (upstream YAML with %s for the mock's URL and %q for
// the key file holding key), and sends calls through it. It returns what
// the mock billed, one charge per call.
func nativeStack(t *testing.T, tenant, key, upstream string, opts mockllm.Options, calls []nativeCall) (*stack, []mockllm.Charge) {
	t.Helper()
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{tenant: 1_000_000})})
	s.startAll("ingest", "aggregator")

	var mu sync.Mutex
	var billed []mockllm.Charge
	opts.Charged = func(c mockllm.Charge) {
		mu.Lock()
		defer mu.Unlock()
		billed = append(billed, c)
	}
	up := httptest.NewServer(mockllm.New(opts))
	t.Cleanup(up.Close)

	gwAddr := freeAddr(t)
	writeFileT(t, filepath.Join(s.dir, "gateway-keys.yaml"), "keys:\n"+frontend.KeyLine(tenant, "sk-"+tenant, tenant, nil))
	writeFileT(t, filepath.Join(s.dir, "ingest-key"), s.ingestKey)
	writeFileT(t, filepath.Join(s.dir, "upstream-key"), key)
	s.appendConfig(fmt.Sprintf(`
  gateway:
    listen: %q
    usage: {ingest_url: "http://%s", ingest_api_key_file: %q, flush_interval: 20ms}
`, gwAddr, s.ingestAddr, filepath.Join(s.dir, "ingest-key")))
	s.writePolicy(policyYAML(map[string]int{tenant: 1_000_000}) + "upstreams:\n" + fmt.Sprintf(upstream, up.URL, filepath.Join(s.dir, "upstream-key")))
	s.start("gateway")

	for _, c := range calls {
		req, _ := http.NewRequest(http.MethodPost, "http://"+gwAddr+c.path, strings.NewReader(c.body))
		for i := 0; i+1 < len(c.header); i += 2 {
			req.Header.Set(c.header[i], c.header[i+1])
		}
		req.Header.Set("X-Request-Id", c.id)
		resp, err := ingestClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.id, resp.StatusCode, b)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(billed) != len(calls) {
		t.Fatalf("the provider billed %+v; want one charge per call", billed)
	}
	return s, append([]mockllm.Charge(nil), billed...)
}

// wantStored waits until ClickHouse's usage_events holds, for each call
// of tenant, the settlement want gives its charge, token type by token
// type.
func wantStored(t *testing.T, s *stack, tenant string, calls []nativeCall, bill []mockllm.Charge, want func(mockllm.Charge) stored) {
	t.Helper()
	ctx := context.Background()
	itest.EventuallyNoError(t, waitTimeout, "every call's token types stored in ClickHouse", func() error {
		rows, err := s.conn.Query(ctx, `
SELECT argMax(attribute_values[indexOf(attribute_keys, 'request_id')], kafka_offset), argMax(estimated, kafka_offset),
       argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset),
       argMax(cached_tokens, kafka_offset), argMax(cache_write_tokens, kafka_offset), argMax(reasoning_tokens, kafka_offset)
FROM usage_events WHERE tenant = ? GROUP BY id`, tenant)
		if err != nil {
			return err
		}
		defer rows.Close()
		got := map[string]stored{}
		for rows.Next() {
			var id string
			var est uint8
			var v stored
			if err := rows.Scan(&id, &est, &v[0], &v[1], &v[2], &v[3], &v[4]); err != nil {
				return err
			}
			if est == 0 {
				got[id] = v
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i, c := range calls {
			if w := want(bill[i]); got[c.id] != w {
				return fmt.Errorf("%s: stored prompt, completion, cache read, cache write, reasoning %v; the provider billed %v", c.id, got[c.id], w)
			}
		}
		return nil
	})
}

// TestAnthropicUsageStoredAsBilled: `sluice gateway` in front of the mock
// Anthropic provider, metering into the real pipeline (ingest, Kafka, the
// aggregator, ClickHouse): for a plain message, one that reads and writes
// the prompt cache and a stream that does, the row stored in usage_events
// carries what the provider billed, token type by token type — the prompt
// (input plus both cache parts), the cache read in cached_tokens, the
// cache write in cache_write_tokens, and the output.
func TestAnthropicUsageStoredAsBilled(t *testing.T) {
	long := strings.Repeat("c", 4*3000)
	h := []string{"X-Api-Key", "sk-an-acme", "Anthropic-Version", "2023-06-01"}
	calls := []nativeCall{
		{"an-plain", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":12,"messages":[{"role":"user","content":"hello"}]}`, h},
		{"an-cached", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":20,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"next"}]}`, h},
		{"an-stream", "/v1/messages", `{"model":"claude-haiku-4-5","max_tokens":9,"stream":true,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"go"}]}`, h},
	}
	s, bill := nativeStack(t, "an-acme", "sk-ant-e2e", `  anthropic: {base_url: "%s/v1", dialect: anthropic, api_key_file: %q, models: ["claude-*"]}
`, mockllm.Options{AnthropicKey: "sk-ant-e2e"}, calls)
	if bill[1].CacheWrite == 0 || bill[2].CacheRead == 0 {
		t.Fatalf("the provider billed %+v; want the cached calls with cache reads and writes", bill)
	}
	wantStored(t, s, "an-acme", calls, bill, func(ch mockllm.Charge) stored {
		return stored{uint64(ch.Input + ch.CacheRead + ch.CacheWrite), uint64(ch.Output), uint64(ch.CacheRead), uint64(ch.CacheWrite), 0}
	})
}

// TestGeminiUsageStoredAsBilled: the same through Gemini's routes: for a
// plain call, one with cached content and thoughts, and streams in both of
// Gemini's forms, the row stored carries the provider's usageMetadata
// token type by token type — promptTokenCount (the cached content
// included), cachedContentTokenCount in cached_tokens, candidates plus
// thoughts in completion_tokens and the thoughts in reasoning_tokens.
func TestGeminiUsageStoredAsBilled(t *testing.T) {
	h := []string{"X-Goog-Api-Key", "sk-gm-acme", "Content-Type", "application/json"}
	calls := []nativeCall{
		{"gm-plain", "/v1/models/gemini-2.5-flash:generateContent",
			`{"contents":[{"role":"user","parts":[{"text":"hello"}]}],"generationConfig":{"maxOutputTokens":12}}`, h},
		{"gm-cached", "/v1beta/models/gemini-2.5-pro:generateContent",
			`{"cachedContent":"cachedContents/c1","contents":[{"role":"user","parts":[{"text":"next"}]}],"generationConfig":{"maxOutputTokens":20,"thinkingConfig":{"thinkingBudget":256}}}`, h},
		{"gm-sse", "/v1/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
			`{"cachedContent":"cachedContents/c1","contents":[{"role":"user","parts":[{"text":"go"}]}],"generationConfig":{"maxOutputTokens":9,"thinkingConfig":{"thinking_budget":64}}}`, h},
		{"gm-array", "/v1/models/gemini-2.5-flash:streamGenerateContent",
			`{"contents":[{"role":"user","parts":[{"text":"go"}]}],"generationConfig":{"maxOutputTokens":7}}`, h},
	}
	s, bill := nativeStack(t, "gm-acme", "AIza-e2e", `  google: {base_url: "%s/v1beta", dialect: gemini, api_key_file: %q, models: ["gemini-*"]}
`, mockllm.Options{GeminiKey: "AIza-e2e"}, calls)
	if bill[1].CacheRead == 0 || bill[1].Reasoning == 0 || bill[2].CacheRead == 0 || bill[2].Reasoning == 0 {
		t.Fatalf("the provider billed %+v; want cached content and thoughts where the calls ask", bill)
	}
	wantStored(t, s, "gm-acme", calls, bill, func(ch mockllm.Charge) stored {
		return stored{uint64(ch.Input), uint64(ch.Output + ch.Reasoning), uint64(ch.CacheRead), 0, uint64(ch.Reasoning)}
	})
}
