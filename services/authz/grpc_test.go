package authz

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
)

// The gRPC tests speak Envoy's own messages (go-control-plane's
// envoy.service.auth.v3) over a real gRPC connection on loopback, built as
// Envoy's ext_authz filter builds them: the request's headers in
// attributes.request.http.headers with lower-case names, its path (query
// included) and method, and the route's context_extensions.

// envoyCheck is a CheckRequest for a request with path and headers (name,
// value pairs; Envoy lower-cases the names), method POST.
func envoyCheck(path string, header ...string) *authv3.CheckRequest {
	h := map[string]string{":method": "POST", ":path": path, ":authority": "llm.example.com"}
	for i := 0; i+1 < len(header); i += 2 {
		h[strings.ToLower(header[i])] = header[i+1]
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "req-1", Method: "POST", Path: path, Host: "llm.example.com", Scheme: "https", Protocol: "HTTP/1.1", Headers: h, Size: -1,
		}},
	}}
}

// withRoute sets the route's context extensions on a check.
func withRoute(req *authv3.CheckRequest, ext ...string) *authv3.CheckRequest {
	m := map[string]string{}
	for i := 0; i+1 < len(ext); i += 2 {
		m[ext[i]] = ext[i+1]
	}
	req.Attributes.ContextExtensions = m
	return req
}

// authzClient dials a gRPC service on addr.
func authzClient(t *testing.T, addr string) (authv3.AuthorizationClient, healthpb.HealthClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn), healthpb.NewHealthClient(conn)
}

// serveGRPC serves s's gRPC service on loopback until the test ends and
// returns its address.
func serveGRPC(t *testing.T, s *Server) (string, *grpcService) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := s.newGRPCService()
	served := make(chan error, 1)
	go func() { served <- gs.srv.Serve(ln) }()
	t.Cleanup(func() {
		gs.srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("gRPC Serve: %v", err)
		}
	})
	return ln.Addr().String(), gs
}

// check sends req and fails the test on a gRPC error; every answer must
// also pass Envoy's own validation of the message (go-control-plane's
// protoc-gen-validate rules).
func check(t *testing.T, c authv3.AuthorizationClient, req *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := resp.ValidateAll(); err != nil {
		t.Fatalf("the CheckResponse fails Envoy's validation: %v\n%v", err, resp)
	}
	return resp
}

// headerOpts is a header option list as name -> value, failing the test on
// an option that would append to what the request had rather than set it.
func headerOpts(t *testing.T, opts []*corev3.HeaderValueOption) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, o := range opts {
		if o.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD {
			t.Errorf("header %s: append action %v, want OVERWRITE_IF_EXISTS_OR_ADD", o.GetHeader().GetKey(), o.GetAppendAction())
		}
		k := o.GetHeader().GetKey()
		if k != strings.ToLower(k) {
			t.Errorf("header name %q is not lower case", k)
		}
		m[k] = o.GetHeader().GetValue()
	}
	return m
}

// allowedGRPC checks an OK answer and returns the headers it sets upstream
// and adds to the client's answer.
func allowedGRPC(t *testing.T, resp *authv3.CheckResponse) (upstream, client map[string]string) {
	t.Helper()
	ok := resp.GetOkResponse()
	if codes.Code(resp.GetStatus().GetCode()) != codes.OK || ok == nil {
		t.Fatalf("not allowed: %v", resp)
	}
	return headerOpts(t, ok.GetHeaders()), headerOpts(t, ok.GetResponseHeadersToAdd())
}

