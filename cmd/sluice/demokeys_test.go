package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

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
