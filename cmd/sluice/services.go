package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter"
	"github.com/sluicehq/sluice/services/reconciler"
)

// ServiceConfigs holds one section per service; each service validates its
// own.
type ServiceConfigs struct {
	Alerter    alerter.Config    `yaml:"alerter"`
	Reconciler reconciler.Config `yaml:"reconciler"`
}

func defaultServiceConfigs() ServiceConfigs {
	return ServiceConfigs{
		Alerter:    alerter.DefaultConfig(),
		Reconciler: reconciler.DefaultConfig(),
	}
}

// Validate checks every service section.
func (s ServiceConfigs) Validate() error {
	return errors.Join(s.Alerter.Validate(), s.Reconciler.Validate())
}

// service is one runnable part of Sluice. Every service package exposes
// Run(ctx, cfg, env); this table adapts them to the root configuration.
type service struct {
	name  string
	about string
	run   func(ctx context.Context, cfg Config, env platform.Env) error
}

// services lists, in data-flow order, what `sluice run` can start.
var services = []service{
	{name: "alerter", about: "signals → Alertmanager, DingTalk and Slack notifications",
		run: func(ctx context.Context, c Config, env platform.Env) error {
			a := c.Services.Alerter
			if a.PolicyFile == "" {
				a.PolicyFile = c.PolicyFile
			}
			return alerter.Run(ctx, a, env)
		}},
	{name: "reconciler", about: "nightly audit of counters against raw events; drift repair and alerts",
		run: func(ctx context.Context, c Config, env platform.Env) error {
			r := c.Services.Reconciler
			if r.Policy == "" {
				r.Policy = c.PolicyFile
			}
			return reconciler.Run(ctx, r, env)
		}},
}

func runServices(ctx context.Context, cfg Config, names []string) error {
	log := logging.New(cfg.Log, os.Stderr)
	var chosen []service
	for _, s := range services {
		if len(names) == 0 || slices.Contains(names, s.name) {
			chosen = append(chosen, s)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(services, func(s service) bool { return s.name == n }) {
			return fmt.Errorf("unknown service %q (see `sluice services`)", n)
		}
	}
	if len(chosen) == 0 {
		return errors.New("no services to run")
	}

	if len(cfg.Kafka.Brokers) == 0 {
		dir := cfg.Embedded.DataDir
		if dir != "" {
			dir, _ = filepath.Abs(dir)
		}
		cluster, addrs, err := kafkaconn.StartEmbedded(cfg.Embedded.Port, dir, schemas.TopicUsageV1, schemas.TopicSignalsV1)
		if err != nil {
			return err
		}
		defer cluster.Close()
		cfg.Kafka.Brokers = addrs
		log.Warn("no kafka.brokers configured: using an embedded development broker (not for production)", "addr", addrs)
	}
	if cfg.Migrate {
		if err := applyMigrations(ctx, cfg.ClickHouse, log); err != nil {
			return err
		}
	}

	reg := ops.NewRegistry()
	env := platform.Env{Logger: log, Metrics: reg, Health: ops.NewHealth(), Kafka: cfg.Kafka, ClickHouse: cfg.ClickHouse, Redis: cfg.Redis}
	tasks := []lifecycle.Task{{Name: "ops", Run: func(ctx context.Context) error {
		return ops.Serve(ctx, cfg.Ops, reg, env.Health, log)
	}}}
	for _, s := range chosen {
		senv := env.Named(s.name)
		tasks = append(tasks, lifecycle.Task{Name: s.name, Run: func(ctx context.Context) error { return s.run(ctx, cfg, senv) }})
	}
	return lifecycle.Run(ctx, log, cfg.ShutdownGrace, tasks...)
}
