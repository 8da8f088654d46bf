// Package admin is the enforcer's authenticated HTTP API for operators:
// list breakers, flags and overrides; trip and reset breakers; blacklist
// and unblacklist a tenant or an API key; set and clear temporary quota
// overrides. Every change is written to the audit log before it takes
// effect, so an action that cannot be audited is refused; it then takes
// effect through the shared admin topic (Publisher, state.go), which every
// replica reads and which survives restarts.
package admin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// Auditor records actions; *audit.Log is the real one.
type Auditor interface {
	Write(ctx context.Context, e audit.Entry) error
}

// Publisher puts admin records on the shared admin topic and returns once
// the broker acknowledged them and this replica's own table has applied
// them, so that the answer shows the action in force.
type Publisher interface {
	Publish(ctx context.Context, recs []Record) error
}

// API serves /admin/v1/.
type API struct {
	pub    Publisher
	table  *breaker.Table
	notify func(tenants ...string)
	audit  Auditor
	tokens []adminapi.Token
	log    *slog.Logger
	now    func() time.Time
	// keys and keyAudit serve the API key routes (keys.go); nil keys
	// serves none. keyUse, when set, tells the keys' last use.
	keys     KeyStore
	keyAudit KeyAuditReader
	keyUse   KeyUseReader
	// sections and sectionAudit serve the tenant and plan routes
	// (sections.go); nil sections serves none.
	sections     SectionStore
	sectionAudit SectionAuditReader
}

// New returns the API. notify is told which tenants' flags changed.
func New(table *breaker.Table, notify func(tenants ...string), aud Auditor, tokens []adminapi.Token, log *slog.Logger) *API {
	return &API{table: table, notify: notify, audit: aud, tokens: tokens, log: log, now: time.Now}
}

// WithPublisher makes the API share its actions through p (the admin
// topic) instead of applying them to its own table only: every replica
// then enforces them, and they survive any restart.
func (a *API) WithPublisher(p Publisher) *API {
	a.pub = p
	return a
}

// Handler returns the HTTP handler.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+adminapi.PathBreakers, a.listBreakers)
	mux.HandleFunc("GET "+adminapi.PathFlags, a.listFlags)
	mux.HandleFunc("GET "+adminapi.PathOverrides, a.listOverrides)
	mux.HandleFunc("GET "+adminapi.PathWhoAmI, func(w http.ResponseWriter, r *http.Request) {
		p := principalOf(r)
		role := cmp.Or(p.role, adminapi.RoleOperator)
		writeJSON(w, http.StatusOK, adminapi.WhoAmIResponse{Name: p.name, Role: role, Tenant: p.tenant})
	})
	for _, act := range adminapi.Actions() {
		mux.HandleFunc("POST "+act.Path(), func(w http.ResponseWriter, r *http.Request) { a.act(w, r, act) })
	}
	if a.keys != nil {
		a.keyRoutes(mux)
	}
	if a.sections != nil {
		a.sectionRoutes(mux)
	}
	return a.authenticate(mux)
}

func (a *API) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || tok == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
			writeError(w, http.StatusUnauthorized, "authorization: a bearer token is required")
			return
		}
		sum := adminapi.HashToken(tok)
		var who *principal
		for _, t := range a.tokens {
			if subtle.ConstantTimeCompare([]byte(sum), []byte(strings.ToLower(t.SHA256))) == 1 {
				who = &principal{name: t.Name, role: t.Role, tenant: t.Tenant}
			}
		}
		if who == nil {
			writeError(w, http.StatusUnauthorized, "authorization: unknown token")
			return
		}
		if msg := who.refuses(r); msg != "" {
			writeError(w, http.StatusForbidden, msg)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, who)))
	})
}

// principal is who a token is: the actor the audit log records, its role
// (adminapi.Role*; empty is an operator) and a tenant admin's tenant.
type principal struct {
	name, role, tenant string
}

// refuses says why the role may not make request r at all, or "". Which
// tenant's keys a tenant admin may touch is checked by each key route
// (keys.go), once it knows the key.
func (p *principal) refuses(r *http.Request) string {
	switch p.role {
	case adminapi.RoleViewer:
		if r.Method != http.MethodGet {
			return "authorization: token " + p.name + " is a viewer: it reads and changes nothing"
		}
	case adminapi.RoleTenantAdmin:
		if r.URL.Path == adminapi.PathWhoAmI {
			return ""
		}
		tenants := adminapi.KindTenant.Path()
		if r.Method == http.MethodGet && (r.URL.Path == tenants || strings.HasPrefix(r.URL.Path, tenants+"/")) {
			return "" // its own tenant only: each route checks (sections.go)
		}
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, tenants+"/") {
			return "" // its own tenant's sub-budgets only: changeSection checks
		}
		if r.URL.Path != adminapi.PathKeys && !strings.HasPrefix(r.URL.Path, adminapi.PathKeys+"/") {
			return "authorization: token " + p.name + " administers tenant " + p.tenant + "'s API keys (" + adminapi.PathKeys + ") and sub-budgets (limits scoped by user, key or session: PUT " + tenants + "/" + p.tenant + "), and reads its tenant"
		}
	}
	return ""
}

