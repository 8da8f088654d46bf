package admin

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// Every action, put on the admin topic and read back, leaves the table as
// applying it directly does: what one replica serves, every replica holds.
func TestRecordsReplayLikeTheActions(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	zero, five := 0.0, 5.0
	steps := []struct {
		action adminapi.Action
		req    adminapi.Request
	}{
		{adminapi.ActionTrip, adminapi.Request{Tenant: "acme", Model: "gpt-4o", Reason: "incident", ExpiresIn: "1h"}},
		{adminapi.ActionTrip, adminapi.Request{Tenant: "acme", APIKeyID: "k1", Reason: "incident", ExpiresIn: "1h"}},
		{adminapi.ActionBlacklist, adminapi.Request{Tenant: "acme", APIKeyID: "k7", Reason: "leak", ExpiresIn: "24h"}},
		{adminapi.ActionBlacklist, adminapi.Request{Tenant: "initech", Reason: "unpaid", ExpiresIn: "24h"}},
		{adminapi.ActionSetOverride, adminapi.Request{Tenant: "globex", Quota: schemas.QuotaDailyTokens, Limit: &zero, Reason: "stop", ExpiresIn: "2h"}},
		{adminapi.ActionSetOverride, adminapi.Request{Tenant: "hooli", Quota: schemas.QuotaDailyTokens, Limit: &five, Reason: "promo", ExpiresIn: "2h"}},
		{adminapi.ActionUnblacklist, adminapi.Request{Tenant: "initech", Reason: "paid"}},
		{adminapi.ActionReset, adminapi.Request{Tenant: "acme", Model: "gpt-4o", Kind: "manual", Reason: "over"}},
		{adminapi.ActionClearOverride, adminapi.Request{Tenant: "hooli", Quota: schemas.QuotaDailyTokens, Reason: "promo over"}},
	}
	direct, viaTopic := breaker.NewTable(), breaker.NewTable()
	for _, s := range steps {
		req := s.req
		if err := Normalize(&req, s.action, now); err != nil {
			t.Fatalf("%s: %v", s.action, err)
		}
		Apply(direct, s.action, req, "alice", now)
		recs, local := RecordsOf(s.action, req, "alice", now)
		if local || len(recs) != 1 {
			t.Fatalf("%s: %d records, local %v", s.action, len(recs), local)
		}
		// Through the wire format, as a replica reads it.
		var st *schemas.AdminState
		if recs[0].State != nil {
			v, err := schemas.EncodeAdminState(recs[0].State)
			if err != nil {
				t.Fatal(err)
			}
			if st, err = schemas.DecodeAdminState(v); err != nil {
				t.Fatalf("%s: %v", s.action, err)
			}
			if st.Key() != recs[0].Key {
				t.Fatalf("%s: key %q, state's %q", s.action, recs[0].Key, st.Key())
			}
		}
		ApplyRecord(viaTopic, recs[0].Key, st, now)
	}
	summary := func(tb *breaker.Table) string {
		out := ""
		for _, b := range tb.Breakers("") {
			out += fmt.Sprintf("%s/%s/%s/%s/%s/%s/%v;", b.Tenant, b.Scope, b.Kind, b.Quota, b.State, b.Actor, b.Until)
		}
		return out + fmt.Sprint(tb.Overrides(""))
	}
	if got, want := summary(viaTopic), summary(direct); got != want {
		t.Fatalf("through the topic\n got %s\nwant %s", got, want)
	}
	// An expired record lifts its key.
	recs, _ := RecordsOf(adminapi.ActionTrip, adminapi.Request{Tenant: "x", Model: "*", Reason: "r", ExpiresAt: now.Add(time.Minute)}, "a", now)
	ApplyRecord(viaTopic, recs[0].Key, recs[0].State, now)
	ApplyRecord(viaTopic, recs[0].Key, recs[0].State, now.Add(2*time.Minute))
	if len(viaTopic.Breakers("x")) != 0 {
		t.Fatal("an expired trip record did not lift the trip")
	}
}
