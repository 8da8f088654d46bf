package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/gateway"
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
	kc := itest.Kafka(t)
	rc := itest.Redis(t)
	itest.QuietRedisLogs()
	dir := t.TempDir()
	topic := itest.Unique(t, "frontends_usage")
	up := httptest.NewServer(mockllm.Handler())
	defer up.Close()

	cfg := defaultConfig()
	cfg.Kafka = kc
	cfg.Redis = rc
	cfg.Migrate = false
	cfg.Log.Format = "text"
	cfg.Ops.Listen = freeAddr(t)
	cfg.Services.Ingest.Listen = freeAddr(t)
	cfg.Services.Ingest.Topic = topic
	ingestKey := "sk-ingest-" + itest.Unique(t, "")
	sum := sha256.Sum256([]byte(ingestKey))
	cfg.Services.Ingest.KeysFile = writeFile(t, dir, "ingest-keys.yaml", "keys:\n  - {id: fe, sha256: "+hex.EncodeToString(sum[:])+", tenants: [\"*\"]}\n")
	keys := writeFile(t, dir, "keys.yaml", "keys:\n"+gateway.KeyLine("gw", "sk-gw", "proxied", nil)+gateway.KeyLine("az", "sk-az", "checked", nil))
	policy := writeFile(t, dir, "policy.yaml", frontEndsPolicy)
	prefix := itest.Unique(t, "frontends")
	usage := func(u *gateway.EventSink) {
		u.Sink = gateway.SinkIngest
		u.IngestURL = "http://" + cfg.Services.Ingest.Listen
		u.IngestAPIKeyFile = writeFile(t, dir, "ingest-key", ingestKey)
		u.FlushInterval = 10 * time.Millisecond
	}
	admission := func(a *gateway.AdmissionConfig) {
		a.PolicyFile = policy
		a.KeyPrefix = prefix + ":adm:"
		a.UpstreamKeyPrefix = prefix + ":up:"
		a.MaxWait = 200 * time.Millisecond
	}
	g := &cfg.Services.Gateway
	g.Listen = freeAddr(t)
	g.KeysFile = keys
	g.Upstreams = []gateway.Upstream{{Name: "mock", BaseURL: up.URL + "/v1", Models: []string{"*"}}}
	g.Checker.KeyPrefix = prefix + ":flags:"
	usage(&g.Usage.EventSink)
	admission(&g.Admission)
	a := &cfg.Services.Authz
	a.Listen = freeAddr(t)
	a.KeysFile = keys
	a.Checker.KeyPrefix = prefix + ":flags:"
	usage(&a.Usage)
	admission(&a.Admission)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	p, err := preparePipeline(ctx, &cfg, []string{"ingest", "gateway", "authz"}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	ran := make(chan error, 1)
	go func() { ran <- lifecycle.Run(ctx, log, cfg.ShutdownGrace, p.tasks...) }()
	itest.EventuallyNoError(t, 60*time.Second, "ingest, gateway and authz accept connections", func() error {
		for _, addr := range []string{cfg.Services.Ingest.Listen, g.Listen, a.Listen} {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			c.Close()
		}
		select {
		case err := <-ran:
			t.Fatalf("the services stopped: %v", err)
		default:
		}
		return nil
	})

	resp := send(t, http.MethodPost, "http://"+g.Listen+"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer sk-gw", "X-Request-Id", "fe-call-1")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("call through the gateway: %d", resp.StatusCode)
	}
	if resp := send(t, http.MethodGet, "http://"+a.Listen+"/authz", "", "Authorization", "Bearer sk-az", "X-Sluice-Model", "gpt-4o"); resp.StatusCode != http.StatusOK {
		t.Fatalf("first check, within the limit: %d", resp.StatusCode)
	}
	if resp := send(t, http.MethodGet, "http://"+a.Listen+"/authz", "", "Authorization", "Bearer sk-az", "X-Sluice-Model", "gpt-4o"); resp.StatusCode != http.StatusTooManyRequests {
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
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the services did not stop")
	}
	var settled, refused bool
	for _, ev := range usageEventsIn(t, kc, topic) {
		switch {
		case ev.Gateway == g.Name && ev.ID == "fe-call-1" && !ev.Estimated && ev.Outcome == schemas.OutcomeOK && ev.Tenant == "proxied":
			settled = true
		case ev.Gateway == a.Name && ev.Tenant == "checked" && ev.Outcome == schemas.OutcomeRejected:
			refused = true
		}
	}
	if !settled || !refused {
		t.Fatalf("usage topic: the gateway's settlement found %t, authz's refusal found %t", settled, refused)
	}
}

// send sends body (none when empty) with the given headers (name, value
// pairs) and returns the answer, its body read and closed.
func send(t *testing.T, method, url, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp
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
