package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/devbroker"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator"
	"github.com/sluicehq/sluice/services/alerter"
	"github.com/sluicehq/sluice/services/authz"
	"github.com/sluicehq/sluice/services/console"
	"github.com/sluicehq/sluice/services/enforcer"
	"github.com/sluicehq/sluice/services/gateway"
	"github.com/sluicehq/sluice/services/ingest"
	"github.com/sluicehq/sluice/services/reconciler"
)

// ServiceConfigs holds one section per service. A section is validated only
// when its service is started, so `sluice migrate` or `sluice run ingest`
// does not demand settings of services it will not run.
type ServiceConfigs struct {
	Ingest     ingest.Config     `yaml:"ingest"`
	Aggregator aggregator.Config `yaml:"aggregator"`
	Enforcer   enforcer.Config   `yaml:"enforcer"`
	Alerter    alerter.Config    `yaml:"alerter"`
	Reconciler reconciler.Config `yaml:"reconciler"`
	Gateway    gateway.Config    `yaml:"gateway"`
	Authz      authz.Config      `yaml:"authz"`
	Console    console.Config    `yaml:"console"`
}

func defaultServiceConfigs() ServiceConfigs {
	s := ServiceConfigs{
		Ingest:     ingest.DefaultConfig(),
		Aggregator: aggregator.DefaultConfig(),
		Enforcer:   enforcer.DefaultConfig(),
		Alerter:    alerter.DefaultConfig(),
		Reconciler: reconciler.DefaultConfig(),
		Gateway:    gateway.DefaultConfig(),
		Authz:      authz.DefaultConfig(),
		Console:    console.DefaultConfig(),
	}
	// In one process the root policy_file is the default for every service.
	s.Reconciler.PolicyFile = ""
	s.Aggregator.PolicyFile = ""
	return s
}

// service is one runnable part of Sluice. Every service package exposes
// Run(ctx, cfg, env); this table adapts them to the root configuration.
type service struct {
	name  string
	about string
	// prepare returns the service's section with root-level defaults (the
	// shared policy file) filled in, ready to validate and run.
	prepare func(c *Config) validator
	run     func(ctx context.Context, c *Config, env platform.Env) error
	// signals is true for the services that sign or verify signals, and
	// so need signal_auth.
	signals bool
	// optIn services run only when named: `sluice run` without names
	// starts the pipeline, not a gateway that needs upstreams and keys.
	optIn bool
	// stopsAfter names services that, when they run in the same process,
	// must have stopped before this one is asked to (lifecycle.Task.StopsAfter).
	stopsAfter []string
}

type validator interface{ Validate() error }

// sharedPolicy gives a service the root policy_file unless its own section
// names another.
func sharedPolicy(own *string, root string) {
	if *own == "" {
		*own = root
	}
}

// services lists, in data-flow order, what `sluice run` can start.
var services = []service{
	{name: "ingest", about: "HTTP API for gateways → Kafka sluice.usage.v1",
		// A gateway or authz in this process flushes its last usage
		// events into ingest as it stops: ingest must still be there to
		// take them.
		stopsAfter: []string{"gateway", "authz"},
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Ingest.UsageAPI.PolicyFile, c.PolicyFile)
			return c.Services.Ingest
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return ingest.Run(ctx, c.Services.Ingest, env)
		}},
	{name: "aggregator", signals: true, about: "usage events → rates, totals, predictions, tiers → ClickHouse and signals",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Aggregator.PolicyFile, c.PolicyFile)
			return c.Services.Aggregator
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return aggregator.Run(ctx, c.Services.Aggregator, env)
		}},
	{name: "enforcer", signals: true, about: "signals → breakers → Redis flags for the gateway Checker; admin API",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Enforcer.PolicyFile, c.PolicyFile)
			return c.Services.Enforcer
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return enforcer.Run(ctx, c.Services.Enforcer, env)
		}},
	{name: "alerter", signals: true, about: "signals → Alertmanager, DingTalk and Slack notifications",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Alerter.PolicyFile, c.PolicyFile)
			return c.Services.Alerter
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return alerter.Run(ctx, c.Services.Alerter, env)
		}},
	{name: "reconciler", signals: true, about: "nightly audit of counters against raw events; drift repair and alerts",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Reconciler.PolicyFile, c.PolicyFile)
			return c.Services.Reconciler
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return reconciler.Run(ctx, c.Services.Reconciler, env)
		}},
	{name: "gateway", optIn: true, about: "OpenAI-compatible proxy in front of the providers: flags, metering, usage events (only when named)",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Gateway.UsageAPI.PolicyFile, c.PolicyFile)
			return c.Services.Gateway
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return gateway.RunWith(ctx, c.Services.Gateway, env, gateway.Options{Admitter: c.gatewayAdmitter, Guards: c.gatewayGuards})
		}},
	{name: "authz", optIn: true, about: "forward-auth endpoint for nginx, Envoy, Traefik, Kong, APISIX: flags and admission per request (only when named)",
		prepare: func(c *Config) validator { return c.Services.Authz },
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return authz.Run(ctx, c.Services.Authz, env)
		}},
	{name: "console", optIn: true, about: "web console for operators: quotas, charts, flags and admin actions, pipeline health (only when named)",
		prepare: func(c *Config) validator {
			sharedPolicy(&c.Services.Console.PolicyFile, c.PolicyFile)
			return c.Services.Console
		},
		run: func(ctx context.Context, c *Config, env platform.Env) error {
			return console.Run(ctx, c.Services.Console, env)
		}},
}

