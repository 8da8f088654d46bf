package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// TestTenantsOfTheAdminAPIReachTheGatewayWithinTheBound: a plan and a
// tenant created from it through the enforcer's admin API, a key issued for
// the tenant, and the gateway serves the key at once; the tenant's
// admission limit lowered through the API, the gateway refuses it within
// 5 s. Two updates that read the same version end with one refused (409);
// a tenant admin of another tenant neither reads nor lists it; the audit
// trail shows every change with the fields it changed.
func TestTenantsOfTheAdminAPIReachTheGatewayWithinTheBound(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	f := newFleet(t)
	f.eenv.Policy = f.genv.Policy // the cluster's one policy file: the API validates against it
	f.ecfg.Admin.Tokens = append(f.ecfg.Admin.Tokens, adminapi.Token{Name: "acme-admin", SHA256: adminapi.HashToken("acme-admin-token"),
		Role: adminapi.RoleTenantAdmin, Tenant: "acme"})
	ctx := context.Background()
	enf, admin := f.enforcer()
	gw, _ := f.gateway()

	plan := `{"limits":{"rpm":{"unit":"requests","sliding_window":{"length":"1m","limit":1000},"exact":true}}}`
	if _, err := admin.CreateSection(ctx, adminapi.KindPlan, adminapi.CreateSectionRequest{Name: "starter", Body: json.RawMessage(plan), Reason: "plans"}); err != nil {
		t.Fatal(err)
	}
	tn, err := admin.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: "newco", From: "starter",
		Body: json.RawMessage(`{"organization":"newco-org"}`), Reason: "onboarding"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(tn.Body), `"limit":1000`) || !strings.Contains(string(tn.Body), `"organization":"newco-org"`) || tn.Version != 1 {
		t.Fatalf("a tenant from a plan: %s (version %d); want the plan's limits and its own organization", tn.Body, tn.Version)
	}
	key, err := admin.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "newco", Models: []string{"*"}, Reason: "onboarding"})
	if err != nil {
		t.Fatal(err)
	}
	within(t, "the new tenant's key served", http.StatusOK, key.Secret, gw)

	// A bad change is refused, naming the field, and changes nothing.
	var apiErr *adminapi.Error
	_, err = admin.UpdateSection(ctx, adminapi.KindTenant, "newco", adminapi.UpdateSectionRequest{Version: 1,
		Body: json.RawMessage(`{"burst_multiplier": 1000}`), Reason: "typo"})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "tenants.newco.burst_multiplier") {
		t.Fatalf("an invalid tenant: %v; want 400 naming tenants.newco.burst_multiplier", err)
	}

	lowered := `{"organization":"newco-org","limits":{"rpm":{"unit":"requests","sliding_window":{"length":"1m","limit":1},"exact":true}}}`
	if _, err := admin.UpdateSection(ctx, adminapi.KindTenant, "newco", adminapi.UpdateSectionRequest{Version: 1,
		Body: json.RawMessage(lowered), Reason: "over budget"}); err != nil {
		t.Fatal(err)
	}
	within(t, "the lowered limit enforced", http.StatusTooManyRequests, key.Secret, gw)

	// Two operators who read version 2 change it at once: one wins.
	errs := make([]error, 2)
	var race sync.WaitGroup
	for i, tz := range []string{"Europe/Paris", "Asia/Tokyo"} {
		race.Add(1)
		go func() {
			defer race.Done()
			_, errs[i] = admin.UpdateSection(ctx, adminapi.KindTenant, "newco", adminapi.UpdateSectionRequest{Version: 2,
				Body: json.RawMessage(`{"timezone":"` + tz + `"}`), Reason: "time zone"})
		}()
	}
	race.Wait()
	won, stale := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusConflict:
			stale++
		default:
			t.Fatal(err)
		}
	}
	if won != 1 || stale != 1 {
		t.Fatalf("two updates of version 2: %v; want one 200 and one 409", errs)
	}

	// A tenant admin of acme cannot see newco.
	acme, err := adminapi.NewClient("http://"+enf.Addr(), "acme-admin-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Section(ctx, adminapi.KindTenant, "newco"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("acme's admin reading newco: %v; want 404", err)
	}
	if _, err := acme.SectionAudit(ctx, adminapi.KindTenant, "newco"); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("acme's admin reading newco's audit trail: %v; want 404", err)
	}
	if list, err := acme.Sections(ctx, adminapi.KindTenant); err != nil || len(list) != 0 {
		t.Fatalf("acme's admin listing tenants: %v, %v; want none of another tenant", list, err)
	}
	// Its own tenant's sub-budgets it may change (TestTenantAdminSetsItsSubBudgets); another tenant is as unknown as for reading.
	if _, err := acme.UpdateSection(ctx, adminapi.KindTenant, "newco", adminapi.UpdateSectionRequest{Version: 1, Body: json.RawMessage(`{}`), Reason: "x"}); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("acme's admin changing newco: %v; want 404", err)
	}

	trail, err := admin.SectionAudit(ctx, adminapi.KindTenant, "newco")
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	refused := 0
	for _, e := range trail {
		actions = append(actions, string(e.Action))
		if e.Refused {
			refused++
		}
		if e.Actor != "ops" || len(e.Changes) == 0 {
			t.Errorf("audit entry %+v: want actor ops and the fields it changed", e)
		}
	}
	if strings.Join(actions, ",") != "tenant.create,tenant.update,tenant.update,tenant.update" || refused != 1 {
		t.Fatalf("audit trail %v (%d refused); want create, update, and the two racing updates with one refused", actions, refused)
	}
	if c := trail[1].Changes; len(c) != 1 || c[0].Field != "limits" || !strings.Contains(c[0].From, "1000") || !strings.Contains(c[0].To, `"limit":1`) {
		t.Fatalf("the lowering's diff: %+v; want limits from 1000 to 1", c)
	}

	// Restarted, the enforcer and the gateway find the tenant, its plan
	// and its key on the topic: the key served, the timezone change kept.
	if err := gw.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := enf.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, admin = f.enforcer()
	gw, _ = f.gateway()
	got, err := admin.Section(ctx, adminapi.KindTenant, "newco")
	if err != nil || got.Version != 3 || !strings.Contains(string(got.Body), "timezone") {
		t.Fatalf("newco after restarts: %+v, %v; want version 3 with its timezone", got, err)
	}
	if _, err := admin.Section(ctx, adminapi.KindPlan, "starter"); err != nil {
		t.Fatalf("the plan after restarts: %v", err)
	}
	if code := status(t, gw, key.Secret); code != http.StatusOK && code != http.StatusTooManyRequests {
		t.Fatalf("newco's key after restarts: %d; want it authenticated", code)
	}
}

