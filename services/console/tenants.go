package console

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// Tenant records (docs/controlplane.md, "Tenants and plans"): a page linked
// from the overview creates one from a plan, a tenant's page edits its quotas and limits,
// and its audit page shows the record's trail beside its keys'. Every
// change goes to the admin API with the session's token; a refusal comes
// back in place through formState, as the key forms' do.

// newTenantPath is the create form's page.
const newTenantPath = "/new-tenant"

// The forms of this file, by formState name.
const (
	formCreateTenant = "create-tenant"
	formSection      = "section"
)

// quotaFields are the quotas the forms edit, those of models."*".
var quotaFields = []schemas.QuotaKind{schemas.QuotaMonthlyTokens, schemas.QuotaDailyTokens, schemas.QuotaHourlyTokens,
	schemas.QuotaTokensPerMinute, schemas.QuotaRequestsPerMinute}

// sectionInputs maps the admin API's field names of tenant's section (as
// the policy's problems name them) to the tenant forms' inputs.
func sectionInputs(tenant string) map[string]string {
	p := "tenants." + tenant + "."
	in := map[string]string{"name": "name", "from": "plan", "reason": "reason", p + "plan": "plan", p + "timezone": "timezone",
		p + "budget.amount": "budget_amount", p + "budget.currency": "budget_currency", p + "budget": "budget_amount", p + "limits": "limits"}
	for _, q := range quotaFields {
		in[p+"models.*."+string(q)] = string(q)
	}
	return in
}

// fileSections are the tenants and plans the console's policy file
// defines, each in policy.Canonical form; empty without a file. They are
// the watcher's, computed at its last reload: a page reads no file.
func (s *server) fileSections() (policy.Overlay, error) {
	if s.policy == nil {
		return policy.Overlay{}, nil
	}
	return s.policy.FileSections()
}

// planChoice is a plan the create form offers.
type planChoice struct {
	Name string
	// Record: a plan of the admin API (the tenant is created from a copy
	// of it); else the policy file's.
	Record bool
}

// planChoices lists the plans in force: the file's and the records'
// (a record the file also defines is the file's: the precedence rule).
func (s *server) planChoices(ctx context.Context, sess *session) ([]planChoice, error) {
	file, err := s.fileSections()
	out := make([]planChoice, 0, len(file.Plans))
	for name := range file.Plans {
		out = append(out, planChoice{Name: name})
	}
	recs, rerr := sess.client.Sections(ctx, adminapi.KindPlan)
	for _, r := range recs {
		if _, ok := file.Plans[r.Name]; !ok {
			out = append(out, planChoice{Name: r.Name, Record: true})
		}
	}
	slices.SortFunc(out, func(a, b planChoice) int { return strings.Compare(a.Name, b.Name) })
	return out, errors.Join(err, rerr)
}

// sectionForm is a tenant's section as the edit form shows it.
type sectionForm struct {
	// LimitsOnly: the form shows and writes the limits alone, the
	// sub-budgets a tenant administrator may change (the admin API
	// refuses any other change of theirs).
	LimitsOnly bool
	Version    uint64
	// Quotas are models."*"'s, by quotaFields' names; "" for unset.
	Quotas                                 []quotaInput
	BudgetAmount, BudgetCurrency, Timezone string
	// Limits is the limits object, indented JSON.
	Limits string
}

// quotaInput is one quota input of the tenant forms.
type quotaInput struct{ Name, Value string }

// tenantSection is what a tenant's page shows of its definition.
type tenantSection struct {
	// Record is the tenant's record, nil when the API defines none.
	Record *adminapi.Section
	// File is its section in the policy file ("" when the file defines
	// none): the file's definition is the one in force.
	File string
	// Conflict: both define it, differently.
	Conflict bool
	Form     sectionForm
	// Body is the section in force, indented.
	Body string
	// CanEdit: the session may change it (operators, and a tenant's
	// administrators its sub-budgets; not a tenant the file defines).
	CanEdit bool
	Error   string
}