// deniedGRPC checks a denied answer's HTTP status, gRPC code and OpenAI
// error code, and returns the error and the headers for the client.
func deniedGRPC(t *testing.T, resp *authv3.CheckResponse, status int, grpcCode codes.Code, code string) (ratelimit.Error, map[string]string) {
	t.Helper()
	d := resp.GetDeniedResponse()
	if d == nil || int(d.GetStatus().GetCode()) != status || codes.Code(resp.GetStatus().GetCode()) != grpcCode {
		t.Fatalf("want denied %d (%v): %v", status, grpcCode, resp)
	}
	h := headerOpts(t, d.GetHeaders())
	if !strings.HasPrefix(h["content-type"], "application/json") {
		t.Fatalf("denied %d with content-type %q", status, h["content-type"])
	}
	var b ratelimit.Body
	if err := json.Unmarshal([]byte(d.GetBody()), &b); err != nil || b.Error.Code != code || b.Error.Message == "" {
		t.Fatalf("denied %d: body is not an OpenAI error with code %q (%v): %s", status, code, err, d.GetBody())
	}
	if _, ok := h[strings.ToLower(HeaderError)]; ok {
		t.Fatalf("the gRPC answer carries %s, which only nginx needs: %v", HeaderError, h)
	}
	return b.Error, h
}

