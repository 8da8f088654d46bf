// Package gateway is `sluice gateway`: an OpenAI-compatible reverse proxy
// that a team puts in front of its providers, Sluice's own customer of the
// SDK. It authenticates callers by tenant API key (hashed in a keys file),
// routes each request by model to the upstreams configured for it
// (balanced by weight, failing over on connection errors, timeouts, 429
// and 5xx), and meters every call exactly:
//
//   - the flag Checker refuses tenants the enforcer stopped, in OpenAI's
//     429/503 format naming the limit (sdk/go/middleware);
//   - an estimate of each call is emitted before it runs and settled with
//     the provider's usage after it (the same event id: the request's
//     x-request-id);
//   - non-streamed answers settle from their `usage`; streams are relayed
//     event by event as they arrive, and when the client did not ask for
//     stream_options.include_usage the gateway asks for it and removes the
//     extra usage chunk from what the client receives; a provider that
//     reports no usage is counted by the gateway (attribute usage=counted);
//   - a client that goes away cancels the upstream call, which is settled
//     with what it generated; upstream errors and timeouts are events with
//     their outcome and latency, for the aggregator's error and slow-call
//     breakers; cached and reasoning tokens are carried where reported;
//   - an Admitter (sdk/go/admission, when it lands) is asked before each
//     upstream call with the estimate, and settled after.
//
// Usage events go to ingest over HTTP or straight to Kafka through the
// SDK's Emitter. On shutdown the gateway stops accepting, lets requests in
// flight finish (streams included) up to shutdown_timeout, cuts and
// settles the rest, and only then flushes the Emitter; `sluice run` and
// `sluice demo` stop ingest after the gateway so those last events land.
package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/fifo"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/emitter"
	"github.com/sluicehq/sluice/sdk/go/estimate"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/sdk/go/middleware"
	"github.com/sluicehq/sluice/sdk/go/priority"
	"github.com/sluicehq/sluice/sdk/go/ratelimit"
	"github.com/sluicehq/sluice/services/gateway/deferred"
)

// Options are what a hosting program adds to the configuration.
type Options struct {
	// Admitter, when not nil, is asked before every upstream call.
	Admitter frontend.Admitter
	// Started, when not nil, learns the address the API listens on.
	Started func(addr string)
	// Guards, when not nil, are the upstream guards the gateway follows
	// the policy file with (a host that shows their state, as the demo
	// does); otherwise it builds its own. Either way only with a policy
	// file (services.gateway.admission.policy_file).
	Guards *Guards
}

// ProcessID names this process in the fleet's shared counts: the
// gateway's name, the host and the process id.
func ProcessID(name string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s/%d", name, host, os.Getpid())
}

// Run serves the gateway on cfg.Listen until ctx is cancelled, then shuts
// down as the package documentation says.
func Run(ctx context.Context, cfg Config, env platform.Env) error {
	return RunWith(ctx, cfg, env, Options{})
}

