package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/devbroker"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/platform/tracing"
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
	return ServiceConfigs{
		Ingest:     ingest.DefaultConfig(),
		Aggregator: aggregator.DefaultConfig(),
		Enforcer:   enforcer.DefaultConfig(),
		Alerter:    alerter.DefaultConfig(),
		Reconciler: reconciler.DefaultConfig(),
		Gateway:    gateway.DefaultConfig(),
		Authz:      authz.DefaultConfig(),
		Console:    console.DefaultConfig(),
	}
}

// hostOptions are what a hosting program (the demo) adds to the services
// at run time: observers and shared parts, never settings.
type hostOptions struct {
	gateway []gateway.Option
}

// service is one runnable part of Sluice. Every service package exposes
// New(cfg, env, options…) returning a platform.Service; this table adapts
// them to the root configuration.
type service struct {
	name  string
	about string
	// section returns the service's configuration section, to validate.
	section    func(c *Config) validator
	newService func(c *Config, env platform.Env, host hostOptions) (*platform.Service, error)
	// needs says which backing services the service uses with c: the
	// process connects to (and, for Kafka, may start) only what its
	// services need. writesClickHouse services get the migrations first.
	needs func(c *Config) needs
	// signals is true for the services that sign or verify signals, and
	// so need signal_auth.
	signals bool
	// optIn services run only when named: `sluice run` without names
	// starts the pipeline, not a gateway that needs upstreams and keys.
	optIn bool
	// stopsAfter names services that, when they run in the same process,
	// must have stopped before this one is asked to (lifecycle.Task.StopsAfter).
	stopsAfter []string
	// shutdown is how long the service may take to stop with c: the
	// process's shutdown_timeout must cover it, or the process would cut
	// the service's last flush short.
	shutdown func(c *Config) time.Duration
}

// needs are the backing services and shared files a service uses.
type needs struct {
	kafka, writesClickHouse bool
	// policy: the service cannot run without policy.file.
	policy bool
}

type validator interface{ Validate() error }

// always returns a needs function that ignores the configuration.
func always(n needs) func(*Config) needs { return func(*Config) needs { return n } }