// TestGRPCAnswersAsTheHTTPEndpoint: for the same request, the gRPC service
// and the HTTP endpoint answer the same status, OpenAI body and headers,
// and admission is asked the same thing — one decision, two front ends.
func TestGRPCAnswersAsTheHTTPEndpoint(t *testing.T) {
	until := time.Now().Add(time.Hour)
	dec := refusingDecider(until, "fraud case 17")
	adm := &fakeAdmitter{}
	reg := prometheus.NewRegistry()
	s, err := NewServer(DefaultConfig(), Deps{Checker: dec, Admitter: adm, Keys: testKeys(t), Logger: slog.New(slog.DiscardHandler), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	hs := newServer(t, DefaultConfig(), Deps{Checker: dec, Admitter: adm, Keys: testKeys(t)})
	addr, _ := serveGRPC(t, s)
	c, _ := authzClient(t, addr)

	refused := &frontend.Refusal{Status: http.StatusTooManyRequests, RetryAfter: 12 * time.Second, Rule: "per-user",
		Error: ratelimit.Error{Type: "requests", Code: "rate_limit_exceeded", Message: "rule per-user (user=jürgen 🚀)"}}
	limits := []ratelimit.Limit{{Unit: ratelimit.Requests, Limit: 5, Remaining: 0, Reset: 12 * time.Second},
		{Unit: ratelimit.Tokens, Limit: 9000, Remaining: 7000, Reset: time.Second}}
	for _, tc := range []struct {
		what    string
		headers []string
		admit   frontend.Admission
		status  int
	}{
		{"allowed, with limits", []string{"Authorization", "Bearer sk-acme", "X-Sluice-Model", "gpt-4o"}, frontend.Admission{Limits: limits}, 200},
		{"allowed, no limits", []string{"Authorization", "Bearer sk-boss", "X-Sluice-Priority", "critical"}, frontend.Admission{}, 200},
		{"unknown key", []string{"Authorization", "Bearer sk-wrong"}, frontend.Admission{}, 401},
		{"no key", nil, frontend.Admission{}, 401},
		{"model the key may not use", []string{"Authorization", "Bearer sk-mini", "X-Sluice-Model", "gpt-4o"}, frontend.Admission{}, 403},
		{"priority the key may not raise", []string{"Authorization", "Bearer sk-acme", "X-Sluice-Priority", "critical"}, frontend.Admission{}, 403},
		{"invalid priority", []string{"Authorization", "Bearer sk-boss", "X-Sluice-Priority", "urgent"}, frontend.Admission{}, 400},
		{"blacklist", []string{"Authorization", "Bearer sk-blocked"}, frontend.Admission{}, 403},
		{"stale view, fails closed", []string{"Authorization", "Bearer sk-strict"}, frontend.Admission{}, 503},
		{"admission rule", []string{"Authorization", "Bearer sk-trial", "X-Sluice-Model", "gpt-4o"}, frontend.Admission{Limits: limits[:1], Refused: refused}, 429},
	} {
		adm.answer(tc.admit)
		before := adm.asked()
		resp, body := ask(t, hs.URL+"/authz/v1/chat/completions", tc.headers...)
		mid := adm.asked()
		var httpAsked frontend.AdmitRequest
		if mid > before {
			httpAsked = adm.last(t)
		}
		g := check(t, c, envoyCheck("/v1/chat/completions?stream=true", tc.headers...))
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: HTTP answered %d, want %d: %s", tc.what, resp.StatusCode, tc.status, body)
		}
		if after := adm.asked(); after-mid != mid-before || after > mid && adm.last(t) != httpAsked {
			t.Fatalf("%s: admission was asked %d times over HTTP (%+v), %d over gRPC (%+v)", tc.what, mid-before, httpAsked, after-mid, adm.last(t))
		}
		if tc.status == http.StatusOK {
			up, cl := allowedGRPC(t, g)
			if up["x-sluice-tenant"] != resp.Header.Get("X-Sluice-Tenant") || up["x-sluice-key-id"] != resp.Header.Get("X-Sluice-Key-Id") || len(up) != 2 {
				t.Fatalf("%s: upstream headers %v over gRPC, HTTP answered %v", tc.what, up, resp.Header)
			}
			for _, name := range []string{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
				"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
				if cl[name] != resp.Header.Get(name) {
					t.Fatalf("%s: %s is %q over gRPC, %q over HTTP", tc.what, name, cl[name], resp.Header.Get(name))
				}
			}
			continue
		}
		d := g.GetDeniedResponse()
		if d == nil || int(d.GetStatus().GetCode()) != tc.status || d.GetBody() != body || codes.Code(g.GetStatus().GetCode()) != grpcCode(tc.status) {
			t.Fatalf("%s: gRPC answered %v; HTTP %d %s", tc.what, g, resp.StatusCode, body)
		}
		// The same headers, less those of the HTTP answer itself and the
		// body's copy for nginx.
		want := map[string]string{}
		for name := range resp.Header {
			if name != HeaderError && name != "Date" && name != "Content-Length" {
				want[strings.ToLower(name)] = resp.Header.Get(name)
			}
		}
		if h := headerOpts(t, d.GetHeaders()); !maps.Equal(h, want) {
			t.Fatalf("%s: gRPC headers %v, HTTP %v", tc.what, h, want)
		}
	}

	// The checks are counted by transport.
	if n := testutil.ToFloat64(s.m.checks.WithLabelValues(transportGRPC, "200", byAllowed)); n != 2 {
		t.Fatalf("sluice_authz_checks_total{transport=grpc,status=200} = %v, want 2", n)
	}
	if n := testutil.ToFloat64(s.m.checks.WithLabelValues(transportGRPC, "429", byAdmission)); n != 1 {
		t.Fatalf("sluice_authz_checks_total{transport=grpc,status=429,by=admission} = %v, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.checks.WithLabelValues(transportHTTP, "200", byAllowed)); n != 0 {
		t.Fatalf("gRPC checks were counted as http: %v", n)
	}
}

// TestGRPCRequestFromEnvoy: the endpoint is the request's path without its
// query; the route's context extensions win over the client's headers;
// the estimate headers come from the route only, unless
// trust_estimate_headers; Envoy's raw header map (encode_raw_headers) is
// read as its header map is; a request without HTTP attributes is an
// error, not a refusal.
func TestGRPCRequestFromEnvoy(t *testing.T) {
	adm := &fakeAdmitter{}
	s, err := NewServer(DefaultConfig(), Deps{Admitter: adm, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serveGRPC(t, s)
	c, _ := authzClient(t, addr)

	req := envoyCheck("/v1/embeddings?api-version=2", "X-Sluice-Tenant", "acme", "X-Sluice-Key-Id", "k1", "X-Sluice-Model", "gpt-4o",
		"X-Sluice-User", "bob", "X-Sluice-Estimate-Prompt-Tokens", "0", "X-Sluice-Estimate-Completion-Tokens", "0")
	up, _ := allowedGRPC(t, check(t, c, req))
	if up["x-sluice-tenant"] != "acme" || up["x-sluice-key-id"] != "k1" {
		t.Fatalf("upstream headers %v", up)
	}
	want := frontend.AdmitRequest{Tenant: "acme", APIKeyID: "k1", Model: "gpt-4o", User: "bob", Endpoint: "/v1/embeddings",
		EstimatePrompt: 1000, EstimateCompletion: 1000, Estimated: true}
	if got := adm.last(t); got != want {
		t.Fatalf("a client's estimate headers were read: admission asked %+v, want %+v", got, want)
	}

	// The route names the model and the estimates; the client cannot
	// change them.
	allowedGRPC(t, check(t, c, withRoute(req, "x-sluice-model", "text-embedding-3-small", "x-sluice-estimate-prompt-tokens", "300",
		"x-sluice-estimate-completion-tokens", "0")))
	want.Model, want.EstimatePrompt, want.EstimateCompletion = "text-embedding-3-small", 300, 0
	if got := adm.last(t); got != want {
		t.Fatalf("with the route's context extensions admission asked %+v, want %+v", got, want)
	}
	resp := check(t, c, withRoute(envoyCheck("/v1/chat/completions", "X-Sluice-Tenant", "acme"), "x-sluice-estimate-completion-tokens", "lots"))
	if e, _ := deniedGRPC(t, resp, http.StatusBadRequest, codes.InvalidArgument, "invalid_estimate"); !strings.Contains(e.Message, "X-Sluice-Estimate-Completion-Tokens") {
		t.Fatalf("%q does not name the setting", e.Message)
	}

	// Trusted: the headers count, the route still wins.
	cfg := DefaultConfig()
	cfg.GRPC.TrustEstimateHeaders = true
	s2, err := NewServer(cfg, Deps{Admitter: adm, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	addr2, _ := serveGRPC(t, s2)
	c2, _ := authzClient(t, addr2)
	allowedGRPC(t, check(t, c2, withRoute(envoyCheck("/v1/chat/completions", "X-Sluice-Tenant", "acme",
		"X-Sluice-Estimate-Prompt-Tokens", "40", "X-Sluice-Estimate-Completion-Tokens", "50"), "x-sluice-estimate-completion-tokens", "60")))
	if got := adm.last(t); got.EstimatePrompt != 40 || got.EstimateCompletion != 60 {
		t.Fatalf("trusted estimate headers: admission asked %+v, want 40 from the header and 60 from the route", got)
	}

	// encode_raw_headers: the headers arrive as a list of raw values.
	raw := envoyCheck("/v1/chat/completions")
	raw.Attributes.Request.Http.Headers = nil
	raw.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: "x-sluice-tenant", RawValue: []byte("acme")}, {Key: "x-sluice-model", RawValue: []byte("gpt-4o-mini")}}}
	allowedGRPC(t, check(t, c, raw))
	if got := adm.last(t); got.Tenant != "acme" || got.Model != "gpt-4o-mini" {
		t.Fatalf("raw headers: admission asked %+v", got)
	}

	// No tenant header: 401 naming it.
	resp = check(t, c, envoyCheck("/v1/chat/completions", "X-Sluice-Key-Id", "k1"))
	if e, h := deniedGRPC(t, resp, http.StatusUnauthorized, codes.Unauthenticated, "missing_tenant"); !strings.Contains(e.Message, "X-Sluice-Tenant") || h["www-authenticate"] == "" {
		t.Fatalf("missing tenant: %q %v", e.Message, h)
	}

	// Not an HTTP check (Envoy's network filter): an error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a CheckRequest without attributes.request.http: %v, want InvalidArgument", err)
	}
}

// blockingAdmitter holds each admission until released or until its
// context ends, telling entered when one is waiting.
type blockingAdmitter struct {
	entered chan struct{}
	release chan struct{}
}

func (b *blockingAdmitter) Admit(ctx context.Context, _ frontend.AdmitRequest) frontend.Admission {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return frontend.Admission{}
}

// TestGRPCGracefulStop: on shutdown the health service answers
// NOT_SERVING and new checks are refused, a check in flight is still
// answered, and one still running when the shutdown's time is up is cut.
func TestGRPCGracefulStop(t *testing.T) {
	for _, cut := range []bool{false, true} {
		adm := &blockingAdmitter{entered: make(chan struct{}, 1), release: make(chan struct{})}
		s, err := NewServer(DefaultConfig(), Deps{Admitter: adm, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		addr, gs := serveGRPC(t, s)
		c, hc := authzClient(t, addr)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, svc := range []string{"", AuthorizationService} {
			if h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health of %q before shutdown: %v %v", svc, h, err)
			}
		}
		// A health watcher, as a load balancer keeps one, sees the change.
		watchCtx, endWatch := context.WithCancel(ctx)
		defer endWatch()
		watch, err := hc.Watch(watchCtx, &healthpb.HealthCheckRequest{Service: AuthorizationService})
		if err != nil {
			t.Fatal(err)
		}
		if h, err := watch.Recv(); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health watch: %v %v", h, err)
		}

		type result struct {
			resp *authv3.CheckResponse
			err  error
		}
		inFlight := make(chan result, 1)
		go func() {
			r, err := c.Check(ctx, envoyCheck("/v1/chat/completions", "X-Sluice-Tenant", "acme"))
			inFlight <- result{r, err}
		}()
		<-adm.entered

		stopCtx, stopNow := context.WithCancel(context.Background())
		stopped := make(chan struct{})
		go func() {
			gs.stop(stopCtx)
			close(stopped)
		}()
		if h, err := watch.Recv(); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("health watch during shutdown: %v %v, want NOT_SERVING", h, err)
		}
		// The watcher leaves (a watch still open is an RPC GracefulStop
		// waits for, until shutdown_timeout cuts it).
		endWatch()
		select {
		case <-stopped:
			t.Fatal("the gRPC service stopped with a check in flight")
		case r := <-inFlight:
			t.Fatalf("the check in flight was answered before it was decided: %v %v", r.resp, r.err)
		default:
		}
		if cut {
			// shutdown_timeout is over: the check in flight is cut.
			stopNow()
			<-stopped
			if r := <-inFlight; r.err == nil {
				t.Fatalf("a check cut by the shutdown was answered %v", r.resp)
			}
			continue
		}
		close(adm.release)
		r := <-inFlight
		<-stopped
		stopNow()
		if r.err != nil || r.resp.GetOkResponse() == nil {
			t.Fatalf("the check in flight during a graceful stop: %v %v", r.resp, r.err)
		}
		if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			conn.Close()
			t.Fatal("the gRPC port still accepts connections after the stop")
		}
	}
}

