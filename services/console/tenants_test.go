package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
)

// testPolicy is the test console's policy file.
const testPolicy = `plans:
  starter:
    models:
      "*":
        monthly_tokens: 5000000
  pro:
    priority: high
tenants:
  red:
    plan: pro
`

// sectionRoutes serves the tenant and plan routes: versions, roles,
// audit, and refusals worded as the enforcer's (the policy's problems
// after the file and line).
func (f *fakeAdmin) sectionRoutes(mux *http.ServeMux) {
	for _, k := range []adminapi.SectionKind{adminapi.KindTenant, adminapi.KindPlan} {
		mux.HandleFunc("GET "+k.Path(), func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			defer f.mu.Unlock()
			out := []adminapi.Section{}
			for _, s := range f.sections[k] {
				if k == adminapi.KindPlan || mayTouch(f.who(r), s.Name) {
					out = append(out, s)
				}
			}
			reply(w, 200, adminapi.SectionsResponse{Sections: out})
		})
		mux.HandleFunc("GET "+k.ItemPath(), func(w http.ResponseWriter, r *http.Request) {
			if s, ok := f.section(w, r, k); ok {
				reply(w, 200, adminapi.SectionResponse{Section: s})
			}
		})
		mux.HandleFunc("GET "+k.AuditPath(), func(w http.ResponseWriter, r *http.Request) {
			if s, ok := f.section(w, r, k); ok {
				f.mu.Lock()
				defer f.mu.Unlock()
				reply(w, 200, adminapi.AuditResponse{Entries: f.strail[string(k)+"/"+s.Name]})
			}
		})
		mux.HandleFunc("POST "+k.Path(), func(w http.ResponseWriter, r *http.Request) {
			var req adminapi.CreateSectionRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			f.putSection(w, r, k, req.Name, 0, req.From, req.Body, req.Reason)
		})
		mux.HandleFunc("PUT "+k.ItemPath(), func(w http.ResponseWriter, r *http.Request) {
			var req adminapi.UpdateSectionRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if _, ok := f.section(w, r, k); ok {
				f.putSection(w, r, k, r.PathValue("name"), req.Version, "", req.Body, req.Reason)
			}
		})
	}
}

func (f *fakeAdmin) section(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind) (adminapi.Section, bool) {
	f.mu.Lock()
	s, ok := f.sections[k][r.PathValue("name")]
	f.mu.Unlock()
	if !ok || (k == adminapi.KindTenant && !mayTouch(f.who(r), s.Name)) {
		refuse(w, 404, fmt.Sprintf("name: no %s %q", k, r.PathValue("name")))
		return s, false
	}
	return s, true
}

