package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/services/gateway"
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

// TestGatewayAndAuthzAdmittingInOneProcessRefused: each admission
// Limiter registers the sluice_admission_* series on the process's one
// registry, which would panic on the second; the start is refused with
// what to do instead.
func TestGatewayAndAuthzAdmittingInOneProcessRefused(t *testing.T) {
	cfg := defaultConfig()
	g := &cfg.Services.Gateway
	g.KeysFile, g.Usage.Sink = "keys.yaml", "none"
	g.Upstreams = []gateway.Upstream{{Name: "up", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"*"}}}
	g.Admission.PolicyFile = "policy.yaml"
	if _, err := chooseServices(&cfg, []string{"gateway", "authz"}); err != nil {
		t.Fatalf("the gateway admitting and authz without admission: %v", err)
	}
	cfg.Services.Authz.Admission.PolicyFile = "policy.yaml"
	_, err := chooseServices(&cfg, []string{"gateway", "authz"})
	if err == nil || !strings.Contains(err.Error(), "services.authz.admission.policy_file") || !strings.Contains(err.Error(), "process of its own") {
		t.Fatalf("both admitting in one process: %v", err)
	}
	if _, err := chooseServices(&cfg, []string{"authz"}); err != nil {
		t.Fatalf("authz alone: %v", err)
	}
	// The same for usage events: one Emitter per process.
	cfg.Services.Authz.Admission.PolicyFile = ""
	g.Usage.Sink = gateway.SinkIngest
	cfg.Services.Authz.Usage.Sink = gateway.SinkIngest
	_, err = chooseServices(&cfg, []string{"gateway", "authz"})
	if err == nil || !strings.Contains(err.Error(), "services.authz.usage.sink") || !strings.Contains(err.Error(), "process of its own") {
		t.Fatalf("both sending usage events in one process: %v", err)
	}
	cfg.Services.Authz.Usage.Sink = gateway.SinkNone
	if _, err := chooseServices(&cfg, []string{"gateway", "authz"}); err != nil {
		t.Fatalf("the gateway sending events and authz not: %v", err)
	}
}
