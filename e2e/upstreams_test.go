package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
)

// classUpstream is the mock provider behind both gateways: it holds every
// call until release is closed, counting the calls it holds by the class
// marker in their prompt, then answers as the mock LLM does.
type classUpstream struct {
	mock    http.Handler
	release chan struct{}

	mu   sync.Mutex
	held map[string]int

	// Calls marked flaky-call fail (500): at once, or while holdFlaky is
	// set once flakyRelease is closed.
	holdFlaky    atomic.Bool
	flakyRelease chan struct{}
}

func (u *classUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	mark := "?"
	for _, m := range []string{"class-low", "class-critical", "class-normal", "pool-call", "flaky-call"} {
		if bytes.Contains(body, []byte(m)) {
			mark = m
		}
	}
	u.mu.Lock()
	u.held[mark]++
	u.mu.Unlock()
	if mark == "flaky-call" {
		if u.holdFlaky.Load() {
			select {
			case <-u.flakyRelease:
			case <-r.Context().Done():
			}
		}
		http.Error(w, `{"error":{"message":"upstream down","type":"server_error"}}`, http.StatusInternalServerError)
		return
	}
	select {
	case <-u.release:
	case <-r.Context().Done():
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	u.mock.ServeHTTP(w, r)
}

func (u *classUpstream) heldOf(mark string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.held[mark]
}

// answers collects the status and error code of calls made in the
// background.
type answers struct {
	mu    sync.Mutex
	codes map[string][]string // marker → "status code" per answer
	wg    sync.WaitGroup
}

func (a *answers) send(t *testing.T, gw, key, model, mark string) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		body := fmt.Sprintf(`{"model":%q,"max_tokens":3,"messages":[{"role":"user","content":"%s"}]}`, model, mark)
		code, b, err := httpPost("http://"+gw+"/v1/chat/completions", key, body)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal([]byte(b), &e)
		got := fmt.Sprintf("%d %s", code, e.Error.Code)
		if err != nil {
			got = "error " + err.Error()
		}
		a.mu.Lock()
		a.codes[mark] = append(a.codes[mark], got)
		a.mu.Unlock()
	}()
}

// of returns the answers to the calls marked mark so far.
func (a *answers) of(mark string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.codes[mark]...)
}

func count(list []string, want string) int {
	n := 0
	for _, s := range list {
		if s == want {
			n++
		}
	}
	return n
}

