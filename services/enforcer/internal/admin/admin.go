// Package admin is the enforcer's authenticated HTTP API for operators:
// list breakers, flags and overrides; trip and reset breakers; blacklist
// and unblacklist a tenant or an API key; set and clear temporary quota
// overrides. Every change is written to the audit log before it takes
// effect, so an action that cannot be audited is refused; the same log
// replays the actions still in force when the enforcer restarts.
package admin

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gateway/flags"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// Token is one accepted bearer token, stored as its SHA-256 so that the
// configuration file does not hold secrets.
type Token struct {
	// Name is the actor recorded in the audit log.
	Name string `yaml:"name" help:"who uses the token; recorded as the audit actor"`
	// SHA256 is the hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
	SHA256 string `yaml:"sha256" help:"hex SHA-256 of the bearer token"`
}

// HashToken returns the hex SHA-256 of a token, the form Token.SHA256 holds.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}

// Auditor records actions; *audit.Log is the real one.
type Auditor interface {
	Write(ctx context.Context, e audit.Entry) error
}

// Limits on requests.
const (
	MaxReasonLen = 500
	MaxExpiry    = 90 * 24 * time.Hour
	maxBody      = 64 << 10
)

// Actions, as recorded in admin_audit.action.
const (
	ActionTrip          = "breaker.trip"
	ActionReset         = "breaker.reset"
	ActionBlacklist     = "blacklist.add"
	ActionUnblacklist   = "blacklist.remove"
	ActionSetOverride   = "override.set"
	ActionClearOverride = "override.clear"
)

// Request is the body of every admin action and its audit details.
type Request struct {
	Tenant   string `json:"tenant"`
	Model    string `json:"model,omitempty"`
	APIKeyID string `json:"api_key_id,omitempty"`
	// Kind narrows a reset to one breaker kind; empty resets all but
	// blacklists.
	Kind  string   `json:"kind,omitempty"`
	Quota string   `json:"quota,omitempty"`
	Limit *float64 `json:"limit,omitempty"`
	// Reason is required: the audit log says why.
	Reason string `json:"reason"`
	// ExpiresAt or ExpiresIn (a Go duration such as "2h") bounds trips,
	// blacklists and overrides; at most MaxExpiry ahead.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	ExpiresIn string    `json:"expires_in,omitempty"`
}

// API serves /admin/v1/.
type API struct {
	table  *breaker.Table
	notify func(tenants ...string)
	audit  Auditor
	tokens []Token
	log    *slog.Logger
	now    func() time.Time
	ttl    time.Duration
}

// New returns the API. notify is told which tenants' flags changed.
func New(table *breaker.Table, notify func(tenants ...string), aud Auditor, tokens []Token, flagTTL time.Duration, log *slog.Logger) *API {
	return &API{table: table, notify: notify, audit: aud, tokens: tokens, log: log, now: time.Now, ttl: flagTTL}
}

// Handler returns the HTTP handler.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/v1/breakers", a.listBreakers)
	mux.HandleFunc("GET /admin/v1/flags", a.listFlags)
	mux.HandleFunc("GET /admin/v1/overrides", a.listOverrides)
	for _, act := range []struct{ path, action string }{
		{"/admin/v1/breakers/trip", ActionTrip},
		{"/admin/v1/breakers/reset", ActionReset},
		{"/admin/v1/blacklist/add", ActionBlacklist},
		{"/admin/v1/blacklist/remove", ActionUnblacklist},
		{"/admin/v1/overrides/set", ActionSetOverride},
		{"/admin/v1/overrides/clear", ActionClearOverride},
	} {
		mux.HandleFunc("POST "+act.path, func(w http.ResponseWriter, r *http.Request) { a.act(w, r, act.action) })
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
		sum := HashToken(tok)
		actor := ""
		for _, t := range a.tokens {
			if subtle.ConstantTimeCompare([]byte(sum), []byte(strings.ToLower(t.SHA256))) == 1 {
				actor = t.Name
			}
		}
		if actor == "" {
			writeError(w, http.StatusUnauthorized, "authorization: unknown token")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), actorKey{}, actor)))
	})
}

type actorKey struct{}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg}})
}

func (a *API) listBreakers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"breakers": nonNil(a.table.Breakers(r.URL.Query().Get("tenant")))})
}

func (a *API) listOverrides(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"overrides": nonNil(a.table.Overrides(r.URL.Query().Get("tenant")))})
}

// FlagView is one flag as the admin API lists it.
type FlagView struct {
	Tenant string `json:"tenant"`
	Field  string `json:"field"`
	flags.Flag
}

func (a *API) listFlags(w http.ResponseWriter, r *http.Request) {
	want := r.URL.Query().Get("tenant")
	now := a.now()
	out := []FlagView{}
	for _, t := range a.table.Tenants() {
		if want != "" && t != want {
			continue
		}
		for field, f := range a.table.Flags(t, now, a.ttl) {
			out = append(out, FlagView{Tenant: t, Field: field, Flag: *f})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"flags": out})
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (a *API) act(w http.ResponseWriter, r *http.Request, action string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	if len(body) > maxBody {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("body: larger than the limit of %d bytes", maxBody))
		return
	}
	var req Request
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return
	}
	precise := a.now().UTC()
	now := precise.Truncate(time.Second) // admin_audit.time is a DateTime
	if err := Normalize(&req, action, now); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	details, _ := json.Marshal(req)
	e := audit.Entry{Time: now, Actor: r.Context().Value(actorKey{}).(string), Action: action, Tenant: req.Tenant,
		Model: req.Model, APIKeyID: req.APIKeyID, Reason: req.Reason, ExpiresAt: req.ExpiresAt,
		Details: string(details), RequestID: requestID(precise)}
	actx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := a.audit.Write(actx, e); err != nil {
		a.log.Error("admin: audit write failed; action refused", "action", action, "err", err)
		writeError(w, http.StatusServiceUnavailable, "audit log unavailable, so the action was not applied: "+err.Error())
		return
	}
	changed := Apply(a.table, action, req, e.Actor, now)
	if changed {
		a.notify(req.Tenant)
	}
	a.log.Info("admin action", "actor", e.Actor, "action", action, "tenant", req.Tenant, "model", req.Model,
		"api_key_id", req.APIKeyID, "reason", req.Reason, "expires_at", req.ExpiresAt, "request_id", e.RequestID)
	writeJSON(w, http.StatusOK, map[string]any{"request_id": e.RequestID, "action": action, "changed": changed,
		"breakers": nonNil(a.table.Breakers(req.Tenant))})
}

