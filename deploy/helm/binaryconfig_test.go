package helm

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
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
	"github.com/sluicehq/sluice/services/aggregator"
	"github.com/sluicehq/sluice/services/alerter"
	"github.com/sluicehq/sluice/services/authz"
	"github.com/sluicehq/sluice/services/console"
	"github.com/sluicehq/sluice/services/enforcer"
	"github.com/sluicehq/sluice/services/gateway"
	"github.com/sluicehq/sluice/services/ingest"
	"github.com/sluicehq/sluice/services/reconciler"
)

// The sluice binary's root configuration lives in package main
// (cmd/sluice/config.go and services.go), which no test can import. This
// file repeats its shape — the same sections of the same exported types,
// the same defaults and root checks — so the chart's output can be loaded
// with the real loader (platform/config) and validated by each section's
// own Validate. TestMirrorIsTheBinarysConfiguration holds the copy to the
// binary: every setting, environment variable, default and help text it
// describes must equal docs/configuration.md, which cmd/sluice's
// TestConfigurationReferenceIsCurrent holds to the binary in turn. A
// setting added to the binary fails that test until it is added here.

type binaryConfig struct {
	Log        logging.Config   `yaml:"log"`
	Ops        ops.Config       `yaml:"ops"`
	Tracing    tracing.Config   `yaml:"tracing"`
	Kafka      kafkaconn.Config `yaml:"kafka"`
	ClickHouse chconn.Config    `yaml:"clickhouse"`
	Redis      redisconn.Config `yaml:"redis"`
	Embedded   struct {
		Enabled bool   `yaml:"enabled" help:"run an in-process development Kafka broker (franz-go's kfake) and use it instead of kafka.brokers: for the demo and trying Sluice out only — it has no replication and, without data_dir, forgets everything at exit"`
		Port    int    `yaml:"port" help:"port of the embedded Kafka broker"`
		DataDir string `yaml:"data_dir" help:"folder where the embedded broker persists (empty: memory only)"`
	} `yaml:"embedded_kafka"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"how long the process gives its services, together, to finish in-flight work on shutdown (each service's own shutdown_timeout bounds its part)"`
	Migrate         bool          `yaml:"migrate" help:"apply ClickHouse migrations before starting the services that write ClickHouse (aggregator, enforcer, reconciler)"`

	Policy     platform.FileSource `yaml:"policy" help:"the quota policy every service follows (tenants, quotas, limits, upstreams, channels, prices; hot-reloaded)"`
	TenantKeys platform.FileSource `yaml:"tenant_keys" help:"the tenant API keys sluice gateway and authz authenticate callers with (id, sha256, tenant, user, models, priority, may_set_priority, class)"`

	SignalAuth signalauth.Config `yaml:"signal_auth"`

	Services binaryServices `yaml:"services"`
}

type binaryServices struct {
	Ingest     ingest.Config     `yaml:"ingest"`
	Aggregator aggregator.Config `yaml:"aggregator"`
	Enforcer   enforcer.Config   `yaml:"enforcer"`
	Alerter    alerter.Config    `yaml:"alerter"`
	Reconciler reconciler.Config `yaml:"reconciler"`
	Gateway    gateway.Config    `yaml:"gateway"`
	Authz      authz.Config      `yaml:"authz"`
	Console    console.Config    `yaml:"console"`
}

func defaultBinaryConfig() binaryConfig {
	c := binaryConfig{
		Log:             logging.Defaults(),
		Ops:             ops.Defaults(),
		Tracing:         tracing.Defaults(),
		Kafka:           kafkaconn.Defaults(),
		ClickHouse:      chconn.Defaults(),
		Redis:           redisconn.Defaults(),
		ShutdownTimeout: 35 * time.Second,
		Migrate:         true,
		Policy:          platform.FileSource{Reload: platform.DefaultReload},
		TenantKeys:      platform.FileSource{Reload: 5 * time.Second},
		Services: binaryServices{
			Ingest:     ingest.DefaultConfig(),
			Aggregator: aggregator.DefaultConfig(),
			Enforcer:   enforcer.DefaultConfig(),
			Alerter:    alerter.DefaultConfig(),
			Reconciler: reconciler.DefaultConfig(),
			Gateway:    gateway.DefaultConfig(),
			Authz:      authz.DefaultConfig(),
			Console:    console.DefaultConfig(),
		},
	}
	c.Embedded.Port = 19192
	return c
}

