// Package ingest is Sluice's front door for usage events: an HTTP API
// (POST /v1/events) where gateways hand in one event or a batch, as JSON,
// NDJSON or CloudEvents, optionally gzip-encoded. It authenticates the
// gateway by API key, validates every event, drops duplicates it already
// acknowledged, and produces the rest to Kafka (topic sluice.usage.v1,
// key = tenant) with an idempotent acks=all producer.
//
// The one promise it keeps: a 2xx answer means every accepted event of the
// request was acknowledged by the broker. A slow or unreachable broker
// yields 503 with Retry-After, never a 2xx and never an unbounded queue:
// at most inflight_events events wait for the broker at any time. See
// README.md for the status codes, the limits and examples.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/httpserver/hotroute"
)

// New returns the ingest service of cfg in env. Once started it serves the
// events API on cfg.Listen (its Addr) until stopped, then shuts down
// gracefully within cfg.ShutdownTimeout: readiness turns false, the
// listener closes, in-flight requests finish (each waits for its broker
// acknowledgements), and the producer flushes.
func New(cfg Config, env platform.Env, opts ...Option) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.ingest", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return platform.NewService("ingest", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready, o.kafka...)
	}), nil
}

// Option adds to an ingest service what its host (a test) gives.
type Option func(*options)

type options struct{ kafka []kgo.Opt }

// WithProducerOptions adds franz-go options to the producers (a test's
// dialer through a proxy it can cut).
func WithProducerOptions(o ...kgo.Opt) Option {
	return func(x *options) { x.kafka = append(x.kafka, o...) }
}

// run serves until ctx ends; ready learns the bound address.
func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string), extra ...kgo.Opt) error {
	if env.Logger == nil || env.Metrics == nil || env.Health == nil {
		// The hosting process normally names the env; a bare one (a test,
		// an embedding program) gets defaults.
		env = env.Named("ingest")
	}
	s, err := newServer(ctx, cfg, env, extra...)
	if err != nil {
		return err
	}
	if cfg.UsageAPI.Enabled {
		ua, follow, closeAPI, err := openUsageAPI(ctx, cfg, env)
		if err != nil {
			s.closeProducers()
			return err
		}
		defer closeAPI()
		s.usage, s.followUsage = ua, follow
	}
	if err := s.m.register(env.Metrics); err != nil {
		s.closeProducers()
		return fmt.Errorf("ingest: register metrics: %w", err)
	}
	defer s.m.unregister(env.Metrics)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		s.closeProducers()
		return fmt.Errorf("ingest: listen on %s: %w (set services.ingest.listen to a free address)", cfg.Listen, err)
	}
	// Ready only once the listener accepts: a load balancer that saw
	// /readyz pass may send the next request at once.
	env.Health.AddReadiness("ingest", s.ready)
	defer env.Health.RemoveReadiness("ingest")
	// A batch of max_body_bytes may take a slow link a while; the answer
	// waits up to produce_timeout for the broker.
	srv := httpserver.New(s.handler(), httpserver.Timeouts{
		ReadHeader: 10 * time.Second,
		Read:       60 * time.Second,
		Write:      cfg.ProduceTimeout + 60*time.Second,
		Idle:       2 * time.Minute,
	}, env.Logger)
	var serve func(net.Listener) error = srv.Serve
	var stop func(context.Context) error = srv.Shutdown
	if cfg.HotRouteMaxBodyBytes > 0 {
		hot, err := hotroute.New(hotroute.Route{Method: http.MethodPost, Path: "/v1/events", MaxBodyBytes: cfg.HotRouteMaxBodyBytes, Handler: http.HandlerFunc(s.events)}, srv)
		if err != nil {
			_ = ln.Close()
			s.closeProducers()
			return err
		}
		s.hot.Store(hot)
		serve, stop = hot.Serve, hot.Shutdown
	}
	env.Logger.Info("events API listening", "addr", ln.Addr().String(), "topic", env.Topics.Usage)
	ready(ln.Addr().String())
	// One group, one cancellation: the server, the keys file poller and
	// the shutdown member. When ctx ends, or the server fails, shutdown
	// drains the in-flight requests and flushes the producer.
	g, gctx := errgroup.WithContext(ctx)
	if s.keys != nil {
		g.Go(func() error { s.keys.Watch(gctx, cfg.GatewayKeys.Reload); return nil })
	}
	g.Go(func() error {
		if err := serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("ingest: serve: %w", err)
		}
		return nil
	})
	if s.usage != nil {
		g.Go(func() error { return s.followUsage(gctx) })
	}
	g.Go(func() error {
		<-gctx.Done()
		return s.shutdown(stop)
	})
	return g.Wait()
}

// shutdown stops accepting, lets in-flight requests finish, then flushes
// and closes the producer, all within ShutdownTimeout.
func (s *server) shutdown(stopServing func(context.Context) error) error {
	s.closing.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	var errs []error
	if err := stopServing(sctx); err != nil {
		errs = append(errs, fmt.Errorf("ingest: in-flight requests did not finish within shutdown_timeout = %s: %w", s.cfg.ShutdownTimeout, err))
	}
	// Records of requests that already answered 503 may still be retrying;
	// flushing lets their acknowledgements arrive, which writes their
	// dedup marks, but nothing waits for them past the deadline.
	for _, cl := range []*kgo.Client{s.kafka, s.quick} {
		if err := cl.Flush(sctx); err != nil {
			s.log.Warn("producer did not flush within shutdown_timeout; unacknowledged records were answered 503 and will be retried by gateways", "err", err)
		}
	}
	s.closeProducers()
	s.log.Info("events API stopped")
	return errors.Join(errs...)
}
