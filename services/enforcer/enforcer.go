package enforcer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/httpserver"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/traceprop"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
)

// Run runs the enforcer until ctx is cancelled or a part of it fails, then
// writes the last flags and stops within cfg.ShutdownTimeout.
//
// New returns the enforcer of cfg in env; its Addr is the admin API's
// address ("" when the API is off). run is the wiring: it opens the clients, registers metrics and readiness
// checks, and starts the core (core.go), its recovery (recovery.go), the
// leader lease that decides whether this replica writes (lease.go), the
// admin topic reader (adminstate.go, started once the flags in Redis are
// the table's floor), the signal consumer (consume.go), the policy reload
// and the admin API. ClickHouse may be down at start (lazyClickHouse).
// Everything that can be refused (configuration, policy file, connections,
// the admin listener) is checked before any of them runs, so a bad start
// writes no flag. They then share one errgroup: the first to fail cancels
// the others, and its error is Run's; the deferred closes run after all of
// them have returned, so the last flag write still has its Redis client.
func New(cfg Config, env platform.Env) (*platform.Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, config.Under("services.enforcer", err)
	}
	if err := env.Topics.Check("signals", "admin"); err != nil {
		return nil, fmt.Errorf("enforcer: %w", err)
	}
	return platform.NewService("enforcer", func(ctx context.Context, ready func(string)) error {
		return run(ctx, cfg, env, ready)
	}), nil
}

func run(ctx context.Context, cfg Config, env platform.Env, ready func(addr string)) error {
	env = env.Named("enforcer")
	log := env.Logger

	auth, err := signalauth.Open(env.SignalAuth, log)
	if err != nil {
		return fmt.Errorf("enforcer: %w", err)
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = env.Redis.Prefix(redisconn.FlagKeys)
	}
	pw, err := loadPolicy(env.Policy, log)
	if err != nil {
		return err
	}
	rdb := redisconn.NewClient(env.Redis)
	defer rdb.Close()
	chc := &lazyClickHouse{chconn.NewLazy(env.ClickHouse)}
	defer chc.Close()
	if _, err := chc.Get(ctx); err != nil {
		log.Warn("enforcer: clickhouse unreachable at start; enforcing from redis and kafka, recovery retries", "err", err)
	}
	group, replica := cfg.Group, cfg.ReplicaID
	if replica != "" {
		group += "-" + replica
	} else if replica, err = os.Hostname(); err != nil || replica == "" {
		return fmt.Errorf("services.enforcer.replica_id: empty and the host name is unknown (%v); set it", err)
	}
	c := newCore(cfg, rdb, pw, log)
	c.auth, c.signalsTopic = auth, env.Topics.Signals
	if traceprop.On(env.Tracing) {
		c.tracer = traceprop.Tracer(env.Tracing, "enforcer")
	}
	kc, err := openSignals(ctx, cfg, group, env, c.offsets.groupCallbacks(env.Topics.Signals)...)
	if err != nil {
		return err
	}
	defer leaveGroup(kc)

	// Silent until the lease says otherwise (lease.go).
	c.writer.SetLeading(false)
	as, err := openAdminState(ctx, cfg, env, c)
	if err != nil {
		return err
	}
	c.expireKeys = as.expireDue
	defer as.close()
	if err := errors.Join(env.Metrics.Register(as.records), env.Metrics.Register(as.unsigned)); err != nil {
		return fmt.Errorf("enforcer: metrics: %w", err)
	}
	env.Health.AddReadiness(adminCheck, func(context.Context) error {
		select {
		case <-as.caughtUp():
			return nil
		default:
			return errors.New("admin topic not yet read to its end")
		}
	})
	if err := c.registerMetrics(env.Metrics); err != nil {
		return fmt.Errorf("enforcer: metrics: %w", err)
	}
	env.Health.AddReadiness("enforcer-redis", redisconn.Ready(rdb))
	env.Health.AddReadiness("enforcer-kafka", kafkaconn.Ready(kc))
	env.Health.AddReadiness("enforcer-clickhouse", chc.Ready)
	srv, err := listenAdmin(cfg, c, chc, as, log)
	if err != nil {
		return err
	}

	g, ctx := errgroup.WithContext(ctx)
	recovered := make(chan struct{})
	if cfg.Recover {
		// Registered before the group starts, so readiness is never
		// briefly true with an empty memory (recovery.go).
		env.Health.AddReadiness(recoveredCheck, func(context.Context) error {
			return errors.New("state not yet recovered from ClickHouse")
		})
		g.Go(func() error {
			return c.recoverUntilDone(ctx, chc, func() { env.Health.RemoveReadiness(recoveredCheck) }, recovered)
		})
	} else {
		close(recovered)
	}
	floored, writerDone := make(chan struct{}), make(chan struct{})
	g.Go(func() error { defer close(writerDone); return c.runWriterAfterFloor(ctx, floored) })
	g.Go(func() error { return c.runLease(ctx, rdb, replica, as.caughtUp(), writerDone) })
	g.Go(func() error {
		select {
		case <-floored:
			return as.run(ctx)
		case <-ctx.Done():
			return nil
		}
	})
	g.Go(func() error { return c.runClock(ctx) })
	g.Go(func() error { return pw.Follow(ctx, c.publishFailModes) })
	g.Go(func() error { return c.consume(ctx, kc, recovered) })
	g.Go(func() error { return c.runCommits(ctx, kc, writerDone) })
	if srv != nil {
		g.Go(srv.serve)
		g.Go(func() error { return srv.shutdownOnDone(ctx, cfg.ShutdownTimeout) })
		ready(srv.ln.Addr().String())
	} else {
		ready("")
	}
	return g.Wait()
}

