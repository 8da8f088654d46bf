package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/policy"
)

// fakeAdmin stands in for the enforcer's admin API: the key routes with
// their versions, refusals (field and limit first, as the enforcer words
// them), roles and audit trail, in memory.
type fakeAdmin struct {
	mu     sync.Mutex
	tokens map[string]adminapi.WhoAmIResponse
	keys   map[string]adminapi.Key
	trail  map[string][]adminapi.AuditEntry
	issued int
	// useErr is the listings' LastUseError.
	useErr string
	// sections are the tenant and plan records (tenants_test.go), by
	// kind and name; strail their audit trails, by kind and name.
	sections map[adminapi.SectionKind]map[string]adminapi.Section
	strail   map[string][]adminapi.AuditEntry
}

func newFakeAdmin() *fakeAdmin {
	return &fakeAdmin{keys: map[string]adminapi.Key{}, trail: map[string][]adminapi.AuditEntry{}, strail: map[string][]adminapi.AuditEntry{},
		sections: map[adminapi.SectionKind]map[string]adminapi.Section{adminapi.KindTenant: {}, adminapi.KindPlan: {}}, tokens: map[string]adminapi.WhoAmIResponse{
			"op-token":     {Name: "ops", Role: adminapi.RoleOperator},
			"alice-token":  {Name: "alice", Role: adminapi.RoleOperator},
			"viewer-token": {Name: "auditor", Role: adminapi.RoleViewer},
			"blue-token":   {Name: "blue-admin", Role: adminapi.RoleTenantAdmin, Tenant: "blue"},
		}}
}

func (f *fakeAdmin) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.PathWhoAmI, func(w http.ResponseWriter, r *http.Request) { reply(w, 200, f.who(r)) })
	mux.HandleFunc("GET "+adminapi.PathOverrides, func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, adminapi.OverridesResponse{Overrides: []adminapi.Override{}})
	})
	mux.HandleFunc("GET "+adminapi.PathBreakers, func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, adminapi.BreakersResponse{Breakers: []adminapi.Breaker{}})
	})
	for _, a := range adminapi.Actions() {
		mux.HandleFunc("POST "+a.Path(), func(w http.ResponseWriter, r *http.Request) {
			var req adminapi.Request
			_ = json.NewDecoder(r.Body).Decode(&req)
			if d, err := time.ParseDuration(req.ExpiresIn); req.ExpiresIn != "" && (err != nil || d <= 0) {
				refuse(w, 400, fmt.Sprintf("expires_in: %q is not a positive duration such as 2h\nreason: required", req.ExpiresIn))
				return
			}
			reply(w, 200, adminapi.ActionResponse{RequestID: "r1", Action: a, Breakers: []adminapi.Breaker{}})
		})
	}
	f.sectionRoutes(mux)
	mux.HandleFunc("GET "+adminapi.PathKeys, func(w http.ResponseWriter, r *http.Request) {
		out := []adminapi.Key{}
		for _, k := range f.snapshot() {
			if (r.URL.Query().Get("tenant") == "" || k.Tenant == r.URL.Query().Get("tenant")) && mayTouch(f.who(r), k.Tenant) {
				out = append(out, k)
			}
		}
		f.mu.Lock()
		useErr := f.useErr
		f.mu.Unlock()
		reply(w, 200, adminapi.KeysResponse{Keys: out, LastUseError: useErr})
	})
	mux.HandleFunc("POST "+adminapi.PathKeys, f.issue)
	mux.HandleFunc("GET "+adminapi.PathKey, func(w http.ResponseWriter, r *http.Request) {
		if k, ok := f.visible(w, r); ok {
			reply(w, 200, adminapi.KeyResponse{Key: k})
		}
	})
	mux.HandleFunc("GET "+adminapi.PathKeyAudit, func(w http.ResponseWriter, r *http.Request) {
		if k, ok := f.visible(w, r); ok {
			f.mu.Lock()
			defer f.mu.Unlock()
			reply(w, 200, adminapi.AuditResponse{Entries: f.trail[k.ID]})
		}
	})
	mux.HandleFunc("POST "+adminapi.PathKeyRevoke, func(w http.ResponseWriter, r *http.Request) {
		var req adminapi.RevokeKeyRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.change(w, r, adminapi.ActionKeyRevoke, req.Version, req.Reason, func(k *adminapi.Key) []adminapi.Change {
			k.Revoked = true
			return []adminapi.Change{{Field: "revoked", From: "false", To: "true"}}
		})
	})
	mux.HandleFunc("POST "+adminapi.PathKeyRotate, func(w http.ResponseWriter, r *http.Request) {
		var req adminapi.RotateKeyRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		if _, err := time.ParseDuration(req.Overlap); req.Overlap != "" && err != nil {
			refuse(w, 400, fmt.Sprintf("overlap: %q must be a duration from 0s to 168h0m0s", req.Overlap))
			return
		}
		f.change(w, r, adminapi.ActionKeyRotate, req.Version, req.Reason, func(k *adminapi.Key) []adminapi.Change {
			k.PreviousFingerprint, k.PreviousUntil, k.Fingerprint = k.Fingerprint, time.Now().Add(time.Hour), k.Fingerprint+"r"
			return []adminapi.Change{{Field: "fingerprint", From: k.PreviousFingerprint, To: k.Fingerprint}}
		})
	})
	return mux
}

