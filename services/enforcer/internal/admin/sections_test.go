package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
)

// memSections stands in for the admin topic's tenants and plans, checked
// against an empty policy file.
type memSections struct {
	mu   sync.Mutex
	recs map[string]controlplane.Section
}

func (m *memSections) Section(kind controlplane.Kind, name string) *controlplane.Section {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.recs[string(kind)+"/"+name]; ok {
		return &s
	}
	return nil
}

func (m *memSections) Sections(kind controlplane.Kind) []*controlplane.Section {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*controlplane.Section
	for id, s := range m.recs {
		if strings.HasPrefix(id, string(kind)+"/") && !s.Deleted {
			out = append(out, &s)
		}
	}
	return out
}

func (m *memSections) PutSection(_ context.Context, kind controlplane.Kind, s *controlplane.Section, read uint64, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := string(kind) + "/" + s.Name
	if cur := m.recs[id]; cur.Version != read {
		return fmt.Errorf("%w: at %d, read %d", controlplane.ErrStale, cur.Version, read)
	}
	s.Version = read + 1
	m.recs[id] = *s
	return nil
}

func (m *memSections) Overlay() policy.Overlay {
	o := policy.Overlay{Tenants: map[string]json.RawMessage{}, Plans: map[string]json.RawMessage{}}
	for _, s := range m.Sections(controlplane.KindTenant) {
		o.Tenants[s.Name] = s.Body
	}
	for _, s := range m.Sections(controlplane.KindPlan) {
		o.Plans[s.Name] = s.Body
	}
	return o
}

func (m *memSections) CheckOverlay(o policy.Overlay) error {
	_, _, err := policy.Overlaid([]byte("{}\n"), "policy.yaml", o)
	return err
}

func (m *memSections) Synced(context.Context) error { return nil }

// An operator creates a plan and a tenant from it, and is refused, each
// naming the field, a bad section, a missing plan, a stale version and
// the deletion of a plan a tenant takes; a deleted tenant re-created
// continues its versions.
func TestTenantsAndPlansAreValidatedAndVersioned(t *testing.T) {
	op, _, _ := keyServer(t)
	ctx := context.Background()
	tenants, plans := adminapi.KindTenant, adminapi.KindPlan
	create := func(k adminapi.SectionKind, name, from, body string) (adminapi.Section, error) {
		return op.CreateSection(ctx, k, adminapi.CreateSectionRequest{Name: name, From: from, Body: json.RawMessage(body), Reason: "test"})
	}
	if _, err := create(plans, "gold", "", `{"priority":"high","mode":"soft"}`); err != nil {
		t.Fatal(err)
	}
	red, err := create(tenants, "red", "gold", `{"mode":"hard"}`)
	if err != nil || string(red.Body) != `{"mode":"hard","priority":"high"}` {
		t.Fatalf("red from gold: %s, %v; want gold's priority and red's own mode", red.Body, err)
	}
	_, err = create(tenants, "bad", "", `{"fail_mode":"shut"}`)
	if err == nil || !strings.Contains(err.Error(), "tenants.bad.fail_mode") {
		t.Fatalf("a bad fail mode: %v; want 400 naming tenants.bad.fail_mode", err)
	}
	wantStatus(t, "a bad section", err, http.StatusBadRequest)
	_, err = create(tenants, "lost", "platinum", `{}`)
	wantStatus(t, "from a plan that does not exist", err, http.StatusBadRequest)
	_, err = create(tenants, "red", "", `{}`)
	wantStatus(t, "creating red twice", err, http.StatusConflict)

	if _, err := create(tenants, "taker", "", `{"plan":"gold"}`); err != nil {
		t.Fatal(err)
	}
	_, err = op.DeleteSection(ctx, plans, "gold", adminapi.DeleteSectionRequest{Version: 1, Reason: "retire"})
	wantStatus(t, "deleting a plan a tenant takes", err, http.StatusBadRequest)

	_, err = op.UpdateSection(ctx, tenants, "red", adminapi.UpdateSectionRequest{Version: 2, Body: json.RawMessage(`{}`), Reason: "x"})
	wantStatus(t, "an update that read a version red never had", err, http.StatusConflict)
	if _, err := op.DeleteSection(ctx, tenants, "red", adminapi.DeleteSectionRequest{Version: 1, Reason: "offboarding"}); err != nil {
		t.Fatal(err)
	}
	_, err = op.Section(ctx, tenants, "red")
	wantStatus(t, "a deleted tenant", err, http.StatusNotFound)
	again, err := create(tenants, "red", "", `{}`)
	if err != nil || again.Version != 3 {
		t.Fatalf("red re-created: %+v, %v; want version 3", again, err)
	}
	trail, err := op.SectionAudit(ctx, tenants, "red")
	if err != nil || len(trail) != 3 || trail[1].Action != "tenant.delete" || trail[2].Changes[0].Field != "deleted" {
		t.Fatalf("red's trail: %+v, %v; want create, delete, create", trail, err)
	}
}

