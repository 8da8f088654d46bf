package main

import (
	"strings"
	"testing"
)

// testKey is a signal_auth key for the sections that sign or verify.
var testKey = "test:" + strings.Repeat("k", 64)

func TestChooseServicesValidatesOnlyChosenSections(t *testing.T) {
	cfg := defaultConfig()
	cfg.SignalAuth.Keys = []string{testKey}
	cfg.Services.Ingest.KeysFile, cfg.Services.Ingest.AllowAnonymous = "", false // invalid on purpose
	if _, err := chooseServices(&cfg, []string{"alerter"}); err != nil {
		t.Fatalf("running only the alerter must not validate the ingest section: %v", err)
	}
	_, err := chooseServices(&cfg, []string{"ingest"})
	if err == nil || !strings.Contains(err.Error(), "services.ingest") {
		t.Fatalf("chooseServices(ingest) = %v, want an error naming services.ingest", err)
	}
	if _, err := chooseServices(&cfg, []string{"ingset"}); err == nil || !strings.Contains(err.Error(), `unknown service "ingset"`) {
		t.Fatalf("misspelt service: %v", err)
	}
}

// TestSharedPolicyFileReachesServices: the root policy_file is every
// policy-reading service's policy_file unless the service's own section
// names another, and the sections then validate.
func TestSharedPolicyFileReachesServices(t *testing.T) {
	cfg := defaultConfig()
	cfg.SignalAuth.Keys = []string{testKey}
	cfg.PolicyFile = "/etc/sluice/policy.yaml"
	cfg.Services.Ingest.AllowAnonymous = true
	cfg.Services.Enforcer.PolicyFile = "/etc/sluice/enforcer.yaml" // its own section wins
	if _, err := chooseServices(&cfg, nil); err != nil {
		t.Fatalf("chooseServices with a root policy_file: %v", err)
	}
	got := map[string]string{
		"aggregator": cfg.Services.Aggregator.PolicyFile,
		"alerter":    cfg.Services.Alerter.PolicyFile,
		"reconciler": cfg.Services.Reconciler.PolicyFile,
		"enforcer":   cfg.Services.Enforcer.PolicyFile,
	}
	want := map[string]string{
		"aggregator": cfg.PolicyFile,
		"alerter":    cfg.PolicyFile,
		"reconciler": cfg.PolicyFile,
		"enforcer":   "/etc/sluice/enforcer.yaml",
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("services.%s.policy_file = %q, want %q", name, got[name], w)
		}
	}

	// Without a root policy_file and without their own, the services that
	// need a policy refuse to start, naming the setting.
	cfg = defaultConfig()
	cfg.PolicyFile = ""
	cfg.Services.Ingest.AllowAnonymous = true
	_, err := chooseServices(&cfg, nil)
	for _, name := range []string{"aggregator", "reconciler"} {
		if err == nil || !strings.Contains(err.Error(), "services."+name) || !strings.Contains(err.Error(), name+".policy_file") {
			t.Errorf("no policy file anywhere: err = %v, want it to name services.%s and %s.policy_file", err, name, name)
		}
	}
}

// TestSignalAuthIsRequiredWhereSignalsAre: the services that sign or
// verify signals refuse to start without a key unless signal_auth.mode is
// explicitly off; ingest alone needs none.
func TestSignalAuthIsRequiredWhereSignalsAre(t *testing.T) {
	for _, name := range []string{"aggregator", "enforcer", "alerter", "reconciler"} {
		cfg := defaultConfig()
		cfg.PolicyFile = "/etc/sluice/policy.yaml"
		_, err := chooseServices(&cfg, []string{name})
		if err == nil || !strings.Contains(err.Error(), "signal_auth: no key") || !strings.Contains(err.Error(), "signal_auth.mode: off") {
			t.Errorf("%s without a key: %v, want signal_auth named with both ways out", name, err)
		}
		cfg.SignalAuth.Mode = "off"
		if _, err := chooseServices(&cfg, []string{name}); err != nil {
			t.Errorf("%s with signal_auth.mode off: %v", name, err)
		}
	}
	cfg := defaultConfig()
	cfg.Services.Ingest.AllowAnonymous = true
	if _, err := chooseServices(&cfg, []string{"ingest"}); err != nil {
		t.Errorf("ingest alone without a key: %v", err)
	}
}
