package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/demo/refgateway"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter"
)

// referenceGateway is the reference gateway, in the test process, in front of the
// mock LLM, metering into the stack's ingest subprocess.
type referenceGateway struct {
	url     string
	checker *checker.Checker
	emitter *emitter.Emitter
	// shift moves the gateway's clock (the event times it stamps).
	shift atomic.Int64
	keys  map[string]string // tenant -> API key
}

// newGateway starts the gateway for tenants (each gets the API key
// "sk-<tenant>") and waits until its Checker has synced.
func newGateway(t testing.TB, s *stack, tenants ...string) *referenceGateway {
	t.Helper()
	return newGatewayTo(t, s, mockllm.Handler(), tenants...)
}

// newGatewayTo is newGateway in front of the upstream h.
func newGatewayTo(t testing.TB, s *stack, h http.Handler, tenants ...string) *referenceGateway {
	t.Helper()
	upstream := httptest.NewServer(h)
	t.Cleanup(upstream.Close)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ccfg := checker.DefaultConfig()
	ccfg.KeyPrefix = s.prefix
	ccfg.ResyncInterval = 2 * time.Second
	chk, err := checker.New(s.rdb, ccfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = chk.Run(ctx) }()

	ecfg := emitter.DefaultConfig()
	ecfg.FlushInterval = 10 * time.Millisecond
	ecfg.Logger = log
	em, err := emitter.New(&emitter.HTTPSender{URL: "http://" + s.ingestAddr, APIKey: s.ingestKey}, ecfg)
	if err != nil {
		t.Fatal(err)
	}
	g := &referenceGateway{checker: chk, emitter: em, keys: map[string]string{}}
	keys := map[string]refgateway.Caller{}
	for _, tn := range tenants {
		g.keys[tn] = "sk-" + tn
		keys["sk-"+tn] = refgateway.Caller{Tenant: tn, APIKeyID: "key-" + tn}
	}
	gw := &refgateway.Gateway{Upstream: upstream.URL, Keys: keys, Checker: chk, Emitter: em, Name: "e2e-gateway",
		Now: func() time.Time { return time.Now().Add(time.Duration(g.shift.Load())) }}
	srv := httptest.NewServer(gw.Handler())
	g.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer ccancel()
		_ = em.Close(cctx)
		cancel()
		<-done
	})
	itest.EventuallyNoError(t, waitTimeout, "gateway Checker synced", func() error {
		if !chk.Synced() {
			return fmt.Errorf("not synced")
		}
		return nil
	})
	return g
}

// chatAnswer is what the gateway answered one chat completion.
type chatAnswer struct {
	status int
	header http.Header
	body   []byte
}

// chatStatus sends one small chat completion for tenant and returns the
// status; safe from any goroutine.
func (g *referenceGateway) chatStatus(tenant, model string) (int, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 5,
		"messages": []map[string]string{{"role": "user", "content": "x"}}})
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.keys[tenant])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// chat sends one chat completion for tenant whose usage is exactly total
// tokens (the mock's tokenizer counts a one-character prompt as 5).
func (g *referenceGateway) chat(t testing.TB, tenant, model string, total int64) chatAnswer {
	t.Helper()
	if total < 6 {
		t.Fatalf("chat: total %d below the 6-token minimum", total)
	}
	body, _ := json.Marshal(map[string]any{
		"model": model, "max_tokens": total - 5,
		"messages": []map[string]string{{"role": "user", "content": "x"}},
	})
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.keys[tenant])
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return chatAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// flush waits until the Emitter has handed every usage event to ingest.
// spend makes one call of tenant's to model costing total tokens, which
// must be served, and flushes its usage event.
func (g *referenceGateway) spend(t testing.TB, tenant, model string, total int64) {
	t.Helper()
	if a := g.chat(t, tenant, model, total); a.status != http.StatusOK {
		t.Fatalf("chat: status %d: %s", a.status, a.body)
	}
	g.flush(t)
}

// waitRefused waits until the gateway's Checker refuses tenant's calls
// to model.
func (g *referenceGateway) waitRefused(t testing.TB, tenant, model string) {
	t.Helper()
	itest.EventuallyNoError(t, waitTimeout, "gateway Checker refuses", func() error {
		if d := g.checker.Check(tenant, model, "key-"+tenant); d.Allowed() {
			return fmt.Errorf("still allowed")
		}
		return nil
	})
}

func (g *referenceGateway) flush(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := g.emitter.Flush(ctx); err != nil {
		t.Fatalf("emitter flush: %v", err)
	}
}
