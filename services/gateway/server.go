package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// Deps are the SDK parts a Server uses; New builds none of them, so tests
// and embedding programs give their own.
type Deps struct {
	// Checker decides per request from the enforcement flags; nil allows
	// everything.
	Checker middleware.Decider
	// Emitter receives the usage events; nil meters nothing.
	Emitter middleware.Emitter
	// Limits, when not nil, are the policy's limits: Admit is asked before
	// every upstream call, Soft (when not nil) decides whether a tenant
	// past a soft per-minute quota (policy.SoftLimitRules) is served by
	// the fallback model instead of the one asked for.
	Limits *frontend.Limits
	// Logger receives the access log and errors; nil means slog.Default.
	Logger *slog.Logger
	// Metrics receives the gateway's series; nil registers none.
	Metrics prometheus.Registerer
	// Keys authenticates the callers (tenant_keys.file, which Run opens);
	// required.
	Keys *keyfile.File[frontend.Caller]
	// TopicKeys, when not nil, are the keys issued through the admin API,
	// accepted beside Keys (services.gateway.follow_admin).
	TopicKeys *frontend.TopicKeys
	// Tasks, when not nil, accepts deferred requests and answers
	// GET /v1/tasks/{id} (deferred.go).
	Tasks *deferred.Queue
	// Usage, when not nil, serves GET /v1/usage to the keys' tenants.
	Usage *usageapi.API
	// Policy is the policy in force: the upstreams, the tenants' priority
	// classes and the fallback models; required. ApplyPolicy follows it.
	Policy func() *policy.Policy
	// Guards guard the policy's upstreams (the priority queue, the
	// concurrency limit, degradation, the breaker and reserved shares
	// before each attempt), following the policy (Guards.Update) as the
	// host applies it; required.
	Guards *Guards
	// RedisPing, when not nil, checks the gateway's Redis (flags,
	// admission) at each scrape for sluice_redis_up{client="gateway"};
	// nil exports no such series.
	RedisPing func(context.Context) error
	// Tracing, when not nil nor OpenTelemetry's no-op provider, records a
	// server span per API call (docs/tracing.md) and stamps its context on
	// the call's usage events.
	Tracing trace.TracerProvider
}

// Server is the gateway's HTTP handler.
type Server struct {
	cfg      Config
	log      *slog.Logger
	keys     *keyfile.File[frontend.Caller]
	topic    *frontend.TopicKeys // nil: the keys file only
	routes   atomic.Pointer[routes]
	est      *estimate.Estimator
	admitter frontend.Admitter
	route    frontend.Admitter // nil: no rules scoped by model or upstream are admitted per attempt
	tasks    *deferred.Queue
	policy   func() *policy.Policy
	guards   *Guards
	soft     frontend.Admitter // nil: soft quotas are not checked on the request path
	// over finds the tenant's soft-quota flag (checker.Checker.Over); nil
	// without a Checker that has one.
	over func(tenant, model, apiKeyID string) *flags.Flag
	m    *metrics
	api  http.Handler // auth, then the middleware, then the proxy
	// tracer is nil when tracing is off: the request path then skips it
	// without a call.
	tracer trace.Tracer
	mux    *http.ServeMux

	// inflight counts requests being served, so shutdown can wait for
	// their settlements; hardStop cancels every upstream call when the
	// drain time is over.
	inflight sync.WaitGroup
	hardStop context.Context
	stopAll  context.CancelFunc
	closing  atomic.Bool
	now      func() time.Time
}

