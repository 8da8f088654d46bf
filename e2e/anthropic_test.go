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

// TestAnthropicUsageStoredAsBilled: `sluice gateway` (a process of the
// sluice binary) in front of the mock Anthropic provider, metering into
// the real pipeline (ingest, Kafka, the aggregator, ClickHouse): for a
// plain message, one that reads and writes the prompt cache and a stream
// that does, the row stored in usage_events carries what the provider
// billed, token type by token type — the prompt (input plus both cache
// parts), the cache read in cached_tokens, the cache write in
// cache_write_tokens, and the output.
func TestAnthropicUsageStoredAsBilled(t *testing.T) {
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{"an-acme": 1_000_000})})
	s.startAll("ingest", "aggregator")

	var mu sync.Mutex
	var billed []mockllm.Charge
	up := httptest.NewServer(mockllm.New(mockllm.Options{AnthropicKey: "sk-ant-e2e", Charged: func(c mockllm.Charge) {
		mu.Lock()
		defer mu.Unlock()
		billed = append(billed, c)
	}}))
	defer up.Close()

	gwAddr := freeAddr(t)
	writeFileT(t, filepath.Join(s.dir, "gateway-keys.yaml"), "keys:\n"+frontend.KeyLine("an-acme", "sk-an-acme", "an-acme", nil))
	writeFileT(t, filepath.Join(s.dir, "ingest-key"), s.ingestKey)
	writeFileT(t, filepath.Join(s.dir, "anthropic-key"), "sk-ant-e2e")
	s.appendConfig(fmt.Sprintf(`
  gateway:
    listen: %q
    usage: {ingest_url: "http://%s", ingest_api_key_file: %q, flush_interval: 20ms}
`, gwAddr, s.ingestAddr, filepath.Join(s.dir, "ingest-key")))
	s.writePolicy(policyYAML(map[string]int{"an-acme": 1_000_000}) + fmt.Sprintf(`upstreams:
  anthropic: {base_url: "%s/v1", dialect: anthropic, api_key_file: %q, models: ["claude-*"]}
`, up.URL, filepath.Join(s.dir, "anthropic-key")))
	s.start("gateway")

	long := strings.Repeat("c", 4*3000)
	calls := []struct{ id, body string }{
		{"an-plain", `{"model":"claude-sonnet-4-5","max_tokens":12,"messages":[{"role":"user","content":"hello"}]}`},
		{"an-cached", `{"model":"claude-sonnet-4-5","max_tokens":20,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"next"}]}`},
		{"an-stream", `{"model":"claude-haiku-4-5","max_tokens":9,"stream":true,"system":[{"type":"text","text":"` + long +
			`","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"go"}]}`},
	}
	for _, c := range calls {
		req, _ := http.NewRequest(http.MethodPost, "http://"+gwAddr+"/v1/messages", strings.NewReader(c.body))
		req.Header.Set("X-Api-Key", "sk-an-acme")
		req.Header.Set("Anthropic-Version", "2023-06-01")
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
	bill := append([]mockllm.Charge(nil), billed...)
	mu.Unlock()
	if len(bill) != len(calls) || bill[1].CacheWrite == 0 || bill[2].CacheRead == 0 {
		t.Fatalf("the provider billed %+v; want one charge per call, the cached ones with cache reads and writes", bill)
	}
	ctx := context.Background()
	itest.EventuallyNoError(t, waitTimeout, "every call's token types stored in ClickHouse", func() error {
		rows, err := s.conn.Query(ctx, `
SELECT argMax(attribute_values[indexOf(attribute_keys, 'request_id')], kafka_offset), argMax(estimated, kafka_offset),
       argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset),
       argMax(cached_tokens, kafka_offset), argMax(cache_write_tokens, kafka_offset)
FROM usage_events WHERE tenant = 'an-acme' GROUP BY id`)
		if err != nil {
			return err
		}
		defer rows.Close()
		got := map[string][4]uint64{}
		for rows.Next() {
			var id string
			var est uint8
			var v [4]uint64
			if err := rows.Scan(&id, &est, &v[0], &v[1], &v[2], &v[3]); err != nil {
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
			ch := bill[i]
			want := [4]uint64{uint64(ch.Input + ch.CacheRead + ch.CacheWrite), uint64(ch.Output), uint64(ch.CacheRead), uint64(ch.CacheWrite)}
			if got[c.id] != want {
				return fmt.Errorf("%s: stored prompt, completion, cache read, cache write %v; the provider billed %v", c.id, got[c.id], want)
			}
		}
		return nil
	})
}
