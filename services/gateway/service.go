// Package gateway is `sluice gateway`: an OpenAI-compatible reverse proxy
// that a team puts in front of its providers, Sluice's own customer of the
// SDK. It authenticates callers by tenant API key (hashed in a keys file),
// routes each request by model to the policy's upstreams that serve it
// (balanced by weight, failing over on connection errors, timeouts, 429
// and 5xx, each upstream behind its guard), and meters every call exactly:
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
//   - the policy's limits (sdk/go/admission, through internal/frontend's
//     Admitter) are asked before the upstream call with the estimate, and
//     settled after.
//
// A request is handled in stages, one file each, in the order they run:
// intake.go, then the middleware's flags and estimate, then proxy.go's
// admit (admit.go), dispatch (dispatch.go), relay (relay.go, stream.go)
// and settle.
//
// Usage events go to ingest over HTTP or straight to Kafka through the
// SDK's Emitter. On shutdown the gateway stops accepting, lets requests in
// flight finish (streams included) up to shutdown_timeout, cuts and
// settles the rest, and only then flushes the Emitter; `sluice run` and
// `sluice demo` stop ingest after the gateway so those last events land.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/admission"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/resource"
)

// Option adds to a gateway what its hosting program gives: observers and
// shared parts, never settings.
type Option func(*options)

type options struct {
	wrapAdmitter func(frontend.Admitter) frontend.Admitter
	guards       *Guards
	admission    []admission.Option
}

// WithAdmitterWrap wraps the admission the gateway builds from the policy:
// a host that watches the decisions (the demo's live view counts them per
// tenant) passes them through.
func WithAdmitterWrap(wrap func(frontend.Admitter) frontend.Admitter) Option {
	return func(o *options) { o.wrapAdmitter = wrap }
}

// WithAdmissionOptions passes opts to the gateway's admission limiters: a
// test moves their clock (admission.WithClock) past a period's end or a
// one-off budget's expiry.
func WithAdmissionOptions(opts ...admission.Option) Option {
	return func(o *options) { o.admission = append(o.admission, opts...) }
}

// WithGuards makes g the upstream guards the gateway follows the policy
// with (a host that shows their state, as the demo does); otherwise it
// builds its own.
func WithGuards(g *Guards) Option { return func(o *options) { o.guards = g } }

// ProcessID names this process in the fleet's shared counts: the
// gateway's name, the host and the process id.
func ProcessID(name string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s/%d", name, host, os.Getpid())
}

// New returns the gateway service of cfg in env. Once started it serves on
// cfg.Listen (its Addr) until stopped, then shuts down as the package
// documentation says.
func New(cfg Config, env platform.Env, opts ...Option) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.gateway", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return platform.NewService("gateway", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, o, ready)
	}), nil
}