// openSignals returns a client of consumer group group on the signals
// topic, creating the topic if the cluster lacks it. extra are the
// group's commit options (commit.go: no auto-commit).
func openSignals(ctx context.Context, cfg Config, group string, env platform.Env, extra ...kgo.Opt) (*kgo.Client, error) {
	kc, err := kafkaconn.NewClient(env.Kafka, append([]kgo.Opt{
		// With replica_id set, every replica reads every signal (its own
		// group): each holds the whole state, so that any of them can take
		// the lead (lease.go).
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(env.Topics.Signals),
		kgo.SessionTimeout(cfg.SessionTimeout),
		kgo.FetchMaxWait(100 * time.Millisecond),
	}, extra...)...)
	if err != nil {
		return nil, err
	}
	if err := kafkaconn.EnsureTopics(ctx, kc, env.Kafka, env.Topics.Signals); err != nil {
		leaveGroup(kc)
		return nil, err
	}
	return kc, nil
}

// leaveGroup leaves the consumer group and closes kc. Leaving waits for a
// join in progress; it is bounded so that a shutdown during a rebalance
// cannot overrun the process's grace period.
func leaveGroup(kc *kgo.Client) {
	lctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = kc.LeaveGroupContext(lctx)
	kc.Close()
}

// adminServer is the admin API bound to its listener.
type adminServer struct {
	ln  net.Listener
	srv *http.Server
	log *slog.Logger
	tls bool
}

// listenAdmin binds the admin API, or returns nil when it is disabled (no
// address, or no tokens: an API nobody can call is not served).
func listenAdmin(cfg Config, c *core, aud *lazyClickHouse, as *adminState, log *slog.Logger) (*adminServer, error) {
	if cfg.Admin.Listen == "" {
		return nil, nil
	}
	if len(cfg.Admin.Tokens) == 0 {
		log.Warn("enforcer: admin API disabled: no admin.tokens configured")
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		return nil, fmt.Errorf("services.enforcer.admin.listen: %w", err)
	}
	tlsCfg, err := httpserver.LoadTLS(cfg.Admin.TLSCertFile, cfg.Admin.TLSKeyFile, "services.enforcer.admin.tls_cert_file", "services.enforcer.admin.tls_key_file")
	if err != nil {
		ln.Close()
		return nil, err
	}
	var auditor admin.Auditor
	if aud != nil {
		auditor = aud
	}
	api := admin.New(c.table, c.writer.MarkDirty, auditor, cfg.Admin.Tokens, log)
	if as != nil {
		api.WithPublisher(as).WithKeys(as, aud).WithSections(as, aud).WithKeyUse(aud)
	}
	srv := httpserver.New(api.Handler(), cfg.Admin.HTTP, log)
	if tlsCfg != nil {
		// Tokens and operator actions cross the network: with a
		// certificate, the listener speaks only TLS.
		srv.TLSConfig = tlsCfg
		ln = tls.NewListener(ln, tlsCfg)
	} else if host, _, _ := net.SplitHostPort(cfg.Admin.Listen); !httpserver.IsLoopback(host) {
		log.Warn("enforcer: admin API serves plain HTTP on a non-loopback address; bearer tokens cross the network in clear text (set enforcer.admin.tls_cert_file and tls_key_file)", "addr", cfg.Admin.Listen)
	}
	return &adminServer{ln: ln, srv: srv, log: log, tls: tlsCfg != nil}, nil
}

// serve serves until the server is shut down. Only a failure of the
// listener itself is an error.
func (s *adminServer) serve() error {
	s.log.Info("enforcer: admin API listening", "addr", s.ln.Addr().String(), "tls", s.tls)
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("enforcer: admin API: %w", err)
	}
	return nil
}

// shutdownOnDone shuts the server down once ctx ends, letting requests in
// flight (whose actions are already audited) finish within grace. It runs
// beside serve because Serve returns as soon as Shutdown starts.
func (s *adminServer) shutdownOnDone(ctx context.Context, grace time.Duration) error {
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = s.srv.Shutdown(sctx)
	return nil
}

// loadPolicy returns the watcher of the policy file src names, or the
// built-in defaults when there is none. A broken file refuses the start.
func loadPolicy(src platform.FileSource, log *slog.Logger) (*policy.Watcher, error) {
	if src.File == "" {
		// Data rather than Static: the admin API's tenants and plans are
		// laid over the defaults as they would be over a file.
		return policy.FromData([]byte("{}\n"), "(built-in defaults)")
	}
	w, err := policy.NewWatcher(src.File, src.Reload, log)
	if err != nil {
		return nil, fmt.Errorf("policy.file: %w", err)
	}
	return w, nil
}
