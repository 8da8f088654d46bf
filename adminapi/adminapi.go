// Package adminapi is the contract of the enforcer's admin HTTP API: the
// route of every action, the request and response bodies, the bearer tokens
// it accepts, and a typed Client. The enforcer's server decodes into these
// types and `sluicectl admin` sends them through Client, so a field renamed
// on one side fails to compile on the other instead of being silently
// dropped on the wire.
//
// Every request carries `Authorization: Bearer TOKEN`. Every answer is JSON;
// a refused request has a status other than 200 and an ErrorResponse body
// whose message names the bad field and its limit.
package adminapi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// The read-only routes (GET). Each takes an optional ?tenant= filter.
const (
	// PathBreakers lists open and half-open breakers: BreakersResponse.
	PathBreakers = "/admin/v1/breakers"
	// PathFlags lists the flags gateways see: FlagsResponse.
	PathFlags = "/admin/v1/flags"
	// PathOverrides lists temporary quota overrides: OverridesResponse.
	PathOverrides = "/admin/v1/overrides"
	// PathWhoAmI answers who the caller's token is: WhoAmIResponse. Every
	// role may read it, so a front end (the console) can show each role
	// only what it may do.
	PathWhoAmI = "/admin/v1/whoami"
)

// WhoAmIResponse answers GET PathWhoAmI.
type WhoAmIResponse struct {
	// Name is the actor the audit trail records for the token.
	Name string `json:"name"`
	// Role is RoleOperator, RoleTenantAdmin or RoleViewer (never empty).
	Role string `json:"role"`
	// Tenant is a RoleTenantAdmin token's tenant; empty for the others.
	Tenant string `json:"tenant,omitempty"`
}

// Action is one change an operator can make. Its value is what the audit
// log (admin_audit.action) records, so existing values must never change:
// the enforcer replays the log by them after a restart.
type Action string

// The actions, each POSTed as a Request to its Path and answered with an
// ActionResponse.
const (
	// ActionTrip opens a manual breaker on a tenant, model or API key
	// until ExpiresAt.
	ActionTrip Action = "breaker.trip"
	// ActionReset closes a scope's breakers (of Kind, or every kind but
	// blacklists).
	ActionReset Action = "breaker.reset"
	// ActionBlacklist blocks a tenant, or one of its API keys, until
	// ExpiresAt.
	ActionBlacklist Action = "blacklist.add"
	// ActionUnblacklist lifts a blacklist.
	ActionUnblacklist Action = "blacklist.remove"
	// ActionSetOverride replaces one quota limit until ExpiresAt; a Limit of
	// 0 stops the tenant's spend (a leaked key).
	ActionSetOverride Action = "override.set"
	// ActionClearOverride removes an override, restoring the policy's limit.
	ActionClearOverride Action = "override.clear"
)

// actionPaths is the one table of action routes; the server registers it
// and the Client posts to it.
var actionPaths = map[Action]string{
	ActionTrip:          "/admin/v1/breakers/trip",
	ActionReset:         "/admin/v1/breakers/reset",
	ActionBlacklist:     "/admin/v1/blacklist/add",
	ActionUnblacklist:   "/admin/v1/blacklist/remove",
	ActionSetOverride:   "/admin/v1/overrides/set",
	ActionClearOverride: "/admin/v1/overrides/clear",
}

// Actions lists every action, in a fixed order.
func Actions() []Action {
	return []Action{ActionTrip, ActionReset, ActionBlacklist, ActionUnblacklist, ActionSetOverride, ActionClearOverride}
}

// Path is the route a is POSTed to; empty for an undefined action.
func (a Action) Path() string { return actionPaths[a] }

// Valid reports whether a is a defined action.
func (a Action) Valid() bool { _, ok := actionPaths[a]; return ok }

// NeedsExpiry reports whether a makes a change that must end by itself
// (trips, blacklists, overrides), so that a forgotten action cannot block a
// tenant forever.
func (a Action) NeedsExpiry() bool {
	return a == ActionTrip || a == ActionBlacklist || a == ActionSetOverride
}

// Limits on requests, enforced by the server.
const (
	// MaxReasonLen is the longest Reason accepted, in bytes.
	MaxReasonLen = 500
	// MaxExpiry is how far ahead ExpiresAt may be.
	MaxExpiry = 90 * 24 * time.Hour
	// MaxBodyBytes is the largest request body accepted.
	MaxBodyBytes = 64 << 10
	// MaxLimit is the largest override Limit accepted.
	MaxLimit = 1e15
)

