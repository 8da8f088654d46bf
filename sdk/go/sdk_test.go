package sdk_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
)

// sdkPackages are the packages a gateway imports.
const sdkPackages = "github.com/sluicehq/sluice/sdk/go/..."

// allowedSluice are the Sluice packages the SDK may link besides its own.
var allowedSluice = []string{
	"github.com/sluicehq/sluice/sdk/go",
	"github.com/sluicehq/sluice/schemas",
}

// forbidden are third-party packages only servers need.
var forbidden = []string{
	"github.com/twmb/franz-go/pkg/kfake",
	"github.com/ClickHouse/",
	"go.yaml.in/yaml",
	"gopkg.in/yaml",
}

func goCmd(t *testing.T, dir string, env []string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...) // the go that runs this test is on PATH
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func TestSDKLinksNothingServerOnly(t *testing.T) {
	out := goCmd(t, ".", nil, "list", "-deps", sdkPackages)
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps returned %d packages; expected the SDK's whole graph", len(deps))
	}
	var bad []string
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/sluicehq/sluice") {
			ok := false
			for _, a := range allowedSluice {
				if d == a || strings.HasPrefix(d, a+"/") {
					ok = true
				}
			}
			if !ok {
				bad = append(bad, d)
			}
			continue
		}
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				bad = append(bad, d)
			}
		}
	}
	if len(bad) > 0 {
		t.Fatalf("the gateway SDK links server-only packages (move them out of the SDK's import graph):\n  %s", strings.Join(bad, "\n  "))
	}
}

// TestOutsideModuleBuildsAGateway builds internal/outsidegw as a module of
// its own that requires github.com/sluicehq/sluice (the replace line stands
// in for a tagged version), checks the binary links no server-only module,
// and runs it against the real Redis: it must see a blacklist flag and let
// another tenant through.
func TestOutsideModuleBuildsAGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and needs Redis")
	}
	rc := itest.Redis(t)
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	src, err := os.ReadFile("internal/outsidegw/main.go")
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	mod := "module example.com/mygateway\n\ngo 1.26.0\n\nrequire github.com/sluicehq/sluice v0.0.0\n\nreplace github.com/sluicehq/sluice => " + root + "\n"
	for name, body := range map[string][]byte{"main.go": src, "go.mod": []byte(mod), "go.sum": sum} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Offline: every module the SDK needs is in the module cache already,
	// because the root module was built to run this test.
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOSUMDB=off"}
	goCmd(t, dir, env, "build", "-o", "gw", ".")

	mods := string(goCmd(t, dir, env, "version", "-m", "gw"))
	for _, f := range []string{"franz-go/pkg/kfake", "ClickHouse/clickhouse-go", "go.yaml.in/yaml"} {
		if strings.Contains(mods, f) {
			t.Errorf("the outside gateway links %s:\n%s", f, mods)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "gw"), rc.Addr, itest.Unique(t, "sluice:outside:")+":")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("outside gateway: %v\n%s", err, out)
	}
	want := "leaky gpt-4o: refused (blacklist)\nfine gpt-4o: allowed\nemitted 1 event\n"
	if string(out) != want {
		t.Fatalf("outside gateway printed\n%s\nwant\n%s", out, want)
	}
}
