package platform

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestNamedTagsOnceAndFillsNils(t *testing.T) {
	var b bytes.Buffer
	env := Env{Logger: slog.New(slog.NewTextHandler(&b, nil))}
	env = env.Named("aggregator").Named("aggregator")
	env.Logger.Info("x")
	if n := strings.Count(b.String(), "service=aggregator"); n != 1 {
		t.Fatalf("service tagged %d times: %s", n, b.String())
	}
	if env.Metrics == nil || env.Health == nil {
		t.Fatal("Named must fill a nil registry and health")
	}
}