// putSection creates (read 0) or updates a record.
func (f *fakeAdmin) putSection(w http.ResponseWriter, r *http.Request, k adminapi.SectionKind, name string, read uint64, from string, body json.RawMessage, reason string) {
	who := f.who(r)
	if who.Role != adminapi.RoleOperator && !f.subBudgetsOnly(who, k, name, read, body) {
		refuse(w, 403, "authorization: operators change tenants and plans; a tenant admin its tenant's sub-budgets")
		return
	}
	var sec struct {
		Timezone string                      `json:"timezone"`
		Models   map[string]map[string]int64 `json:"models"`
		Limits   map[string]struct {
			Unit string `json:"unit"`
		} `json:"limits"`
	}
	_ = json.Unmarshal(body, &sec)
	var problems []string
	if _, err := time.LoadLocation(sec.Timezone); err != nil {
		problems = append(problems, fmt.Sprintf("tenants.%s.timezone: unknown timezone %q (use an IANA name such as Asia/Shanghai)", name, sec.Timezone))
	}
	for q, v := range sec.Models["*"] {
		if v < 0 {
			problems = append(problems, fmt.Sprintf("tenants.%s.models.*.%s: %d is outside 0..1000000000000000", name, q, v))
		}
	}
	for l, v := range sec.Limits {
		if v.Unit != "requests" && v.Unit != "total_tokens" {
			problems = append(problems, fmt.Sprintf("tenants.%s.limits.%s.unit: %q is not one of requests, prompt_tokens, completion_tokens, total_tokens, cost", name, l, v.Unit))
		}
	}
	if reason == "" {
		problems = append(problems, "reason: required, 1..500 bytes")
	}
	if len(problems) > 0 {
		msg := fmt.Sprintf("policy: %d problem(s):", len(problems))
		for _, p := range problems {
			msg += "\n  policy.yaml with the admin API's tenants and plans:1: " + p
		}
		refuse(w, 400, msg)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, exists := f.sections[k][name]
	switch {
	case read == 0 && exists:
		refuse(w, 409, fmt.Sprintf("name: %s %q exists", k, name))
		return
	case read != 0 && read != cur.Version:
		refuse(w, 409, fmt.Sprintf("version: %s %q is at version %d, the change read version %d", k, name, cur.Version, read))
		return
	}
	if from != "" {
		if _, ok := f.sections[adminapi.KindPlan][from]; !ok {
			refuse(w, 400, fmt.Sprintf("from: no plan %q", from))
			return
		}
	}
	now := time.Now().UTC()
	s := adminapi.Section{Name: name, Body: body, Stamp: adminapi.Stamp{CreatedAt: cmpTime(cur.CreatedAt, now),
		CreatedBy: cmpString(cur.CreatedBy, who.Name), UpdatedAt: now, UpdatedBy: who.Name, Version: cur.Version + 1}}
	f.sections[k][name] = s
	verb := "update"
	if read == 0 {
		verb = "create"
	}
	f.strail[string(k)+"/"+name] = append(f.strail[string(k)+"/"+name], adminapi.AuditEntry{Time: now, Actor: who.Name, Action: k.Action(verb),
		Tenant: name, Reason: reason, Version: s.Version, Changes: []adminapi.Change{{Field: "body", From: string(cur.Body), To: string(body)}}})
	reply(w, 200, adminapi.SectionResponse{Section: s})
}

// subBudgetsOnly: as the enforcer's admin API, a tenant admin may update
// its own tenant's record when only its sub-budgets change, by the
// enforcer's own rule (controlplane.SubBudgetsOnly) over canonical forms.
func (f *fakeAdmin) subBudgetsOnly(who adminapi.WhoAmIResponse, k adminapi.SectionKind, name string, read uint64, body json.RawMessage) bool {
	if who.Role != adminapi.RoleTenantAdmin || who.Tenant != name || k != adminapi.KindTenant || read == 0 {
		return false
	}
	f.mu.Lock()
	cur := f.sections[k][name].Body
	f.mu.Unlock()
	before, err1 := policy.Canonical(cur)
	after, err2 := policy.Canonical(body)
	return err1 == nil && err2 == nil && controlplane.SubBudgetsOnly(before, after) == ""
}

func cmpTime(a, b time.Time) time.Time {
	if a.IsZero() {
		return b
	}
	return a
}

func cmpString(a, b string) string {
	if a == "" {
		return b
	}
	return a
}

func (f *fakeAdmin) tenantRecord(name string) adminapi.Section {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sections[adminapi.KindTenant][name]
}

// An operator creates a tenant from a plan (a page the overview links, as
// the overview reloads itself): the plans of
// the file and of the records are offered; a bad time zone comes back next
// to its input with what was typed kept; the tenant takes the plan (a
// record plan is also copied into it, from).
func TestATenantIsCreatedFromAPlanWithRefusalsInPlace(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	c.admin.sections[adminapi.KindPlan]["gold"] = adminapi.Section{Name: "gold", Body: json.RawMessage(`{"priority":"high"}`), Stamp: adminapi.Stamp{Version: 1}}
	if !strings.Contains(c.do(ck, http.MethodGet, "/", nil).Body.String(), `<a href="/new-tenant" id="new-tenant">`) {
		t.Error("the overview does not link the create form")
	}
	page := c.do(ck, http.MethodGet, "/new-tenant", nil).Body.String()
	for _, want := range []string{`id="form-create-tenant"`, `<option value="starter">starter (policy file)</option>`, `<option value="gold">gold (admin API)</option>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview lacks %s:\n%s", want, page)
		}
	}
	form := url.Values{"name": {"green"}, "plan": {"starter"}, "timezone": {"Mars/Olympus"}, "monthly_tokens": {"1000000"}, "reason": {"onboarding"}}
	rec := c.do(ck, http.MethodPost, "/tenants", form)
	body := rec.Body.String()
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(body, `<label>Time zone (IANA, such as Europe/Berlin; empty: UTC) <input name="timezone" value="Mars/Olympus"></label><span class="field-error" role="alert">tenants.green.timezone: unknown timezone`) ||
		!strings.Contains(body, `name="monthly_tokens" inputmode="numeric" value="1000000"`) || strings.Contains(body, "tenants and plans:1") {
		t.Fatalf("a bad time zone: %d\n%s", rec.Code, body)
	}
	form.Set("monthly_tokens", "lots")
	if rec := c.do(ck, http.MethodPost, "/tenants", form); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(rec.Body.String(), `monthly_tokens: &#34;lots&#34; is not a whole number`) {
		t.Fatalf("a quota that is no number: %d\n%s", rec.Code, rec.Body.String())
	}
	form.Set("monthly_tokens", "1000000")
	form.Set("timezone", "Europe/Berlin")
	rec = c.do(ck, http.MethodPost, "/tenants", form)
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/tenants/green?done=") {
		t.Fatalf("create: %d %s", rec.Code, rec.Body.String())
	}
	if got := string(c.admin.tenantRecord("green").Body); got != `{"models":{"*":{"monthly_tokens":1000000}},"plan":"starter","timezone":"Europe/Berlin"}` {
		t.Errorf("green's section: %s", got)
	}
	form = url.Values{"name": {"gilt"}, "plan": {"gold"}, "reason": {"onboarding"}}
	if rec := c.do(ck, http.MethodPost, "/tenants", form); rec.Code != http.StatusSeeOther || c.admin.tenantRecord("gilt").Version != 1 {
		t.Fatalf("create from a record plan: %d %s", rec.Code, rec.Body.String())
	}
}