func (f *fakeAdmin) key(id string) adminapi.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.keys[id]
}

func (f *fakeAdmin) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.issued
}

func (f *fakeAdmin) who(r *http.Request) adminapi.WhoAmIResponse {
	return f.tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
}

func mayTouch(who adminapi.WhoAmIResponse, tenant string) bool {
	return who.Role != adminapi.RoleTenantAdmin || who.Tenant == tenant
}

func (f *fakeAdmin) snapshot() []adminapi.Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []adminapi.Key
	for _, k := range f.keys {
		out = append(out, k)
	}
	return out
}

func (f *fakeAdmin) visible(w http.ResponseWriter, r *http.Request) (adminapi.Key, bool) {
	f.mu.Lock()
	k, ok := f.keys[r.PathValue("id")]
	f.mu.Unlock()
	if !ok || !mayTouch(f.who(r), k.Tenant) {
		refuse(w, 404, fmt.Sprintf("id: no key %q", r.PathValue("id")))
		return k, false
	}
	return k, true
}

func (f *fakeAdmin) issue(w http.ResponseWriter, r *http.Request) {
	who := f.who(r)
	var req adminapi.IssueKeyRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	if who.Role == adminapi.RoleViewer || !mayTouch(who, req.Tenant) {
		refuse(w, 403, "authorization: not yours")
		return
	}
	var msgs []string
	if len(req.Models) == 0 {
		msgs = append(msgs, "models: required")
	}
	for i, m := range req.Models {
		if _, err := path.Match(m, ""); err != nil {
			msgs = append(msgs, fmt.Sprintf("models[%d]: %q is not a model name or pattern of at most 128 bytes", i, m))
		}
	}
	if d, err := time.ParseDuration(req.ExpiresIn); req.ExpiresIn != "" && (err != nil || d <= 0) {
		msgs = append(msgs, fmt.Sprintf("expires_in: %q is not a positive duration such as 720h", req.ExpiresIn))
	}
	if req.Reason == "" {
		msgs = append(msgs, "reason: required, 1..500 bytes (the audit trail says why)")
	}
	if len(msgs) > 0 {
		refuse(w, 400, strings.Join(msgs, "\n"))
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.keys[req.ID]; ok {
		refuse(w, 409, fmt.Sprintf("id: key %q exists; rotate it, or issue under another id", req.ID))
		return
	}
	f.issued++
	now := time.Now().UTC()
	stamp := adminapi.MadeBy(who.Name, now)
	stamp.Version = 1
	k := adminapi.Key{Fingerprint: fmt.Sprintf("sha256:%012d", f.issued), KeyTerms: adminapi.KeyTerms{ID: req.ID, Tenant: req.Tenant,
		Name: req.Name, Models: req.Models, Endpoints: req.Endpoints, Stamp: stamp}}
	f.keys[k.ID] = k
	f.trail[k.ID] = append(f.trail[k.ID], adminapi.AuditEntry{Time: now, Actor: who.Name, Action: adminapi.ActionKeyIssue, Tenant: k.Tenant,
		APIKeyID: k.ID, Reason: req.Reason, Version: 1, Changes: []adminapi.Change{{Field: "models", To: strings.Join(req.Models, ",")}}})
	reply(w, 200, adminapi.SecretResponse{Key: k, Secret: fmt.Sprintf("sk-secret-%d-do-not-show-twice", f.issued)})
}

func (f *fakeAdmin) change(w http.ResponseWriter, r *http.Request, action adminapi.Action, read uint64, reason string, apply func(*adminapi.Key) []adminapi.Change) {
	who := f.who(r)
	if who.Role == adminapi.RoleViewer {
		refuse(w, 403, "authorization: a viewer changes nothing")
		return
	}
	k, ok := f.visible(w, r)
	if !ok {
		return
	}
	if read != k.Version {
		refuse(w, 409, fmt.Sprintf("version: key %q is at version %d, the change read version %d; read it again and retry", k.ID, k.Version, read))
		return
	}
	if reason == "" {
		refuse(w, 400, "reason: required, 1..500 bytes (the audit trail says why)")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	changes := apply(&k)
	k.Version++
	k.UpdatedBy, k.UpdatedAt = who.Name, time.Now().UTC()
	f.keys[k.ID] = k
	f.trail[k.ID] = append(f.trail[k.ID], adminapi.AuditEntry{Time: k.UpdatedAt, Actor: who.Name, Action: action, Tenant: k.Tenant,
		APIKeyID: k.ID, Reason: reason, Version: k.Version, Changes: changes})
	if action == adminapi.ActionKeyRotate {
		reply(w, 200, adminapi.SecretResponse{Key: k, Secret: "sk-rotated-secret"})
		return
	}
	reply(w, 200, adminapi.KeyResponse{Key: k})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func refuse(w http.ResponseWriter, status int, msg string) {
	reply(w, status, adminapi.ErrorResponse{Error: adminapi.ErrorBody{Message: msg}})
}

// memState is a StateStore with one hourly quota per tenant.
type memState struct{ tenants []string }

func (m memState) Quotas(_ context.Context, tenant string, now time.Time) ([]quotastatus.TenantQuota, error) {
	var out []quotastatus.TenantQuota
	for _, t := range m.tenants {
		if tenant == "" || tenant == t {
			out = append(out, quotastatus.TenantQuota{Tenant: t, Quota: quotastatus.Quota{Model: "*", Quota: "hourly_tokens", Period: "hour",
				Unit: "tokens", Limit: 1000, Used: 10, ResetsAt: now.Truncate(time.Hour).Add(time.Hour)}})
		}
	}
	return out, nil
}

func (memState) Refused(context.Context, string, time.Time) (map[string]int64, error) {
	return map[string]int64{}, nil
}

// keyConsole is a console against a fakeAdmin, its log kept to check that
// no secret is written there.
type keyConsole struct {
	t     *testing.T
	h     http.Handler
	admin *fakeAdmin
	log   *bytes.Buffer
	// file is the policy file, policy its watcher (reloaded by hand).
	file   string
	policy *policy.Watcher
}

func newKeyConsole(t *testing.T) *keyConsole {
	t.Helper()
	fa := newFakeAdmin()
	api := httptest.NewServer(fa.handler())
	t.Cleanup(api.Close)
	var logs bytes.Buffer
	// The policy file defines red and the plans starter and pro.
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(testPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	pw, err := policy.NewWatcher(file, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newServer(DefaultConfig(), deps{log: slog.New(slog.NewTextHandler(&logs, nil)), sampler: newSampler(nil, nil, 10), policy: pw,
		adminURL: api.URL, status: quotastatus.New(memState{tenants: []string{"blue", "red"}}, nil, pw.Current),
		// Nothing listens there: the charts say so, the rest renders.
		ch: chconn.NewLazy(chconn.Config{Addr: "127.0.0.1:1"})})
	if err != nil {
		t.Fatal(err)
	}
	return &keyConsole{t: t, h: s.Handler(), admin: fa, log: &logs, file: file, policy: pw}
}

// login returns the session cookie of token.
func (c *keyConsole) login(token string) *http.Cookie {
	c.t.Helper()
	rec := c.do(nil, http.MethodPost, "/login", url.Values{"token": {token}})
	for _, ck := range rec.Result().Cookies() {
		if ck.Name == cookieName {
			return ck
		}
	}
	c.t.Fatalf("login with %s: %d %s", token, rec.Code, rec.Body.String())
	return nil
}

func (c *keyConsole) do(ck *http.Cookie, method, target string, form url.Values) *httptest.ResponseRecorder {
	c.t.Helper()
	var req *http.Request
	if form != nil {
		req = httptest.NewRequest(method, target, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	if ck != nil {
		req.AddCookie(ck)
	}
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, req)
	return rec
}

var issueIDRE = regexp.MustCompile(`name="id" value="([^"]+)"`)

// issueForm is what a browser posts from the tenant page's issue form.
func (c *keyConsole) issueForm(ck *http.Cookie, tenant string, fields url.Values) url.Values {
	c.t.Helper()
	page := c.do(ck, http.MethodGet, "/tenants/"+tenant, nil).Body.String()
	m := issueIDRE.FindStringSubmatch(page)
	if m == nil {
		c.t.Fatalf("no issue form on %s's page:\n%s", tenant, page)
	}
	fields.Set("id", m[1])
	return fields
}

// The secret of an issued key is in the answer to the issue form and
// nowhere else: not in a redirect, a log or a later page; the same form
// posted again (a reload of the answer) issues no second key and shows
// no secret.
func TestAnIssuedKeysSecretIsShownOnceInTheFormsOwnAnswer(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	form := c.issueForm(ck, "blue", url.Values{"name": {"ci"}, "models": {"gpt-4o, gpt-4o-mini*"}, "expires": {"720h"}, "reason": {"onboarding"}})
	rec := c.do(ck, http.MethodPost, "/tenants/blue/keys", form)
	const secret = "sk-secret-1-do-not-show-twice"
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), secret) || !strings.Contains(rec.Body.String(), "it will not be shown again") {
		t.Fatalf("issue answer: %d\n%s", rec.Code, rec.Body.String())
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("the secret's page may be stored: Cache-Control %q", cc)
	}
	k := c.admin.key(form.Get("id"))
	if k.Tenant != "blue" || strings.Join(k.Models, "|") != "gpt-4o|gpt-4o-mini*" || k.CreatedBy != "ops" {
		t.Errorf("key issued: %+v", k)
	}

	again := c.do(ck, http.MethodPost, "/tenants/blue/keys", form)
	if again.Code != http.StatusSeeOther || again.Header().Get("Location") != "/tenants/blue/keys/"+form.Get("id")+"?resubmitted=1" {
		t.Errorf("the form posted again: %d %s", again.Code, again.Header().Get("Location"))
	}
	if c.admin.count() != 1 {
		t.Errorf("%d keys issued by one form posted twice", c.admin.count())
	}
	for _, p := range []string{again.Header().Get("Location"), "/tenants/blue", "/tenants/blue/audit"} {
		body := c.do(ck, http.MethodGet, p, nil).Body.String()
		if strings.Contains(body, secret) {
			t.Errorf("%s shows the secret", p)
		}
		if !strings.Contains(body, form.Get("id")) {
			t.Errorf("%s does not show the key", p)
		}
	}
	if strings.Contains(again.Body.String()+c.log.String(), secret) {
		t.Errorf("the secret is in the redirect or the log:\n%s", c.log.String())
	}
}

// A refused form comes back in place: the field's message next to its
// input, what the user typed kept, 422 rather than an error page.
func TestARefusedIssueIsShownInPlaceWithTheInputKept(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	form := c.issueForm(ck, "blue", url.Values{"name": {"ci <x>"}, "models": {"gpt-["}, "expires": {"soon"}, "reason": {"onboarding"}})
	rec := c.do(ck, http.MethodPost, "/tenants/blue/keys", form)
	body := rec.Body.String()
	if rec.Code != http.StatusUnprocessableEntity || strings.Contains(body, "Something went wrong") {
		t.Fatalf("refused issue: %d\n%s", rec.Code, body)
	}
	for _, want := range []string{
		`value="gpt-["`, `value="soon"`, `value="ci &lt;x&gt;"`, `value="` + form.Get("id") + `"`,
		`<input name="models" required value="gpt-["></label><span class="field-error" role="alert">models[0]: &#34;gpt-[&#34; is not a model name`,
		`<input name="expires" value="soon"></label><span class="field-error" role="alert">expires_in: &#34;soon&#34; is not a positive duration`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %s", html.UnescapeString(want))
		}
	}
	if c.admin.count() != 0 {
		t.Error("a refused form issued a key")
	}
}

// A change posted from a page that read an older version gets the API's
// 409 in place, saying who changed the key since; the change from a
// fresh page is made and shows in the audit trail with its diff.
func TestAStaleRevokeSaysWhoChangedTheKeySince(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	form := c.issueForm(ck, "blue", url.Values{"models": {"*"}, "reason": {"onboarding"}})
	if rec := c.do(ck, http.MethodPost, "/tenants/blue/keys", form); rec.Code != http.StatusOK {
		t.Fatalf("issue: %d %s", rec.Code, rec.Body.String())
	}
	id := form.Get("id")
	// alice rotates the key meanwhile.
	if rec := c.do(c.login("alice-token"), http.MethodPost, "/tenants/blue/keys/"+id+"/rotate", url.Values{"version": {"1"}, "overlap": {"1h"}, "reason": {"rotation"}}); rec.Code != http.StatusOK {
		t.Fatalf("alice's rotation: %d %s", rec.Code, rec.Body.String())
	}
	rec := c.do(ck, http.MethodPost, "/tenants/blue/keys/"+id+"/revoke", url.Values{"version": {"1"}, "reason": {"leaked"}})
	body := rec.Body.String()
	if rec.Code != http.StatusConflict || !strings.Contains(body, "was changed by alice") || !strings.Contains(body, "This page is reloaded") ||
		!strings.Contains(body, `<details open><summary>Revoke</summary>`) || !strings.Contains(body, `value="leaked"`) {
		t.Fatalf("stale revoke: %d\n%s", rec.Code, body)
	}
	if c.admin.key(id).Revoked {
		t.Fatal("a stale revoke was made")
	}
	rec = c.do(ck, http.MethodPost, "/tenants/blue/keys/"+id+"/revoke", url.Values{"version": {"2"}, "reason": {"leaked"}})
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/tenants/blue?done=") {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Header().Get("Location"))
	}
	page := c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
	if !strings.Contains(page, `data-key="`+id+`" data-state="revoked" data-version="3"`) {
		t.Errorf("the tenant page does not show the key revoked at version 3:\n%s", page)
	}
	trail := c.do(ck, http.MethodGet, "/tenants/blue/keys/"+id, nil).Body.String()
	for _, want := range []string{`data-action="key.issue" data-version="1"`, `data-action="key.rotate" data-version="2"`,
		`data-action="key.revoke" data-version="3"`, "leaked", "alice", "<code>revoked</code>: false → true"} {
		if !strings.Contains(trail, want) {
			t.Errorf("the key's audit trail lacks %s:\n%s", want, trail)
		}
	}
}

// A viewer sees keys and no form; a tenant administrator sees and manages
// its own tenant only; neither gets the breaker forms.
func TestRolesDecideWhatThePagesOffer(t *testing.T) {
	c := newKeyConsole(t)
	op := c.login("op-token")
	form := c.issueForm(op, "red", url.Values{"models": {"*"}, "reason": {"red's key"}})
	c.do(op, http.MethodPost, "/tenants/red/keys", form)
	redKey := form.Get("id")

	viewer := c.login("viewer-token")
	page := c.do(viewer, http.MethodGet, "/tenants/red", nil).Body.String()
	if !strings.Contains(page, `data-key="`+redKey+`"`) || strings.Contains(page, `<form method="post" action="/tenants/red/`) {
		t.Errorf("a viewer must see red's key and no form:\n%s", page)
	}
	if rec := c.do(viewer, http.MethodPost, "/tenants/red/keys/"+redKey+"/revoke", url.Values{"version": {"1"}, "reason": {"x"}}); rec.Code != http.StatusForbidden || c.admin.key(redKey).Revoked {
		t.Errorf("a viewer's revoke: %d", rec.Code)
	}

	rec := c.do(nil, http.MethodPost, "/login", url.Values{"token": {"blue-token"}})
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/tenants/blue" {
		t.Errorf("a tenant admin's login goes to %d %s, want its tenant", rec.Code, rec.Header().Get("Location"))
	}
	blue := c.login("blue-token")
	page = c.do(blue, http.MethodGet, "/tenants/blue", nil).Body.String()
	if !strings.Contains(page, `id="form-issue"`) || strings.Contains(page, `id="form-trip"`) {
		t.Errorf("a tenant admin on its tenant: an issue form and no breaker form wanted:\n%s", page)
	}
	for _, p := range []string{"/tenants/red", "/tenants/red/audit", "/tenants/red/keys/" + redKey} {
		if rec := c.do(blue, http.MethodGet, p, nil); rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), redKey) {
			t.Errorf("a tenant admin reading %s: %d", p, rec.Code)
		}
	}
	if rec := c.do(blue, http.MethodPost, "/tenants/red/keys", url.Values{"models": {"*"}, "reason": {"x"}}); rec.Code != http.StatusForbidden {
		t.Errorf("a tenant admin issuing for red: %d", rec.Code)
	}
	overview := c.do(blue, http.MethodGet, "/", nil).Body.String()
	if !strings.Contains(overview, `data-tenant="blue"`) || strings.Contains(overview, `data-tenant="red"`) {
		t.Errorf("a tenant admin's overview must list blue alone:\n%s", overview)
	}
}