func run(ctx context.Context, cfg Config, env platform.Env, opts options, ready func(addr string)) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		env = env.Named("gateway")
	}
	log := env.Logger
	switch {
	case env.Policy.File == "":
		return errors.New("gateway: policy.file is required: the upstreams the gateway calls are defined in it (upstreams:)")
	case env.TenantKeys.File == "":
		return errors.New("gateway: tenant_keys.file is required: the tenants' API keys (see services/gateway/README.md)")
	}
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	pol, err := openPolicy(cfg, env, opts)
	if err != nil {
		return err
	}
	defer pol.close()
	tasks, runTasks, stopTasks, err := startDeferred(ctx, cfg, env, rdb, log)
	if err != nil {
		return err
	}
	defer stopTasks()
	var s *Server                     // the reload callback runs only from Watch, once s is set
	var topicKeys *frontend.TopicKeys // set before the keys file is watched
	keys, err := frontend.OpenKeys(env.TenantKeys.File, log, func(err error) {
		s.keyReloaded(err)
		if topicKeys != nil && err == nil {
			topicKeys.Refresh() // a conflict may have come or gone
		}
	})
	if err != nil {
		return fmt.Errorf("tenant_keys.%w", err)
	}
	topicKeys, stopKeys, err := followKeys(ctx, cfg, env, keys, pol.w)
	if err != nil {
		return err
	}
	defer stopKeys()
	chkCfg := cfg.Checker
	chkCfg.KeyPrefix = env.Redis.Prefix(redisconn.FlagKeys)
	chk, err := checker.New(rdb, chkCfg, log.With("component", "checker"))
	if err != nil {
		return err
	}
	usage, closeUsage := openUsageAPI(cfg, env, pol.w)
	defer closeUsage()
	em, closeSender, err := frontend.NewEmitter(cfg.Usage.EventSink, "gateway", env)
	if err != nil {
		return err
	}
	if em == nil {
		env.Logger.Warn("services.gateway.usage.sink is none: calls are not metered")
	}
	deps := pol.deps
	deps.Checker, deps.Emitter, deps.Logger, deps.Metrics, deps.Keys, deps.TopicKeys = chk, em, log, env.Metrics, keys, topicKeys
	deps.Tasks, deps.Usage, deps.RedisPing, deps.Tracing = tasks, usage, redisconn.Ready(rdb), env.Tracing
	s, err = NewServer(cfg, deps)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return err
	}
	defer s.m.unregister(env.Metrics)
	pol.apply = append(pol.apply, s.ApplyPolicy)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return fmt.Errorf("gateway: listen on %s: %w (set services.gateway.listen to a free address)", cfg.Listen, err)
	}
	return serve(ctx, cfg, env, ready, s, ln, pol, chk, runTasks, func() {
		// Only now, with every request settled, do the events leave.
		frontend.CloseEmitter(context.Background(), em, closeSender, cfg.Usage.FlushTimeout, log)
	})
}

// followKeys follows the admin topic for the keys, tenants and plans made
// through the admin API, with follow_admin on: it reads the topic to its end first, so
// that a restarted gateway serves every key and tenant made before, then
// follows it until stop is called, laying the tenants and plans over the
// policy file (pw.SetOverlay). With follow_admin off it returns nil keys
// and a no-op stop.
func followKeys(ctx context.Context, cfg Config, env platform.Env, file *keyfile.File[frontend.Caller], pw *policy.Watcher) (*frontend.TopicKeys, func(), error) {
	if !cfg.FollowAdmin {
		return nil, func() {}, nil
	}
	var keys *frontend.TopicKeys
	f, stopFollower, err := controlplane.FollowPolicy(ctx, "gateway", env, pw, func() { keys.Refresh() })
	if err != nil {
		return nil, nil, fmt.Errorf("services.gateway.follow_admin: %w", err)
	}
	log := env.Logger.With("component", "controlplane")
	keys = frontend.NewTopicKeys(f.Log(), file.Keys, log)
	if err := env.Metrics.Register(keys.Collector()); err != nil {
		stopFollower()
		return nil, nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	stop := func() {
		env.Metrics.Unregister(keys.Collector())
		stopFollower()
	}
	if err := f.CatchUp(ctx); err != nil {
		stop()
		return nil, nil, fmt.Errorf("services.gateway.follow_admin: %w", err)
	}
	log.Info("following the admin API's keys, tenants and plans", "topic", env.Topics.Admin, "keys", len(f.Log().Keys("")), "conflicts", keys.Conflicts(),
		"tenants", len(f.Log().Sections(controlplane.KindTenant)), "policy_conflicts", pw.Conflicts())
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Run(fctx) }()
	return keys, func() { cancel(); <-done; stop() }, nil
}

