package main

import (
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/ingest/apikey"
)

// TestComposeFileIsComplete parses docker-compose.yml (no Docker engine runs
// here) and checks what a user relies on: every backing service and Sluice
// itself are there, each long-running one has a healthcheck, Sluice waits
// for healthy dependencies and finished migrations, and every env variable
// it sets is one the sluice binary reads.
func TestComposeFileIsComplete(t *testing.T) {
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Build       any               `yaml:"build"`
			Healthcheck map[string]any    `yaml:"healthcheck"`
			DependsOn   map[string]any    `yaml:"depends_on"`
			Environment map[string]string `yaml:"environment"`
			Restart     string            `yaml:"restart"`
			Ports       []string          `yaml:"ports"`
			Command     []string          `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	for _, want := range []string{"kafka", "clickhouse", "redis", "alertmanager", "prometheus", "grafana", "sluice", "sluice-migrate", "sluice-console"} {
		s, ok := f.Services[want]
		if !ok {
			t.Errorf("service %s missing", want)
			continue
		}
		if s.Image == "" && s.Build == nil {
			t.Errorf("service %s has neither image nor build", want)
		}
		if s.Restart != "no" && s.Healthcheck == nil {
			t.Errorf("long-running service %s has no healthcheck", want)
		}
	}
	// An example stack must not offer its example key, admin API, metrics
	// or admin/admin Grafana to the network: every port is published on
	// loopback only.
	for name, s := range f.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every interface; write 127.0.0.1:%s", name, p, p)
			}
		}
	}
	for _, dep := range []string{"kafka", "clickhouse", "redis", "alertmanager", "sluice-migrate"} {
		if _, ok := f.Services["sluice"].DependsOn[dep]; !ok {
			t.Errorf("sluice does not wait for %s", dep)
		}
	}
	// Every variable of every sluice container must load into the real
	// configuration.
	cfg := sluiceconfig.Defaults()
	known := map[string]bool{}
	collectEnvNames(&cfg, known)
	for name, s := range f.Services {
		if s.Build == nil {
			continue
		}
		for k := range s.Environment {
			if !known[k] {
				t.Errorf("docker-compose sets %s for %s, which sluice does not read", k, name)
			}
		}
	}
	env := f.Services["sluice"].Environment

	// The configuration the compose file gives sluice must validate for
	// every service, with the mounted policy (deploy/compose) in place.
	lookup := func(k string) (string, bool) {
		v, ok := env[k]
		return strings.ReplaceAll(v, "/etc/sluice", "../../deploy/compose"), ok
	}
	ccfg := sluiceconfig.Defaults()
	if _, err := sluiceconfig.Load(&ccfg, nil, lookup); err != nil {
		t.Fatalf("compose configuration: %v", err)
	}
	if _, err := sluiceconfig.Choose(&ccfg, nil); err != nil {
		t.Fatalf("compose configuration does not validate: %v", err)
	}
	if _, err := policy.Load(ccfg.Policy.File); err != nil {
		t.Fatalf("compose policy: %v", err)
	}
	// The console runs in a process of its own: its configuration must
	// validate, and its pipeline page must read the pipeline's metrics
	// from the sluice service's ops listener (empty metrics_urls would read
	// the console process's own, which has none of them) and act through
	// the enforcer's admin API there.
	con := f.Services["sluice-console"]
	if strings.Join(con.Command, " ") != "run console" {
		t.Errorf("sluice-console runs %q, want run console", con.Command)
	}
	if _, ok := con.DependsOn["sluice"]; !ok {
		t.Error("sluice-console does not wait for sluice")
	}
	consoleCfg := sluiceconfig.Defaults()
	if _, err := sluiceconfig.Load(&consoleCfg, nil, func(k string) (string, bool) {
		v, ok := con.Environment[k]
		return strings.ReplaceAll(v, "/etc/sluice", "../../deploy/compose"), ok
	}); err != nil {
		t.Fatalf("sluice-console configuration: %v", err)
	}
	if _, err := sluiceconfig.Choose(&consoleCfg, []string{"console"}); err != nil {
		t.Fatalf("sluice-console configuration does not validate: %v", err)
	}
	if consoleCfg.ClickHouse.Addr != ccfg.ClickHouse.Addr || consoleCfg.Redis.Addr != ccfg.Redis.Addr || consoleCfg.Policy.File != ccfg.Policy.File {
		t.Errorf("sluice-console reads ClickHouse %s, Redis %s, policy %s; sluice writes ClickHouse %s, Redis %s, policy %s",
			consoleCfg.ClickHouse.Addr, consoleCfg.Redis.Addr, consoleCfg.Policy.File, ccfg.ClickHouse.Addr, ccfg.Redis.Addr, ccfg.Policy.File)
	}
	cc := consoleCfg.Services.Console
	_, opsPort, _ := strings.Cut(ccfg.Ops.Listen, ":")
	_, adminPort, _ := strings.Cut(ccfg.Services.Enforcer.Admin.Listen, ":")
	if len(cc.MetricsURLs) != 1 || cc.MetricsURLs[0] != "http://sluice:"+opsPort+"/metrics" {
		t.Errorf("sluice-console reads metrics from %q, want [http://sluice:%s/metrics] (the sluice service's ops listener)", cc.MetricsURLs, opsPort)
	}
	if cc.AdminURL != "http://sluice:"+adminPort || consoleCfg.Redis.KeyPrefix != ccfg.Redis.KeyPrefix {
		t.Errorf("sluice-console acts through %q with Redis prefix %q, want http://sluice:%s and the pipeline's %q",
			cc.AdminURL, consoleCfg.Redis.KeyPrefix, adminPort, ccfg.Redis.KeyPrefix)
	}

	// The example keys file must load, and its key must not be an
	// any-tenant key: it is published with the example.
	keys, err := os.ReadFile(ccfg.Services.Ingest.GatewayKeys.File)
	if err != nil {
		t.Fatal(err)
	}
	set, err := apikey.Parse(keys)
	if err != nil {
		t.Fatalf("compose keys file: %v", err)
	}
	id := set.Authenticate("sk-compose-example")
	if id == nil {
		t.Fatal("the example key sk-compose-example the keys file documents does not authenticate")
	}
	if id.Allows("any-other-tenant") {
		t.Error(`the example key may report any tenant; list the example tenants instead of tenants: ["*"]`)
	}
}

// collectEnvNames lists the SLUICE_* names the config loader accepts, by
// asking it: every flag it registers has an env twin.
func collectEnvNames(cfg *sluiceconfig.Config, out map[string]bool) {
	_, _ = sluiceconfig.Load(cfg, []string{}, func(name string) (string, bool) {
		out[name] = true
		return "", false
	})
	delete(out, "")
	for k := range out {
		if !strings.HasPrefix(k, "SLUICE_") {
			delete(out, k)
		}
	}
}
