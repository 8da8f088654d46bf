package alerter

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

func TestExampleConfigLoads(t *testing.T) {
	cfg := DefaultConfig()
	err := config.Load(&cfg, config.Options{Args: []string{"-config", "testdata/alerter.yaml"}, LookupEnv: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules.PendingFor != 5*time.Minute || cfg.Language != "zh" || cfg.Slack.RatePerMinute != 60 || cfg.Alertmanager.URL == "" {
		t.Fatalf("loaded %+v", cfg)
	}
	r, err := cfg.Tenants["acme"].route("acme", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if r.QuietHours == nil || r.QuietHours.Start != 22*60 || r.QuietHours.End != 8*60 || r.QuietHours.Allow != alert.SeverityCritical ||
		len(r.Silences) != 1 || r.Silences[0].Model != "gpt-4o" {
		t.Fatalf("route %+v", r)
	}
}
