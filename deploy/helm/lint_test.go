package helm

import (
	"path/filepath"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestHelmLint runs what `helm lint --strict` runs (Chart.yaml, the
// templates, the values against the schema, API versions deprecated or
// removed in the oldest Kubernetes the chart supports) over each
// documented combination, and fails on any warning or error.
func TestHelmLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion("v1.30.0")
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scenarios {
		t.Run(strings.TrimSuffix(filepath.Base(sc.file), "-values.yaml"), func(t *testing.T) {
			res := lint.AllWithKubeVersion(chartDir, readValues(t, sc.file), namespace, kv)
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("helm lint: %s", m)
				} else {
					t.Logf("helm lint: %s", m)
				}
			}
		})
	}
}