// NewServer builds the Server of cfg (which must validate) with deps: the
// handler the service serves, which an embedding host or a test can serve
// itself.
func NewServer(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cmp.Or(deps.Logger, slog.Default())
	s := &Server{cfg: cfg, log: log, policy: deps.Policy, guards: deps.Guards, tasks: deps.Tasks, m: newMetrics(deps.RedisPing), now: time.Now}
	s.m.guards = deps.Guards
	s.hardStop, s.stopAll = context.WithCancel(context.Background())
	if traceprop.On(deps.Tracing) {
		s.tracer = traceprop.Tracer(deps.Tracing, "gateway")
	}
	if deps.Limits != nil {
		s.admitter, s.route, s.soft = deps.Limits.Admit, deps.Limits.Route, deps.Limits.Soft
	}
	if v, ok := deps.Checker.(flagView); ok {
		s.m.view = v
	}
	if o, ok := deps.Checker.(softFlags); ok {
		s.over = o.Over
	}
	if deps.Metrics != nil {
		if err := s.m.register(deps.Metrics); err != nil {
			return nil, fmt.Errorf("gateway: register metrics: %w", err)
		}
	}
	s.keys, s.topic = deps.Keys, deps.TopicKeys
	if s.keys == nil {
		return nil, errors.New("gateway: no tenant keys (Deps.Keys)")
	}
	if deps.Policy == nil || deps.Guards == nil {
		return nil, errors.New("gateway: no policy or no guards (Deps.Policy, Deps.Guards)")
	}
	r, err := newRoutes(deps.Policy(), nil)
	if err != nil {
		return nil, fmt.Errorf("gateway: policy.file: %w", err)
	}
	if len(r.byName) == 0 {
		return nil, errors.New("gateway: the policy names no upstreams; list the providers the gateway calls under upstreams: in policy.file (base_url, models)")
	}
	s.routes.Store(r)
	est, err := estimate.New(estimate.Config{Limits: estimate.Limits{MaxBodyBytes: int(cfg.MaxBodyBytes)}})
	if err != nil {
		return nil, err
	}
	s.est = est
	dec := frontend.OrAllowAll(deps.Checker)
	opts := []middleware.Option{
		middleware.WithEstimates(est),
		middleware.WithEstimateEvents(cfg.Usage.EstimateEvents),
		middleware.WithEventFields(fillEvent),
		middleware.WithLogger(log),
		middleware.WithRefused(func(r *http.Request, _ checker.Decision) {
			if c := callFrom(r.Context()); c != nil {
				c.source = usageNone
				c.end(schemas.OutcomeRejected, "flags")
			}
		}),
	}
	if deps.Emitter != nil && !isNilEmitter(deps.Emitter) {
		opts = append(opts, middleware.WithEmitter(deps.Emitter, cfg.Name))
	}
	s.api = middleware.New(dec, identify, opts...)(http.HandlerFunc(s.proxy))
	mux := http.NewServeMux()
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"} {
		mux.HandleFunc("POST "+p, s.serveAPI)
	}
	for _, op := range []string{"chat/completions", "completions", "embeddings"} {
		mux.HandleFunc("POST "+azurePrefix+"{deployment}/"+op, s.serveAPI)
	}
	mux.HandleFunc("POST "+pathMessages, s.serveAPI)
	mux.HandleFunc("POST "+pathCountTokens, s.serveCountTokens)
	for _, p := range geminiPrefixes {
		mux.HandleFunc("POST "+p+"{target}", s.serveGemini)
	}
	mux.HandleFunc("GET /v1/tasks/{id}", s.getTask)
	mux.HandleFunc("GET /v1/models", s.listModels)
	if deps.Usage != nil {
		mux.Handle("GET "+usageapi.Path, deps.Usage.Handler(s.usageTenant))
	}
	mux.HandleFunc("GET /v1/models/{model...}", s.getModel)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	// On the API port too, for load balancers that probe the port they
	// send to: not ready from the moment a shutdown begins.
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.closing.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
			fmt.Sprintf("This gateway serves POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, Anthropic's /v1/messages, Gemini's /v1/models/{model}:generateContent and :streamGenerateContent (or /v1beta/…), Azure OpenAI's /openai/deployments/{deployment}/chat/completions, /completions and /embeddings, and GET /v1/models and /v1/usage, not %s %s.", r.Method, r.URL.Path))
	})
	s.mux = mux
	return s, nil
}

// ApplyPolicy makes p's upstreams the ones the gateway routes to: a new or
// changed entry gets a new provider (calls in flight keep the old one),
// one whose credential cannot be read keeps its previous provider or is
// left out, logged. The host calls it on every reload of the policy file
// (after Guards.Update, so that a new upstream has its guard).
func (s *Server) ApplyPolicy(p *policy.Policy) {
	r, err := newRoutes(p, s.routes.Load())
	if err != nil {
		s.log.Error("the reloaded policy's upstreams were not all applied", "err", err)
	}
	s.routes.Store(r)
}

// keyReloaded counts a reload of the tenant keys file.
func (s *Server) keyReloaded(err error) {
	if err != nil {
		s.m.keyReloads.WithLabelValues("error").Inc()
		return
	}
	s.m.keyReloads.WithLabelValues("ok").Inc()
}

// isNilEmitter catches a typed nil (*emitter.Emitter)(nil) in the
// interface, which sink none produces.
func isNilEmitter(e middleware.Emitter) bool {
	em, ok := e.(*emitter.Emitter)
	return ok && em == nil
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close cancels every upstream call still running; their requests settle
// with what they used. Run calls it when the drain time is over.
func (s *Server) Close() { s.stopAll() }

// shutdown stops accepting, lets requests in flight finish within
// timeout, cuts the rest (cancelling their upstream calls) and waits until
// every request has settled.
func (s *Server) shutdown(srv *http.Server, timeout time.Duration) error {
	s.closing.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		s.log.Warn("requests still running at the end of shutdown_timeout are cut and settled with what they used", "shutdown_timeout", timeout)
		s.Close()
		_ = srv.Close()
	}
	// Handlers return promptly once their upstream calls are cancelled;
	// each emits its settlement before it does.
	done := make(chan struct{})
	go func() { s.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		s.log.Error("requests did not return after their upstream calls were cancelled; their usage events may be missing")
	}
	// Requests cut at the end of the drain are a normal end, logged above.
	return nil
}
