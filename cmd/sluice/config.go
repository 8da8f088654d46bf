package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/gateway"
)

// Config is the whole process configuration: the shared parts first, then
// one section per service (see services.go).
type Config struct {
	Log        logging.Config   `yaml:"log"`
	Ops        ops.Config       `yaml:"ops"`
	Kafka      kafkaconn.Config `yaml:"kafka"`
	ClickHouse chconn.Config    `yaml:"clickhouse"`
	Redis      redisconn.Config `yaml:"redis"`
	// Embedded configures franz-go's in-process broker, started only when
	// kafka.brokers is empty (development; never in tests or production).
	Embedded struct {
		Port    int    `yaml:"port" help:"port of the embedded Kafka broker used when kafka.brokers is empty"`
		DataDir string `yaml:"data_dir" help:"folder where the embedded broker persists (empty: memory only)"`
	} `yaml:"embedded_kafka"`
	ShutdownGrace time.Duration `yaml:"shutdown_grace" help:"how long services get to finish in-flight work on shutdown"`
	// gatewayAdmitter, when not nil, is the request-path limiter the
	// gateway service asks before each call (the demo builds one from its
	// policy); not a setting.
	gatewayAdmitter frontend.Admitter
	// gatewayGuards, when not nil, are the upstream guards the gateway
	// service follows the policy with (the demo shows them); not a setting.
	gatewayGuards *gateway.Guards
	// Migrate applies migrations before services start.
	Migrate bool `yaml:"migrate" help:"apply ClickHouse migrations before starting services"`

	// PolicyFile is the quota policy every service reads unless its own
	// section names another.
	PolicyFile string `yaml:"policy_file" help:"quota policy YAML shared by the services (hot-reloaded)"`

	// SignalAuth is the key ring the aggregator and reconciler sign signals
	// with and the enforcer and alerter verify them with, the enforcer
	// signs admin actions with (verified by the enforcers and aggregators)
	// and the alerter its state: one setting, so that every service of a
	// deployment agrees.
	SignalAuth signalauth.Config `yaml:"signal_auth"`

	Services ServiceConfigs `yaml:"services"`
}

func defaultConfig() Config {
	c := Config{
		Log:           logging.Defaults(),
		Ops:           ops.Defaults(),
		Kafka:         kafkaconn.Defaults(),
		ClickHouse:    chconn.Defaults(),
		Redis:         redisconn.Defaults(),
		ShutdownGrace: 15 * time.Second,
		Migrate:       true,
		Services:      defaultServiceConfigs(),
	}
	c.Embedded.Port = 19192
	return c
}

// Validate checks every section and reports all problems at once.
func (c *Config) Validate() error {
	errs := []error{c.Log.Validate(), c.Ops.Validate(), c.Kafka.Validate(), c.ClickHouse.Validate(), c.Redis.Validate(), c.SignalAuth.Validate()}
	if c.ShutdownGrace <= 0 {
		errs = append(errs, errors.New("shutdown_grace: must be positive"))
	}
	if len(c.Kafka.Brokers) == 0 && (c.Embedded.Port < 1 || c.Embedded.Port > 65535) {
		errs = append(errs, fmt.Errorf("embedded_kafka.port: %d is outside 1..65535", c.Embedded.Port))
	}
	return errors.Join(errs...)
}

// loadConfig parses flags, env and YAML; the remaining arguments are
// service names.
func loadConfig(args []string) (Config, []string, error) {
	cfg := defaultConfig()
	return loadConfigWith(&cfg, args, os.LookupEnv)
}

func loadConfigWith(cfg *Config, args []string, lookupEnv func(string) (string, bool)) (Config, []string, error) {
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	if err := config.Load(cfg, config.Options{Args: args, FlagSet: fs, LookupEnv: lookupEnv}); err != nil {
		return *cfg, nil, err
	}
	return *cfg, fs.Args(), nil
}