// mayTouch reports whether p may see and change tenant's records.
func (p *principal) mayTouch(tenant string) bool {
	return p.role != adminapi.RoleTenantAdmin || p.tenant == tenant
}

func principalOf(r *http.Request) *principal { return r.Context().Value(actorKey{}).(*principal) }

type actorKey struct{}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, adminapi.ErrorResponse{Error: adminapi.ErrorBody{Message: msg}})
}

func (a *API) listBreakers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, adminapi.BreakersResponse{Breakers: breakersOf(a.table.Breakers(r.URL.Query().Get("tenant")))})
}

func (a *API) listOverrides(w http.ResponseWriter, r *http.Request) {
	os := a.table.Overrides(r.URL.Query().Get("tenant"))
	out := make([]adminapi.Override, 0, len(os))
	for _, o := range os {
		out = append(out, adminapi.Override{Tenant: o.Tenant, Model: o.Model, Quota: o.Quota, Limit: o.Limit,
			Until: o.Until, Reason: o.Reason, Actor: o.Actor})
	}
	writeJSON(w, http.StatusOK, adminapi.OverridesResponse{Overrides: out})
}

func (a *API) listFlags(w http.ResponseWriter, r *http.Request) {
	want := r.URL.Query().Get("tenant")
	out := []adminapi.Flag{}
	for _, t := range a.table.Tenants() {
		if want != "" && t != want {
			continue
		}
		for field, f := range a.table.Flags(t) {
			out = append(out, adminapi.FlagOf(t, field, f))
		}
	}
	writeJSON(w, http.StatusOK, adminapi.FlagsResponse{Flags: out})
}

// breakersOf converts the table's breakers to the API's (never nil, so
// that the answer lists [] rather than null).
func breakersOf(bs []breaker.Breaker) []adminapi.Breaker {
	out := make([]adminapi.Breaker, 0, len(bs))
	for _, b := range bs {
		out = append(out, adminapi.Breaker{Tenant: b.Tenant, Scope: b.Scope, Kind: b.Kind, Quota: b.Quota,
			State: b.State, Reason: b.Reason, Until: b.Until, OpenedAt: b.OpenedAt, Period: b.Period,
			Limit: b.Limit, Used: b.Used, ResetsAt: b.ResetsAt, Failures: b.Failures, Probes: b.Probes, Actor: b.Actor})
	}
	return out
}

func (a *API) act(w http.ResponseWriter, r *http.Request, action adminapi.Action) {
	var req adminapi.Request
	if !decodeBody(w, r, &req) {
		return
	}
	precise := a.now().UTC()
	now := precise.Truncate(time.Second) // admin_audit.time is a DateTime
	if err := Normalize(&req, action, now); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	details, _ := json.Marshal(req)
	e := audit.Entry{Time: now, Actor: principalOf(r).name, Action: string(action), Tenant: req.Tenant,
		Model: req.Model, APIKeyID: req.APIKeyID, Reason: req.Reason, ExpiresAt: req.ExpiresAt,
		Details: string(details), RequestID: requestID(precise)}
	actx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := a.audit.Write(actx, e); err != nil {
		a.log.Error("admin: audit write failed; action refused", "action", action, "err", err)
		writeError(w, http.StatusServiceUnavailable, "audit log unavailable, so the action was not applied: "+err.Error())
		return
	}
	var changed bool
	if a.pub == nil {
		changed = Apply(a.table, action, req, e.Actor, now)
	} else {
		recs, local := RecordsOf(action, req, e.Actor, now)
		before := fmt.Sprint(a.table.Breakers(req.Tenant), a.table.Overrides(req.Tenant))
		if len(recs) > 0 {
			if err := a.pub.Publish(actx, recs); err != nil {
				a.log.Error("admin: publishing to the admin topic failed; action refused", "action", action, "err", err)
				writeError(w, http.StatusServiceUnavailable, "admin topic: "+err.Error()+"; unless the broker acknowledged it the action is not in force (list breakers to see; the audit log has the attempt), so retry")
				return
			}
		}
		if local {
			Apply(a.table, action, req, e.Actor, now)
		}
		changed = before != fmt.Sprint(a.table.Breakers(req.Tenant), a.table.Overrides(req.Tenant))
	}
	if changed {
		a.notify(req.Tenant)
	}
	a.log.Info("admin action", "actor", e.Actor, "action", action, "tenant", req.Tenant, "model", req.Model,
		"api_key_id", req.APIKeyID, "reason", req.Reason, "expires_at", req.ExpiresAt, "request_id", e.RequestID)
	writeJSON(w, http.StatusOK, adminapi.ActionResponse{RequestID: e.RequestID, Action: action, Changed: changed,
		Breakers: breakersOf(a.table.Breakers(req.Tenant))})
}

