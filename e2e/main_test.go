package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// sluiceBin is the binary every suite runs its services from, built once.
var sluiceBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	sluiceBin = filepath.Join(dir, "sluice")
	out, err := exec.Command("go", "build", "-o", sluiceBin, "github.com/sluicehq/sluice/cmd/sluice").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building sluice: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}