// TestGRPCExtAuthz runs `sluice run authz` with grpc.listen set, on the
// real Redis (the enforcer's flags, admission's counters) behind a proxy
// the test can cut, with the test keys file, and asks it as Envoy does:
// an allowed check sets the key's tenant and id upstream and adds the
// rate-limit headers; an unknown key is 401, a blacklisted tenant 403, a
// tenant over its admission limit 429 with Retry-After, the rate-limit
// headers and the rule in the body; with Redis away the tenant that fails
// closed gets 503 and the one that fails open 200. The health service
// answers SERVING, and the service stops cleanly.
func TestGRPCExtAuthz(t *testing.T) {
	env, proxy := liveEnv(t)
	reg := env.Metrics.(*prometheus.Registry)
	ctx := context.Background()
	cfg := DefaultConfig()
	cfg.Listen, cfg.GRPC.Listen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Admission.MaxWait = 200 * time.Millisecond

	var addr string // learnt before the service is ready
	svc, err := New(cfg, env, WithGRPCListening(func(a string) { addr = a }))
	itest.StartService(t, svc, err)
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := svc.Stop(sctx); err != nil {
			t.Errorf("authz: %v", err)
		}
	}
	c, hc := authzClient(t, addr)
	if h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: AuthorizationService}); err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	chat := func(key string) *authv3.CheckRequest {
		return envoyCheck("/v1/chat/completions", "Authorization", "Bearer "+key, "X-Sluice-Model", "gpt-4o-mini",
			"Content-Type", "application/json", "X-Sluice-Tenant", "someone-else")
	}

	// Allowed: the key's tenant and id replace what the client sent, and
	// the client gets admission's rate-limit headers.
	up, cl := allowedGRPC(t, check(t, c, chat("sk-acme")))
	if up["x-sluice-tenant"] != "acme" || up["x-sluice-key-id"] != "acme" {
		t.Fatalf("upstream headers %v, want the key's tenant and id", up)
	}
	if cl["x-ratelimit-limit-tokens"] != "1000000" {
		t.Fatalf("client headers %v, want x-ratelimit-limit-tokens 1000000", cl)
	}

	// Blacklisted: 403, the operator's reason not shown.
	itest.Eventually(t, 30*time.Second, "the blacklisted tenant refused with 403 over gRPC", func() bool {
		return check(t, c, chat("sk-blocked")).GetDeniedResponse().GetStatus().GetCode() == http.StatusForbidden
	})
	resp := check(t, c, chat("sk-blocked"))
	if _, h := deniedGRPC(t, resp, http.StatusForbidden, codes.PermissionDenied, "blacklisted"); strings.Contains(resp.GetDeniedResponse().GetBody(), "4411") || h["retry-after"] != "" {
		t.Fatalf("blacklist: %v", resp)
	}

	// Unknown key: 401.
	if _, h := deniedGRPC(t, check(t, c, chat("sk-nobody")), http.StatusUnauthorized, codes.Unauthenticated, "invalid_api_key"); h["www-authenticate"] != `Bearer realm="sluice"` {
		t.Fatalf("401 headers %v", h)
	}

	// Over the admission limit: the third request in a minute is 429.
	for range 2 {
		allowedGRPC(t, check(t, c, chat("sk-trial")))
	}
	e, h := deniedGRPC(t, check(t, c, chat("sk-trial")), http.StatusTooManyRequests, codes.ResourceExhausted, "rate_limit_exceeded")
	if !strings.Contains(e.Message, "trial-rpm") {
		t.Fatalf("429 does not name the rule: %q", e.Message)
	}
	if ra, err := strconv.Atoi(h["retry-after"]); err != nil || ra < 1 || ra > 61 {
		t.Fatalf("429 retry-after %q, want 1..61 seconds", h["retry-after"])
	}
	if h["x-ratelimit-limit-requests"] != "2" || h["x-ratelimit-remaining-requests"] != "0" {
		t.Fatalf("429 rate-limit headers %v", h)
	}

	// Redis away: the fail-closed tenant gets 503, the fail-open one 200.
	proxy.Cut()
	t.Cleanup(proxy.Restore)
	itest.Eventually(t, 30*time.Second, "the fail-closed tenant refused with 503 over gRPC while Redis is away", func() bool {
		return check(t, c, chat("sk-strict")).GetDeniedResponse().GetStatus().GetCode() == http.StatusServiceUnavailable
	})
	resp = check(t, c, chat("sk-strict"))
	if d := resp.GetDeniedResponse(); codes.Code(resp.GetStatus().GetCode()) != codes.Unavailable || !slices.ContainsFunc(d.GetHeaders(), func(o *corev3.HeaderValueOption) bool {
		return o.GetHeader().GetKey() == "retry-after" && o.GetHeader().GetValue() != ""
	}) {
		t.Fatalf("fail-closed refusal: %v", resp)
	}
	allowedGRPC(t, check(t, c, chat("sk-acme")))
	proxy.Restore()

	// The metrics carry the transport.
	if n := itest.CounterValue(t, reg, "sluice_authz_checks_total", map[string]string{"transport": "grpc", "status": "429", "by": "admission"}); n != 1 {
		t.Fatalf("sluice_authz_checks_total{transport=grpc,status=429,by=admission} = %v, want 1", n)
	}

	// Shutdown: Run returns without error (itest.Start checks it), and
	// the gRPC port is closed.
	stop()
	if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		conn.Close()
		t.Fatal("the gRPC port still accepts connections after the service stopped")
	}
}

// TestGRPCConfigErrorsNameTheSetting: grpc.listen is validated like listen.
func TestGRPCConfigErrorsNameTheSetting(t *testing.T) {
	c := DefaultConfig()
	c.GRPC.Listen = "nowhere"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "grpc.listen: ") {
		t.Fatalf("grpc.listen %q: %v", c.GRPC.Listen, err)
	}
	c.GRPC.Listen = c.Listen
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "grpc.listen: ") || !strings.Contains(err.Error(), "listen") {
		t.Fatalf("grpc.listen equal to listen: %v", err)
	}
	c.GRPC.Listen = "0.0.0.0:8092"
	if err := c.Validate(); err != nil {
		t.Fatalf("a valid grpc.listen: %v", err)
	}
}