// sectionOf reads what tenant's page shows of its definition; form is a
// refused edit shown again.
func (s *server) sectionOf(ctx context.Context, sess *session, tenant string, form formState) tenantSection {
	var ts tenantSection
	file, err := s.fileSections()
	if err != nil {
		ts.Error = "reading the policy file: " + err.Error()
	}
	if def, ok := file.Tenants[tenant]; ok {
		ts.File = indented(def)
	}
	rec, err := sess.client.Section(ctx, adminapi.KindTenant, tenant)
	var ae *adminapi.Error
	switch {
	case errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound:
	case err != nil:
		ts.Error = cmp.Or(ts.Error, "Admin API: "+err.Error())
	default:
		ts.Record = &rec
		ts.Conflict = ts.File != "" && ts.File != indented(rec.Body)
		ts.Form = formOf(rec)
	}
	ts.Body = ts.File
	if ts.Body == "" && ts.Record != nil {
		ts.Body = indented(ts.Record.Body)
	}
	ts.CanEdit = sess.mayManage(tenant) && ts.Record != nil && ts.File == ""
	// A stale form shows the settings as they are now, not what was
	// typed over an older version: submitting it again would undo the
	// other change unseen.
	if form.Is(formSection) && form.Status != http.StatusConflict {
		ts.Form = ts.Form.typed(form.Values)
	}
	ts.Form.LimitsOnly = !sess.mayAct()
	return ts
}

// formOf fills the edit form from a record's section.
func formOf(rec adminapi.Section) sectionForm {
	var b struct {
		Models   map[string]map[string]any `json:"models"`
		Budget   map[string]any            `json:"budget"`
		Timezone string                    `json:"timezone"`
		Limits   json.RawMessage           `json:"limits"`
	}
	_ = decodeNumbers(rec.Body, &b)
	f := sectionForm{Version: rec.Version, Timezone: b.Timezone}
	for _, q := range quotaFields {
		v := ""
		if x, ok := b.Models["*"][string(q)]; ok {
			v = fmt.Sprint(x)
		}
		f.Quotas = append(f.Quotas, quotaInput{Name: string(q), Value: v})
	}
	if v, ok := b.Budget["amount"]; ok {
		f.BudgetAmount = fmt.Sprint(v)
	}
	if v, ok := b.Budget["currency"]; ok {
		f.BudgetCurrency = fmt.Sprint(v)
	}
	if len(b.Limits) > 0 {
		f.Limits = indented(b.Limits)
	}
	return f
}

// typed is the form with what the user typed: a refused form keeps it.
func (f sectionForm) typed(v url.Values) sectionForm {
	out := sectionForm{Version: f.Version, BudgetAmount: v.Get("budget_amount"), BudgetCurrency: v.Get("budget_currency"),
		Timezone: v.Get("timezone"), Limits: v.Get("limits")}
	for _, q := range quotaFields {
		out.Quotas = append(out.Quotas, quotaInput{Name: string(q), Value: v.Get(string(q))})
	}
	return out
}

