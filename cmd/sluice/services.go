package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/devbroker"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/tracing"
	"github.com/sluicehq/sluice/services/aggregator"
	"github.com/sluicehq/sluice/services/alerter"
	"github.com/sluicehq/sluice/services/authz"
	"github.com/sluicehq/sluice/services/console"
	"github.com/sluicehq/sluice/services/enforcer"
	"github.com/sluicehq/sluice/services/gateway"
	"github.com/sluicehq/sluice/services/ingest"
	"github.com/sluicehq/sluice/services/reconciler"
)

// hostOptions are what a hosting program (the demo) adds to the services
// at run time: observers and shared parts, never settings.
type hostOptions struct {
	gateway []gateway.Option
}

// newService builds the service of sluiceconfig.Services named name: every
// service package exposes New(cfg, env, options…) returning a
// platform.Service, given here its section of the root configuration.
func newService(name string, c *sluiceconfig.Config, env platform.Env, host hostOptions) (*platform.Service, error) {
	s := &c.Services
	switch name {
	case "ingest":
		return ingest.New(s.Ingest, env)
	case "aggregator":
		return aggregator.New(s.Aggregator, env)
	case "enforcer":
		return enforcer.New(s.Enforcer, env)
	case "alerter":
		return alerter.New(s.Alerter, env)
	case "reconciler":
		return reconciler.New(s.Reconciler, env)
	case "gateway":
		return gateway.New(s.Gateway, env, host.gateway...)
	case "authz":
		return authz.New(s.Authz, env)
	case "console":
		return console.New(s.Console, env)
	}
	return nil, fmt.Errorf("sluice cannot build the service %q that sluiceconfig.Services lists", name)
}

func runServices(ctx context.Context, cfg sluiceconfig.Config, names []string) error {
	log := logging.New(cfg.Log, os.Stderr)
	p, err := preparePipeline(ctx, &cfg, names, &hostOptions{}, log)
	if err != nil {
		return err
	}
	defer p.close()
	return lifecycle.Run(ctx, log, cfg.ShutdownTimeout, p.tasks...)
}

// pipeline is a prepared set of services: their tasks (the operational
// endpoints first) and what to release when they have stopped.
type pipeline struct {
	tasks   []lifecycle.Task
	env     platform.Env
	cleanup []func()
}

func (p *pipeline) close() {
	for i := len(p.cleanup) - 1; i >= 0; i-- {
		p.cleanup[i]()
	}
}

// preparePipeline validates the chosen services, connects what they need
// — the embedded development broker when embedded_kafka.enabled asks for
// it (and nothing when kafka.brokers is empty and no service needs Kafka),
// the migrations when a service writes ClickHouse — and returns the tasks
// to run. host is read when each service starts, so a host may fill it in
// after preparePipeline returns (the demo builds its observers on the
// pipeline's metrics registry).
func preparePipeline(ctx context.Context, cfg *sluiceconfig.Config, names []string, host *hostOptions, log *slog.Logger) (*pipeline, error) {
	chosen, err := sluiceconfig.Choose(cfg, names)
	if err != nil {
		return nil, err
	}
	var want sluiceconfig.Needs
	for _, s := range chosen {
		n := s.Needs(cfg)
		want.Kafka = want.Kafka || n.Kafka
		want.WritesClickHouse = want.WritesClickHouse || n.WritesClickHouse
	}
	p := &pipeline{}
	switch {
	case cfg.Embedded.Enabled:
		dir := cfg.Embedded.DataDir
		if dir != "" {
			dir, _ = filepath.Abs(dir)
		}
		cluster, addrs, err := devbroker.Start(cfg.Embedded.Port, dir, cfg.Topics.Usage, cfg.Topics.Signals)
		if err != nil {
			return nil, err
		}
		p.cleanup = append(p.cleanup, cluster.Close)
		cfg.Kafka.Brokers = addrs
		log.Warn("embedded_kafka.enabled: using an in-process development broker (no replication; not for production)", "addr", addrs, "data_dir", dir)
	case want.Kafka && len(cfg.Kafka.Brokers) == 0:
		return nil, errors.New("kafka.brokers: empty, but the services to run use Kafka; name the brokers (SLUICE_KAFKA_BROKERS), or set embedded_kafka.enabled for a development broker that keeps nothing")
	}
	if cfg.Migrate && want.WritesClickHouse {
		if err := applyMigrations(ctx, cfg.ClickHouse, log); err != nil {
			p.close()
			return nil, err
		}
	}
	tp, err := tracing.New(cfg.Tracing)
	if err != nil {
		p.close()
		return nil, err
	}
	// Cleanups run once every service has stopped: the spans of their
	// last work are exported then.
	p.cleanup = append(p.cleanup, func() {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Tracing.Timeout)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: the last spans were not all exported", "err", err)
		}
	})
	reg := ops.NewRegistry()
	p.env = cfg.Env()
	// The provider itself, not its wrapper: services ask traceprop.On
	// whether it is the no-op one, and a wrapper never is, so with
	// tracing off every event still paid for starting a no-op span
	// (9% of ingest's CPU at 70,000 events/s; bench/README.md).
	p.env.Logger, p.env.Metrics, p.env.Health, p.env.Tracing = log, reg, ops.NewHealth(), tp.TracerProvider
	opsCfg := cfg.Ops
	// The operational endpoints stop last: /metrics and /healthz answer
	// while the services drain, and the last flush's metrics can be read.
	opsTask := lifecycle.Task{Name: "ops", Run: func(ctx context.Context) error {
		return ops.Serve(ctx, opsCfg, reg, p.env.Health, log)
	}}
	for _, s := range chosen {
		opsTask.StopsAfter = append(opsTask.StopsAfter, s.Name)
	}
	p.tasks = []lifecycle.Task{opsTask}
	for _, s := range chosen {
		p.env.Health.Expect(s.Name)
		senv := p.env.Named(s.Name)
		var after []string
		for _, a := range s.StopsAfter {
			if slices.ContainsFunc(chosen, func(o sluiceconfig.Service) bool { return o.Name == a }) {
				after = append(after, a)
			}
		}
		p.tasks = append(p.tasks, lifecycle.Task{Name: s.Name, StopsAfter: after, Run: func(ctx context.Context) error {
			svc, err := newService(s.Name, cfg, senv, *host)
			if err != nil {
				return err
			}
			return svc.Run(ctx)
		}})
	}
	return p, nil
}