// An operator edits a record tenant's quotas and limits with the version
// the page read: refusals in place, a stale page told who changed the
// tenant and shown its settings as they are now (not what was typed over
// the older version), the record's trail on the tenant's changes page.
func TestATenantsQuotasAndLimitsAreEditedWithTheVersionRead(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	c.do(ck, http.MethodPost, "/tenants", url.Values{"name": {"blue"}, "plan": {"pro"}, "monthly_tokens": {"1000"}, "reason": {"onboarding"}})
	page := c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
	if !strings.Contains(page, `id="form-section"`) || !strings.Contains(page, `name="version" value="1"`) || !strings.Contains(page, `name="monthly_tokens" inputmode="numeric" value="1000"`) {
		t.Fatalf("blue's edit form:\n%s", page)
	}
	limits := `{"blue-rpm": {"unit": "calls", "sliding_window": {"length": "1m", "limit": 5}}}`
	edit := url.Values{"version": {"1"}, "monthly_tokens": {"-5"}, "daily_tokens": {"200"}, "limits": {limits}, "reason": {"tighter"}}
	rec := c.do(ck, http.MethodPost, "/tenants/blue/section", edit)
	body := rec.Body.String()
	if rec.Code != http.StatusUnprocessableEntity || !strings.Contains(body, `value="-5"></label><span class="field-error" role="alert">tenants.blue.models.*.monthly_tokens: -5 is outside`) ||
		!strings.Contains(body, `</textarea></label><span class="field-error" role="alert">tenants.blue.limits.blue-rpm.unit: &#34;calls&#34; is not one of`) ||
		!strings.Contains(body, `&#34;unit&#34;: &#34;calls&#34;`) {
		t.Fatalf("a negative quota and an unknown unit: %d\n%s", rec.Code, body)
	}
	edit.Set("monthly_tokens", "500")
	edit.Set("limits", strings.Replace(limits, "calls", "requests", 1))
	if rec := c.do(ck, http.MethodPost, "/tenants/blue/section", edit); rec.Code != http.StatusSeeOther {
		t.Fatalf("edit: %d\n%s", rec.Code, rec.Body.String())
	}
	want := `{"limits":{"blue-rpm":{"sliding_window":{"length":"1m","limit":5},"unit":"requests"}},"models":{"*":{"daily_tokens":200,"monthly_tokens":500}},"plan":"pro"}`
	if got := c.admin.tenantRecord("blue"); string(got.Body) != want || got.Version != 2 {
		t.Errorf("blue after the edit: v%d %s; want v2 %s", got.Version, got.Body, want)
	}
	// alice changes blue meanwhile: the page that read version 2 is told.
	if rec := c.do(c.login("alice-token"), http.MethodPost, "/tenants/blue/section", url.Values{"version": {"2"}, "monthly_tokens": {"400"}, "reason": {"alice's"}}); rec.Code != http.StatusSeeOther {
		t.Fatalf("alice's edit: %d", rec.Code)
	}
	edit.Set("version", "2")
	edit.Set("reason", "stale")
	rec = c.do(ck, http.MethodPost, "/tenants/blue/section", edit)
	body = rec.Body.String()
	if rec.Code != http.StatusConflict || !strings.Contains(body, "Tenant blue was changed by alice") || !strings.Contains(body, `name="version" value="3"`) ||
		!strings.Contains(body, `value="stale"`) || !strings.Contains(body, `name="monthly_tokens" inputmode="numeric" value="400"`) {
		t.Fatalf("a stale edit: %d\n%s", rec.Code, body)
	}
	trail := c.do(ck, http.MethodGet, "/tenants/blue/audit", nil).Body.String()
	for _, w := range []string{`data-action="tenant.update" data-version="3"`, `data-action="tenant.update" data-version="2"`, `data-action="tenant.create" data-version="1"`, "alice&#39;s", "tighter", `#section">settings</a>`} {
		if !strings.Contains(trail, w) {
			t.Errorf("blue's changes lack %s:\n%s", w, trail)
		}
	}
}

