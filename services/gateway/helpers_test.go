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
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/emitter/emittertest"
	"github.com/sluicehq/sluice/sdk/go/middleware"
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

// Upstream is an upstreams entry of a test's policy: where the upstream
// is and what it serves (its guard settings, when a test wants them, go
// in testGateway.policy under the same name).
type Upstream struct {
	Name, BaseURL                  string
	Dialect, APIKeyEnv             string
	Models                         []string
	Weight                         int
	Timeout, ResponseHeaderTimeout time.Duration
}

// testGateway is a gateway's configuration and the policy it runs with:
// its upstreams and more policy YAML (tenants, fallbacks, the upstreams'
// guards), merged.
type testGateway struct {
	Config
	ups    []Upstream
	policy string
}

// testConfig is a valid configuration with the given upstreams.
func testConfig(t testing.TB, ups ...Upstream) testGateway {
	t.Helper()
	c := DefaultConfig()
	c.Usage.Sink = frontend.SinkNone
	c.Name = "gw-test"
	return testGateway{Config: c, ups: ups}
}

// oneUpstream is testConfig with one upstream at base serving every model.
func oneUpstream(t testing.TB, base string) testGateway {
	return testConfig(t, Upstream{Name: "mock", BaseURL: base, Models: []string{"*"}})
}

// policyYAML is tg's policy: tg.policy with each upstream's place and
// models added to its entry.
func (tg testGateway) policyYAML(t testing.TB) []byte {
	t.Helper()
	doc := map[string]any{}
	if err := yaml.Unmarshal([]byte(tg.policy), &doc); err != nil {
		t.Fatalf("test policy: %v", err)
	}
	ups, _ := doc["upstreams"].(map[string]any)
	if ups == nil {
		ups = map[string]any{}
	}
	for _, u := range tg.ups {
		e, _ := ups[u.Name].(map[string]any)
		if e == nil {
			e = map[string]any{}
		}
		e["base_url"], e["models"] = u.BaseURL, u.Models
		if u.Weight > 0 {
			e["weight"] = u.Weight
		}
		if u.Dialect != "" {
			e["dialect"] = u.Dialect
		}
		if u.APIKeyEnv != "" {
			e["api_key_env"] = u.APIKeyEnv
		}
		if u.Timeout > 0 {
			e["timeout"] = u.Timeout.String()
		}
		if u.ResponseHeaderTimeout > 0 {
			e["response_header_timeout"] = u.ResponseHeaderTimeout.String()
		}
		ups[u.Name] = e
	}
	doc["upstreams"] = ups
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parsePolicy is tg's policy, parsed.
func (tg testGateway) parsePolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(tg.policyYAML(t), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// writePolicy writes tg's policy into a file of the test's own.
func (tg testGateway) writePolicy(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, tg.policyYAML(t), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

type gw struct {
	*Server
	url  string
	sink *emittertest.Recorder
}

// startGateway serves a Server of tg in the test (New, behind httptest):
// the test keys, tg's policy and its upstreams' guards counting in this
// process, unless deps brings its own.
func startGateway(t *testing.T, tg testGateway, deps Deps) *gw {
	t.Helper()
	s := &emittertest.Recorder{}
	if deps.Emitter == nil {
		deps.Emitter = s
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Keys == nil {
		keys, err := frontend.OpenKeys(writeKeys(t), deps.Logger, nil)
		if err != nil {
			t.Fatal(err)
		}
		deps.Keys = keys
	}
	if deps.Policy == nil {
		p := tg.parsePolicy(t)
		deps.Policy = func() *policy.Policy { return p }
	}
	if deps.Guards == nil {
		deps.Guards = NewGuards(nil, "", "test", nil, nil)
		t.Cleanup(deps.Guards.Close)
		if err := deps.Guards.Update(deps.Policy()); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := NewServer(tg.Config, deps)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &gw{Server: srv, url: hs.URL, sink: s}
}

// settlement returns the settlement of the call with event id id.
// settlement is the one settlement of the call the client sent with
// x-request-id requestID (the event's request_id attribute; the event's
// own id is the gateway's).
func (g *gw) settlement(t *testing.T, requestID string) schemas.UsageEvent {
	t.Helper()
	var found []schemas.UsageEvent
	for _, ev := range g.sink.Events() {
		if ev.Attributes["request_id"] == requestID && !ev.Estimated {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d settlements with request id %s, want 1; events: %+v", len(found), requestID, g.sink.Events())
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

// cutStream opens a streamed call (header as openStream takes it, which
// must name its X-Request-Id), reads three lines that start with
// eventPrefix, leaves the call as a client that gives up would, and
// returns what the mock provider billed for it and the settlement the
// gateway emitted: the pair a cut-stream test compares.
func cutStream(t *testing.T, g *gw, bill *charges, path, eventPrefix, body string, header ...string) (mockllm.Charge, schemas.UsageEvent) {
	t.Helper()
	requestID := ""
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "X-Request-Id" {
			requestID = header[i+1]
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, rd := openStream(t, ctx, g.url, path, "", body, header...)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for events := 0; events < 3; {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, eventPrefix) {
			events++
		}
	}
	cancel()
	resp.Body.Close()
	itest.Eventually(t, 10*time.Second, "the provider's bill of the cut stream", func() bool { return len(bill.list()) == 1 })
	itest.Eventually(t, 10*time.Second, "the settlement", func() bool { return len(g.sink.Events()) == 2 })
	return bill.list()[0], g.settlement(t, requestID)
}

// clientUsages is the usage an official client reported per call, in
// Sluice's token types.
func clientUsages[T any, P interface {
	*T
	Usage() middleware.Usage
}](seen map[string]T) map[string]middleware.Usage {
	out := make(map[string]middleware.Usage, len(seen))
	for id, u := range seen {
		out[id] = P(&u).Usage()
	}
	return out
}

// wantSettledAsTheClientSaw checks that each call ids names was settled
// with the usage its client saw, token type by token type, and not as an
// estimate or a count of the gateway's own.
func wantSettledAsTheClientSaw(t *testing.T, g *gw, seen map[string]middleware.Usage, ids ...string) {
	t.Helper()
	for _, id := range ids {
		want, ok := seen[id]
		if !ok {
			t.Fatalf("the client saw no usage for %s: %+v", id, seen)
		}
		ev := g.settlement(t, id)
		if ev.PromptTokens != want.PromptTokens || ev.CachedTokens != want.CachedTokens || ev.CacheWriteTokens != want.CacheWriteTokens ||
			ev.CompletionTokens != want.CompletionTokens || ev.ReasoningTokens != want.ReasoningTokens || ev.Attributes["usage"] != "" {
			t.Errorf("%s: settled %+v; the client saw %+v", id, ev, want)
		}
	}
}