// RunWith is Run with options.
func RunWith(ctx context.Context, cfg Config, env platform.Env, opts Options) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		env = env.Named("gateway")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := env.Logger

	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	var deps Deps
	if cfg.Admission.PolicyFile != "" {
		stop, err := followPolicy(ctx, cfg, env, &opts, &deps)
		if err != nil {
			return err
		}
		defer stop()
	}
	tasks, runTasks, stopTasks, err := startDeferred(ctx, cfg, env, rdb, log)
	if err != nil {
		return err
	}
	defer stopTasks()
	chk, err := checker.New(rdb, cfg.Checker, log.With("component", "checker"))
	if err != nil {
		return err
	}
	usage, closeUsage, err := openUsageAPI(ctx, cfg, env)
	if err != nil {
		return fmt.Errorf("services.gateway.%w", err)
	}
	defer closeUsage()
	em, closeSender, err := frontend.NewEmitter(cfg.Usage.EventSink, "gateway", env)
	if err != nil {
		return err
	}
	if em == nil {
		env.Logger.Warn("services.gateway.usage.sink is none: calls are not metered")
	}
	deps.Checker, deps.Emitter, deps.Admitter, deps.Logger, deps.Metrics = chk, em, opts.Admitter, log, env.Metrics
	deps.Tasks, deps.Usage = tasks, usage
	s, err := New(cfg, deps)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return err
	}
	defer s.m.unregister(env.Metrics)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return fmt.Errorf("gateway: listen on %s: %w (set services.gateway.listen to a free address)", cfg.Listen, err)
	}
	env.Health.AddReadiness("gateway", func(context.Context) error {
		if s.closing.Load() {
			return errors.New("shutting down")
		}
		return nil
	})
	defer env.Health.RemoveReadiness("gateway")
	srv := httpserver.New(s, cfg.HTTP, log)
	log.Info("OpenAI-compatible gateway listening", "addr", ln.Addr().String(), "upstreams", len(cfg.Upstreams), "usage_sink", cfg.Usage.Sink)
	if opts.Started != nil {
		opts.Started(ln.Addr().String())
	}

	// The Checker outlives the server: requests still finishing are
	// checked against current flags until the last one returns.
	chkCtx, stopChecker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopChecker()
	chkDone := make(chan struct{})
	go func() { defer close(chkDone); _ = chk.Run(chkCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { s.keys.Watch(gctx, cfg.KeysReloadInterval); return nil })
	if runTasks != nil {
		g.Go(func() error { return runTasks(gctx, s) })
	}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("gateway: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		err := s.shutdown(srv, cfg.ShutdownTimeout)
		// Only now, with every request settled, do the events leave.
		frontend.CloseEmitter(context.Background(), em, closeSender, cfg.Usage.FlushTimeout, log)
		stopChecker()
		<-chkDone
		log.Info("gateway stopped")
		return err
	})
	return g.Wait()
}

// followPolicy builds what the policy file drives into deps — admission
// (unless opts brings an Admitter, which it then sets), the tenants' soft
// per-minute quotas and the upstreams' guards — and follows the file, so
// that a reload updates all of them. stop ends the following and closes
// them in the reverse order; on an error everything built is closed.
func followPolicy(ctx context.Context, cfg Config, env platform.Env, opts *Options, deps *Deps) (stop func(), err error) {
	log := env.Logger
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
			stop = nil
		}
	}()
	// One policy file for admission, the tenants' classes, the
	// upstreams' guards and the fallbacks, followed by one watcher.
	w, err := policy.NewWatcher(cfg.Admission.PolicyFile, cfg.Admission.PolicyReload, log.With("component", "policy"))
	if err != nil {
		return nil, fmt.Errorf("gateway: policy (services.gateway.admission.policy_file): %w", err)
	}
	deps.Policy = w.Current
	var apply []func(*policy.Policy)
	if opts.Admitter == nil {
		lim, closeAdm, err := frontend.NewLimiter(cfg.Admission, w.Current(), "gateway", env, log.With("component", "admission"))
		if err != nil {
			return nil, err
		}
		closers = append(closers, closeAdm)
		opts.Admitter = frontend.LimiterAdmitter{L: lim}
		apply = append(apply, frontend.ReloadRules(lim, (*policy.Policy).AdmissionRules, "admission", log.With("file", cfg.Admission.PolicyFile)))
	}
	// The tenants' soft per-minute quotas, on counters of their own:
	// past one, a request goes to the fallback model first.
	softCfg := cfg.Admission
	softCfg.KeyPrefix += "soft:"
	soft, closeSoft, err := frontend.NewSoftLimiter(softCfg, w.Current(), env, log.With("component", "soft-limits"))
	if err != nil {
		return nil, err
	}
	closers = append(closers, closeSoft)
	deps.Soft = frontend.LimiterAdmitter{L: soft}
	apply = append(apply, frontend.ReloadRules(soft, (*policy.Policy).SoftLimitRules, "soft quotas", log.With("file", cfg.Admission.PolicyFile)))
	deps.Guards = opts.Guards
	if deps.Guards == nil {
		// A client of its own: the shared counts bound each call by its
		// context, which must reach the socket.
		grdb := redisconn.NewClient(env.Redis, redisconn.ContextTimeouts())
		closers = append(closers, func() { grdb.Close() })
		deps.Guards = NewGuards(grdb, cfg.SharedUpstreams.KeyPrefix, ProcessID(cfg.Name), log.With("component", "upstream"), nil)
		deps.Guards.SetRedisTimeout(cfg.SharedUpstreams.RedisTimeout)
	}
	closers = append(closers, deps.Guards.Close)
	if err := deps.Guards.Update(w.Current()); err != nil {
		return nil, err
	}
	apply = append(apply, func(p *policy.Policy) {
		if err := deps.Guards.Update(p); err != nil {
			log.Error("the reloaded policy's upstreams were not all applied; the previous guards stay for those", "err", err)
		}
	})
	fctx, stopFollow := context.WithCancel(ctx)
	followed := make(chan struct{})
	go func() {
		defer close(followed)
		_ = w.Follow(fctx, func(p *policy.Policy) {
			for _, f := range apply {
				f(p)
			}
		})
	}()
	closers = append(closers, func() { stopFollow(); <-followed })
	return stop, nil
}