// indented is a section's JSON indented for reading; raw as it is when it
// is not JSON.
func indented(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

// The parts of a section the tenant forms write (laidOver).
const (
	// quotaInputs are the quotas of models."*", the budget and the time
	// zone.
	quotaInputs = 1 << iota
	// limitsInput is the limits object.
	limitsInput
)

// laidOver returns body (a section's JSON; empty for none) with the tenant
// forms' inputs of v that parts names laid over it: each quota of
// models."*" (empty removes it, so that the plan's or the defaults'
// applies), budget and time zone (quotaInputs), the limits object
// (limitsInput). A value the console cannot read is answered as a refusal
// of form, named by input.
func laidOver(body json.RawMessage, v url.Values, parts int, form string) (json.RawMessage, *formState) {
	sec := map[string]any{}
	if len(body) > 0 {
		if err := decodeNumbers(body, &sec); err != nil {
			return nil, &formState{Name: form, Values: v, Status: http.StatusBadGateway, Errors: []string{"the section read is not JSON: " + err.Error()}}
		}
	}
	bad := map[string][]string{}
	if parts&quotaInputs != 0 {
		layQuotas(sec, v, bad)
	}
	if parts&limitsInput != 0 {
		if raw := strings.TrimSpace(v.Get("limits")); raw == "" {
			delete(sec, "limits")
		} else if l, err := policy.Canonical([]byte(raw)); err != nil {
			bad["limits"] = append(bad["limits"], "limits: "+err.Error())
		} else {
			sec["limits"] = l
		}
	}
	if len(bad) > 0 {
		return nil, &formState{Name: form, Values: v, Status: http.StatusUnprocessableEntity, Fields: bad}
	}
	out, _ := json.Marshal(sec)
	return out, nil
}

// layQuotas lays the quota, budget and time zone inputs of v over sec,
// adding what it cannot read to bad by input.
func layQuotas(sec map[string]any, v url.Values, bad map[string][]string) {
	models, _ := sec["models"].(map[string]any)
	if models == nil {
		models = map[string]any{}
	}
	all, _ := models["*"].(map[string]any)
	if all == nil {
		all = map[string]any{}
	}
	for _, q := range quotaFields {
		n := string(q)
		switch raw := strings.TrimSpace(v.Get(n)); {
		case raw == "":
			delete(all, n)
		default:
			x, err := strconv.ParseInt(strings.ReplaceAll(raw, "_", ""), 10, 64)
			if err != nil {
				bad[n] = append(bad[n], fmt.Sprintf("%s: %q is not a whole number", n, raw))
				continue
			}
			all[n] = x
		}
	}
	setOrDelete(models, "*", all)
	setOrDelete(sec, "models", models)
	amount, currency := strings.TrimSpace(v.Get("budget_amount")), strings.TrimSpace(v.Get("budget_currency"))
	switch a, err := strconv.ParseFloat(amount, 64); {
	case amount == "" && currency == "":
		delete(sec, "budget")
	case amount != "" && err != nil:
		bad["budget_amount"] = append(bad["budget_amount"], fmt.Sprintf("budget.amount: %q is not a number", amount))
	default:
		sec["budget"] = map[string]any{"amount": a, "currency": currency}
	}
	if tz := strings.TrimSpace(v.Get("timezone")); tz != "" {
		sec["timezone"] = tz
	} else {
		delete(sec, "timezone")
	}
}

// decodeNumbers decodes a section's JSON keeping its numbers as they are
// written (json.Number): a quota is an integer, and written back as one.
func decodeNumbers(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// setOrDelete sets m[k] to v, or deletes it when v is empty.
func setOrDelete(m map[string]any, k string, v map[string]any) {
	if len(v) == 0 {
		delete(m, k)
		return
	}
	m[k] = v
}

// tenantForm starts a change of a tenant record — of tenant, or a new
// one when tenant is empty: a login first, the form read, and a session
// refused that may not make the change (the enforcer refuses it too):
// operators create and change tenants, a tenant's administrators change
// its sub-budgets.
func (s *server) tenantForm(w http.ResponseWriter, r *http.Request, back, tenant string) (*session, bool) {
	sess := s.sessions.get(r)
	if sess == nil {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(back), http.StatusSeeOther)
		return nil, false
	}
	r.Body = http.MaxBytesReader(w, r.Body, adminapi.MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return nil, false
	}
	if tenant == "" && !sess.mayAct() || !sess.mayManage(tenant) {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s, %s) may not create or change this tenant: operators do, and a tenant's administrators change its sub-budgets.", sess.who.Name, sess.who.Role))
		return nil, false
	}
	return sess, true
}

// newTenantPage is the create form's page: a page of its own, since the
// overview reloads itself every few seconds and would lose what is typed.
type newTenantPage struct {
	// Plans are the plans in force (PlansError says why they could not
	// be listed).
	Plans      []planChoice
	PlansError string
	// Form is a refused create form shown again in place.
	Form formState
}

// newTenant shows the create form, to operators.
func (s *server) newTenant(w http.ResponseWriter, r *http.Request) {
	sess := s.sessions.get(r)
	if sess == nil {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
		return
	}
	if !sess.mayAct() {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s, %s) may not create tenants: operators do.", sess.who.Name, sess.who.Role))
		return
	}
	s.showNewTenant(w, r, sess, formState{})
}

// showNewTenant renders the create form, with form shown again in place
// when it was refused (its status is the page's).
func (s *server) showNewTenant(w http.ResponseWriter, r *http.Request, sess *session, form formState) {
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	pg := newTenantPage{Form: form}
	var err error
	if pg.Plans, err = s.planChoices(ctx, sess); err != nil {
		pg.PlansError = err.Error()
	}
	s.render(w, r, "newtenant", cmp.Or(form.Status, http.StatusOK), pg)
}

