package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
)

func TestNormalizeNamesEveryBadFieldAndLimit(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	neg := -1.0
	req := adminapi.Request{Tenant: "bad tenant!", Model: "@key:x", Reason: " ", ExpiresAt: now.Add(100 * 24 * time.Hour), Quota: "weekly", Limit: &neg}
	err := Normalize(&req, adminapi.ActionSetOverride, now)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"tenant:", "1..64", "model:", "reason:", "1..500", "expires_at:", "90 days", "quota:", "limit:", "0..1e15"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestNormalizeFillsDefaultsAndExpiry(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	req := adminapi.Request{Tenant: "acme", Reason: "incident", ExpiresIn: "90m"}
	if err := Normalize(&req, adminapi.ActionTrip, now); err != nil {
		t.Fatal(err)
	}
	if req.Model != "*" || !req.ExpiresAt.Equal(now.Add(90*time.Minute)) || req.ExpiresIn != "" {
		t.Fatalf("%+v", req)
	}
	// Removals need no expiry.
	rm := adminapi.Request{Tenant: "acme", Reason: "paid"}
	if err := Normalize(&rm, adminapi.ActionUnblacklist, now); err != nil {
		t.Fatal(err)
	}
	// Changes do.
	tr := adminapi.Request{Tenant: "acme", Reason: "x"}
	if err := Normalize(&tr, adminapi.ActionBlacklist, now); err == nil || !strings.Contains(err.Error(), "expires_at: required") {
		t.Fatalf("missing expiry: %v", err)
	}
}