// services lists, in data-flow order, what `sluice run` can start.
var services = []service{
	{name: "ingest", shutdown: func(c *Config) time.Duration { return c.Services.Ingest.ShutdownTimeout },
		about: "HTTP API for gateways → Kafka sluice.usage.v1",
		// A gateway or authz in this process flushes its last usage
		// events into ingest as it stops: ingest must still be there to
		// take them.
		stopsAfter: []string{"gateway", "authz"},
		section:    func(c *Config) validator { return c.Services.Ingest },
		needs:      always(needs{kafka: true}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return ingest.New(c.Services.Ingest, env)
		}},
	{name: "aggregator", shutdown: func(c *Config) time.Duration { return c.Services.Aggregator.ShutdownTimeout },
		signals: true, about: "usage events → rates, totals, predictions, tiers → ClickHouse and signals",
		section: func(c *Config) validator { return c.Services.Aggregator },
		needs:   always(needs{kafka: true, writesClickHouse: true, policy: true}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return aggregator.New(c.Services.Aggregator, env)
		}},
	{name: "enforcer", shutdown: func(c *Config) time.Duration { return c.Services.Enforcer.ShutdownTimeout },
		signals: true, about: "signals → breakers → Redis flags for the gateway Checker; admin API",
		section: func(c *Config) validator { return c.Services.Enforcer },
		needs:   always(needs{kafka: true, writesClickHouse: true}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return enforcer.New(c.Services.Enforcer, env)
		}},
	{name: "alerter", shutdown: func(c *Config) time.Duration { return c.Services.Alerter.ShutdownTimeout },
		signals: true, about: "signals → Alertmanager, DingTalk, Feishu, WeCom, Slack and webhook notifications",
		section: func(c *Config) validator { return c.Services.Alerter },
		needs:   always(needs{kafka: true}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return alerter.New(c.Services.Alerter, env)
		}},
	{name: "reconciler", shutdown: func(c *Config) time.Duration { return c.Services.Reconciler.ShutdownTimeout },
		signals: true, about: "nightly audit of counters against raw events; drift repair and alerts",
		section: func(c *Config) validator { return c.Services.Reconciler },
		needs:   always(needs{kafka: true, writesClickHouse: true, policy: true}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return reconciler.New(c.Services.Reconciler, env)
		}},
	{name: "gateway", shutdown: func(c *Config) time.Duration {
		return c.Services.Gateway.ShutdownTimeout + c.Services.Gateway.Usage.FlushTimeout
	},
		optIn: true, about: "OpenAI-compatible proxy in front of the providers: flags, metering, usage events (only when named)",
		section: func(c *Config) validator { return c.Services.Gateway },
		needs: func(c *Config) needs {
			g := c.Services.Gateway
			return needs{kafka: g.Usage.Sink == frontend.SinkKafka || g.Deferred.Enabled}
		},
		newService: func(c *Config, env platform.Env, host hostOptions) (*platform.Service, error) {
			return gateway.New(c.Services.Gateway, env, host.gateway...)
		}},
	{name: "authz", shutdown: func(c *Config) time.Duration {
		return c.Services.Authz.ShutdownTimeout + c.Services.Authz.Usage.FlushTimeout
	},
		optIn: true, about: "forward-auth endpoint for nginx, Envoy, Traefik, Kong, APISIX: flags and admission per request (only when named)",
		section: func(c *Config) validator { return c.Services.Authz },
		needs:   func(c *Config) needs { return needs{kafka: c.Services.Authz.Usage.Sink == frontend.SinkKafka} },
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return authz.New(c.Services.Authz, env)
		}},
	{name: "console", shutdown: func(*Config) time.Duration { return 5 * time.Second },
		optIn: true, about: "web console for operators: quotas, charts, flags and admin actions, pipeline health (only when named)",
		section: func(c *Config) validator { return c.Services.Console },
		needs:   always(needs{}),
		newService: func(c *Config, env platform.Env, _ hostOptions) (*platform.Service, error) {
			return console.New(c.Services.Console, env)
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
			if err := s.section(cfg).Validate(); err != nil {
				errs = append(errs, config.Under("services."+s.name, err))
			}
			if s.needs(cfg).policy && cfg.Policy.File == "" {
				errs = append(errs, fmt.Errorf("policy.file: is required by the %s (the quota policy it counts against); name the policy YAML", s.name))
			}
		}
	}
	if len(chosen) == 0 {
		return nil, errors.New("no services to run")
	}
	if name, need := shutdownNeed(cfg, chosen); need > cfg.ShutdownTimeout {
		errs = append(errs, fmt.Errorf("shutdown_timeout: %v is shorter than the %v the %s needs to stop (its shutdown_timeout, and those of the services that stop before it in this process); the process would cut its last flush short, so raise shutdown_timeout", cfg.ShutdownTimeout, need, name))
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

// shutdownNeed is the longest a process of the chosen services takes to
// stop, and the service whose stop ends last: a service stopping after
// others (stopsAfter) starts its own stop only once they have stopped.
func shutdownNeed(cfg *Config, chosen []service) (string, time.Duration) {
	byName := map[string]service{}
	for _, s := range chosen {
		byName[s.name] = s
	}
	var need func(s service) time.Duration
	need = func(s service) time.Duration { // stopsAfter has no cycles (lifecycle checks)
		var before time.Duration
		for _, a := range s.stopsAfter {
			if o, ok := byName[a]; ok {
				before = max(before, need(o))
			}
		}
		return before + s.shutdown(cfg)
	}
	var (
		last    string
		longest time.Duration
	)
	for _, s := range chosen {
		if d := need(s); d > longest {
			last, longest = s.name, d
		}
	}
	return last, longest
}

func runServices(ctx context.Context, cfg Config, names []string) error {
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
func preparePipeline(ctx context.Context, cfg *Config, names []string, host *hostOptions, log *slog.Logger) (*pipeline, error) {
	chosen, err := chooseServices(cfg, names)
	if err != nil {
		return nil, err
	}
	var want needs
	for _, s := range chosen {
		n := s.needs(cfg)
		want.kafka = want.kafka || n.kafka
		want.writesClickHouse = want.writesClickHouse || n.writesClickHouse
	}
	p := &pipeline{}
	switch {
	case cfg.Embedded.Enabled:
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
		log.Warn("embedded_kafka.enabled: using an in-process development broker (no replication; not for production)", "addr", addrs, "data_dir", dir)
	case want.kafka && len(cfg.Kafka.Brokers) == 0:
		return nil, errors.New("kafka.brokers: empty, but the services to run use Kafka; name the brokers (SLUICE_KAFKA_BROKERS), or set embedded_kafka.enabled for a development broker that keeps nothing")
	}
	if cfg.Migrate && want.writesClickHouse {
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
	p.env = cfg.env()
	p.env.Logger, p.env.Metrics, p.env.Health, p.env.Tracing = log, reg, ops.NewHealth(), tp
	opsCfg := cfg.Ops
	// The operational endpoints stop last: /metrics and /healthz answer
	// while the services drain, and the last flush's metrics can be read.
	opsTask := lifecycle.Task{Name: "ops", Run: func(ctx context.Context) error {
		return ops.Serve(ctx, opsCfg, reg, p.env.Health, log)
	}}
	for _, s := range chosen {
		opsTask.StopsAfter = append(opsTask.StopsAfter, s.name)
	}
	p.tasks = []lifecycle.Task{opsTask}
	for _, s := range chosen {
		p.env.Health.Expect(s.name)
		senv := p.env.Named(s.name)
		var after []string
		for _, a := range s.stopsAfter {
			if slices.ContainsFunc(chosen, func(o service) bool { return o.name == a }) {
				after = append(after, a)
			}
		}
		p.tasks = append(p.tasks, lifecycle.Task{Name: s.name, StopsAfter: after, Run: func(ctx context.Context) error {
			svc, err := s.newService(cfg, senv, *host)
			if err != nil {
				return err
			}
			return svc.Run(ctx)
		}})
	}
	return p, nil
}
