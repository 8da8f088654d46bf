package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type testConfig struct {
	Kafka struct {
		Brokers []string `yaml:"brokers"`
	} `yaml:"kafka"`
	Listen  string        `yaml:"listen"`
	Timeout time.Duration `yaml:"timeout"`
	Workers int           `yaml:"workers"`
	Debug   bool          `yaml:"debug"`
}

func (c *testConfig) Validate() error {
	if c.Workers < 1 {
		return errors.New("workers: must be at least 1")
	}
	return nil
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func quiet() *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestPrecedenceDefaultsYAMLEnvFlags(t *testing.T) {
	path := writeFile(t, "listen: ':1'\ntimeout: 5s\nworkers: 2\nkafka:\n  brokers: [a:1]\n")
	c := testConfig{Listen: ":0", Workers: 1, Timeout: time.Second}
	err := Load(&c, Options{
		FlagSet:   quiet(),
		Args:      []string{"-config", path, "-workers=4"},
		LookupEnv: env(map[string]string{"SLUICE_WORKERS": "3", "SLUICE_TIMEOUT": "7s", "SLUICE_KAFKA_BROKERS": "b:1, c:2"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != ":1" { // YAML over default
		t.Errorf("listen = %q, want :1 from YAML", c.Listen)
	}
	if c.Timeout != 7*time.Second { // env over YAML
		t.Errorf("timeout = %v, want 7s from env", c.Timeout)
	}
	if c.Workers != 4 { // flag over env
		t.Errorf("workers = %d, want 4 from flag", c.Workers)
	}
	if strings.Join(c.Kafka.Brokers, ",") != "b:1,c:2" {
		t.Errorf("brokers = %v, want [b:1 c:2] from env", c.Kafka.Brokers)
	}
}

func TestUnknownYAMLKeyIsAnError(t *testing.T) {
	path := writeFile(t, "workers: 1\nlisten_addr: x\n")
	c := testConfig{Workers: 1}
	err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-config", path}, LookupEnv: env(nil)})
	if err == nil || !strings.Contains(err.Error(), "listen_addr") || !strings.Contains(err.Error(), path) {
		t.Fatalf("want error naming the file and the unknown key, got %v", err)
	}
}

func TestBadEnvValueNamesTheVariable(t *testing.T) {
	c := testConfig{Workers: 1}
	err := Load(&c, Options{FlagSet: quiet(), LookupEnv: env(map[string]string{"SLUICE_TIMEOUT": "soon"})})
	if err == nil || !strings.Contains(err.Error(), "SLUICE_TIMEOUT") || !strings.Contains(err.Error(), "duration") {
		t.Fatalf("want error naming SLUICE_TIMEOUT and the expected form, got %v", err)
	}
}

func TestBadFlagValueIsRejected(t *testing.T) {
	c := testConfig{Workers: 1}
	err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-workers=many"}, LookupEnv: env(nil)})
	if err == nil || !strings.Contains(err.Error(), "workers") {
		t.Fatalf("want error naming -workers, got %v", err)
	}
}

func TestValidateRunsLast(t *testing.T) {
	c := testConfig{Workers: 1}
	err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-workers=0"}, LookupEnv: env(nil)})
	if err == nil || !strings.Contains(err.Error(), "workers: must be at least 1") {
		t.Fatalf("want the Validate error, got %v", err)
	}
}

func TestEmptyFileKeepsDefaults(t *testing.T) {
	path := writeFile(t, "")
	c := testConfig{Workers: 2, Listen: ":9"}
	if err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-config", path}, LookupEnv: env(nil)}); err != nil {
		t.Fatal(err)
	}
	if c.Workers != 2 || c.Listen != ":9" {
		t.Fatalf("defaults lost: %+v", c)
	}
}

func TestBareBoolFlag(t *testing.T) {
	c := testConfig{Workers: 1}
	if err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-debug"}, LookupEnv: env(nil)}); err != nil {
		t.Fatal(err)
	}
	if !c.Debug {
		t.Fatal("-debug did not set Debug")
	}
}

// Describe leaves out nothing: settings without an environment or flag
// spelling (lists of structs, maps) are listed too, with their entries'
// fields, so a generated reference is complete.
func TestDescribeListsYAMLOnlySettings(t *testing.T) {
	type token struct {
		Name string `yaml:"name" help:"who"`
	}
	var c struct {
		Listen string            `yaml:"listen" help:"address"`
		Tokens []token           `yaml:"tokens" help:"tokens"`
		Labels map[string]string `yaml:"labels" help:"labels"`
	}
	c.Listen = ":1"
	got, err := Describe(&c, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []Setting{
		{Path: "labels", Help: "labels", YAMLOnly: true},
		{Path: "listen", Env: "SLUICE_LISTEN", Default: ":1", Help: "address"},
		{Path: "tokens", Help: "tokens", YAMLOnly: true},
		{Path: "tokens[].name", Help: "who", YAMLOnly: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("setting %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestHelpNamesYAMLOnlySettingsAndSmallIntsAreSettable(t *testing.T) {
	var c struct {
		Replicas int16 `yaml:"replicas" help:"copies"`
		Tokens   []struct {
			Name string `yaml:"name" help:"who"`
		} `yaml:"tokens" help:"admin tokens"`
	}
	var out strings.Builder
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&out)
	if err := Load(&c, Options{Args: []string{"-h"}, FlagSet: fs, LookupEnv: env(nil)}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("Load -h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"-replicas", "tokens\n", "admin tokens", "tokens[].name"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, out.String())
		}
	}
	if err := Load(&c, Options{FlagSet: quiet(), LookupEnv: env(map[string]string{"SLUICE_REPLICAS": "3"})}); err != nil {
		t.Fatal(err)
	}
	if c.Replicas != 3 {
		t.Fatalf("int16 from the environment: %d, want 3", c.Replicas)
	}
}

// Sink is embedded inline in inlineConfig, as services/gateway embeds its
// EventSink in UsageConfig.
type Sink struct {
	URL    string `yaml:"url"`
	Buffer int    `yaml:"buffer"`
}

type inlineConfig struct {
	Usage struct {
		Sink     `yaml:",inline"`
		Estimate bool `yaml:"estimate"`
	} `yaml:"usage"`
}

// TestInlineStructSettingsBelongToTheParent: the settings of a struct
// embedded with yaml ",inline" are named as its parent's own, in YAML, the
// environment, the flags and the reference.
func TestInlineStructSettingsBelongToTheParent(t *testing.T) {
	path := writeFile(t, "usage:\n  url: http://a\n  estimate: true\n")
	var c inlineConfig
	err := Load(&c, Options{FlagSet: quiet(), Args: []string{"-config", path, "-usage.buffer=7"},
		LookupEnv: env(map[string]string{"SLUICE_USAGE_URL": "http://b"})})
	if err != nil {
		t.Fatal(err)
	}
	if c.Usage.URL != "http://b" || c.Usage.Buffer != 7 || !c.Usage.Estimate {
		t.Fatalf("loaded %+v, want url from env, buffer from the flag, estimate from YAML", c.Usage)
	}
	settings, err := Describe(&inlineConfig{}, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, s := range settings {
		keys = append(keys, s.Path)
	}
	if got := strings.Join(keys, ","); got != "usage.buffer,usage.estimate,usage.url" {
		t.Fatalf("settings %s, want usage.buffer, usage.estimate and usage.url", got)
	}
}
