package gateway

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
)

// Test keys: each secret is "sk-" + its id.
const testKeys = `keys:
  - {id: acme, sha256: %acme%, tenant: acme, user: batch, models: ["*"], class: enterprise}
  - {id: mini-only, sha256: %mini-only%, tenant: trial, models: ["gpt-4o-mini*", "text-embedding-3-small"]}
  - {id: boss, sha256: %boss%, tenant: acme, models: ["*"], priority: high, may_set_priority: true}
`

func writeKeys(t testing.TB) string {
	t.Helper()
	body := testKeys
	for _, id := range []string{"acme", "mini-only", "boss"} {
		line := frontend.KeyLine(id, "sk-"+id, "x", nil)
		sum := line[strings.Index(line, "sha256: ")+8:]
		sum = sum[:64]
		body = strings.ReplaceAll(body, "%"+id+"%", sum)
	}
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// testConfig is a valid configuration with the given upstreams.
func testConfig(t testing.TB, ups ...Upstream) Config {
	t.Helper()
	c := DefaultConfig()
	c.KeysFile = writeKeys(t)
	c.Upstreams = ups
	c.Usage.Sink = frontend.SinkNone
	c.Name = "gw-test"
	return c
}

type gw struct {
	*Server
	url  string
	sink *emittertest.Recorder
}

func startGateway(t *testing.T, cfg Config, deps Deps) *gw {
	t.Helper()
	s := &emittertest.Recorder{}
	if deps.Emitter == nil {
		deps.Emitter = s
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &gw{Server: srv, url: hs.URL, sink: s}
}

// settlement returns the settlement of the call with event id id.
func (g *gw) settlement(t *testing.T, id string) schemas.UsageEvent {
	t.Helper()
	var found []schemas.UsageEvent
	for _, ev := range g.sink.Events() {
		if ev.ID == id && !ev.Estimated {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d settlements with id %s, want 1; events: %+v", len(found), id, g.sink.Events())
	}
	return found[0]
}

// post sends body to path with key and returns the answer.
func post(t *testing.T, url, path, key, body string, header ...string) (*http.Response, string) {
	t.Helper()
	return itest.Send(t, http.MethodPost, url+path, body, append([]string{"Authorization", "Bearer " + key, "Content-Type", "application/json"}, header...)...)
}

// openStream starts a streamed request and returns its reader.
func openStream(t *testing.T, ctx context.Context, url, path, key, body string, header ...string) (*http.Response, *bufio.Reader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, bufio.NewReader(resp.Body)
}
