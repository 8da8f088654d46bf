package enforcer

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
)

// Admin actions change what Checkers see, are refused without a valid token
// or with bad input (naming the field), land in admin_audit with who, what,
// when and why (the audit trail; the state itself is shared through the
// admin topic: TestTwoReplicasShareAdminStateAndOneWrites).
func TestAdminActionsAreAuditedAndEnforced(t *testing.T) {
	rc := itest.Redis(t)
	chc := itest.ClickHouse(t)
	ctx := context.Background()
	conn := testClickHouse(t, chc)
	cfg := testConfig(t)
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	c, _ := startCore(t, cfg, rdb)
	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)

	const token = "s3cret-token"
	api := admin.New(c.table, c.writer.MarkDirty, audit.New(conn), []adminapi.Token{{Name: "alice", SHA256: adminapi.HashToken(token)}}, quietLog())
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	client := func(tok string) *adminapi.Client {
		cl, err := adminapi.NewClient(srv.URL, tok, srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	cl := client(token)

	_, err := client("wrong").Trip(ctx, adminapi.Request{Tenant: "acme"})
	if ae := (*adminapi.Error)(nil); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized {
		t.Fatalf("unknown token: %v", err)
	}
	_, err = cl.Blacklist(ctx, adminapi.Request{Tenant: "acme", ExpiresIn: "2400h"})
	if err == nil || !strings.Contains(err.Error(), "reason") || !strings.Contains(err.Error(), "90 days") {
		t.Fatalf("bad input: %v", err)
	}

	zero := 0.0
	steps := []struct {
		action adminapi.Action
		req    adminapi.Request
	}{
		{adminapi.ActionTrip, adminapi.Request{Tenant: "acme", Model: "gpt-4o", Reason: "incident 42", ExpiresIn: "1h"}},
		{adminapi.ActionBlacklist, adminapi.Request{Tenant: "acme", APIKeyID: "key-7", Reason: "key leaked on github", ExpiresIn: "24h"}},
		{adminapi.ActionSetOverride, adminapi.Request{Tenant: "globex", Model: "*", Quota: schemas.QuotaDailyTokens, Limit: &zero, Reason: "leaked key: stop spend", ExpiresIn: "2h"}},
		{adminapi.ActionBlacklist, adminapi.Request{Tenant: "initech", Reason: "unpaid", ExpiresIn: "24h"}},
		{adminapi.ActionUnblacklist, adminapi.Request{Tenant: "initech", Reason: "paid"}},
	}
	for _, s := range steps {
		if _, err := cl.Do(ctx, s.action, s.req); err != nil {
			t.Fatalf("%s: %v", s.action, err)
		}
	}
	itest.Eventually(t, within, "manual breaker visible", func() bool {
		d := ch.Check("acme", "gpt-4o", "")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindManual
	})
	itest.Eventually(t, within, "key blacklist visible", func() bool {
		d := ch.Check("acme", "other-model", "key-7")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindBlacklist
	})
	itest.Eventually(t, within, "zero override visible", func() bool {
		d := ch.Check("globex", "any", "")
		return d.Outcome == checker.Refused && d.Flag.Quota == "daily_tokens" && d.Flag.Limit == 0
	})
	if d := ch.Check("acme", "other-model", "key-8"); !d.Allowed() {
		t.Fatalf("other key refused: %+v", d)
	}
	itest.Eventually(t, within, "unblacklisted tenant served", func() bool { return ch.Check("initech", "m", "").Allowed() })

	entries, err := audit.New(conn).Since(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(steps) {
		t.Fatalf("%d audit rows, want %d: %+v", len(entries), len(steps), entries)
	}
	e := entries[1]
	if e.Actor != "alice" || e.Action != string(adminapi.ActionBlacklist) || e.Tenant != "acme" || e.APIKeyID != "key-7" ||
		e.Reason != "key leaked on github" || e.ExpiresAt.Sub(e.Time) != 24*time.Hour || e.RequestID == "" {
		t.Fatalf("audit row: %+v", e)
	}
}