// Deps are the SDK parts a Server uses; New builds none of them, so tests
// and embedding programs give their own.
type Deps struct {
	// Checker decides per request from the enforcement flags; nil allows
	// everything.
	Checker middleware.Decider
	// Emitter receives the usage events; nil meters nothing.
	Emitter middleware.Emitter
	// Admitter, when not nil, is asked before every upstream call.
	Admitter frontend.Admitter
	// Logger receives the access log and errors; nil means slog.Default.
	Logger *slog.Logger
	// Metrics receives the gateway's series; nil registers none.
	Metrics prometheus.Registerer
	// Keys, when not nil, replaces cfg.KeysFile (tests).
	Keys *keyfile.File[frontend.Caller]
	// Tasks, when not nil, accepts deferred requests and answers
	// GET /v1/tasks/{id} (deferred.go).
	Tasks *deferred.Queue
	// Usage, when not nil, serves GET /v1/usage to the keys' tenants.
	Usage *usageapi.API
	// Policy, when not nil, is the policy in force: the tenants' priority
	// classes and the fallback models. Without it every tenant is normal.
	Policy func() *policy.Policy
	// Guards, when not nil, guard the upstreams the policy names (the
	// priority queue, the concurrency limit, degradation, the breaker and
	// reserved shares before each attempt).
	Guards *Guards
	// Soft, when not nil, checks the tenants' soft per-minute quotas
	// (policy.SoftLimitRules): a request it refuses is served by the
	// policy's fallback model instead of the one asked for.
	Soft frontend.Admitter
}

// Server is the gateway's HTTP handler.
type Server struct {
	cfg    Config
	log    *slog.Logger
	keys   *keyfile.File[frontend.Caller]
	routes *routes
	est    *estimate.Estimator
	admit  frontend.Admitter
	tasks  *deferred.Queue
	policy func() *policy.Policy // nil: no policy
	guards *Guards               // nil: no upstream is guarded
	soft   frontend.Admitter     // nil: soft quotas are not checked on the request path
	// over finds the tenant's soft-quota flag (checker.Checker.Over); nil
	// without a Checker that has one.
	over func(tenant, model, apiKeyID string) *flags.Flag
	m    *metrics
	api  http.Handler // auth, then the middleware, then the proxy
	mux  *http.ServeMux

	idsMu sync.Mutex
	ids   *fifo.Set[string]

	// inflight counts requests being served, so shutdown can wait for
	// their settlements; hardStop cancels every upstream call when the
	// drain time is over.
	inflight sync.WaitGroup
	hardStop context.Context
	stopAll  context.CancelFunc
	closing  atomic.Bool
	now      func() time.Time
}