// requestID sorts by time, so that replay order is action order.
func requestID(now time.Time) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%020d-%s", now.UnixNano(), hex.EncodeToString(b[:]))
}

var quotaNames = map[string]bool{"monthly_tokens": true, "daily_tokens": true, "hourly_tokens": true,
	"tokens_per_minute": true, "requests_per_minute": true, "budget": true}

var tenantRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,` + strconv.Itoa(schemas.MaxTenantLen) + `}$`)

// Normalize checks req for action, fills defaults (model "*") and turns
// ExpiresIn into ExpiresAt. Errors name every bad field and its limit.
func Normalize(req *Request, action string, now time.Time) error {
	var errs []error
	if !tenantRE.MatchString(req.Tenant) {
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
	if strings.TrimSpace(req.Reason) == "" || len(req.Reason) > MaxReasonLen {
		errs = append(errs, fmt.Errorf("reason: required, 1..%d bytes (the audit log says why)", MaxReasonLen))
	}
	needsExpiry := action == ActionTrip || action == ActionBlacklist || action == ActionSetOverride
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("expires_in: %q is not a positive duration such as 2h", req.ExpiresIn))
		} else {
			req.ExpiresAt = now.Add(d)
		}
		req.ExpiresIn = ""
	}
	if needsExpiry {
		switch {
		case req.ExpiresAt.IsZero():
			errs = append(errs, errors.New("expires_at: required (or expires_in); at most 90 days ahead"))
		case !req.ExpiresAt.After(now):
			errs = append(errs, fmt.Errorf("expires_at: %s is not in the future", req.ExpiresAt.Format(time.RFC3339)))
		case req.ExpiresAt.Sub(now) > MaxExpiry:
			errs = append(errs, fmt.Errorf("expires_at: %s is beyond the limit of 90 days ahead", req.ExpiresAt.Format(time.RFC3339)))
		}
	}
	if action == ActionReset && req.Kind != "" && !flags.Kind(req.Kind).Valid() {
		errs = append(errs, fmt.Errorf("kind: %q is not quota, rate, error_ratio, slow_call, manual or blacklist", req.Kind))
	}
	if action == ActionSetOverride || action == ActionClearOverride {
		if !quotaNames[req.Quota] {
			errs = append(errs, fmt.Errorf("quota: %q is not monthly_tokens, daily_tokens, hourly_tokens, tokens_per_minute, requests_per_minute or budget", req.Quota))
		}
	}
	if action == ActionSetOverride {
		if req.Limit == nil || *req.Limit < 0 || *req.Limit > 1e15 {
			errs = append(errs, errors.New("limit: required, 0..1e15 (0 stops the tenant, e.g. a leaked key)"))
		}
	}
	return errors.Join(errs...)
}

// Apply performs a normalized action on table at now; it reports whether
// flags may have changed. Replay after a restart calls it with each audited
// action's own time.
func Apply(table *breaker.Table, action string, req Request, actor string, now time.Time) bool {
	scope := req.Model
	if req.APIKeyID != "" && action != ActionBlacklist && action != ActionUnblacklist {
		scope = flags.KeyField(req.APIKeyID)
	}
	switch action {
	case ActionTrip:
		table.Trip(req.Tenant, scope, req.Reason, actor, req.ExpiresAt, now)
		return true
	case ActionReset:
		return table.Reset(req.Tenant, scope, flags.Kind(req.Kind))
	case ActionBlacklist:
		table.Blacklist(req.Tenant, req.APIKeyID, req.Reason, actor, req.ExpiresAt, now)
		return true
	case ActionUnblacklist:
		return table.Unblacklist(req.Tenant, req.APIKeyID)
	case ActionSetOverride:
		table.SetOverride(breaker.Override{Tenant: req.Tenant, Model: req.Model, Quota: req.Quota, Limit: *req.Limit,
			Until: req.ExpiresAt, Reason: req.Reason, Actor: actor}, now)
		return true
	case ActionClearOverride:
		return table.ClearOverride(req.Tenant, req.Model, req.Quota)
	}
	return false
}

// Replay applies audited actions in order, skipping those already expired
// at now; it returns the tenants touched.
func Replay(table *breaker.Table, entries []audit.Entry, now time.Time, log *slog.Logger) []string {
	var touched []string
	for _, e := range entries {
		var req Request
		if err := json.Unmarshal([]byte(e.Details), &req); err != nil {
			log.Warn("admin: skipping unreadable audit entry", "request_id", e.RequestID, "err", err)
			continue
		}
		if !req.ExpiresAt.IsZero() && !req.ExpiresAt.After(now) {
			continue
		}
		if Apply(table, e.Action, req, e.Actor, e.Time) {
			touched = append(touched, req.Tenant)
		}
	}
	return touched
}