// Validate is cmd/sluice's Config.Validate: the shared sections.
func (c *binaryConfig) Validate() error {
	errs := []error{c.Log.Validate(), c.Ops.Validate(), c.Tracing.Validate(), c.Kafka.Validate(), c.ClickHouse.Validate(), c.Redis.Validate(), c.SignalAuth.Validate(),
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

// binaryService is what cmd/sluice's services table says of each service
// that the chart relies on.
type binaryService struct {
	section func(c *binaryConfig) interface{ Validate() error }
	// policy: refuses to start without policy.file; signals: signs or
	// verifies signals (needs signal_auth's keys).
	policy, signals bool
}

var binaryServiceTable = map[string]binaryService{
	"ingest":     {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Ingest }},
	"aggregator": {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Aggregator }, policy: true, signals: true},
	"enforcer":   {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Enforcer }, signals: true},
	"alerter":    {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Alerter }, signals: true},
	"reconciler": {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Reconciler }, policy: true, signals: true},
	"gateway":    {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Gateway }},
	"authz":      {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Authz }},
	"console":    {section: func(c *binaryConfig) interface{ Validate() error } { return c.Services.Console }},
}

// loadBinaryConfig loads args (after the command) and the environment the
// way `sluice run` and `sluice migrate` do, and returns the configuration
// and the service names.
func loadBinaryConfig(args []string, env map[string]string) (binaryConfig, []string, error) {
	cfg := defaultBinaryConfig()
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	err := config.Load(&cfg, config.Options{Args: args, FlagSet: fs, LookupEnv: func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	}})
	if err != nil {
		return cfg, nil, err
	}
	return cfg, fs.Args(), nil
}

// chooseServices is cmd/sluice's chooseServices: each named service's
// section, the policy file the services that count need, and the signing
// keys, all read as at start.
func chooseServices(cfg *binaryConfig, names []string) error {
	if len(names) == 0 {
		return errors.New("no service named: the chart runs one service per pod")
	}
	var errs []error
	signals := false
	for _, n := range names {
		s, ok := binaryServiceTable[n]
		if !ok {
			return fmt.Errorf("unknown service %q", n)
		}
		if err := s.section(cfg).Validate(); err != nil {
			errs = append(errs, config.Under("services."+n, err))
		}
		if s.policy && cfg.Policy.File == "" {
			errs = append(errs, fmt.Errorf("policy.file: is required by the %s", n))
		}
		signals = signals || s.signals
	}
	if signals {
		if _, err := signalauth.Open(cfg.SignalAuth, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// knownEnv lists the SLUICE_* variables the loader reads.
func knownEnv(t testing.TB) map[string]bool {
	cfg := defaultBinaryConfig()
	settings, err := config.Describe(&cfg, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"SLUICE_CONFIG": true}
	for _, s := range settings {
		if !s.YAMLOnly {
			known[s.Env] = true
		}
	}
	return known
}

// TestMirrorIsTheBinarysConfiguration compares every setting of the copy
// above, as the loader describes it, with docs/configuration.md (written by
// `sluice config-reference` from the binary's own Config).
func TestMirrorIsTheBinarysConfiguration(t *testing.T) {
	cfg := defaultBinaryConfig()
	settings, err := config.Describe(&cfg, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	for _, s := range settings {
		env := "`" + s.Env + "`"
		if s.YAMLOnly {
			env = "(YAML only)"
		}
		def := s.Default
		if def == "[]" || def == "map[]" {
			def = ""
		}
		if def != "" {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&want, "| `%s` | %s | %s | %s |\n", s.Path, env, def, strings.ReplaceAll(s.Help, "|", "\\|"))
	}
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	var have bytes.Buffer
	for _, line := range strings.SplitAfter(string(doc), "\n") {
		if strings.HasPrefix(line, "| `") {
			have.WriteString(line)
		}
	}
	if have.String() != want.String() {
		wl, hl := strings.Split(want.String(), "\n"), strings.Split(have.String(), "\n")
		for i := 0; i < len(wl) || i < len(hl); i++ {
			var w, h string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(hl) {
				h = hl[i]
			}
			if w != h {
				t.Fatalf("the copy of cmd/sluice's Config in this package differs from docs/configuration.md (the binary's) at setting %d:\n copy:   %s\n binary: %s\nUpdate binaryconfig_test.go to the binary's Config.", i+1, w, h)
			}
		}
	}
}
