package schemas_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

func TestAdminStateRoundTripAndKey(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	a := &schemas.AdminState{Kind: schemas.AdminOverride, Tenant: "acme", Model: "*", Quota: schemas.QuotaHourlyTokens,
		Limit: 5000, Until: now.Add(time.Hour), Reason: "promo", Actor: "ops", Time: now}
	b, err := schemas.EncodeAdminState(a)
	if err != nil {
		t.Fatal(err)
	}
	got, err := schemas.DecodeAdminState(b)
	if err != nil {
		t.Fatal(err)
	}
	if *got != *a {
		t.Fatalf("round trip: %+v, want %+v", got, a)
	}
	if schemas.AdminKeyTenant(a.Key()) != "acme" {
		t.Fatalf("key %q does not start with its tenant", a.Key())
	}
	other := *a
	other.Quota = schemas.QuotaDailyTokens
	if other.Key() == a.Key() {
		t.Fatal("overrides of two quotas share a compaction key")
	}
	if !a.Active(now) || a.Active(now.Add(time.Hour)) {
		t.Fatal("an action applies before Until only")
	}
}

func TestAdminStateValidationNamesFields(t *testing.T) {
	_, err := schemas.DecodeAdminState([]byte(`{"kind":"override","tenant":"","model":"*","quota":"weekly","limit":-1}`))
	if err == nil {
		t.Fatal("invalid admin state accepted")
	}
	for _, f := range []string{"tenant", "quota", "limit", "until"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
}
