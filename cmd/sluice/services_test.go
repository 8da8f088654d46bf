package main

import (
	"strings"
	"testing"
)

func TestChooseServicesValidatesOnlyChosenSections(t *testing.T) {
	cfg := defaultConfig()
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

func TestSharedPolicyFileReachesServices(t *testing.T) {
	cfg := defaultConfig()
	cfg.PolicyFile = "/etc/sluice/policy.yaml"
	cfg.Services.Ingest.AllowAnonymous = true
	if _, err := chooseServices(&cfg, nil); err != nil && !strings.Contains(err.Error(), "policy") {
		t.Logf("validation (file does not exist here): %v", err)
	}
	if cfg.Services.Alerter.PolicyFile != cfg.PolicyFile || cfg.Services.Reconciler.Policy != cfg.PolicyFile {
		t.Fatalf("policy_file not passed down: alerter %q reconciler %q", cfg.Services.Alerter.PolicyFile, cfg.Services.Reconciler.Policy)
	}
}
