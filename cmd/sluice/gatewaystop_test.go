package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/schemas"
)

// lossLog records log lines that report lost usage events.
type lossLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lossLog) Write(p []byte) (int, error) {
	s := string(p)
	if strings.Contains(s, "lost") || strings.Contains(s, "undelivered") {
		l.mu.Lock()
		l.lines = append(l.lines, s)
		l.mu.Unlock()
	}
	return len(p), nil
}

// TestStoppingTheGatewayUnderLoadLosesNoUsage: `sluice run ingest gateway`
// (the demo's arrangement) is stopped, as by Ctrl-C, while clients keep
// it busy with streamed and plain calls. Every call a client got an
// answer for has its settlement in the usage topic, and nothing reports
// a lost event: the gateway finishes its streams and flushes its Emitter
// before ingest stops.
func TestStoppingTheGatewayUnderLoadLosesNoUsage(t *testing.T) {
	dir := t.TempDir()
	topic := itest.Unique(t, "gwstop_usage")
	// A slow stream: each of its 8 chunks waits 20 ms, so calls are in
	// flight whenever the stop comes.
	up := httptest.NewServer(mockllm.New(mockllm.Options{StreamUsage: mockllm.UsageWhenAsked, ChunkDelay: 20 * time.Millisecond}))
	defer up.Close()

	cfg, sink := withIngest(t, dir, topic)
	kc := cfg.Kafka
	cfg.ShutdownTimeout = 60 * time.Second
	cfg.TenantKeys.File = writeFile(t, dir, "gateway-keys.yaml", "keys:\n"+frontend.KeyLine("load", "sk-load", "loadco", nil))
	g := &cfg.Services.Gateway
	g.Listen = freeAddr(t)
	cfg.Policy.File = writeFile(t, dir, "policy.yaml", upstreamPolicy(up.URL))
	g.Usage.EventSink = sink
	g.ShutdownTimeout = 20 * time.Second

	logs := &lossLog{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	stop := runPipeline(t, &cfg, []string{"ingest", "gateway"}, log, g.Listen, cfg.Services.Ingest.Listen)

	// Load: workers send until the gateway stops answering.
	var (
		mu       sync.Mutex
		answered = map[string]bool{}
		wg       sync.WaitGroup
	)
	client := &http.Client{Timeout: 60 * time.Second}
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				id := fmt.Sprintf("load-%d-%d", w, i)
				body := fmt.Sprintf(`{"model":"gpt-4o","max_tokens":8,"stream":%t,"messages":[{"role":"user","content":"call %s"}]}`, i%2 == 0, id)
				req, _ := http.NewRequest(http.MethodPost, "http://"+g.Listen+"/v1/chat/completions", bytes.NewReader([]byte(body)))
				req.Header.Set("Authorization", "Bearer sk-load")
				req.Header.Set("X-Request-Id", id)
				resp, err := client.Do(req)
				if err != nil {
					return // the gateway has stopped accepting
				}
				_, rerr := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && rerr == nil {
					mu.Lock()
					answered[id] = true
					mu.Unlock()
				}
			}
		}()
	}
	itest.Eventually(t, 60*time.Second, "100 calls answered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(answered) >= 100
	})
	stop() // Ctrl-C, in the middle of the load
	wg.Wait()

	stored := settlementsIn(t, kc, topic)
	mu.Lock()
	defer mu.Unlock()
	missing := 0
	for id := range answered {
		if !stored[id] {
			missing++
		}
	}
	t.Logf("%d calls answered, %d settlements stored", len(answered), len(stored))
	if missing > 0 || len(stored) < len(answered) {
		t.Errorf("%d of %d answered calls have no settlement in the usage topic", missing, len(answered))
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if len(logs.lines) > 0 {
		t.Errorf("loss reported at shutdown:\n%s", strings.Join(logs.lines, ""))
	}
}