// A viewer reads tenants and plans and changes none; a tenant admin reads
// its own tenant only, changes no more of it than its sub-budgets
// (TestTenantAdminSetsItsSubBudgets), and reads no plan.
func TestTenantAdminReadsOnlyItsTenant(t *testing.T) {
	op, viewer, blue := keyServer(t)
	ctx := context.Background()
	for _, name := range []string{"blue", "red"} {
		if _, err := op.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: name, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := viewer.Sections(ctx, adminapi.KindTenant); err != nil || len(list) != 2 {
		t.Fatalf("viewer's list: %v, %v; want both", list, err)
	}
	_, err := viewer.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: "green", Reason: "x"})
	wantStatus(t, "a viewer creating", err, http.StatusForbidden)

	if list, err := blue.Sections(ctx, adminapi.KindTenant); err != nil || len(list) != 1 || list[0].Name != "blue" {
		t.Fatalf("blue admin's list: %v, %v; want blue only", list, err)
	}
	if _, err := blue.Section(ctx, adminapi.KindTenant, "blue"); err != nil {
		t.Fatal(err)
	}
	_, err = blue.Section(ctx, adminapi.KindTenant, "red")
	wantStatus(t, "blue admin reading red", err, http.StatusNotFound)
	_, err = blue.UpdateSection(ctx, adminapi.KindTenant, "blue", adminapi.UpdateSectionRequest{Version: 1, Body: json.RawMessage(`{"timezone":"Asia/Tokyo"}`), Reason: "x"})
	wantStatus(t, "blue admin changing its tenant's zone", err, http.StatusForbidden)
	_, err = blue.UpdateSection(ctx, adminapi.KindTenant, "red", adminapi.UpdateSectionRequest{Version: 1, Body: json.RawMessage(`{}`), Reason: "x"})
	wantStatus(t, "blue admin changing red", err, http.StatusNotFound)
	_, err = blue.DeleteSection(ctx, adminapi.KindTenant, "blue", adminapi.DeleteSectionRequest{Version: 1, Reason: "x"})
	wantStatus(t, "blue admin deleting its tenant", err, http.StatusForbidden)
	_, err = blue.Sections(ctx, adminapi.KindPlan)
	wantStatus(t, "blue admin listing plans", err, http.StatusForbidden)
}

// A tenant admin divides its tenant's budget among its users, keys and
// sessions: it adds, changes and removes the limits scoped by them, and is
// refused any other change of its tenant (its quotas, its tenant-wide
// limits, its zone), naming what it may change.
func TestTenantAdminSetsItsSubBudgets(t *testing.T) {
	op, _, blue := keyServer(t)
	ctx := context.Background()
	tenantWide := `"team":{"unit":"total_tokens","sliding_window":{"length":"1m","limit":100000}}`
	if _, err := op.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: "blue",
		Body: json.RawMessage(`{"limits":{` + tenantWide + `}}`), Reason: "onboard"}); err != nil {
		t.Fatal(err)
	}
	perUser := `"per-user":{"unit":"total_tokens","scope":{"user":"*"},"sliding_window":{"length":"1m","limit":5000}}`
	s, err := blue.UpdateSection(ctx, adminapi.KindTenant, "blue", adminapi.UpdateSectionRequest{Version: 1,
		Body: json.RawMessage(`{"limits":{` + tenantWide + `,` + perUser + `}}`), Reason: "split the team's budget"})
	if err != nil || !strings.Contains(string(s.Body), `"per-user"`) || s.UpdatedBy != "blue-admin" {
		t.Fatalf("a per-user sub-budget: %+v, %v", s, err)
	}
	for what, body := range map[string]string{
		"its tenant-wide limit": `{"limits":{"team":{"unit":"total_tokens","sliding_window":{"length":"1m","limit":900000}},` + perUser + `}}`,
		"its quotas":            `{"limits":{` + tenantWide + `,` + perUser + `},"models":{"*":{"monthly_tokens":1}}}`,
		"a limit of no caller":  `{"limits":{` + tenantWide + `,` + perUser + `,"all":{"unit":"requests","sliding_window":{"length":"1m","limit":1}}}}`,
	} {
		_, err := blue.UpdateSection(ctx, adminapi.KindTenant, "blue", adminapi.UpdateSectionRequest{Version: 2, Body: json.RawMessage(body), Reason: "x"})
		var e *adminapi.Error
		if !errors.As(err, &e) || e.StatusCode != http.StatusForbidden || !strings.Contains(e.Message, "sub-budgets") {
			t.Errorf("blue admin changing %s: %v; want 403 naming its sub-budgets", what, err)
		}
	}
	if _, err := blue.UpdateSection(ctx, adminapi.KindTenant, "blue", adminapi.UpdateSectionRequest{Version: 2,
		Body: json.RawMessage(`{"limits":{` + tenantWide + `}}`), Reason: "no more split"}); err != nil {
		t.Errorf("removing its sub-budget: %v", err)
	}
}