// decodeBody decodes r's JSON body into v, refusing unknown fields and a
// body over adminapi.MaxBodyBytes; it answers the error itself and returns
// false when it fails.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(io.LimitReader(r.Body, adminapi.MaxBodyBytes+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	if len(body) > adminapi.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than the limit of %d bytes", adminapi.MaxBodyBytes))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	return true
}

// requestID sorts by time, so that replay order is action order.
func requestID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%020d-%s", now.UnixNano(), hex.EncodeToString(b[:]))
}

// quotaChoices lists the quota kinds for error messages, from the one table
// of kinds (schemas), so that a new kind is named without editing this file.
var quotaChoices = func() string {
	kinds := schemas.QuotaKinds()
	names := make([]string, len(kinds))
	for i, q := range kinds {
		names[i] = string(q)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}()

// Normalize checks req for action, fills defaults (model "*") and turns
// ExpiresIn into ExpiresAt. Errors name every bad field and its limit.
func Normalize(req *adminapi.Request, action adminapi.Action, now time.Time) error {
	var errs []error
	if !controlplane.ValidTenant(req.Tenant) {
		errs = append(errs, fmt.Errorf("tenant: %q must be 1..%d characters of [A-Za-z0-9._:-]", req.Tenant, schemas.MaxTenantLen))
	}
	if req.Model == "" {
		req.Model = flags.AllModels
	}
	if len(req.Model) > schemas.MaxModelLen || strings.HasPrefix(req.Model, "@") || strings.ContainsAny(req.Model, " \t\n") {
		errs = append(errs, fmt.Errorf("model: %q must be at most %d bytes without spaces and not start with @", req.Model, schemas.MaxModelLen))
	}
	if len(req.APIKeyID) > schemas.MaxStringLen {
		errs = append(errs, fmt.Errorf("api_key_id: longer than the limit of %d bytes", schemas.MaxStringLen))
	}
	if err := checkReason(req.Reason); err != nil {
		errs = append(errs, err)
	}
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("expires_in: %q is not a positive duration such as 2h", req.ExpiresIn))
		} else {
			req.ExpiresAt = now.Add(d)
		}
		req.ExpiresIn = ""
	}
	if action.NeedsExpiry() {
		switch {
		case req.ExpiresAt.IsZero():
			errs = append(errs, errors.New("expires_at: required (or expires_in); at most 90 days ahead"))
		case !req.ExpiresAt.After(now):
			errs = append(errs, fmt.Errorf("expires_at: %s is not in the future", req.ExpiresAt.Format(time.RFC3339)))
		case req.ExpiresAt.Sub(now) > adminapi.MaxExpiry:
			errs = append(errs, fmt.Errorf("expires_at: %s is beyond the limit of 90 days ahead", req.ExpiresAt.Format(time.RFC3339)))
		}
	}
	if action == adminapi.ActionReset && req.Kind != "" && !req.Kind.Valid() {
		errs = append(errs, fmt.Errorf("kind: %q is not quota, rate, error_ratio, slow_call, manual or blacklist", req.Kind))
	}
	if action == adminapi.ActionSetOverride || action == adminapi.ActionClearOverride {
		if !req.Quota.Valid() {
			errs = append(errs, fmt.Errorf("quota: %q is not %s", req.Quota, quotaChoices))
		}
	}
	if action == adminapi.ActionSetOverride {
		if req.Limit == nil || *req.Limit < 0 || *req.Limit > adminapi.MaxLimit {
			errs = append(errs, errors.New("limit: required, 0..1e15 (0 stops the tenant, e.g. a leaked key)"))
		}
	}
	return errors.Join(errs...)
}

// Apply performs a normalized action on table at now; it reports whether
// flags may have changed. The API uses it when it has no Publisher (a
// single process, tests) and for the resets that are not admin state.
func Apply(table *breaker.Table, action adminapi.Action, req adminapi.Request, actor string, now time.Time) bool {
	scope := req.Model
	if req.APIKeyID != "" && action != adminapi.ActionBlacklist && action != adminapi.ActionUnblacklist {
		scope = flags.KeyField(req.APIKeyID)
	}
	switch action {
	case adminapi.ActionTrip:
		table.Trip(req.Tenant, scope, req.Reason, actor, req.ExpiresAt, now)
		return true
	case adminapi.ActionReset:
		return table.Reset(req.Tenant, scope, req.Kind)
	case adminapi.ActionBlacklist:
		table.Blacklist(req.Tenant, req.APIKeyID, req.Reason, actor, req.ExpiresAt, now)
		return true
	case adminapi.ActionUnblacklist:
		return table.Unblacklist(req.Tenant, req.APIKeyID)
	case adminapi.ActionSetOverride:
		table.SetOverride(breaker.Override{Tenant: req.Tenant, Model: req.Model, Quota: string(req.Quota), Limit: *req.Limit,
			Until: req.ExpiresAt, Reason: req.Reason, Actor: actor}, now)
		return true
	case adminapi.ActionClearOverride:
		return table.ClearOverride(req.Tenant, req.Model, string(req.Quota))
	}
	return false
}
