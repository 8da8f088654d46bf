//go:build linux

package authz

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// snippetFile is the nginx configuration docs/forward-auth.md shows and
// this test runs, included in the server block nginxConf wraps it in.
const snippetFile = "../../deploy/nginx/sluice-forward-auth.conf"

// nginxConf is the rest of the test's nginx configuration: one process in
// the foreground, every path (pid, logs, temp files) in the test's folder,
// the two upstreams the snippet names, and the snippet.
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid nginx.pid;
error_log error.log info;
events { worker_connections 256; }
http {
    access_log access.log;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    fastcgi_temp_path tmp/fastcgi;
    uwsgi_temp_path tmp/uwsgi;
    scgi_temp_path tmp/scgi;
    upstream sluice_authz { server %s; keepalive 8; }
    upstream llm_upstream { server %s; keepalive 8; }
    server {
        listen 127.0.0.1:%d;
        include %s;
    }
}
`

// nginxBin finds the nginx the services script installs (SLUICE_NGINX_BIN,
// else nginx on PATH, else Debian's /usr/sbin/nginx); without one the test
// is skipped, or fails under CI=true.
func nginxBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("SLUICE_NGINX_BIN")
	if bin == "" {
		if p, err := exec.LookPath("nginx"); err == nil {
			bin = p
		} else {
			bin = "/usr/sbin/nginx"
		}
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("nginx is not installed at %s (%v); install it with `scripts/services.sh install nginx`", bin, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// startNginx runs nginx in front of authz and upstream until the test ends
// and returns its address. A port taken between choosing and binding it is
// retried with another.
func startNginx(t *testing.T, authzAddr, upstreamAddr string) string {
	t.Helper()
	bin := nginxBin(t)
	snippet, err := filepath.Abs(snippetFile)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		conf := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, authzAddr, upstreamAddr, port, snippet)), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "-t", "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log")).CombinedOutput(); err != nil {
			t.Fatalf("nginx -t refuses the configuration: %v\n%s", err, out)
		}
		cmd := exec.Command(bin, "-p", dir+"/", "-c", conf, "-e", filepath.Join(dir, "error.log"))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		// nginx dies with the test binary even if the cleanup never runs.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start nginx: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		addr := "127.0.0.1:" + strconv.Itoa(port)
		deadline := time.Now().Add(30 * time.Second)
		for {
			select {
			case err := <-exited:
				log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
				if attempt < 3 && bytes.Contains(log, []byte("Address already in use")) {
					goto retry
				}
				t.Fatalf("nginx exited during start-up (%v): %s\n%s", err, out.String(), log)
			default:
			}
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Cleanup(func() {
					_ = cmd.Process.Signal(syscall.SIGTERM)
					select {
					case <-exited:
					case <-time.After(10 * time.Second):
						_ = cmd.Process.Kill()
						<-exited
					}
					if t.Failed() {
						log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
						t.Logf("nginx error.log:\n%s", log)
					}
				})
				return addr
			}
			if time.Now().After(deadline) {
				_ = cmd.Process.Kill()
				t.Fatalf("nginx did not listen on %s within 30s", addr)
			}
			time.Sleep(20 * time.Millisecond)
		}
	retry:
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// upstreamSeen records the identity headers the mock upstream received.
type upstreamSeen struct {
	mu      sync.Mutex
	tenants []string
}

func (u *upstreamSeen) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.tenants = append(u.tenants, r.Header.Get("X-Sluice-Tenant")+"/"+r.Header.Get("X-Sluice-Key-Id"))
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (u *upstreamSeen) all() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.tenants...)
}

// TestNginxForwardAuth runs the real nginx with deploy/nginx's
// configuration in front of the mock upstream, asking the authz service
// (keys file, flags and admission on the real Redis) before each call: an
// allowed call reaches the upstream, which learns the tenant, and its
// answer carries the rate-limit headers; a blacklisted tenant gets 403, an
// unknown key 401, a tenant over its admission limit 429 with Retry-After
// and the rate-limit headers, each with Sluice's OpenAI error body; and
// once Redis is gone, the tenant that fails closed gets 503 while the one
// that fails open is still served. Each refusal of the flags or admission
// reaches ingest (here a recording stand-in) as a rejected usage event.
func TestNginxForwardAuth(t *testing.T) {
	seen := &upstreamSeen{}
	up := httptest.NewServer(seen.wrap(mockllm.Handler()))
	t.Cleanup(up.Close)

	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Admission.MaxWait = 200 * time.Millisecond
	ing := &recordingIngest{}
	ingest := httptest.NewServer(ing)
	t.Cleanup(ingest.Close)
	cfg.Usage.Sink, cfg.Usage.IngestURL, cfg.Usage.FlushInterval = frontend.SinkIngest, ingest.URL, 10*time.Millisecond
	// The service reaches Redis through a proxy the test can cut.
	env, proxy := liveEnv(t)
	authzAddr := startService(t, cfg, env)
	base := "http://" + startNginx(t, authzAddr, strings.TrimPrefix(up.URL, "http://"))

	// Allowed: the call reaches the upstream with the key's tenant, and the
	// answer carries the admission's rate-limit headers.
	resp, body := chat(t, base, "sk-acme", "gpt-4o-mini")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"usage"`) {
		t.Fatalf("allowed call through nginx: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("x-ratelimit-limit-tokens"); got != "1000000" {
		t.Fatalf("allowed call: x-ratelimit-limit-tokens %q, want 1000000 (headers %v)", got, resp.Header)
	}
	if s := seen.all(); len(s) != 1 || s[0] != "acme/acme" {
		t.Fatalf("the upstream saw tenant/key %v, want [acme/acme]", s)
	}

	// Blacklisted: 403 with Sluice's body, never reaching the upstream;
	// the flag's internal reason is not shown.
	itest.Eventually(t, 30*time.Second, "the blacklisted tenant refused with 403 through nginx", func() bool {
		resp, _ := chat(t, base, "sk-blocked", "gpt-4o-mini")
		return resp.StatusCode == http.StatusForbidden
	})
	resp, body = chat(t, base, "sk-blocked", "gpt-4o-mini")
	if e := openAIError(t, resp, body); e.Code != "blacklisted" || strings.Contains(body, "4411") {
		t.Fatalf("blacklist refusal body: %s", body)
	}

	// An unknown key: 401 with the OpenAI body.
	resp, body = chat(t, base, "sk-nobody", "gpt-4o-mini")
	if resp.StatusCode != http.StatusUnauthorized || openAIError(t, resp, body).Code != "invalid_api_key" {
		t.Fatalf("unknown key: %d %s", resp.StatusCode, body)
	}

	// Over the admission limit: two requests a minute, the third is 429
	// with Retry-After and the rate-limit headers, naming the rule.
	for i := range 2 {
		if resp, body := chat(t, base, "sk-trial", "gpt-4o-mini"); resp.StatusCode != http.StatusOK {
			t.Fatalf("trial call %d within its limit: %d %s", i+1, resp.StatusCode, body)
		}
	}
	resp, body = chat(t, base, "sk-trial", "gpt-4o-mini")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("trial over its limit: %d %s, want 429", resp.StatusCode, body)
	}
	// At most the window and one of its granules (admission's sliding window).
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 61 {
		t.Fatalf("429 Retry-After %q, want 1..61 seconds", resp.Header.Get("Retry-After"))
	}
	if l, r := resp.Header.Get("x-ratelimit-limit-requests"), resp.Header.Get("x-ratelimit-remaining-requests"); l != "2" || r != "0" {
		t.Fatalf("429 rate-limit headers limit %q remaining %q, want 2 and 0 (headers %v)", l, r, resp.Header)
	}
	if e := openAIError(t, resp, body); e.Code != "rate_limit_exceeded" || !strings.Contains(e.Message, "trial-rpm") {
		t.Fatalf("429 body does not name the rule: %s", body)
	}
	if n := len(seen.all()); n != 3 {
		t.Fatalf("the upstream saw %d calls, want 3 (acme, trial twice): refusals must not reach it %v", n, seen.all())
	}
	// The refusals as usage events: the blacklist's (at least one, more
	// while the flag was being picked up) and the admission rule's; no
	// event for the allowed calls, nor for the unknown key.
	itest.Eventually(t, 30*time.Second, "ingest received the admission refusal's event", func() bool {
		return ing.count(func(ev schemas.UsageEvent) bool { return ev.Tenant == "trial" }) == 1
	})
	for _, ev := range ing.all() {
		want := map[string]string{"refused_by": "blacklist"}
		if ev.Tenant == "trial" {
			want = map[string]string{"refused_by": "admission", "rule": "trial-rpm"}
		}
		if ev.Outcome != schemas.OutcomeRejected || ev.Model != "gpt-4o-mini" || ev.PromptTokens+ev.CompletionTokens != 0 ||
			(ev.Tenant == "trial") != (ev.Status == http.StatusTooManyRequests) || (ev.Tenant == "blocked") != (ev.Status == http.StatusForbidden) ||
			ev.Endpoint != "/v1/chat/completions" || ev.Gateway != cfg.Name || ev.Attributes["refused_by"] != want["refused_by"] || ev.Attributes["rule"] != want["rule"] {
			t.Fatalf("refusal event %+v, want a rejected event of blocked (403) or trial (429, rule trial-rpm)", ev)
		}
	}
	if ing.count(func(ev schemas.UsageEvent) bool { return ev.Tenant == "blocked" }) < 1 {
		t.Fatal("ingest received no event for the blacklist's refusals")
	}

	// Redis gone: the tenant that fails closed is refused with 503, the
	// one that fails open is admitted by the local limiter.
	proxy.Cut()
	// Back before the service stops, so the Limiter hands back what it
	// holds instead of waiting for Redis on Close.
	t.Cleanup(proxy.Restore)
	itest.Eventually(t, 30*time.Second, "the fail-closed tenant refused with 503 while Redis is away", func() bool {
		resp, _ := chat(t, base, "sk-strict", "gpt-4o-mini")
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	resp, body = chat(t, base, "sk-strict", "gpt-4o-mini")
	if e := openAIError(t, resp, body); e.Type != "service_unavailable" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("fail-closed refusal: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp, body := chat(t, base, "sk-acme", "gpt-4o-mini"); resp.StatusCode != http.StatusOK {
		t.Fatalf("the fail-open tenant while Redis is away: %d %s, want 200", resp.StatusCode, body)
	}
}

// startService runs the authz service until the test ends and returns its
// address.
func startService(t *testing.T, cfg Config, env platform.Env) string {
	t.Helper()
	svc, err := New(cfg, env)
	return itest.StartService(t, svc, err).Addr()
}

// chat sends a chat completion with key, naming model in X-Sluice-Model.
func chat(t *testing.T, base, key, model string) (*http.Response, string) {
	t.Helper()
	return itest.Send(t, http.MethodPost, base+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`,
		"Authorization", "Bearer "+key, "Content-Type", "application/json", "X-Sluice-Model", model)
}

// recordingIngest stands in for ingest's POST /v1/events: it keeps every
// event and acknowledges each batch with 202.
type recordingIngest struct {
	mu  sync.Mutex
	evs []schemas.UsageEvent
}

func (ri *recordingIngest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var batch []schemas.UsageEvent
	if r.Method != http.MethodPost || r.URL.Path != "/v1/events" || json.NewDecoder(r.Body).Decode(&batch) != nil {
		http.Error(w, `{"error":"not a batch of usage events"}`, http.StatusBadRequest)
		return
	}
	ri.mu.Lock()
	ri.evs = append(ri.evs, batch...)
	ri.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write([]byte(`{}`))
}

func (ri *recordingIngest) all() []schemas.UsageEvent {
	ri.mu.Lock()
	defer ri.mu.Unlock()
	return append([]schemas.UsageEvent(nil), ri.evs...)
}

func (ri *recordingIngest) count(match func(schemas.UsageEvent) bool) int {
	n := 0
	for _, ev := range ri.all() {
		if match(ev) {
			n++
		}
	}
	return n
}