// createTenant creates a tenant from a plan with its first settings. A
// plan of the records is copied into it (from), and the tenant takes the
// plan either way (its plan field), so that a later change of the plan
// reaches it.
func (s *server) createTenant(w http.ResponseWriter, r *http.Request) {
	sess, ok := s.tenantForm(w, r, newTenantPath, "")
	if !ok {
		return
	}
	f := r.PostForm
	name, plan := strings.TrimSpace(f.Get("name")), strings.TrimSpace(f.Get("plan"))
	body, bad := laidOver(nil, f, quotaInputs, formCreateTenant)
	if bad != nil {
		s.showNewTenant(w, r, sess, *bad)
		return
	}
	req := adminapi.CreateSectionRequest{Name: name, Body: body, Reason: strings.TrimSpace(f.Get("reason"))}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if plan != "" {
		var sec map[string]any
		_ = json.Unmarshal(body, &sec)
		sec["plan"] = plan
		req.Body, _ = json.Marshal(sec)
		plans, _ := s.planChoices(ctx, sess)
		if i := slices.IndexFunc(plans, func(p planChoice) bool { return p.Name == plan }); i >= 0 && plans[i].Record {
			req.From = plan
		}
	}
	t, err := sess.client.CreateSection(ctx, adminapi.KindTenant, req)
	if err != nil {
		s.showNewTenant(w, r, sess, refusal(formCreateTenant, f, err, sectionInputs(name)))
		return
	}
	s.log.Info("console: tenant created", "tenant", t.Name, "plan", plan, "version", t.Version)
	done := fmt.Sprintf("Tenant %s created (version %d): every gateway, enforcer and aggregator follows it within seconds.", t.Name, t.Version)
	http.Redirect(w, r, tenantURL(t.Name)+"?done="+url.QueryEscape(done)+"#section", http.StatusSeeOther)
}

// updateTenant replaces a tenant record's section: the record as it is
// now with the form's quotas, budget, time zone and limits laid over it
// (a tenant administrator's form: its limits alone), carrying the version
// the page read (a change since is refused by the
// API, and said in place with who made it).
func (s *server) updateTenant(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	sess, ok := s.tenantForm(w, r, tenantURL(tenant), tenant)
	if !ok {
		return
	}
	f := r.PostForm
	read := version(f)
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	cur, err := sess.client.Section(ctx, adminapi.KindTenant, tenant)
	if err != nil {
		s.showTenant(w, r, refusal(formSection, f, err, sectionInputs(tenant)))
		return
	}
	parts := quotaInputs | limitsInput
	if !sess.mayAct() {
		parts = limitsInput // a tenant administrator's form has no other input
	}
	body, bad := laidOver(cur.Body, f, parts, formSection)
	if bad != nil {
		s.showTenant(w, r, *bad)
		return
	}
	t, err := sess.client.UpdateSection(ctx, adminapi.KindTenant, tenant, adminapi.UpdateSectionRequest{Version: read, Body: body, Reason: strings.TrimSpace(f.Get("reason"))})
	if err != nil {
		fs := refusal(formSection, f, err, sectionInputs(tenant))
		if fs.Status == http.StatusConflict {
			if now, nerr := sess.client.Section(ctx, adminapi.KindTenant, tenant); nerr == nil && now.Version != read {
				fs.Errors = []string{staleMessage("Tenant "+tenant, now.UpdatedBy, now.UpdatedAt, now.Version, read,
					"its settings as they are now (what you typed is not kept, so that nothing of the other change is undone unseen)")}
			}
		}
		s.showTenant(w, r, fs)
		return
	}
	s.log.Info("console: tenant updated", "tenant", tenant, "version", t.Version)
	done := fmt.Sprintf("Tenant %s updated (version %d): every gateway, enforcer and aggregator follows it within seconds.", tenant, t.Version)
	http.Redirect(w, r, tenantURL(tenant)+"?done="+url.QueryEscape(done)+"#section", http.StatusSeeOther)
}

// tenantTrail is the audit trail of tenant's record; none when the API
// defines no such tenant.
func tenantTrail(ctx context.Context, sess *session, tenant string) ([]adminapi.AuditEntry, error) {
	es, err := sess.client.SectionAudit(ctx, adminapi.KindTenant, tenant)
	var ae *adminapi.Error
	if errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound {
		return nil, nil
	}
	return es, err
}
