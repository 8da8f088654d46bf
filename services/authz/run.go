package authz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/checker"
)

// New returns the authz service of cfg in env. Once started it serves the
// endpoint on cfg.Listen (its Addr) until stopped, then stops accepting and
// lets checks in flight finish within cfg.ShutdownTimeout.
func New(cfg Config, env platform.Env) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.authz", err)
	}
	return platform.NewService("authz", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready)
	}), nil
}

func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string)) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		env = env.Named("authz")
	}
	log := env.Logger
	deps := Deps{Logger: log, Metrics: env.Metrics}

	var follow func(context.Context) error
	if env.Policy.File != "" {
		w, err := policy.NewWatcher(env.Policy.File, env.Policy.Reload, log.With("component", "policy"))
		if err != nil {
			return fmt.Errorf("authz: policy.file: %w", err)
		}
		limits, err := frontend.NewLimits(cfg.Admission, w.Current(), "authz", false, env, log.With("component", "admission"))
		if err != nil {
			return fmt.Errorf("authz: %w", err)
		}
		defer limits.Close()
		deps.Admitter, deps.Policy = limits.Admit, w.Current
		follow = func(ctx context.Context) error { return w.Follow(ctx, limits.Apply) }
	}
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

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		frontend.CloseEmitter(context.Background(), em, closeSender, time.Second, log)
		return fmt.Errorf("authz: listen on %s: %w (set services.authz.listen to a free address)", cfg.Listen, err)
	}
	env.Health.AddReadiness("authz", func(context.Context) error {
		if s.closing.Load() {
			return errors.New("shutting down")
		}
		return nil
	})
	defer env.Health.RemoveReadiness("authz")
	srv := httpserver.New(s, cfg.HTTP, log)
	log.Info("forward-auth endpoint listening", "addr", ln.Addr().String(), "path", cfg.Path,
		"tenant_keys", env.TenantKeys.File != "", "admission", env.Policy.File != "")
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
	g.Go(func() error {
		<-gctx.Done()
		s.closing.Store(true)
		sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
		// Only now, with every check answered, do the refusal events leave.
		frontend.CloseEmitter(context.Background(), em, closeSender, cfg.Usage.FlushTimeout, log)
		log.Info("forward-auth endpoint stopped")
		return nil
	})
	return g.Wait()
}