// New builds a Server for cfg (which must validate) with deps.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, log: log, admit: deps.Admitter, policy: deps.Policy, guards: deps.Guards, soft: deps.Soft, tasks: deps.Tasks, m: newMetrics(),
		ids: fifo.NewSet[string](cfg.RequestIDMemory), now: time.Now}
	s.hardStop, s.stopAll = context.WithCancel(context.Background())
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
	s.keys = deps.Keys
	if s.keys == nil {
		f, err := frontend.OpenKeys(cfg.KeysFile, log, func(err error) {
			if err != nil {
				s.m.keyReloads.WithLabelValues("error").Inc()
			} else {
				s.m.keyReloads.WithLabelValues("ok").Inc()
			}
		})
		if err != nil {
			return nil, fmt.Errorf("services.gateway.%w", err)
		}
		s.keys = f
	}
	ups := make([]*provider, 0, len(cfg.Upstreams))
	for i, u := range cfg.Upstreams {
		up, err := newProvider(u)
		if err != nil {
			return nil, fmt.Errorf("services.gateway.upstreams[%d].%w", i, err)
		}
		ups = append(ups, up)
	}
	s.routes = newRoutes(ups)
	est, err := estimate.New(estimate.Config{Limits: estimate.Limits{MaxBodyBytes: int(cfg.MaxBodyBytes)}})
	if err != nil {
		return nil, err
	}
	s.est = est
	dec := deps.Checker
	if dec == nil {
		dec = allowAll{}
	}
	opts := []middleware.Option{
		middleware.WithEstimates(est),
		middleware.WithEstimateEvents(cfg.Usage.EstimateEvents),
		middleware.WithEventFields(fillEvent),
		middleware.WithLogger(log),
		middleware.WithRefused(func(r *http.Request, _ checker.Decision) {
			if c := callFrom(r.Context()); c != nil {
				c.outcome, c.source = "refused", "none"
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
			fmt.Sprintf("This gateway serves POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses and GET /v1/models and /v1/usage, not %s %s.", r.Method, r.URL.Path))
	})
	s.mux = mux
	return s, nil
}

// isNilEmitter catches a typed nil (*emitter.Emitter)(nil) in the
// interface, which sink none produces.
func isNilEmitter(e middleware.Emitter) bool {
	em, ok := e.(*emitter.Emitter)
	return ok && em == nil
}

type allowAll struct{}

func (allowAll) Check(string, string, string) checker.Decision { return checker.Decision{} }

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

