package ingest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/ops"
)

const (
	testKey       = "test-key-any-tenant"
	testScopedKey = "test-key-acme-only"
)

// testInstance is one ingest service running against the real broker.
type testInstance struct {
	url    string
	topic  string
	kafka  kafkaconn.Config
	health *ops.Health
	reg    *prometheus.Registry
	stop   func() error
}

// startIngest runs the service with test defaults changed by edit, and
// stops it when the test ends.
func startIngest(t testing.TB, edit func(*Config), extra ...kgo.Opt) *testInstance {
	t.Helper()
	return startTracedIngest(t, nil, edit, extra...)
}

// startTracedIngest is startIngest with tp as the process's tracer
// provider (nil: tracing off).
func startTracedIngest(t testing.TB, tp trace.TracerProvider, edit func(*Config), extra ...kgo.Opt) *testInstance {
	t.Helper()
	kc := itest.Kafka(t)
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.GatewayKeys.File = writeKeys(t, fmt.Sprintf("keys:\n  - {id: gw-any, sha256: %s, tenants: [\"*\"]}\n  - {id: gw-acme, sha256: %s, tenants: [acme]}\n",
		sha(testKey), sha(testScopedKey)))
	cfg.MaxEventAge = 0
	if edit != nil {
		edit(&cfg)
	}
	topics := itest.Topics(t)
	inst := &testInstance{topic: topics.Usage, kafka: kc, health: ops.NewHealth(), reg: prometheus.NewRegistry()}
	env := platform.Env{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: inst.reg, Health: inst.health, Kafka: kc, Topics: topics, Tracing: tp}
	if testing.Verbose() {
		env.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	svc, err := New(cfg, env, WithProducerOptions(extra...))
	itest.StartService(t, svc, err)
	inst.url = "http://" + svc.Addr()
	inst.stop = func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return svc.Stop(ctx)
	}
	return inst
}

func sha(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func writeKeys(t testing.TB, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// eventJSON is a valid event with the given id and tenant.
func eventJSON(id, tenant string) string {
	return fmt.Sprintf(`{"id":%q,"time":%q,"tenant":%q,"model":"gpt-4o","prompt_tokens":100,"completion_tokens":20}`,
		id, time.Now().UTC().Format(time.RFC3339Nano), tenant)
}

func batchJSON(events ...string) string { return "[" + strings.Join(events, ",") + "]" }

type answer struct {
	code       int
	retryAfter string
	body       response
	raw        string
}

func post(t testing.TB, url, key, contentType string, body []byte, headers ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/events", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), raw: string(raw)}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		t.Fatalf("answer %d is not JSON: %q", resp.StatusCode, raw)
	}
	return a
}

var httpClient = &http.Client{Timeout: 90 * time.Second}

// idCounts decodes the events in recs and counts them by id.
func idCounts(t testing.TB, recs []*kgo.Record) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, r := range recs {
		var ev struct {
			ID     string `json:"id"`
			Tenant string `json:"tenant"`
		}
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Fatalf("record value is not an event: %v: %q", err, r.Value)
		}
		if string(r.Key) != ev.Tenant {
			t.Fatalf("record key %q is not the tenant %q", r.Key, ev.Tenant)
		}
		counts[ev.ID]++
	}
	return counts
}

// proxyDialer sends every broker connection through p, so cutting p is the
// broker going down for this client only.
func proxyDialer(p *itest.Proxy) kgo.Opt { return kgo.Dialer(p.Dial) }
