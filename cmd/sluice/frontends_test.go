package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// frontEndsPolicy limits tenant "checked", whom authz admits, to one
// request a minute; the gateway's tenant has no limit.
const frontEndsPolicy = `
tenants:
  checked:
    limits:
      checked-rpm: {unit: requests, sliding_window: {length: 1m, limit: 1}, exact: true}
`

// TestGatewayAndAuthzInOneProcess: `sluice run ingest gateway authz`, the
// gateway and the forward-auth endpoint both admitting by the same policy
// and both sending usage events, starts and serves: a call through the
// gateway is settled, a check authz refuses for its limit is a rejected
// event, both reach the usage topic through the ingest of the same
// process, and /metrics shows each front end's Emitter and admission
// series apart, labelled with its service.
func TestGatewayAndAuthzInOneProcess(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewServer(mockllm.Handler())
	defer up.Close()

	topic := itest.Unique(t, "frontends_usage")
	cfg, sink := withIngest(t, dir, topic)
	sink.FlushInterval = 10 * time.Millisecond
	keys := writeFile(t, dir, "keys.yaml", "keys:\n"+frontend.KeyLine("gw", "sk-gw", "proxied", nil)+frontend.KeyLine("az", "sk-az", "checked", nil))
	policy := writeFile(t, dir, "policy.yaml", frontEndsPolicy+upstreamPolicy(up.URL))
	cfg.Policy.File, cfg.TenantKeys.File = policy, keys
	g := &cfg.Services.Gateway
	g.Listen = freeAddr(t)
	g.Usage.EventSink = sink
	g.Admission.MaxWait = 200 * time.Millisecond
	a := &cfg.Services.Authz
	a.Listen = freeAddr(t)
	a.Usage = sink
	a.Admission.MaxWait = 200 * time.Millisecond

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	stop := runPipeline(t, &cfg, []string{"ingest", "gateway", "authz"}, log, cfg.Services.Ingest.Listen, g.Listen, a.Listen)

	resp, _ := itest.Send(t, http.MethodPost, "http://"+g.Listen+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer sk-gw", "X-Request-Id", "fe-call-1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call through the gateway: %d", resp.StatusCode)
	}
	if resp, _ := itest.Send(t, http.MethodGet, "http://"+a.Listen+"/authz", "", "Authorization", "Bearer sk-az", "X-Sluice-Model", "gpt-4o"); resp.StatusCode != http.StatusOK {
		t.Fatalf("first check, within the limit: %d", resp.StatusCode)
	}
	if resp, _ := itest.Send(t, http.MethodGet, "http://"+a.Listen+"/authz", "", "Authorization", "Bearer sk-az", "X-Sluice-Model", "gpt-4o"); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second check, over the limit of one a minute: %d, want 429", resp.StatusCode)
	}

	// Each front end's series, apart.
	itest.EventuallyNoError(t, 30*time.Second, "each front end's emitter and admission series", func() error {
		m := scrape(t, "http://"+cfg.Ops.Listen+"/metrics")
		for _, want := range []struct {
			series string
			min    float64
		}{
			{`sluice_emitter_delivered_events_total{service="gateway"}`, 2}, // estimate and settlement
			{`sluice_emitter_delivered_events_total{service="authz"}`, 1},   // the refusal
			{`sluice_admission_requests_total{result="allowed",service="gateway"}`, 1},
			{`sluice_admission_requests_total{result="allowed",service="authz"}`, 1},
			{`sluice_admission_requests_total{result="refused",service="authz"}`, 1},
		} {
			if v, ok := m[want.series]; !ok || v < want.min {
				return fmt.Errorf("%s is %v (exported: %t), want at least %v", want.series, v, ok, want.min)
			}
		}
		return nil
	})

	stop()
	var settled, refused bool
	for _, ev := range usageEventsIn(t, cfg.Kafka, topic) {
		switch {
		case ev.Gateway == g.Name && ev.Attributes["request_id"] == "fe-call-1" && !ev.Estimated && ev.Outcome == schemas.OutcomeOK && ev.Tenant == "proxied":
			settled = true
		case ev.Gateway == a.Name && ev.Tenant == "checked" && ev.Outcome == schemas.OutcomeRejected:
			refused = true
		}
	}
	if !settled || !refused {
		t.Fatalf("usage topic: the gateway's settlement found %t, authz's refusal found %t", settled, refused)
	}
}

// scrape reads a Prometheus text exposition into series (name with its
// labels, as exposed) → value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); i > 0 && err == nil {
			out[line[:i]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGatewayAloneNeedsNeitherKafkaNorClickHouse: the README's minimal
// `sluice run -config sluice.yaml gateway` — its configuration as the
// README shows it, with this machine's addresses — starts and proxies
// while ClickHouse is unreachable and no Kafka is named: it migrates
// nothing and starts no broker, and meters to its ingest.
func TestGatewayAloneNeedsNeitherKafkaNorClickHouse(t *testing.T) {
	dir := t.TempDir()
	up := httptest.NewServer(mockllm.Handler())
	defer up.Close()
	var events atomic.Int64
	ingest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer sk-ingest" {
			events.Add(1)
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	defer ingest.Close()
	listen, rc := freeAddr(t), itest.Redis(t)
	policy := writeFile(t, dir, "policy.yaml", upstreamPolicy(up.URL))
	keys := writeFile(t, dir, "gateway-keys.yaml", "keys:\n"+frontend.KeyLine("app", "sk-app", "acme", nil))
	key := writeFile(t, dir, "sluice-ingest-key", "sk-ingest")
	// The README's sluice.yaml, then where this machine's services are.
	conf := writeFile(t, dir, "sluice.yaml", fmt.Sprintf(`
policy: {file: %s}
tenant_keys: {file: %s}
services:
  gateway:
    listen: %s
    usage: {ingest_url: %s, ingest_api_key_file: %s}
redis: {addr: %q, key_prefix: %q}
clickhouse: {addr: %q}
ops: {listen: %q}
`, policy, keys, listen, ingest.URL, key, rc.Addr, itest.Unique(t, "sluice_test_alone:")+":", closedAddr(t), freeAddr(t)))
	cfg := sluiceconfig.Defaults()
	_, err := sluiceconfig.Load(&cfg, []string{"-config", conf}, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Migrate || len(cfg.Kafka.Brokers) != 0 || cfg.Embedded.Enabled {
		t.Fatalf("the minimal configuration changed: migrate %t, brokers %v, embedded %t", cfg.Migrate, cfg.Kafka.Brokers, cfg.Embedded.Enabled)
	}
	stop := runPipeline(t, &cfg, []string{"gateway"}, slog.New(slog.DiscardHandler), listen)
	defer stop()
	resp, body := itest.Send(t, http.MethodPost, "http://"+listen+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer sk-app")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call through the gateway alone: %d %s", resp.StatusCode, body)
	}
	itest.Eventually(t, 30*time.Second, "the call's events at ingest", func() bool { return events.Load() >= 1 })
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	return freeAddr(t) // freed at once: nothing listens there
}