// call is one API request as the gateway handles it, in the request's
// context from authentication to the access log.
type call struct {
	caller    *frontend.Caller
	req       request
	body      []byte
	endpoint  string
	ep        estimate.Endpoint
	route     string
	ups       []*provider
	requestID string // the x-request-id answered
	eventID   string // usage event id (the request id unless it was reused)
	priority  schemas.Priority
	deadline  time.Time // the caller's (priority.TimeoutHeader); zero: none
	user      string
	start     time.Time

	// Filled while the call runs.
	upstream   string
	attempts   int
	usage      middleware.Usage
	source     string // reported, counted, estimate, none
	outcome    string
	upstreamID string
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// identify tells the middleware who calls which model; requests without a
// call (never on the API paths) pass unchecked.
func identify(r *http.Request) (tenant, model, apiKeyID string, ok bool) {
	c := callFrom(r.Context())
	if c == nil {
		return "", "", "", false
	}
	return c.caller.Tenant, c.req.Model, c.caller.KeyID, true
}

// fillEvent gives every usage event of a call its id, user and priority.
func fillEvent(r *http.Request, ev *schemas.UsageEvent) {
	c := callFrom(r.Context())
	if c == nil {
		return
	}
	ev.ID, ev.User, ev.Priority = c.eventID, c.user, c.priority
	if c.eventID != c.requestID {
		ev.Attributes = map[string]string{"request_id": c.requestID}
	}
}

// Headers a caller may send that the gateway reads.
const (
	headerRequestID = "X-Request-Id"
)

// serveAPI authenticates, reads and routes a request, then hands it to the
// middleware (flags, estimate, settlement) and the proxy.
func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	rw := &recorder{ResponseWriter: w, start: s.now()}
	c := &call{endpoint: r.URL.Path, start: rw.start, route: "unknown", outcome: "ok"}
	c.ep, _ = estimate.EndpointOf(r.URL.Path)
	c.requestID = r.Header.Get(headerRequestID)
	if !validID(c.requestID) {
		c.requestID = "req_" + randomHex(16)
	}
	rw.Header().Set(headerRequestID, c.requestID)
	defer s.finish(rw, c)

	if c.caller = s.authenticate(rw, r); c.caller == nil {
		c.outcome = "unauthenticated"
		return
	}
	body, err := readBody(rw, r, s.cfg.MaxBodyBytes)
	if err != nil {
		c.outcome = "bad_request"
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(rw, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large",
				fmt.Sprintf("The request body exceeds this gateway's limit of %d bytes (services.gateway.max_body_bytes).", s.cfg.MaxBodyBytes))
			return
		}
		writeError(rw, http.StatusBadRequest, "invalid_request_error", "body_unreadable", "The request body could not be read.")
		return
	}
	c.body = body
	if c.req, err = scanRequest(body); err != nil {
		c.outcome = "bad_request"
		writeError(rw, http.StatusBadRequest, "invalid_request_error", "invalid_json", "We could not parse the JSON body of your request: "+err.Error())
		return
	}
	model := c.req.Model
	if model == "" || len(model) > schemas.MaxModelLen {
		c.outcome = "bad_request"
		writeParamError(rw, http.StatusBadRequest, "model", "missing_model",
			fmt.Sprintf("You must provide a model parameter (1 to %d bytes).", schemas.MaxModelLen))
		return
	}
	c.ups, c.route = s.routes.lookup(model)
	switch {
	case !c.caller.MayUse(model):
		c.outcome = "forbidden"
		writeParamError(rw, http.StatusForbidden, "model", "model_not_allowed",
			fmt.Sprintf("The API key %s may not use the model `%s`; GET /v1/models lists the models it may use.", c.caller.KeyID, model))
		return
	case c.ups == nil:
		c.route = "unknown"
		c.outcome = "unknown_model"
		writeParamError(rw, http.StatusNotFound, "model", "model_not_found",
			fmt.Sprintf("The model `%s` does not exist or is not served by this gateway.", model))
		return
	}
	if c.priority, err = s.classOf(c.caller, r.Header.Get(priority.Header)); err != nil {
		if errors.Is(err, priority.ErrRaiseNotAllowed) {
			c.outcome = "forbidden"
			writeError(rw, http.StatusForbidden, "permission_denied", "priority_not_allowed",
				fmt.Sprintf("%v. The API key %s may only lower its priority; ask for may_set_priority in the gateway's keys file.", err, c.caller.KeyID))
			return
		}
		c.outcome = "bad_request"
		writeError(rw, http.StatusBadRequest, "invalid_request_error", "invalid_priority", err.Error()+".")
		return
	}
	if c.deadline, err = priority.DeadlineOf(r.Header.Get(priority.TimeoutHeader), c.start); err != nil {
		c.outcome = "bad_request"
		writeError(rw, http.StatusBadRequest, "invalid_request_error", "invalid_timeout", err.Error()+".")
		return
	}
	c.user = c.caller.User
	if c.user == "" && len(c.req.User) <= schemas.MaxStringLen {
		c.user = c.req.User
	}
	if deferralRequested(r) {
		s.deferRequest(rw, r, c)
		return
	}
	c.eventID = c.requestID
	if s.reused(c.caller.Tenant, c.requestID) {
		// Sluice deduplicates events by id: a second call under the same
		// id would go unmetered. It gets a fresh one.
		c.eventID = c.requestID + "." + randomHex(4)
		s.m.idReuses.Inc()
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // the middleware reads it again to estimate
	s.api.ServeHTTP(rw, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
}

// classOf is the class c's request runs under: the key's or its tenant's
// policy class, moved by the X-Sluice-Priority header (Caller.PriorityOf).
func (s *Server) classOf(c *frontend.Caller, header string) (schemas.Priority, error) {
	var tenantClass schemas.Priority
	if s.policy != nil {
		tenantClass = s.policy().Tenant(c.Tenant).Class()
	}
	return c.PriorityOf(tenantClass, header)
}

// reused reports whether tenant sent requestID before (as far as the
// bounded memory reaches).
func (s *Server) reused(tenant, requestID string) bool {
	s.idsMu.Lock()
	defer s.idsMu.Unlock()
	return s.ids.Seen(tenant + "\x00" + requestID)
}

// finish records the access log line and the metrics of a request.
func (s *Server) finish(rw *recorder, c *call) {
	status := rw.status
	if status == 0 {
		status = statusClientClosed
	}
	end := s.now()
	class := "unauthenticated"
	tenant, key := "", ""
	if c.caller != nil {
		class, tenant, key = c.caller.Class, c.caller.Tenant, c.caller.KeyID
	}
	ep := c.ep.String()
	s.m.requests.WithLabelValues(class, c.route, ep, statusLabel(status)).Inc()
	if !rw.first.IsZero() {
		s.m.ttfb.WithLabelValues(ep, boolLabel(c.req.Stream)).Observe(rw.first.Sub(rw.start).Seconds())
	}
	if c.source != "" {
		s.m.usage.WithLabelValues(c.source).Inc()
	}
	if c.source == "reported" || c.source == "counted" {
		for kind, n := range map[string]int64{"prompt": c.usage.PromptTokens, "completion": c.usage.CompletionTokens,
			"cached": c.usage.CachedTokens, "reasoning": c.usage.ReasoningTokens} {
			if n > 0 {
				s.m.tokens.WithLabelValues(class, c.route, kind).Add(float64(n))
			}
		}
	}
	attrs := []slog.Attr{
		slog.String("request_id", c.requestID), slog.String("tenant", tenant), slog.String("api_key_id", key),
		slog.String("model", c.req.Model), slog.String("endpoint", c.endpoint), slog.Bool("stream", c.req.Stream),
		slog.Int("status", status), slog.String("outcome", c.outcome), slog.Int64("latency_ms", end.Sub(rw.start).Milliseconds()),
	}
	if !rw.first.IsZero() {
		attrs = append(attrs, slog.Int64("ttfb_ms", rw.first.Sub(rw.start).Milliseconds()))
	}
	if c.upstream != "" {
		attrs = append(attrs, slog.String("upstream", c.upstream), slog.Int("attempts", c.attempts))
	}
	if c.upstreamID != "" {
		attrs = append(attrs, slog.String("upstream_request_id", c.upstreamID))
	}
	if c.source != "" {
		attrs = append(attrs, slog.String("usage", c.source), slog.Int64("prompt_tokens", c.usage.PromptTokens),
			slog.Int64("completion_tokens", c.usage.CompletionTokens))
	}
	if c.eventID != c.requestID && c.eventID != "" {
		attrs = append(attrs, slog.String("event_id", c.eventID))
	}
	// Never the prompt or the answer: an access log is read by more
	// people than the conversations it describes.
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// statusClientClosed is the status logged for a request whose client went
// away before any answer (nginx's 499; nothing is sent).
const statusClientClosed = 499

func statusLabel(code int) string { return fmt.Sprint(code) }

func boolLabel(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// readBody reads at most limit bytes of r's body.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
}

// validID reports whether a client's x-request-id can be an event id:
// 1 to 128 bytes of printable ASCII without spaces.
func validID(id string) bool {
	if id == "" || len(id) > schemas.MaxIDLen-9 { // room for a ".xxxxxxxx" suffix on reuse
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// writeError answers an OpenAI error body.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	ratelimit.WriteError(w, status, ratelimit.Error{Type: typ, Code: code, Message: msg}, 0)
}

func writeParamError(w http.ResponseWriter, status int, param, code, msg string) {
	ratelimit.WriteError(w, status, ratelimit.Error{Type: "invalid_request_error", Code: code, Message: msg, Param: &param}, 0)
}

// recorder records the status and the time of the first body byte, and
// keeps Flush for streams.
type recorder struct {
	http.ResponseWriter
	start  time.Time
	first  time.Time
	status int
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.first.IsZero() && len(b) > 0 {
		w.first = time.Now()
	}
	return w.ResponseWriter.Write(b)
}

func (w *recorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }
