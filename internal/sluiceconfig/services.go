package sluiceconfig

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/signalauth"
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

// Service is what the binary knows of one of its services before running
// it: the part of the configuration it reads and what that asks of the
// process. How to build the service is the binary's (cmd/sluice).
type Service struct {
	Name  string
	About string
	// Section returns the service's configuration section, to validate.
	Section func(c *Config) Validator
	// Needs says which backing services the service uses with c: the
	// process connects to (and, for Kafka, may start) only what its
	// services need.
	Needs func(c *Config) Needs
	// Signals is true for the services that sign or verify signals, and
	// so need signal_auth.
	Signals bool
	// OptIn services run only when named: `sluice run` without names
	// starts the pipeline, not a gateway that needs upstreams and keys.
	OptIn bool
	// StopsAfter names services that, when they run in the same process,
	// must have stopped before this one is asked to (lifecycle.Task.StopsAfter).
	StopsAfter []string
	// Shutdown is how long the service may take to stop with c: the
	// process's shutdown_timeout must cover it, or the process would cut
	// the service's last flush short.
	Shutdown func(c *Config) time.Duration
}

// Needs are the backing services and shared files a service uses.
type Needs struct {
	Kafka bool
	// WritesClickHouse services get the migrations first.
	WritesClickHouse bool
	// Policy: the service cannot run without policy.file.
	Policy bool
}

// Validator is a configuration section.
type Validator interface{ Validate() error }

// always returns a Needs function that ignores the configuration.
func always(n Needs) func(*Config) Needs { return func(*Config) Needs { return n } }

// Services lists, in data-flow order, what `sluice run` can start.
var Services = []Service{
	{Name: "ingest", Shutdown: func(c *Config) time.Duration { return c.Services.Ingest.ShutdownTimeout },
		About: "HTTP API for gateways → Kafka sluice.usage.v1",
		// A gateway or authz in this process flushes its last usage
		// events into ingest as it stops: ingest must still be there to
		// take them.
		StopsAfter: []string{"gateway", "authz"},
		Section:    func(c *Config) Validator { return c.Services.Ingest },
		Needs:      always(Needs{Kafka: true})},
	{Name: "aggregator", Shutdown: func(c *Config) time.Duration { return c.Services.Aggregator.ShutdownTimeout },
		Signals: true, About: "usage events → rates, totals, predictions, tiers → ClickHouse and signals",
		Section: func(c *Config) Validator { return c.Services.Aggregator },
		Needs:   always(Needs{Kafka: true, WritesClickHouse: true, Policy: true})},
	{Name: "enforcer", Shutdown: func(c *Config) time.Duration { return c.Services.Enforcer.ShutdownTimeout },
		Signals: true, About: "signals → breakers → Redis flags for the gateway Checker; admin API",
		Section: func(c *Config) Validator { return c.Services.Enforcer },
		Needs:   always(Needs{Kafka: true, WritesClickHouse: true})},
	{Name: "alerter", Shutdown: func(c *Config) time.Duration { return c.Services.Alerter.ShutdownTimeout },
		Signals: true, About: "signals → Alertmanager, DingTalk, Feishu, WeCom, Slack and webhook notifications",
		Section: func(c *Config) Validator { return c.Services.Alerter },
		Needs:   always(Needs{Kafka: true})},
	{Name: "reconciler", Shutdown: func(c *Config) time.Duration { return c.Services.Reconciler.ShutdownTimeout },
		Signals: true, About: "nightly audit of counters against raw events; drift repair and alerts",
		Section: func(c *Config) Validator { return c.Services.Reconciler },
		Needs:   always(Needs{Kafka: true, WritesClickHouse: true, Policy: true})},
	{Name: "gateway", Shutdown: func(c *Config) time.Duration {
		return c.Services.Gateway.ShutdownTimeout + c.Services.Gateway.Usage.FlushTimeout
	},
		OptIn: true, About: "OpenAI-compatible proxy in front of the providers: flags, metering, usage events (only when named)",
		Section: func(c *Config) Validator { return c.Services.Gateway },
		Needs: func(c *Config) Needs {
			g := c.Services.Gateway
			return Needs{Kafka: g.Usage.Sink == frontend.SinkKafka || g.Deferred.Enabled || g.FollowAdmin}
		}},
	{Name: "authz", Shutdown: func(c *Config) time.Duration {
		return c.Services.Authz.ShutdownTimeout + c.Services.Authz.Usage.FlushTimeout
	},
		OptIn: true, About: "forward-auth endpoint for nginx, Envoy, Traefik, Kong, APISIX: flags and admission per request (only when named)",
		Section: func(c *Config) Validator { return c.Services.Authz },
		Needs:   func(c *Config) Needs { return Needs{Kafka: c.Services.Authz.Usage.Sink == frontend.SinkKafka} }},
	{Name: "console", Shutdown: func(*Config) time.Duration { return 5 * time.Second },
		OptIn: true, About: "web console for operators: quotas, charts, flags and admin actions, pipeline health (only when named)",
		Section: func(c *Config) Validator { return c.Services.Console },
		Needs:   func(c *Config) Needs { return Needs{Kafka: c.Services.Console.FollowAdmin} }},
}

// Lookup returns the service named name.
func Lookup(name string) (Service, bool) {
	i := slices.IndexFunc(Services, func(s Service) bool { return s.Name == name })
	if i < 0 {
		return Service{}, false
	}
	return Services[i], true
}

// Choose resolves service names (none = all but the opt-in ones) and
// validates the chosen services' sections, the files and keys they need
// and the process's shutdown budget, reporting every problem at once.
func Choose(cfg *Config, names []string) ([]Service, error) {
	for _, n := range names {
		if _, ok := Lookup(n); !ok {
			return nil, fmt.Errorf("unknown service %q (see `sluice services`)", n)
		}
	}
	var (
		chosen []Service
		errs   []error
	)
	for _, s := range Services {
		if (len(names) == 0 && !s.OptIn) || slices.Contains(names, s.Name) {
			chosen = append(chosen, s)
			if err := s.Section(cfg).Validate(); err != nil {
				errs = append(errs, config.Under("services."+s.Name, err))
			}
			if s.Needs(cfg).Policy && cfg.Policy.File == "" {
				errs = append(errs, fmt.Errorf("policy.file: is required by the %s (the quota policy it counts against); name the policy YAML", s.Name))
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
	if slices.ContainsFunc(chosen, func(s Service) bool { return s.Signals }) {
		if _, err := signalauth.Open(cfg.SignalAuth, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return chosen, errors.Join(errs...)
}

// shutdownNeed is the longest a process of the chosen services takes to
// stop, and the service whose stop ends last: a service stopping after
// others (StopsAfter) starts its own stop only once they have stopped.
func shutdownNeed(cfg *Config, chosen []Service) (string, time.Duration) {
	byName := map[string]Service{}
	for _, s := range chosen {
		byName[s.Name] = s
	}
	var need func(s Service) time.Duration
	need = func(s Service) time.Duration { // StopsAfter has no cycles (lifecycle checks)
		var before time.Duration
		for _, a := range s.StopsAfter {
			if o, ok := byName[a]; ok {
				before = max(before, need(o))
			}
		}
		return before + s.Shutdown(cfg)
	}
	var (
		last    string
		longest time.Duration
	)
	for _, s := range chosen {
		if d := need(s); d > longest {
			last, longest = s.Name, d
		}
	}
	return last, longest
}
