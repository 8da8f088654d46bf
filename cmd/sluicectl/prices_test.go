package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/policy"
)

const importFile = `version: 1
currency: USD
as_of: 2026-11-20
sources: {contract: "our provider contract, 2026"}
prices:
  - {model: gpt-4o, input: 2.00, cached_input: 1.00, output: 8.00}
  - {model: house-model, input: 1, output: 2}
`

// TestPricesImportInstallsTheFileThePolicyReads: `sluicectl prices import
// FILE` validates FILE, refuses a bad one naming the field and limit
// (leaving the installed prices alone), and installs a good one as the
// policy's prices_file, which the policy then prices with.
func TestPricesImportInstallsTheFileThePolicyReads(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("prices_file: prices.yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(dir, "prices.yaml")
	if err := os.WriteFile(installed, []byte(strings.Replace(importFile, "house-model", "old-model", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := runPricesTo(context.Background(), append([]string{"import", "-policy.file", pol}, args...), &out)
		return out.String(), err
	}
	write := func(name, body string) string {
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}

	bad := write("bad.yaml", strings.Replace(importFile, "output: 2}", "output: -2}", 1))
	if _, err := run(bad); err == nil || !strings.Contains(err.Error(), "prices.1.output") || !strings.Contains(err.Error(), "0..1e+09") {
		t.Fatalf("bad file: err %v; want prices.1.output and its limit named", err)
	}
	good := write("good.yaml", importFile)
	if out, err := run("-dry_run", good); err != nil || !strings.Contains(out, "would replace") {
		t.Fatalf("dry run: %q, %v", out, err)
	}
	if got, _ := os.ReadFile(installed); !strings.Contains(string(got), "old-model") {
		t.Fatal("a refused or dry-run import changed the installed prices")
	}
	out, err := run(good)
	if err != nil || !strings.Contains(out, "imported 2 prices of 2 models") {
		t.Fatalf("import: %q, %v", out, err)
	}
	p, err := policy.Load(pol)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if pr, ok := p.Price("house-model", at); !ok || pr.Completion != 2 {
		t.Errorf("house-model after import: %+v, %v; want output 2", pr, ok)
	}
	if _, ok := p.Price("old-model", at); ok {
		t.Error("the replaced file's old-model still priced")
	}

	if err := os.WriteFile(pol, []byte("tenants: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(good); err == nil || !strings.Contains(err.Error(), "names no prices_file") {
		t.Errorf("policy without prices_file: err %v", err)
	}
}
