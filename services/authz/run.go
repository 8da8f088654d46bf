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
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/checker"
)

// Options are what a hosting program adds to the configuration.
type Options struct {
	// Started, when not nil, learns the address the endpoint listens on.
	Started func(addr string)
}

// Run serves the endpoint on cfg.Listen until ctx is cancelled, then stops
// accepting and lets checks in flight finish within cfg.ShutdownTimeout.
func Run(ctx context.Context, cfg Config, env platform.Env) error {
	return RunWith(ctx, cfg, env, Options{})
}

// RunWith is Run with options.
func RunWith(ctx context.Context, cfg Config, env platform.Env, opts Options) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		env = env.Named("authz")
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := env.Logger
	deps := Deps{Logger: log, Metrics: env.Metrics}

	var follow func(context.Context) error
	if cfg.Admission.PolicyFile != "" {
		adm, f, closeAdm, err := frontend.PolicyAdmitter(cfg.Admission, "authz", env, log.With("component", "admission"))
		if err != nil {
			return fmt.Errorf("services.authz.admission: %w", err)
		}
		defer closeAdm()
		deps.Admitter, follow = adm, f
	}
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	chk, err := checker.New(rdb, cfg.Checker, log.With("component", "checker"))
	if err != nil {
		return fmt.Errorf("services.authz.checker: %w", err)
	}
	deps.Checker = chk
	var s *Server // the reload callback runs only from Watch, once s is set
	if cfg.KeysFile != "" {
		f, err := keyfile.Open(cfg.KeysFile, frontend.ParseKeys, log, func(err error) { s.keyReloaded(err) })
		if err != nil {
			return fmt.Errorf("services.authz.%w", err)
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
	s, err = New(cfg, deps)
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
		"keys_file", cfg.KeysFile != "", "admission", cfg.Admission.PolicyFile != "")
	if opts.Started != nil {
		opts.Started(ln.Addr().String())
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { _ = chk.Run(gctx); return nil })
	if follow != nil {
		g.Go(func() error { _ = follow(gctx); return nil })
	}
	if deps.Keys != nil {
		g.Go(func() error { deps.Keys.Watch(gctx, cfg.KeysReloadInterval); return nil })
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