// runPipeline starts the named services of cfg in this process as `sluice
// run` does, waits until every address of listens accepts connections,
// and returns what stops them as Ctrl-C does and waits until they have,
// failing t if they stop with an error, or not within 90 s.
func runPipeline(t *testing.T, cfg *sluiceconfig.Config, names []string, log *slog.Logger, listens ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p, err := preparePipeline(ctx, cfg, names, &hostOptions{}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	ran := make(chan error, 1)
	go func() { ran <- lifecycle.Run(ctx, log, cfg.ShutdownTimeout, p.tasks...) }()
	itest.EventuallyNoError(t, 60*time.Second, strings.Join(names, ", ")+" accept connections", func() error {
		select {
		case err := <-ran:
			t.Fatalf("the services stopped: %v", err)
		default:
		}
		for _, a := range listens {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return err
			}
			c.Close()
		}
		return nil
	})
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-ran:
			if err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		case <-time.After(90 * time.Second):
			t.Fatal("the services did not stop")
		}
	}
}

// withIngest is the configuration of services a test runs in one process:
// the test's Kafka and Redis, free ports for ops and ingest, ingest
// writing to topic and knowing one key, and the usage sink that sends to
// that ingest with that key, for a gateway or authz of the process.
func withIngest(t *testing.T, dir, topic string) (sluiceconfig.Config, frontend.EventSink) {
	t.Helper()
	cfg := sluiceconfig.Defaults()
	cfg.Kafka = itest.Kafka(t)
	cfg.Redis = itest.Redis(t)
	cfg.Migrate = false
	cfg.Log.Format = "text"
	cfg.Ops.Listen = freeAddr(t)
	cfg.Services.Ingest.Listen = freeAddr(t)
	cfg.Topics = itest.Topics(t)
	cfg.Topics.Usage = topic
	key := "sk-ingest-" + itest.Unique(t, "")
	sum := sha256.Sum256([]byte(key))
	cfg.Services.Ingest.GatewayKeys.File = writeFile(t, dir, "ingest-keys.yaml", "keys:\n  - {id: frontend, sha256: "+hex.EncodeToString(sum[:])+", tenants: [\"*\"]}\n")
	sink := frontend.DefaultEventSink()
	sink.IngestURL = "http://" + cfg.Services.Ingest.Listen
	sink.IngestAPIKeyFile = writeFile(t, dir, "ingest-key", key)
	return cfg, sink
}

// upstreamPolicy is a policy's upstreams section with one upstream, the
// mock LLM at url, serving every model.
func upstreamPolicy(url string) string {
	return fmt.Sprintf("upstreams:\n  mock: {base_url: %q, models: [\"*\"]}\n", url+"/v1")
}

// demoPolicyAt copies the demo policy into dir with its upstreams at url,
// the test's mock LLM, instead of the demo's fixed address.
func demoPolicyAt(t *testing.T, dir, url string) string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("..", "..", "deploy", "demo", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, "demo-policy.yaml", strings.ReplaceAll(string(src), "http://"+demoUpstreamAddr, url))
}

// settlementsIn reads topic from its start to its end and returns the
// request ids (attribute request_id, the client's x-request-id) of the
// settlements (events that are not estimates) it holds.
func settlementsIn(t *testing.T, kc kafkaconn.Config, topic string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, ev := range usageEventsIn(t, kc, topic) {
		if !ev.Estimated {
			out[ev.Attributes["request_id"]] = true
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return itest.FreeAddr(t)
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// usageEventsIn reads topic from its start to its end and returns the
// usage events it holds.
func usageEventsIn(t *testing.T, kc kafkaconn.Config, topic string) []schemas.UsageEvent {
	t.Helper()
	var out []schemas.UsageEvent
	for _, r := range itest.ReadTopic(t, kc, topic) {
		var ev schemas.UsageEvent
		if err := json.Unmarshal(r.Value, &ev); err != nil {
			t.Errorf("record %s: %v", r.Value, err)
		}
		out = append(out, ev)
	}
	return out
}