func TestRefusalMapsEachMessageToItsInput(t *testing.T) {
	err := &adminapi.Error{StatusCode: 400, Message: "models[2]: bad\nexpires_at: too far\nid: taken"}
	f := refusal("issue", url.Values{"models": {"a"}}, err, issueInputs)
	if f.Status != http.StatusUnprocessableEntity || f.Err("issue", "models") != "models[2]: bad" || f.Err("issue", "expires") != "expires_at: too far" ||
		strings.Join(f.FormErrors("issue"), "|") != "id: taken" || f.Err("rotate:x", "models") != "" || f.Value("issue", "models") != "a" {
		t.Errorf("%+v", f)
	}
	if f := refusal("issue", nil, errors.New("connection refused"), issueInputs); f.Status != http.StatusBadGateway || len(f.Errors) != 1 {
		t.Errorf("unreachable API: %+v", f)
	}
}

func TestAKeysStateSaysWhetherItIsAccepted(t *testing.T) {
	now := time.Now()
	for want, k := range map[string]adminapi.Key{
		keyActive:   {KeyTerms: adminapi.KeyTerms{ExpiresAt: now.Add(time.Hour), PreviousUntil: now.Add(-time.Second)}, PreviousFingerprint: "sha256:old"},
		keyRotating: {KeyTerms: adminapi.KeyTerms{PreviousUntil: now.Add(time.Minute)}, PreviousFingerprint: "sha256:old"},
		keyExpired:  {KeyTerms: adminapi.KeyTerms{ExpiresAt: now}},
		keyRevoked:  {KeyTerms: adminapi.KeyTerms{Revoked: true, ExpiresAt: now.Add(-time.Hour)}},
	} {
		if got := viewKey(k, now).State; got != want {
			t.Errorf("%+v: %s, want %s", k, got, want)
		}
	}
}