// A tenant the policy file defines is shown read-only (the precedence
// rule); a viewer gets no tenant form, nor does a tenant administrator
// the quotas' (its sub-budgets: TestATenantAdminChangesItsSubBudgets).
func TestTenantFormsFollowThePrecedenceRuleAndRoles(t *testing.T) {
	c := newKeyConsole(t)
	op := c.login("op-token")
	page := c.do(op, http.MethodGet, "/tenants/red", nil).Body.String()
	if !strings.Contains(page, "Defined in the policy file; edit the file") || strings.Contains(page, `id="form-section"`) || !strings.Contains(page, `&#34;plan&#34;: &#34;pro&#34;`) {
		t.Errorf("red, of the file:\n%s", page)
	}
	c.do(op, http.MethodPost, "/tenants", url.Values{"name": {"blue"}, "reason": {"onboarding"}})
	for _, tok := range []string{"viewer-token", "blue-token"} {
		ck := c.login(tok)
		page := c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
		if strings.Contains(page, `name="monthly_tokens"`) || (tok == "viewer-token") == strings.Contains(page, `id="form-section"`) ||
			!strings.Contains(page, "Defined through the admin API: version 1") {
			t.Errorf("%s on blue's page:\n%s", tok, page)
		}
		if strings.Contains(c.do(ck, http.MethodGet, "/", nil).Body.String(), `id="new-tenant"`) {
			t.Errorf("%s is offered the create form", tok)
		}
		if rec := c.do(ck, http.MethodGet, "/new-tenant", nil); rec.Code != http.StatusForbidden {
			t.Errorf("%s's create form: %d", tok, rec.Code)
		}
		if rec := c.do(ck, http.MethodPost, "/tenants/blue/section", url.Values{"version": {"1"}, "reason": {"x"}}); tok == "viewer-token" && rec.Code != http.StatusForbidden {
			t.Errorf("%s's edit: %d", tok, rec.Code)
		}
		if rec := c.do(ck, http.MethodPost, "/tenants", url.Values{"name": {"x"}, "reason": {"x"}}); rec.Code != http.StatusForbidden {
			t.Errorf("%s's create: %d", tok, rec.Code)
		}
	}
}

