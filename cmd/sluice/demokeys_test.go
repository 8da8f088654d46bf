package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/services/ingest/apikey"
)

// TestDemoKeysLoad: the keys file `sluice demo` writes must load in ingest
// (which needs explicit tenants) and let the reference gateway report all
// three demo tenants.
func TestDemoKeysLoad(t *testing.T) {
	path, key, err := writeDemoKeys()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(path)) })
	f, err := apikey.Open(path, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatalf("demo keys file: %v", err)
	}
	id := f.Authenticate(key)
	if id == nil {
		t.Fatal("demo key does not authenticate")
	}
	for _, tenant := range []string{"acme", "runaway", "trial"} {
		if !id.Allows(tenant) {
			t.Errorf("demo key may not report %s", tenant)
		}
	}
}

// TestDemoGatewayConfiguration: the demo's `sluice gateway` section
// validates, its keys file lets each load-generator tenant in under its
// own tenant, the gateway sends usage to the demo's ingest with the key
// ingest knows, and the gateway and console follow the enforcer's admin
// topic.
func TestDemoGatewayConfiguration(t *testing.T) {
	cfg := demoConfig()
	dir := t.TempDir()
	d := newDemoRun(demoGatewayAddr, demoUpstreamAddr, demoTenants, io.Discard, false)
	if err := d.configureGateway(&cfg, dir, "sk-ingest-demo"); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Services.Gateway.Validate(); err != nil {
		t.Fatalf("demo gateway section: %v", err)
	}
	data, err := os.ReadFile(cfg.TenantKeys.File)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := frontend.ParseKeys(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range demoTenants {
		c := keys.Authenticate(tn.APIKey)
		if c == nil || c.Tenant != tn.Name || !c.MayUse(tn.Model) {
			t.Errorf("demo key of %s: %+v", tn.Name, c)
		}
	}
	key, _ := os.ReadFile(cfg.Services.Gateway.Usage.IngestAPIKeyFile)
	if string(key) != "sk-ingest-demo\n" {
		t.Errorf("ingest key %q", key)
	}
	// Keys and tenants made at runtime reach the demo's gateway and console.
	if !cfg.Services.Gateway.FollowAdmin || !cfg.Services.Console.FollowAdmin {
		t.Errorf("the gateway follows the admin topic: %v, the console: %v; want both to follow it", cfg.Services.Gateway.FollowAdmin, cfg.Services.Console.FollowAdmin)
	}
}
