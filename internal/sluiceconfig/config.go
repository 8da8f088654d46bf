// Package sluiceconfig is the sluice binary's root configuration: the
// shape of sluice.yaml (the shared sections and one section per service),
// its defaults, its checks, the settings it refuses by their old names, and
// what the binary knows of each service before it runs one (which section,
// which backing services, how long its stop may take). cmd/sluice runs
// services with it; the Helm chart's tests load the chart's output with
// it, so the chart is held to the binary's own rules rather than a copy.
package sluiceconfig

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/platform/tracing"
)

// Config is the whole process configuration: the shared sections first,
// each declared once and read by every service that needs it, then one
// section per service (see services.go). Only settings live here; what a
// host adds at run time (the demo's observers) goes to the services as
// options (cmd/sluice's hostOptions).
type Config struct {
	Log        logging.Config   `yaml:"log"`
	Ops        ops.Config       `yaml:"ops"`
	Tracing    tracing.Config   `yaml:"tracing"`
	Kafka      kafkaconn.Config `yaml:"kafka"`
	ClickHouse chconn.Config    `yaml:"clickhouse"`
	Redis      redisconn.Config `yaml:"redis"`
	Topics     platform.Topics  `yaml:"topics"`
	// Embedded configures franz-go's in-process broker, a development
	// substitute for Kafka that runs only when asked for by name (sluice
	// demo and make run ask): no broker is ever started because
	// kafka.brokers was left empty.
	Embedded struct {
		Enabled bool   `yaml:"enabled" help:"run an in-process development Kafka broker (franz-go's kfake) and use it instead of kafka.brokers: for the demo and trying Sluice out only — it has no replication and, without data_dir, forgets everything at exit"`
		Port    int    `yaml:"port" help:"port of the embedded Kafka broker"`
		DataDir string `yaml:"data_dir" help:"folder where the embedded broker persists (empty: memory only)"`
	} `yaml:"embedded_kafka"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"how long the process gives its services, together, to finish in-flight work on shutdown (each service's own shutdown_timeout bounds its part)"`
	// Migrate applies migrations before services that write ClickHouse.
	Migrate bool `yaml:"migrate" help:"apply ClickHouse migrations before starting the services that write ClickHouse (aggregator, enforcer, reconciler)"`

	Policy     platform.FileSource `yaml:"policy" help:"the quota policy every service follows (tenants, quotas, limits, upstreams, channels, prices; hot-reloaded)"`
	TenantKeys platform.FileSource `yaml:"tenant_keys" help:"the tenant API keys sluice gateway and authz authenticate callers with (id, sha256, tenant, user, models, priority, may_set_priority, class)"`

	// SignalAuth is the key ring the aggregator and reconciler sign signals
	// with and the enforcer and alerter verify them with, the enforcer
	// signs admin actions with (verified by the enforcers and aggregators)
	// and the alerter its state: one setting, so that every service of a
	// deployment agrees.
	SignalAuth signalauth.Config `yaml:"signal_auth"`

	Services ServiceConfigs `yaml:"services"`
}

// Defaults is the configuration before any file, environment variable or
// flag is read.
func Defaults() Config {
	c := Config{
		Log:             logging.Defaults(),
		Ops:             ops.Defaults(),
		Tracing:         tracing.Defaults(),
		Kafka:           kafkaconn.Defaults(),
		ClickHouse:      chconn.Defaults(),
		Redis:           redisconn.Defaults(),
		Topics:          platform.DefaultTopics(),
		ShutdownTimeout: 35 * time.Second,
		Migrate:         true,
		Policy:          platform.FileSource{Reload: platform.DefaultReload},
		TenantKeys:      platform.FileSource{Reload: 5 * time.Second},
		Services:        defaultServiceConfigs(),
	}
	c.Embedded.Port = 19192
	return c
}