// The edit form writes the whole section: what it does not show (other
// models' quotas, a mode, channels, priority) is kept, and integers stay
// integers, however large.
func TestATenantEditKeepsWhatTheFormDoesNotShow(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	c.admin.sections[adminapi.KindTenant]["blue"] = adminapi.Section{Name: "blue", Stamp: adminapi.Stamp{Version: 1, UpdatedBy: "ops"},
		Body: json.RawMessage(`{"channels":["ops"],"models":{"*":{"mode":"soft","monthly_tokens":1000000000000000},"gpt-4o":{"daily_tokens":20000000}},"priority":"high","timezone":"Asia/Tokyo"}`)}
	page := c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
	if !strings.Contains(page, `name="monthly_tokens" inputmode="numeric" value="1000000000000000"`) || !strings.Contains(page, `name="timezone" value="Asia/Tokyo"`) {
		t.Fatalf("blue's form:\n%s", page)
	}
	edit := url.Values{"version": {"1"}, "monthly_tokens": {"900000000000001"}, "hourly_tokens": {"5_000"}, "timezone": {"Asia/Tokyo"}, "reason": {"r"}}
	if rec := c.do(ck, http.MethodPost, "/tenants/blue/section", edit); rec.Code != http.StatusSeeOther {
		t.Fatalf("edit: %d\n%s", rec.Code, rec.Body.String())
	}
	want := `{"channels":["ops"],"models":{"*":{"hourly_tokens":5000,"mode":"soft","monthly_tokens":900000000000001},"gpt-4o":{"daily_tokens":20000000}},"priority":"high","timezone":"Asia/Tokyo"}`
	if got := string(c.admin.tenantRecord("blue").Body); got != want {
		t.Errorf("blue after the edit:\n%s\nwant\n%s", got, want)
	}
}

// A section's refusal quotes the policy's problems after the enforcer's
// file and line: each goes to the input of its field or nearest parent,
// without the file, and the header goes nowhere.
func TestRefusalPutsPolicyProblemsByTheirInputs(t *testing.T) {
	err := &adminapi.Error{StatusCode: 400, Message: "policy: 3 problem(s):\n  p.yaml with the admin API's tenants and plans:4: tenants.x.limits.rpm.sliding_window.limit: is required\n" +
		"  p.yaml with the admin API's tenants and plans:9: tenants.x.priority: \"urgent\" is not a priority\nreason: required"}
	f := refusal(formSection, url.Values{}, err, sectionInputs("x"))
	if f.Err(formSection, "limits") != "tenants.x.limits.rpm.sliding_window.limit: is required" || f.Err(formSection, "reason") != "reason: required" ||
		strings.Join(f.FormErrors(formSection), "|") != `tenants.x.priority: "urgent" is not a priority` {
		t.Errorf("%+v", f)
	}
}