// TestReservedSharesHoldAcrossTwoGatewayProcesses: two `sluice gateway`
// processes (the sluice binary, the same policy, one Redis prefix) in
// front of one mock provider whose calls are held open. The policy gives
// upstream "mock" a capacity of 10 calls, a saturation threshold of 50%
// and reserved shares critical 50%, low 10%; upstream "pool" is shared
// with a fixed limit of 4 calls.
//
//   - Below the threshold a class borrows idle capacity: 8 low calls, 4
//     through each gateway, and 5 reach the provider (the threshold,
//     summed over both processes — each alone would have let its 4
//     through), the other 3 are refused 503 class_share.
//   - Above it each class is held to its share: 6 critical calls, 3
//     through each gateway, and 5 (its share of 10) reach the provider
//     although the fleet is past the threshold; a 6th would exceed the
//     capacity. More low calls through either gateway, and a normal one
//     (no share), are refused: low keeps what it borrowed but gets no
//     more.
//   - Once the calls end their holds come back: a low call passes again.
//   - The shared concurrency limit counts across both processes: 6 calls
//     to "pool", 3 through each gateway, and exactly 4 reach the
//     provider; the other 2 wait in their gateway's queue and are
//     refused when their wait runs out.
//   - The upstream breaker of "flaky" (shared) opens after 10 failures
//     in a row through gateway 1 and gateway 2 refuses too; half-open,
//     the fleet sends 2 probes in all through both; their failure
//     reopens it for twice the open time.
func TestReservedSharesHoldAcrossTwoGatewayProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end suite: needs the real services")
	}
	t.Parallel()
	pol := `
defaults:
  timezone: UTC
tenants:
  e2e-vip: {priority: critical}
  e2e-batch: {priority: low}
  e2e-plain: {priority: normal}
`
	// The upstreams, all the mock below, go into the policy once it
	// listens.
	upstreams := `upstreams:
  mock:
    base_url: %[1]q
    models: [gpt-4o]
    concurrency: {mode: fixed, limit: 20, max: 20}
    queue: {max_waiting: 20, max_wait: 30s}
    reserved: {unit: concurrency, capacity: 10, saturation: 0.5, shares: {critical: 0.5, low: 0.1}}
  flaky:
    base_url: %[1]q
    models: [o3-mini]
    shared: true
    breaker: {consecutive_failures: 10, error_ratio: 0, open_for: 2s, max_open_for: 1m, probes: 2}
  pool:
    base_url: %[1]q
    models: [gpt-4o-mini]
    shared: true
    concurrency: {mode: fixed, limit: 4, max: 4}
    queue: {max_waiting: 20, max_wait: 1500ms}
`
	s := newStack(t, stackOptions{Policy: pol})
	up := &classUpstream{mock: mockllm.New(mockllm.Options{}), release: make(chan struct{}), held: map[string]int{}, flakyRelease: make(chan struct{})}
	srv := httptest.NewServer(up)
	var released, flakyReleased sync.Once
	release := func() { released.Do(func() { close(up.release) }) }
	releaseFlaky := func() { flakyReleased.Do(func() { close(up.flakyRelease) }) }
	t.Cleanup(releaseFlaky)
	ans := &answers{codes: map[string][]string{}}
	t.Cleanup(func() { release(); ans.wg.Wait(); srv.Close() })
	s.writePolicy(pol + fmt.Sprintf(upstreams, srv.URL+"/v1"))

	keys := "keys:\n" + frontend.KeyLine("vip", "sk-vip", "e2e-vip", nil) +
		frontend.KeyLine("batch", "sk-batch", "e2e-batch", nil) + frontend.KeyLine("plain", "sk-plain", "e2e-plain", nil)
	writeFileT(t, filepath.Join(s.dir, "gateway-keys.yaml"), keys)
	s.appendConfig(`
  gateway:
    usage: {sink: none}
    # A stall of the shared test machine must not send the shared counts
    # to their per-process fallback: the test counts across processes.
    shared_upstreams: {redis_timeout: 5s}
`)
	gws := [2]string{freeAddr(t), freeAddr(t)}
	ps := [2]*proc{s.spawnAs("gateway-1", "gateway", "-services.gateway.listen="+gws[0]),
		s.spawnAs("gateway-2", "gateway", "-services.gateway.listen="+gws[1])}
	for _, p := range ps {
		s.waitReady(p)
	}

	// wait polls until n answers (or held calls) are in for mark.
	settled := func(what, mark string, held, answered int) {
		t.Helper()
		itest.EventuallyNoError(t, waitTimeout, what, func() error {
			if h, a := up.heldOf(mark), len(ans.of(mark)); h+a < held+answered {
				return fmt.Errorf("%d held at the provider, %d answered; want %d in all", h, a, held+answered)
			}
			return nil
		})
		if h, a := up.heldOf(mark), ans.of(mark); h != held || count(a, "503 class_share") != answered {
			t.Fatalf("%s: %d calls held at the provider, answers %v; want %d held and %d refused 503 class_share", what, h, a, held, answered)
		}
	}

	// Below the threshold: low borrows idle capacity up to it, fleet-wide.
	for i := range 8 {
		ans.send(t, gws[i%2], "sk-batch", "gpt-4o", "class-low")
	}
	settled("8 low calls through two gateways", "class-low", 5, 3)

	// Above it: critical gets its reserved share; low and normal get no more.
	for i := range 6 {
		ans.send(t, gws[i%2], "sk-vip", "gpt-4o", "class-critical")
	}
	settled("6 critical calls past the threshold", "class-critical", 5, 1)
	for i := range 2 {
		ans.send(t, gws[i], "sk-batch", "gpt-4o", "class-low")
	}
	settled("2 more low calls past the threshold", "class-low", 5, 5)
	ans.send(t, gws[0], "sk-plain", "gpt-4o", "class-normal")
	settled("a normal call past the threshold", "class-normal", 0, 1)

	// The shared limit of pool, counted across both processes.
	for i := range 6 {
		ans.send(t, gws[i%2], "sk-plain", "gpt-4o-mini", "pool-call")
	}
	itest.EventuallyNoError(t, waitTimeout, "pool's 6 calls held or answered", func() error {
		if h, a := up.heldOf("pool-call"), ans.of("pool-call"); h+len(a) < 6 {
			return fmt.Errorf("%d held, answers %v", h, a)
		}
		return nil
	})
	if h, a := up.heldOf("pool-call"), ans.of("pool-call"); h != 4 || len(a) != 2 || strings.HasPrefix(a[0], "200") || strings.HasPrefix(a[1], "200") {
		t.Fatalf("pool (limit 4, shared): %d calls reached the provider, answers %v; want 4 and 2 refusals", h, a)
	}

	release()
	ans.wg.Wait()
	for _, mark := range []string{"class-low", "class-critical", "pool-call"} {
		if a := ans.of(mark); count(a, "200 ") != up.heldOf(mark) {
			t.Fatalf("%s: answers %v; want 200 for each of the %d calls the provider held", mark, a, up.heldOf(mark))
		}
	}
	// The ended calls gave their holds back to the fleet's counts.
	itest.EventuallyNoError(t, waitTimeout, "a low call admitted again once the calls ended", func() error {
		for _, gw := range gws {
			code, body := postJSON(t, "http://"+gw+"/v1/chat/completions", "sk-batch", `{"model":"gpt-4o","messages":[{"role":"user","content":"again"}]}`)
			if code != http.StatusOK {
				return fmt.Errorf("%s: %d %s", gw, code, body)
			}
		}
		return nil
	})

	// The upstream breaker of flaky, shared: 10 failures in a row through
	// gateway 1 open it for the fleet — gateway 2, which sent fewer than
	// 10, refuses too —, and once half-open the fleet sends 2 probes in
	// all, whichever gateway they come through; failing, they reopen it
	// for twice the open time.
	const flaky = `{"model":"o3-mini","messages":[{"role":"user","content":"flaky-call"}]}`
	for i := range 10 {
		if code, b := postJSON(t, "http://"+gws[0]+"/v1/chat/completions", "sk-plain", flaky); code != http.StatusInternalServerError {
			t.Fatalf("failing call %d: %d %s", i, code, b)
		}
	}
	itest.EventuallyNoError(t, waitTimeout, "gateway 2 refuses flaky with breaker_open", func() error {
		code, b := postJSON(t, "http://"+gws[1]+"/v1/chat/completions", "sk-plain", flaky)
		if code != http.StatusServiceUnavailable || !strings.Contains(b, "breaker_open") {
			return fmt.Errorf("%d %s", code, b)
		}
		return nil
	})
	if n := up.heldOf("flaky-call"); n >= 20 {
		t.Fatalf("the upstream saw %d calls: gateway 2 sent 10 of its own before it refused", n)
	}
	up.holdFlaky.Store(true)
	arrived := up.heldOf("flaky-call")
	sent := 0
	itest.EventuallyNoError(t, waitTimeout, "the first probe admitted after the open time", func() error {
		if up.heldOf("flaky-call") > arrived {
			return nil
		}
		ans.send(t, gws[sent%2], "sk-plain", "o3-mini", "flaky-call")
		sent++
		return fmt.Errorf("%d calls sent, no probe yet", sent)
	})
	for i := range 6 {
		ans.send(t, gws[i%2], "sk-plain", "o3-mini", "flaky-call")
	}
	sent += 6
	itest.EventuallyNoError(t, waitTimeout, "every call after the open time answered or held", func() error {
		if probes, answered := up.heldOf("flaky-call")-arrived, len(ans.of("flaky-call")); probes+answered < sent {
			return fmt.Errorf("%d probes held, %d answered, %d sent", probes, answered, sent)
		}
		return nil
	})
	if probes, a := up.heldOf("flaky-call")-arrived, ans.of("flaky-call"); probes != 2 || count(a, "503 breaker_open") != len(a) {
		t.Fatalf("half-open: %d probes reached the upstream, the others answered %v; want 2 probes for the fleet and breaker_open for the rest", probes, a)
	}
	releaseFlaky() // the probes fail
	itest.EventuallyNoError(t, waitTimeout, "reopened for twice the open time", func() error {
		req, _ := http.NewRequest(http.MethodPost, "http://"+gws[1]+"/v1/chat/completions", strings.NewReader(flaky))
		req.Header.Set("Authorization", "Bearer sk-plain")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if retry, _ := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusServiceUnavailable || retry < 3 {
			return fmt.Errorf("%d, Retry-After %q; want 503 with about 4 s", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		return nil
	})
	s.requireAlive()
}
