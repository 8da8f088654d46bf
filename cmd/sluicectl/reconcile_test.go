package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// TestReconcileMonthFollowsTheBillingDay: `sluicectl reconcile -period
// month` audits a tenant billed from the 20th by its own months: -at
// 2026-02 is the month that begins on February 20th, and no -at is the
// last month that ended.
func TestReconcileMonthFollowsTheBillingDay(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	for _, tc := range []struct {
		billingDay int
		at         string
		now        time.Time
		want       time.Time
	}{
		{20, "2026-02", time.Date(2026, 6, 1, 0, 0, 0, 0, ny), time.Date(2026, 2, 20, 0, 0, 0, 0, ny)},
		{20, "", time.Date(2026, 3, 25, 0, 0, 0, 0, ny), time.Date(2026, 2, 20, 0, 0, 0, 0, ny)},
		{20, "", time.Date(2026, 3, 19, 0, 0, 0, 0, ny), time.Date(2026, 1, 20, 0, 0, 0, 0, ny)},
		{31, "2026-02", time.Date(2026, 6, 1, 0, 0, 0, 0, ny), time.Date(2026, 2, 28, 0, 0, 0, 0, ny)},
		{1, "", time.Date(2026, 3, 19, 0, 0, 0, 0, ny), time.Date(2026, 2, 1, 0, 0, 0, 0, ny)},
	} {
		tenant := &policy.Tenant{ID: "acme", Location: ny, BillingDay: tc.billingDay}
		at, err := auditDate(schemas.PeriodMonth, tc.at, tenant, tc.now)
		if err != nil {
			t.Fatal(err)
		}
		if start, _ := tenant.PeriodBounds(schemas.PeriodMonth, at); !start.Equal(tc.want) {
			t.Errorf("billing day %d, -at %q at %v: audits the month from %v; want %v", tc.billingDay, tc.at, tc.now, start, tc.want)
		}
	}
}

// TestReconcileReadsRuntimeTenantsAndMakesNoTopic: `sluicectl reconcile`
// audits under the policy the services follow — a tenant made through
// the admin API in its own zone — and, while no admin topic exists,
// under the file alone without creating the topic (a dry run must change
// nothing).
func TestReconcileReadsRuntimeTenantsAndMakesNoTopic(t *testing.T) {
	cfg := reconcileConfig{Kafka: itest.Kafka(t), Topics: itest.Topics(t), SignalAuth: itest.SignalAuth(t)}
	cfg.Policy.File = filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(cfg.Policy.File, []byte("defaults:\n  timezone: UTC\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, log := context.Background(), slog.New(slog.DiscardHandler)
	pol, err := policyInForce(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	if tn := pol.Tenant("newco"); tn.Location != time.UTC {
		t.Errorf("without an admin topic: newco in %v, want the file's UTC", tn.Location)
	}
	if ok, err := kafkaconn.TopicExists(ctx, cfg.Kafka, cfg.Topics.Admin); err != nil || ok {
		t.Fatalf("admin topic exists after a reconcile: %v, %v; want it left uncreated", ok, err)
	}

	controlplanetest.ProduceTenant(t, cfg.Kafka, cfg.SignalAuth, cfg.Topics.Admin, "newco", `{"timezone":"Asia/Tokyo"}`)
	if pol, err = policyInForce(ctx, cfg, log); err != nil {
		t.Fatal(err)
	}
	if tn := pol.Tenant("newco"); tn.Location.String() != "Asia/Tokyo" {
		t.Errorf("with newco made through the admin API: in %v, want its own Asia/Tokyo", tn.Location)
	}
}
