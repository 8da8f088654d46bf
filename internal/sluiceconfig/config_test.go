package sluiceconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testKey is a signal_auth key for the sections that sign or verify.
var testKey = "test:" + strings.Repeat("k", 64)

func TestChooseValidatesOnlyChosenSections(t *testing.T) {
	cfg := Defaults()
	cfg.SignalAuth.Keys = []string{testKey}
	cfg.Services.Ingest.GatewayKeys.File, cfg.Services.Ingest.AllowAnonymous = "", false // invalid on purpose
	if _, err := Choose(&cfg, []string{"alerter"}); err != nil {
		t.Fatalf("running only the alerter must not validate the ingest section: %v", err)
	}
	_, err := Choose(&cfg, []string{"ingest"})
	if err == nil || !strings.Contains(err.Error(), "services.ingest") {
		t.Fatalf("Choose(ingest) = %v, want an error naming services.ingest", err)
	}
	if _, err := Choose(&cfg, []string{"ingset"}); err == nil || !strings.Contains(err.Error(), `unknown service "ingset"`) {
		t.Fatalf("misspelt service: %v", err)
	}
}

// TestServicesThatNeedThePolicyNameIt: the aggregator and the reconciler
// count and audit against the policy; without policy.file they refuse to
// start, naming it, while the others run without one.
func TestServicesThatNeedThePolicyNameIt(t *testing.T) {
	cfg := Defaults()
	cfg.SignalAuth.Keys = []string{testKey}
	cfg.Services.Ingest.AllowAnonymous = true
	_, err := Choose(&cfg, nil)
	for _, name := range []string{"aggregator", "reconciler"} {
		if err == nil || !strings.Contains(err.Error(), "policy.file: is required by the "+name) {
			t.Errorf("no policy file: err = %v, want it to name policy.file for the %s", err, name)
		}
	}
	if _, err := Choose(&cfg, []string{"ingest", "enforcer", "alerter"}); err != nil {
		t.Errorf("ingest, enforcer and alerter without a policy file: %v", err)
	}
	cfg.Policy.File = "/etc/sluice/policy.yaml"
	if _, err := Choose(&cfg, nil); err != nil {
		t.Errorf("with policy.file: %v", err)
	}
}

// TestRenamedSettingsAreRefusedWithTheirNewName: a setting renamed when
// the configuration was unified stops the start with its new name, in the
// YAML file (with its line), as a flag and as an environment variable —
// never silently ignored.
func TestRenamedSettingsAreRefusedWithTheirNewName(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name       string
		yaml       string
		args       []string
		env        map[string]string
		want, line string
	}{
		{name: "root policy_file", yaml: "policy_file: /etc/p.yaml\n", want: "policy_file was renamed to policy.file", line: "line 1"},
		{name: "aggregator group", yaml: "services:\n  aggregator:\n    group: g\n", want: "services.aggregator.group was renamed to services.aggregator.consumer.group", line: "line 3"},
		{name: "gateway keys", yaml: "services:\n  gateway:\n    keys_file: k.yaml\n", want: "services.gateway.keys_file was renamed to tenant_keys.file"},
		{name: "flag", args: []string{"-services.enforcer.key_prefix=x:"}, want: "-services.enforcer.key_prefix was renamed to -redis.key_prefix"},
		{name: "environment", env: map[string]string{"SLUICE_SERVICES_ALERTER_SHUTDOWN_DRAIN": "5s"},
			want: "SLUICE_SERVICES_ALERTER_SHUTDOWN_DRAIN was renamed to SLUICE_SERVICES_ALERTER_SHUTDOWN_TIMEOUT"},
		{name: "removed", yaml: "services:\n  gateway:\n    request_id_memory: 10\n", want: "services.gateway.request_id_memory was removed: usage event ids are built by the gateway", line: "line 3"},
		{name: "removed flag", args: []string{"-services.gateway.request_id_memory=10"}, want: "-services.gateway.request_id_memory was removed"},
		{name: "removed environment", env: map[string]string{"SLUICE_SERVICES_GATEWAY_REQUEST_ID_MEMORY": "10"}, want: "SLUICE_SERVICES_GATEWAY_REQUEST_ID_MEMORY was removed"},
	} {
		args := c.args
		if c.yaml != "" {
			file := filepath.Join(dir, "sluice.yaml")
			if err := os.WriteFile(file, []byte(c.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			args = append([]string{"-config", file}, args...)
		}
		cfg := Defaults()
		_, err := Load(&cfg, args, func(k string) (string, bool) { v, ok := c.env[k]; return v, ok })
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.line) {
			t.Errorf("%s: err = %v, want it to say %q (%s)", c.name, err, c.want, c.line)
		}
	}
	// SLUICE_POLICY_FILE spells both the old and the new name: it still works.
	cfg := Defaults()
	if _, err := Load(&cfg, nil, func(k string) (string, bool) {
		if k == "SLUICE_POLICY_FILE" {
			return "/etc/p.yaml", true
		}
		return "", false
	}); err != nil || cfg.Policy.File != "/etc/p.yaml" {
		t.Errorf("SLUICE_POLICY_FILE: %v, policy.file %q", err, cfg.Policy.File)
	}
}