// Review finding: the gateway's usage API read the policy file through a
// watcher of its own, so GET /v1/usage showed a tenant made through the
// admin API the file's defaults as its quotas while the gateway admitted
// it under its record's. The API answers from the gateway's own policy.
func TestUsageAPIAnswersWithARecordTenantsQuotas(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	f := newFleet(t)
	f.eenv.Policy = f.genv.Policy
	f.gcfg.UsageAPI.Enabled = true
	f.genv.ClickHouse = f.eenv.ClickHouse // the test's database: no usage yet
	ctx := context.Background()
	_, admin := f.enforcer()
	gw, _ := f.gateway()
	if _, err := admin.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: "newco",
		Body: json.RawMessage(`{"models":{"*":{"monthly_tokens":4242}}}`), Reason: "onboarding"}); err != nil {
		t.Fatal(err)
	}
	key, err := admin.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "newco", Models: []string{"*"}, Reason: "onboarding"})
	if err != nil {
		t.Fatal(err)
	}
	itest.EventuallyNoError(t, 30*time.Second, "newco's record quota in GET /v1/usage", func() error {
		resp, body := itest.Send(t, http.MethodGet, "http://"+gw.Addr()+usageapi.Path, "", "Authorization", "Bearer "+key.Secret)
		var st quotastatus.Status
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
			return fmt.Errorf("%s: %s", resp.Status, body)
		}
		if len(st.Quotas) != 1 || st.Quotas[0].Quota != schemas.QuotaMonthlyTokens || st.Quotas[0].Limit != 4242 {
			return fmt.Errorf("quotas %+v; want the record's monthly_tokens of 4242", st.Quotas)
		}
		return nil
	})
}
