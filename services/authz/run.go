package authz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/checker"
)

// New returns the authz service of cfg in env. Once started it serves the
// endpoint on cfg.Listen (its Addr), and Envoy's ext_authz gRPC service on
// cfg.GRPC.Listen when it is set, until stopped, then stops accepting and
// lets checks in flight finish within cfg.ShutdownTimeout.
func New(cfg Config, env platform.Env, opts ...Option) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.authz", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return platform.NewService("authz", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, o, ready)
	}), nil
}

// Option adds to an authz service what its host (a test) gives.
type Option func(*options)

type options struct{ grpcListening func(addr string) }

// WithGRPCListening has f learn the address the gRPC service listens on
// (with grpc.listen set), before the service is ready.
func WithGRPCListening(f func(addr string)) Option {
	return func(o *options) { o.grpcListening = f }
}

func run(ctx context.Context, cfg Config, env platform.Env, opts options, ready func(addr string)) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		env = env.Named("authz")
	}
	log := env.Logger
	deps := Deps{Logger: log, Metrics: env.Metrics}

	follow, closeLimits, err := admissionFromPolicy(cfg, env, log, &deps)
	if err != nil {
		return err
	}
	defer closeLimits()
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	chkCfg := cfg.Checker
	chkCfg.KeyPrefix = env.Redis.Prefix(redisconn.FlagKeys)
	chk, err := checker.New(rdb, chkCfg, log.With("component", "checker"))
	if err != nil {
		return fmt.Errorf("services.authz.checker: %w", err)
	}
	deps.Checker = chk
	var s *Server // the reload callback runs only from Watch, once s is set
	if env.TenantKeys.File != "" {
		if cfg.Headers.Key == "" {
			return errors.New("services.authz.headers.key: is required with tenant_keys.file (the header the caller's key arrives in)")
		}
		f, err := frontend.OpenKeys(env.TenantKeys.File, log, func(err error) { s.keyReloaded(err) })
		if err != nil {
			return fmt.Errorf("tenant_keys.%w", err)
		}
		deps.Keys = f
	}
	em, closeSender, err := frontend.NewEmitter(cfg.Usage, "authz", env)
	if err != nil {
		return fmt.Errorf("services.authz.usage: %w", err)
	}
	if em != nil {
		deps.Emitter = em
	}
	s, err = NewServer(cfg, deps)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return err
	}
	defer s.m.all.Unregister(env.Metrics)

	ln, gln, err := listen(cfg)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return err
	}
	var gs *grpcService
	if gln != nil {
		gs = s.newGRPCService()
	}
	env.Health.AddReadiness("authz", func(ctx context.Context) error {
		if s.closing.Load() {
			return errors.New("shutting down")
		}
		return chk.Ready(ctx) // no traffic before the flags are known (see the gateway's)
	})
	defer env.Health.RemoveReadiness("authz")
	srv := httpserver.New(s, cfg.HTTP, log)
	log.Info("forward-auth endpoint listening", "addr", ln.Addr().String(), "path", cfg.Path,
		"tenant_keys", env.TenantKeys.File != "", "admission", env.Policy.File != "")
	if gs != nil {
		log.Info("ext_authz gRPC service listening", "addr", gln.Addr().String(), "service", AuthorizationService)
		if opts.grpcListening != nil {
			opts.grpcListening(gln.Addr().String())
		}
	}
	ready(ln.Addr().String())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { _ = chk.Run(gctx); return nil })
	if follow != nil {
		g.Go(func() error { _ = follow(gctx); return nil })
	}
	if deps.Keys != nil {
		g.Go(func() error { deps.Keys.Watch(gctx, env.TenantKeys.Reload); return nil })
	}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("authz: serve: %w", err)
		}
		return nil
	})
	if gs != nil {
		g.Go(func() error {
			// Serve returns nil once stopped, ErrServerStopped when the
			// stop came first.
			if err := gs.srv.Serve(gln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("authz: serve gRPC: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.closing.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		// Both front ends drain at once, within the same shutdown_timeout.
		var stopped sync.WaitGroup
		if gs != nil {
			stopped.Go(func() { gs.stop(sctx) })
		}
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		stopped.Wait()
		// Only now, with every check answered, do the refusal events leave.
		frontend.CloseEmitter(context.Background(), em, closeSender, cfg.Usage.FlushTimeout, log)
		log.Info("forward-auth endpoint stopped")
		return nil
	})
	return g.Wait()
}

// admissionFromPolicy sets deps' admitter and policy from env's policy
// file, when there is one: follow follows the file (nil without one),
// closeLimits releases admission.
func admissionFromPolicy(cfg Config, env platform.Env, log *slog.Logger, deps *Deps) (follow func(context.Context) error, closeLimits func(), err error) {
	closeLimits = func() {}
	if env.Policy.File == "" {
		return nil, closeLimits, nil
	}
	w, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log.With("component", "policy"))
	if err != nil {
		return nil, closeLimits, fmt.Errorf("authz: policy.file: %w", err)
	}
	limits, err := frontend.NewLimits(cfg.Admission, w.Current(), "authz", false, env, log.With("component", "admission"))
	if err != nil {
		return nil, closeLimits, fmt.Errorf("authz: %w", err)
	}
	if p := w.Current(); len(p.UpstreamNames()) > 0 {
		if names := frontend.UpstreamScoped(p.AdmissionRules()); len(names) > 0 {
			log.Warn("limits scoped by upstream are not applied here: forward-auth never learns the upstream a call goes to (sluice gateway applies them)", "limits", names)
		}
	}
	deps.Admitter, deps.Policy = limits.Admit, w.Current
	return func(ctx context.Context) error { return w.Follow(ctx, limits.Apply) }, limits.Close, nil
}

// listen opens the HTTP listener and, with grpc.listen set, the gRPC one
// (nil otherwise).
func listen(cfg Config) (ln, gln net.Listener, err error) {
	if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, nil, fmt.Errorf("authz: listen on %s: %w (set services.authz.listen to a free address)", cfg.Listen, err)
	}
	if cfg.GRPC.Listen == "" {
		return ln, nil, nil
	}
	if gln, err = net.Listen("tcp", cfg.GRPC.Listen); err != nil {
		_ = ln.Close()
		return nil, nil, fmt.Errorf("authz: listen on %s: %w (set services.authz.grpc.listen to a free address, or empty for no gRPC service)", cfg.GRPC.Listen, err)
	}
	return ln, gln, nil
}