// Every key form is refused from another site before any handler.
func TestKeyFormsRefuseCrossSitePosts(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	for _, p := range []string{"/tenants/blue/keys", "/tenants/blue/keys/k1/rotate", "/tenants/blue/keys/k1/revoke"} {
		req := httptest.NewRequest(http.MethodPost, p, strings.NewReader("models=*&reason=x&version=1"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		req.AddCookie(ck)
		rec := httptest.NewRecorder()
		c.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || c.admin.count() != 0 {
			t.Errorf("cross-site post to %s: %d", p, rec.Code)
		}
	}
}

// The breaker and override forms come back in place too, the choices and
// the typed values kept; a role that may not act is refused plainly.
func TestARefusedActionIsShownInPlace(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	rec := c.do(ck, http.MethodPost, "/tenants/blue/act", url.Values{"action": {"breaker.trip"}, "model": {"*"}, "key": {"k1"}, "expires": {"soon"}, "reason": {"stop"}})
	body := rec.Body.String()
	if rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("refused trip: %d\n%s", rec.Code, body)
	}
	for _, want := range []string{`<option selected>*</option>`, `<input name="key" value="k1">`,
		`<input name="expires" required value="soon"></label><span class="field-error" role="alert">expires_in: &#34;soon&#34;`,
		`<input name="reason" required maxlength="500" value="stop"></label><span class="field-error" role="alert">reason: required`} {
		if !strings.Contains(body, want) {
			t.Errorf("the trip form lacks %s", want)
		}
	}
	rec = c.do(ck, http.MethodPost, "/tenants/blue/act", url.Values{"action": {"override.set"}, "quota": {"hourly_tokens"}, "limit": {"lots"}, "expires": {"1h"}, "reason": {"x"}})
	if body := rec.Body.String(); rec.Code != http.StatusUnprocessableEntity || !strings.Contains(body, `value="lots"></label><span class="field-error" role="alert">limit: &#34;lots&#34; is not a number`) {
		t.Errorf("an override with a limit that is no number: %d\n%s", rec.Code, body)
	}
	if rec := c.do(c.login("viewer-token"), http.MethodPost, "/tenants/blue/act", url.Values{"action": {"breaker.trip"}, "reason": {"x"}, "expires": {"1h"}}); rec.Code != http.StatusForbidden {
		t.Errorf("a viewer's trip: %d, want 403", rec.Code)
	}
}

// The key table says when each key was last used, that a key was not used
// in the window read, and "unknown" when the admin API could not tell.
func TestTheKeyTableSaysWhenEachKeyWasLastUsed(t *testing.T) {
	c := newKeyConsole(t)
	ck := c.login("op-token")
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	c.admin.mu.Lock()
	c.admin.keys["used"] = adminapi.Key{KeyTerms: adminapi.KeyTerms{ID: "used", Tenant: "blue", Stamp: adminapi.Stamp{Version: 1}}, LastUsedAt: at}
	c.admin.keys["idle"] = adminapi.Key{KeyTerms: adminapi.KeyTerms{ID: "idle", Tenant: "blue", Stamp: adminapi.Stamp{Version: 1}}}
	c.admin.mu.Unlock()
	lastUsed := func(body, id string) string {
		m := regexp.MustCompile(`data-key="` + id + `"(?s:.*?)data-label="Last used">(.*?)</td>`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no row of key %s:\n%s", id, body)
		}
		return m[1]
	}
	body := c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
	if got := lastUsed(body, "used"); got != "2026-12-01 09:30:00 UTC" {
		t.Errorf("used key's last use %q", got)
	}
	if got := lastUsed(body, "idle"); got != "not in 90 days" {
		t.Errorf("idle key's last use %q", got)
	}
	c.admin.mu.Lock()
	c.admin.useErr = "last use unknown: clickhouse: connection refused"
	c.admin.mu.Unlock()
	body = c.do(ck, http.MethodGet, "/tenants/blue", nil).Body.String()
	if got := lastUsed(body, "idle"); !strings.Contains(got, "unknown") || !strings.Contains(got, "connection refused") {
		t.Errorf("idle key's last use without ClickHouse %q; want unknown and why", got)
	}
}