// TestSignalAuthIsRequiredWhereSignalsAre: the services that sign or
// verify signals refuse to start without a key unless signal_auth.mode is
// explicitly off; ingest alone needs none.
func TestSignalAuthIsRequiredWhereSignalsAre(t *testing.T) {
	for _, name := range []string{"aggregator", "enforcer", "alerter", "reconciler"} {
		cfg := Defaults()
		cfg.Policy.File = "/etc/sluice/policy.yaml"
		_, err := Choose(&cfg, []string{name})
		if err == nil || !strings.Contains(err.Error(), "signal_auth: no key") || !strings.Contains(err.Error(), "signal_auth.mode: off") {
			t.Errorf("%s without a key: %v, want signal_auth named with both ways out", name, err)
		}
		cfg.SignalAuth.Mode = "off"
		if _, err := Choose(&cfg, []string{name}); err != nil {
			t.Errorf("%s with signal_auth.mode off: %v", name, err)
		}
	}
	cfg := Defaults()
	cfg.Services.Ingest.AllowAnonymous = true
	if _, err := Choose(&cfg, []string{"ingest"}); err != nil {
		t.Errorf("ingest alone without a key: %v", err)
	}
}

// TestShutdownTimeoutCoversTheServices: the process's shutdown_timeout
// must leave each service its own (and a service stopping after others,
// as ingest after a gateway in the same process, theirs too): a shorter
// one would cut the aggregator's last flush or the reconciler's job short.
// The defaults fit every service.
func TestShutdownTimeoutCoversTheServices(t *testing.T) {
	cfg := Defaults()
	cfg.Policy.File = "policy.yaml"
	cfg.SignalAuth.Mode = "off"
	cfg.Services.Ingest.AllowAnonymous = true
	if _, err := Choose(&cfg, []string{"ingest", "aggregator", "enforcer", "alerter", "reconciler"}); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.ShutdownTimeout = 15 * time.Second
	if _, err := Choose(&cfg, []string{"reconciler"}); err == nil || !strings.Contains(err.Error(), "shutdown_timeout: 15s is shorter than the 30s the reconciler needs") {
		t.Errorf("reconciler under 15s: %v", err)
	}
	cfg.ShutdownTimeout = 20 * time.Second
	cfg.Services.Gateway.ShutdownTimeout, cfg.Services.Gateway.Usage.FlushTimeout = 4*time.Second, time.Second
	if _, err := Choose(&cfg, []string{"ingest", "gateway"}); err != nil {
		t.Errorf("gateway 5s then ingest 15s under 20s: %v", err)
	}
	cfg.Services.Gateway.ShutdownTimeout = 5 * time.Second
	if _, err := Choose(&cfg, []string{"ingest", "gateway"}); err == nil || !strings.Contains(err.Error(), "21s the ingest needs") {
		t.Errorf("gateway 6s then ingest 15s under 20s: %v", err)
	}
}
