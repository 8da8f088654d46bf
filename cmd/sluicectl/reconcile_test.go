package main

import (
	"testing"
	"time"

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
