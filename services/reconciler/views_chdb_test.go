package reconciler_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestReportViewsOnCurrentClickHouse runs the report views and every
// example query of docs/finance.md on current ClickHouse (chdb) against a
// fixture with hand-computed figures; the other tests cover ClickHouse
// 18.16. The interpreter comes from `make chdb` or SLUICE_CHDB_PYTHON.
func TestReportViewsOnCurrentClickHouse(t *testing.T) {
	py := os.Getenv("SLUICE_CHDB_PYTHON")
	if py == "" {
		py = filepath.Join("..", "..", ".services", "venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		msg := "chdb interpreter " + py + " missing; run `make chdb`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	out, err := exec.Command(py, filepath.Join("testdata", "chdb_views_check.py")).CombinedOutput()
	if err != nil {
		t.Fatalf("views on current ClickHouse: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