// Request is the body of every action, and what the audit log keeps of it
// (enough to replay the action after a restart).
type Request struct {
	// Tenant is required.
	Tenant string `json:"tenant"`
	// Model narrows the action to one model; empty or "*" means every model.
	Model string `json:"model,omitempty"`
	// APIKeyID narrows trips, resets and blacklists to one API key.
	APIKeyID string `json:"api_key_id,omitempty"`
	// Kind narrows a reset to one breaker kind; empty resets all but
	// blacklists.
	Kind flags.Kind `json:"kind,omitempty"`
	// Quota is the quota an override sets or clears.
	Quota schemas.QuotaKind `json:"quota,omitempty"`
	// Limit is the override's limit, in the quota's unit; required by
	// ActionSetOverride, 0..MaxLimit.
	Limit *float64 `json:"limit,omitempty"`
	// Reason is required: the audit log says why. 1..MaxReasonLen bytes.
	Reason string `json:"reason"`
	// ExpiresAt or ExpiresIn (a Go duration such as "2h") bounds trips,
	// blacklists and overrides; at most MaxExpiry ahead. The server turns
	// ExpiresIn into ExpiresAt before it audits the request.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// ExpiresIn is ExpiresAt relative to the server's clock.
	ExpiresIn string `json:"expires_in,omitempty"`
}

// ActionResponse answers a successful action.
type ActionResponse struct {
	// RequestID identifies the action in the audit log; IDs sort by time.
	RequestID string `json:"request_id"`
	// Action is the action performed.
	Action Action `json:"action"`
	// Changed reports whether the action may have changed any flag (a reset
	// of a closed breaker changes nothing).
	Changed bool `json:"changed"`
	// Breakers are the tenant's breakers after the action.
	Breakers []Breaker `json:"breakers"`
}

// Breaker is one open or half-open breaker.
type Breaker struct {
	// Tenant, Scope, Kind and Quota identify the breaker. Scope is a model,
	// "*" (every model) or flags.KeyField(apiKeyID).
	Tenant string     `json:"tenant"`
	Scope  string     `json:"scope"`
	Kind   flags.Kind `json:"kind"`
	// Quota distinguishes the quota breakers of one scope; empty for other
	// kinds.
	Quota string `json:"quota,omitempty"`
	// State is open, half_open, throttle, blacklist or soft (a soft quota
	// exceeded: nothing refused, fallback models serve).
	State flags.State `json:"state"`
	// Reason says why the breaker opened, for humans.
	Reason string `json:"reason"`
	// Until is when the breaker leaves its state by itself.
	Until time.Time `json:"until"`
	// OpenedAt is when the breaker last opened.
	OpenedAt time.Time `json:"opened_at"`
	// Period, Limit, Used and ResetsAt describe the quota that was hit.
	Period   string    `json:"period,omitempty"`
	Limit    float64   `json:"limit,omitempty"`
	Used     float64   `json:"used,omitempty"`
	ResetsAt time.Time `json:"resets_at,omitzero"`
	// Failures counts consecutive failed half-open rounds.
	Failures int `json:"failures,omitempty"`
	// Probes is how many requests each Checker lets through while half-open.
	Probes int `json:"probes,omitempty"`
	// Actor names the admin who tripped a manual breaker or blacklist.
	Actor string `json:"actor,omitempty"`
}

// BreakersResponse answers GET PathBreakers.
type BreakersResponse struct {
	// Breakers are sorted by tenant, scope and kind; never null.
	Breakers []Breaker `json:"breakers"`
}

// Override is one temporary quota limit of a tenant × model.
type Override struct {
	// Tenant, Model and Quota name the limit replaced; Model "*" is every
	// model.
	Tenant string `json:"tenant"`
	Model  string `json:"model"`
	Quota  string `json:"quota"`
	// Limit replaces the policy's limit, in the quota's unit.
	Limit float64 `json:"limit"`
	// Until is when the policy's limit applies again.
	Until time.Time `json:"until"`
	// Reason and Actor are the why and who of the audit log.
	Reason string `json:"reason"`
	Actor  string `json:"actor"`
}