// Validate checks every shared section and reports all problems at once;
// the services' sections are checked when a service is chosen.
func (c *Config) Validate() error {
	errs := []error{c.Log.Validate(), c.Ops.Validate(), c.Tracing.Validate(), c.Kafka.Validate(), c.ClickHouse.Validate(), c.Redis.Validate(), c.Topics.Validate(), c.SignalAuth.Validate(),
		c.Policy.Validate("policy"), c.TenantKeys.Validate("tenant_keys")}
	if c.Embedded.Enabled && len(c.Kafka.Brokers) > 0 {
		errs = append(errs, errors.New("embedded_kafka.enabled: set together with kafka.brokers; use one or the other"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("shutdown_timeout: must be positive"))
	}
	if c.Embedded.Enabled && (c.Embedded.Port < 1 || c.Embedded.Port > 65535) {
		errs = append(errs, fmt.Errorf("embedded_kafka.port: %d is outside 1..65535", c.Embedded.Port))
	}
	return errors.Join(errs...)
}

// Env is the shared part of what every service's Run receives.
func (c *Config) Env() platform.Env {
	return platform.Env{Kafka: c.Kafka, ClickHouse: c.ClickHouse, Redis: c.Redis, Topics: c.Topics, SignalAuth: c.SignalAuth, Policy: c.Policy, TenantKeys: c.TenantKeys}
}

// renamed lists the settings renamed when the configuration was unified:
// each is refused at start with its new name (README, "Upgrade notes").
// removed lists the settings that went without a successor, and why.
var removed = map[string]string{
	"services.gateway.request_id_memory": "usage event ids are built by the gateway, so a client reusing an x-request-id no longer needs catching",
	"services.gateway.admin_topic":       "the admin topic is the root topics.admin; set services.gateway.follow_admin: true to follow it",
	"services.console.admin_topic":       "the admin topic is the root topics.admin; set services.console.follow_admin: true to follow it",
}

var renamed = map[string]string{
	"policy_file":    "policy.file",
	"shutdown_grace": "shutdown_timeout",

	"services.ingest.keys_file":             "services.ingest.gateway_keys.file",
	"services.ingest.keys_reload_interval":  "services.ingest.gateway_keys.reload",
	"services.ingest.topic":                 "topics.usage",
	"services.ingest.usage_topic":           "topics.usage",
	"services.ingest.usage_api.policy_file": "policy.file",
	"services.ingest.usage_api.key_prefix":  "redis.key_prefix",

	"services.aggregator.policy_file":     "policy.file",
	"services.aggregator.policy_reload":   "policy.reload",
	"services.aggregator.group":           "services.aggregator.consumer.group",
	"services.aggregator.session_timeout": "services.aggregator.consumer.session_timeout",
	"services.aggregator.topic":           "topics.usage",
	"services.aggregator.usage_topic":     "topics.usage",
	"services.aggregator.signals_topic":   "topics.signals",
	"services.aggregator.admin_topic":     "topics.admin",
	"services.aggregator.shutdown_grace":  "services.aggregator.shutdown_timeout",

	"services.enforcer.policy_file":     "policy.file",
	"services.enforcer.signals_topic":   "topics.signals",
	"services.enforcer.admin_topic":     "topics.admin",
	"services.enforcer.policy_reload":   "policy.reload",
	"services.enforcer.consumer_group":  "services.enforcer.consumer.group",
	"services.enforcer.session_timeout": "services.enforcer.consumer.session_timeout",
	"services.enforcer.key_prefix":      "redis.key_prefix",
	"services.enforcer.shutdown_grace":  "services.enforcer.shutdown_timeout",

	"services.alerter.topic":           "topics.signals",
	"services.alerter.signals_topic":   "topics.signals",
	"services.alerter.group":           "services.alerter.consumer.group",
	"services.alerter.session_timeout": "services.alerter.consumer.session_timeout",
	"services.alerter.policy_file":     "policy.file",
	"services.alerter.policy_reload":   "policy.reload",
	"services.alerter.shutdown_drain":  "services.alerter.shutdown_timeout",

	"services.reconciler.policy_file":    "policy.file",
	"services.reconciler.signals_topic":  "topics.signals",
	"services.reconciler.policy_reload":  "policy.reload",
	"services.reconciler.shutdown_grace": "services.reconciler.shutdown_timeout",

	"services.gateway.upstreams":                   "upstreams in the policy file (policy.file), each entry with its base_url, models and guard",
	"services.gateway.keys_file":                   "tenant_keys.file",
	"services.gateway.keys_reload_interval":        "tenant_keys.reload",
	"services.gateway.checker.key_prefix":          "redis.key_prefix",
	"services.gateway.admission.policy_file":       "policy.file",
	"services.gateway.admission.policy_reload":     "policy.reload",
	"services.gateway.admission.key_prefix":        "redis.key_prefix",
	"services.gateway.shared_upstreams.key_prefix": "redis.key_prefix",
	"services.gateway.usage.topic":                 "topics.usage",
	"services.gateway.usage.usage_topic":           "topics.usage",
	"services.gateway.deferred.group":              "services.gateway.deferred.consumer.group",
	"services.gateway.deferred.key_prefix":         "redis.key_prefix",
	"services.gateway.usage_api.policy_file":       "policy.file",
	"services.gateway.usage_api.key_prefix":        "redis.key_prefix",

	"services.authz.keys_file":               "tenant_keys.file",
	"services.authz.keys_reload_interval":    "tenant_keys.reload",
	"services.authz.checker.key_prefix":      "redis.key_prefix",
	"services.authz.admission.policy_file":   "policy.file",
	"services.authz.admission.policy_reload": "policy.reload",
	"services.authz.admission.key_prefix":    "redis.key_prefix",
	"services.authz.usage.topic":             "topics.usage",
	"services.authz.usage.usage_topic":       "topics.usage",

	"services.console.policy_file": "policy.file",
	"services.console.key_prefix":  "redis.key_prefix",
}

// Load reads args (after the command: flags, then service names), the
// environment through lookupEnv and the YAML file they name into cfg, in
// increasing precedence, refusing renamed and removed settings by their
// new name; it returns the service names left after the flags.
func Load(cfg *Config, args []string, lookupEnv func(string) (string, bool)) ([]string, error) {
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	if err := config.Load(cfg, config.Options{Args: args, FlagSet: fs, LookupEnv: lookupEnv, Renamed: renamed, Removed: removed}); err != nil {
		return nil, err
	}
	return fs.Args(), nil
}