// serve runs s on ln, with what follows it — the policy, the keys file,
// the Checker, the deferred tasks' worker — until ctx ends, then shuts
// down: requests in flight finish (then are cut and settled), flushed
// (after, closes the Emitter), and the Checker stops last.
func serve(ctx context.Context, cfg Config, env platform.Env, ready func(string), s *Server, ln net.Listener, pol *policyParts, chk *checker.Checker,
	runTasks func(context.Context, *Server) error, after func()) error {
	log := env.Logger
	env.Health.AddReadiness("gateway", func(ctx context.Context) error {
		if s.closing.Load() {
			return errors.New("shutting down")
		}
		// Until the Checker's first full read of the flags it knows no
		// tenant the enforcer stopped: a started or restarted gateway takes
		// no traffic before it does (docs/flags.md).
		return chk.Ready(ctx)
	})
	defer env.Health.RemoveReadiness("gateway")
	srv := httpserver.New(s, cfg.HTTP, log)
	log.Info("OpenAI-compatible gateway listening", "addr", ln.Addr().String(), "upstreams", len(s.routes.Load().byName), "usage_sink", cfg.Usage.Sink)
	ready(ln.Addr().String())

	// The Checker outlives the server: requests still finishing are
	// checked against current flags until the last one returns.
	chkCtx, stopChecker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopChecker()
	chkDone := make(chan struct{})
	go func() { defer close(chkDone); _ = chk.Run(chkCtx) }()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pol.follow(gctx) })
	g.Go(func() error { s.keys.Watch(gctx, env.TenantKeys.Reload); return nil })
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
		after()
		stopChecker()
		<-chkDone
		log.Info("gateway stopped")
		return err
	})
	return g.Wait()
}

// policyParts are what the gateway builds from the policy file: admission
// (wrapped by WithAdmitterWrap's function when given), the tenants' soft
// per-minute quotas and the upstreams' guards, in deps for New; apply
// gives each a reloaded policy, follow follows the file until its context
// ends, close releases them in the reverse order.
type policyParts struct {
	w       *policy.Watcher
	deps    Deps
	apply   []func(*policy.Policy)
	closers []func()
}

func (p *policyParts) close() {
	for i := len(p.closers) - 1; i >= 0; i-- {
		p.closers[i]()
	}
}

func (p *policyParts) follow(ctx context.Context) error {
	_ = p.w.Follow(ctx, func(pol *policy.Policy) {
		for _, f := range p.apply {
			f(pol)
		}
	})
	return nil
}

// openPolicy reads the policy file and builds the parts it drives; on an
// error everything built is closed.
func openPolicy(cfg Config, env platform.Env, opts options) (p *policyParts, err error) {
	log := env.Logger
	p = &policyParts{}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	// One policy file for admission, the tenants' classes, the upstreams,
	// their guards and the fallbacks, followed by one watcher.
	if p.w, err = policy.NewWatcher(env.Policy.File, env.Policy.Reload, log.With("component", "policy")); err != nil {
		return nil, fmt.Errorf("gateway: policy.file: %w", err)
	}
	p.deps.Policy = p.w.Current
	limits, err := frontend.NewLimits(cfg.Admission, p.w.Current(), "gateway", true, env, log.With("component", "admission"), opts.admission...)
	if err != nil {
		return nil, err
	}
	p.closers = append(p.closers, limits.Close)
	p.apply = append(p.apply, limits.Apply)
	if opts.wrapAdmitter != nil {
		limits.Admit = opts.wrapAdmitter(limits.Admit)
	}
	p.deps.Limits = limits
	guards := opts.guards
	if guards == nil {
		// A client of its own: the shared counts bound each call by its
		// context, which must reach the socket.
		grdb := redisconn.NewClient(env.Redis, redisconn.ContextTimeouts())
		p.closers = append(p.closers, func() { grdb.Close() })
		guards = NewGuards(grdb, env.Redis.Prefix(redisconn.UpstreamKeys), ProcessID(cfg.Name), log.With("component", "upstream"), nil)
		guards.SetRedisTimeout(cfg.SharedUpstreams.RedisTimeout)
	}
	if rc := cfg.ResourceDegradation; rc.Enabled {
		guards.FollowResources(resource.NewSampler(resource.System{}, rc, nil))
	}
	p.closers = append(p.closers, guards.Close)
	if err := guards.Update(p.w.Current()); err != nil {
		return nil, err
	}
	p.apply = append(p.apply, func(pol *policy.Policy) {
		if err := guards.Update(pol); err != nil {
			log.Error("the reloaded policy's upstreams were not all applied; the previous guards stay for those", "err", err)
		}
	})
	p.deps.Guards = guards
	return p, nil
}