// OverridesResponse answers GET PathOverrides.
type OverridesResponse struct {
	// Overrides are never null.
	Overrides []Override `json:"overrides"`
}

// Flag is one flag as gateways see it: a field of a tenant's flag hash.
type Flag struct {
	Tenant string `json:"tenant"`
	// Field is a model, "*" or flags.KeyField(apiKeyID).
	Field string `json:"field"`
	// The rest mirrors flags.Flag; RetryAfter is in nanoseconds, as
	// time.Duration encodes.
	State      flags.State   `json:"state"`
	Kind       flags.Kind    `json:"kind"`
	Quota      string        `json:"quota,omitempty"`
	Period     string        `json:"period,omitempty"`
	Until      time.Time     `json:"until,omitzero"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Limit      float64       `json:"limit,omitempty"`
	Used       float64       `json:"used,omitempty"`
	ResetsAt   time.Time     `json:"resets_at,omitzero"`
	Probes     int           `json:"probes,omitempty"`
	Reason     string        `json:"reason,omitempty"`
}

// FlagOf returns f as the API lists it.
func FlagOf(tenant, field string, f *flags.Flag) Flag {
	return Flag{Tenant: tenant, Field: field, State: f.State, Kind: f.Kind, Quota: f.Quota, Period: f.Period,
		Until: f.Until, RetryAfter: f.RetryAfter, Limit: f.Limit, Used: f.Used, ResetsAt: f.ResetsAt,
		Probes: f.Probes, Reason: f.Reason}
}

// FlagsResponse answers GET PathFlags.
type FlagsResponse struct {
	// Flags are in no particular order; never null.
	Flags []Flag `json:"flags"`
}

// ErrorResponse is the body of every refused request.
type ErrorResponse struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody says why a request was refused.
type ErrorBody struct {
	// Message names each bad field and its limit.
	Message string `json:"message"`
}

// Stamp is what every record managed through the admin API carries
// besides its own fields: who made it and when, who changed it last and
// when, and its version.
type Stamp struct {
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
	// Version is 1 when the record is made and one more at every change
	// (a deletion and re-creation too). A change must carry the version it
	// read: one that read an older version is refused with 409 Conflict,
	// so two operators cannot overwrite each other.
	Version uint64 `json:"version"`
}

// MadeBy returns the stamp of a record who makes at now; the writer gives
// it its version.
func MadeBy(who string, now time.Time) Stamp {
	return Stamp{CreatedAt: now, CreatedBy: who, UpdatedAt: now, UpdatedBy: who}
}

// Token is one bearer token the server accepts, stored as its SHA-256 so
// that the configuration file holds no secret.
type Token struct {
	// Name is the actor recorded in the audit log.
	Name string `yaml:"name" help:"who uses the token; recorded as the audit actor"`
	// SHA256 is the hex SHA-256 of the token (`printf %s TOKEN | sha256sum`).
	SHA256 string `yaml:"sha256" help:"hex SHA-256 of the bearer token (printf %s TOKEN | sha256sum)"`
	// Role is RoleOperator (empty), RoleTenantAdmin or RoleViewer.
	Role string `yaml:"role" help:"operator (empty: everything), tenant_admin (the API keys of tenant only) or viewer (read only)"`
	// Tenant binds a RoleTenantAdmin token to one tenant; required for it,
	// refused for the other roles.
	Tenant string `yaml:"tenant" help:"the one tenant a tenant_admin token manages; only for role tenant_admin"`
}

// Validate names the bad field of the token at where (e.g.
// "admin.tokens[2]").
func (t Token) Validate(where string) error {
	switch t.Role {
	case "", RoleOperator, RoleViewer:
		if t.Tenant != "" {
			return fmt.Errorf("%s.tenant: only a tenant_admin token is bound to a tenant (role is %q)", where, t.Role)
		}
	case RoleTenantAdmin:
		if t.Tenant == "" {
			return fmt.Errorf("%s.tenant: required for role tenant_admin (the tenant whose keys it manages)", where)
		}
	default:
		return fmt.Errorf("%s.role: %q is not operator, tenant_admin or viewer", where, t.Role)
	}
	return nil
}

// HashToken returns the hex SHA-256 of a token, the form Token.SHA256 holds.
func HashToken(token string) string {
	s := sha256.Sum256([]byte(token))
	return hex.EncodeToString(s[:])
}