// chooseServices resolves service names (none = all) and validates the
// chosen services' sections, reporting every problem at once.
func chooseServices(cfg *Config, names []string) ([]service, error) {
	for _, n := range names {
		if !slices.ContainsFunc(services, func(s service) bool { return s.name == n }) {
			return nil, fmt.Errorf("unknown service %q (see `sluice services`)", n)
		}
	}
	var (
		chosen []service
		errs   []error
	)
	for _, s := range services {
		if (len(names) == 0 && !s.optIn) || slices.Contains(names, s.name) {
			chosen = append(chosen, s)
			if err := s.prepare(cfg).Validate(); err != nil {
				errs = append(errs, fmt.Errorf("services.%s: %w", s.name, err))
			}
		}
	}
	if len(chosen) == 0 {
		return nil, errors.New("no services to run")
	}
	// The key ring is read now, not when the services start: a missing or
	// bad key refuses the start before anything runs.
	if slices.ContainsFunc(chosen, func(s service) bool { return s.signals }) {
		if _, err := signalauth.Open(cfg.SignalAuth, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return chosen, errors.Join(errs...)
}

func runServices(ctx context.Context, cfg Config, names []string) error {
	log := logging.New(cfg.Log, os.Stderr)
	p, err := preparePipeline(ctx, &cfg, names, log)
	if err != nil {
		return err
	}
	defer p.close()
	return lifecycle.Run(ctx, log, cfg.ShutdownGrace, p.tasks...)
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

// preparePipeline validates the chosen services, starts the embedded broker
// when no Kafka is configured (cfg.Kafka.Brokers then points at it), applies
// migrations, and returns the tasks to run.
func preparePipeline(ctx context.Context, cfg *Config, names []string, log *slog.Logger) (*pipeline, error) {
	chosen, err := chooseServices(cfg, names)
	if err != nil {
		return nil, err
	}
	p := &pipeline{}
	if len(cfg.Kafka.Brokers) == 0 {
		dir := cfg.Embedded.DataDir
		if dir != "" {
			dir, _ = filepath.Abs(dir)
		}
		cluster, addrs, err := devbroker.Start(cfg.Embedded.Port, dir, schemas.TopicUsageV1, schemas.TopicSignalsV1)
		if err != nil {
			return nil, err
		}
		p.cleanup = append(p.cleanup, cluster.Close)
		cfg.Kafka.Brokers = addrs
		log.Warn("no kafka.brokers configured: using an embedded development broker (not for production)", "addr", addrs)
	}
	if cfg.Migrate {
		if err := applyMigrations(ctx, cfg.ClickHouse, log); err != nil {
			p.close()
			return nil, err
		}
	}
	reg := ops.NewRegistry()
	p.env = platform.Env{Logger: log, Metrics: reg, Health: ops.NewHealth(), Kafka: cfg.Kafka, ClickHouse: cfg.ClickHouse, Redis: cfg.Redis,
		SignalAuth: cfg.SignalAuth}
	opsCfg := cfg.Ops
	p.tasks = []lifecycle.Task{{Name: "ops", Run: func(ctx context.Context) error {
		return ops.Serve(ctx, opsCfg, reg, p.env.Health, log)
	}}}
	for _, s := range chosen {
		p.env.Health.Expect(s.name)
		senv := p.env.Named(s.name)
		var after []string
		for _, a := range s.stopsAfter {
			if slices.ContainsFunc(chosen, func(o service) bool { return o.name == a }) {
				after = append(after, a)
			}
		}
		p.tasks = append(p.tasks, lifecycle.Task{Name: s.name, StopsAfter: after, Run: func(ctx context.Context) error { return s.run(ctx, cfg, senv) }})
	}
	return p, nil
}