// A tenant page takes the file's tenants from the policy watcher, not from
// a read of the file: with the file gone the pages still know red as the
// file's, and a file that comes to define a record tenant makes it
// read-only once the watcher reloads, not before.
func TestTenantPagesFollowTheWatchersFileNotTheDisk(t *testing.T) {
	c := newKeyConsole(t)
	op := c.login("op-token")
	c.do(op, http.MethodPost, "/tenants", url.Values{"name": {"blue"}, "reason": {"onboarding"}})
	if err := os.Remove(c.file); err != nil {
		t.Fatal(err)
	}
	page := c.do(op, http.MethodGet, "/tenants/red", nil).Body.String()
	if !strings.Contains(page, "Defined in the policy file; edit the file") || strings.Contains(page, "reading the policy file") {
		t.Fatalf("red with its file removed after the load:\n%s", page)
	}
	if !strings.Contains(c.do(op, http.MethodGet, "/new-tenant", nil).Body.String(), `<option value="starter">starter (policy file)</option>`) {
		t.Error("the create form lost the file's plans with the file removed after the load")
	}
	if err := os.WriteFile(c.file, []byte(testPolicy+"  blue:\n    plan: starter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if page := c.do(op, http.MethodGet, "/tenants/blue", nil).Body.String(); !strings.Contains(page, `id="form-section"`) {
		t.Fatalf("blue before the watcher reloads the edited file is still the record's:\n%s", page)
	}
	if !c.policy.Reload() {
		t.Fatal("the edited file did not reload")
	}
	page = c.do(op, http.MethodGet, "/tenants/blue", nil).Body.String()
	if !strings.Contains(page, "Defined in the policy file; edit the file") || strings.Contains(page, `id="form-section"`) {
		t.Fatalf("blue once the file defines it:\n%s", page)
	}
}

// A tenant administrator's page of its own record tenant offers its
// sub-budgets alone: the limits, beside the section read-only. Saving
// writes the limits over the record as it is, every other setting kept,
// which the admin API accepts from a tenant administrator; another
// tenant's form is refused.
func TestATenantAdminChangesItsSubBudgets(t *testing.T) {
	c := newKeyConsole(t)
	op := c.login("op-token")
	for _, name := range []string{"blue", "green"} {
		if rec := c.do(op, http.MethodPost, "/tenants", url.Values{"name": {name}, "monthly_tokens": {"1000"}, "timezone": {"Asia/Tokyo"}, "reason": {"onboarding"}}); rec.Code != http.StatusSeeOther {
			t.Fatalf("create %s: %d", name, rec.Code)
		}
	}
	blue := c.login("blue-token")
	page := c.do(blue, http.MethodGet, "/tenants/blue", nil).Body.String()
	for _, want := range []string{`id="section-sub-budgets"`, `name="limits"`, `id="section-body"`, `&#34;timezone&#34;: &#34;Asia/Tokyo&#34;`} {
		if !strings.Contains(page, want) {
			t.Fatalf("blue's page for its admin lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, `name="monthly_tokens"`) || strings.Contains(page, `name="timezone"`) {
		t.Fatalf("blue's admin is offered the quotas:\n%s", page)
	}
	perUser := `{"per-user": {"scope": {"user": "*"}, "unit": "total_tokens", "period": {"every": "day", "limit": 100}}}`
	edit := url.Values{"version": {"1"}, "limits": {perUser}, "reason": {"a budget per user"}}
	if rec := c.do(blue, http.MethodPost, "/tenants/blue/section", edit); rec.Code != http.StatusSeeOther {
		t.Fatalf("blue's admin saves a sub-budget: %d\n%s", rec.Code, rec.Body.String())
	}
	want := `{"limits":{"per-user":{"period":{"every":"day","limit":100},"scope":{"user":"*"},"unit":"total_tokens"}},"models":{"*":{"monthly_tokens":1000}},"timezone":"Asia/Tokyo"}`
	if got := c.admin.tenantRecord("blue"); string(got.Body) != want || got.Version != 2 || got.UpdatedBy != "blue-admin" {
		t.Errorf("blue after its admin's edit: v%d by %s %s; want v2 by blue-admin %s", got.Version, got.UpdatedBy, got.Body, want)
	}
	if rec := c.do(blue, http.MethodPost, "/tenants/green/section", edit); rec.Code != http.StatusForbidden {
		t.Errorf("blue's admin edits green: %d, want 403", rec.Code)
	}
}

// A tenant administrator's save changes the limits alone, byte for byte
// as the enforcer compares sections (in policy.Canonical form): every
// other setting comes back as it was, large integers, decimals and
// strings included, and so do the limits it kept.
func TestLimitsOnlyKeepsTheRestByteForByte(t *testing.T) {
	cur, err := policy.Canonical([]byte(`{"models":{"*":{"monthly_tokens":1000000000000000},"gpt-4o":{"mode":"soft","daily_tokens":5}},
"budget":{"amount":12.5,"currency":"USD"},"channels":["slack:ops"],"timezone":"Asia/Tokyo","priority":"high","note":"a <b> & c",
"limits":{"rpm":{"unit":"requests","sliding_window":{"length":"1m","limit":5}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	limits := `{"rpm": {"unit": "requests", "sliding_window": {"length": "1m", "limit": 5}},
"per-user": {"scope": {"user": "*"}, "unit": "total_tokens", "period": {"every": "day", "limit": 100}}}`
	body, bad := laidOver(cur, url.Values{"limits": {limits}, "monthly_tokens": {"1"}, "timezone": {"UTC"}}, limitsInput, formSection)
	if bad != nil {
		t.Fatalf("refused: %+v", bad)
	}
	after, err := policy.Canonical(body)
	if err != nil {
		t.Fatal(err)
	}
	var b, a map[string]json.RawMessage
	_ = json.Unmarshal(cur, &b)
	_ = json.Unmarshal(after, &a)
	var bl, al map[string]json.RawMessage
	_ = json.Unmarshal(b["limits"], &bl)
	_ = json.Unmarshal(a["limits"], &al)
	if len(a) != len(b) || string(al["rpm"]) != string(bl["rpm"]) || al["per-user"] == nil {
		t.Errorf("limits: %s, from %s", a["limits"], b["limits"])
	}
	for f := range b {
		if f != "limits" && string(a[f]) != string(b[f]) {
			t.Errorf("%s: %s, was %s", f, a[f], b[f])
		}
	}
}
