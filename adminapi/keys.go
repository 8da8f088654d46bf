package adminapi

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// The API key routes (docs/controlplane.md). Keys live on the admin topic,
// so every gateway that follows it accepts a key issued here within
// seconds, and refuses a revoked one as fast.
const (
	// PathKeys: GET lists keys (KeysResponse; ?tenant= narrows), POST
	// issues one (IssueKeyRequest, answered by SecretResponse).
	PathKeys = "/admin/v1/keys"
	// PathKey is one key: GET answers KeyResponse. Its {id} is the key id.
	PathKey = "/admin/v1/keys/{id}"
	// PathKeyRotate: POST RotateKeyRequest, answered by SecretResponse.
	PathKeyRotate = "/admin/v1/keys/{id}/rotate"
	// PathKeyRevoke: POST RevokeKeyRequest, answered by KeyResponse.
	PathKeyRevoke = "/admin/v1/keys/{id}/revoke"
	// PathKeyAudit: GET the key's audit trail, AuditResponse.
	PathKeyAudit = "/admin/v1/keys/{id}/audit"
)

// The key actions, as the audit trail (admin_audit.action) records them.
const (
	ActionKeyIssue  Action = "key.issue"
	ActionKeyRotate Action = "key.rotate"
	ActionKeyRevoke Action = "key.revoke"
	// ActionKeyRefused marks, under the request id of a change already
	// audited, that the change was then refused (a stale version, the admin
	// topic unavailable): the trail shows it as an attempt (AuditEntry.Refused).
	ActionKeyRefused Action = "key.refused"
)

// Roles a Token may have.
const (
	// RoleOperator may do everything; a token without a role is one.
	RoleOperator = "operator"
	// RoleTenantAdmin manages the API keys of its Tenant only: it cannot
	// list, read or change another tenant's keys, nor the fleet's
	// breakers, flags and overrides.
	RoleTenantAdmin = "tenant_admin"
	// RoleViewer reads everything and changes nothing.
	RoleViewer = "viewer"
)

// Key is one API key as the admin API shows it: never its secret, nor its
// hash, only the hash's fingerprint.
type Key struct {
	KeyTerms
	// Fingerprint names the current secret (sha256: and 12 hex digits).
	Fingerprint string `json:"fingerprint"`
	// PreviousFingerprint is the secret a rotation replaced, accepted until
	// PreviousUntil.
	PreviousFingerprint string `json:"previous_fingerprint,omitempty"`
	// LastUsedAt is the time of the last call metered with the key (its
	// usage events, as ClickHouse holds them: seconds behind the call)
	// within the last KeyUseLookback; zero when there is none in that
	// window, or when ClickHouse did not answer (the response's
	// LastUseError then says why).
	LastUsedAt time.Time `json:"last_used_at,omitzero"`
}

// KeyTerms is what the admin API shows of a key and the control plane's
// record holds alike: whose key it is, what it may call, how long it
// lasts, and its Stamp. The two differ only in how they name the secret
// (a fingerprint here, the hash in the record), so they share this part.
type KeyTerms struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Name   string `json:"name,omitempty"`
	// PreviousUntil is when the secret a rotation replaced stops being
	// accepted; zero when there is none.
	PreviousUntil time.Time `json:"previous_until,omitzero"`
	// Models the key may call: names or path.Match patterns; ["*"] is
	// every model.
	Models []string `json:"models"`
	// Endpoints the key may call (URL paths such as /v1/chat/completions);
	// empty is every endpoint.
	Endpoints []string `json:"endpoints,omitempty"`
	// ExpiresAt ends the key by itself; zero never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	Revoked   bool      `json:"revoked,omitempty"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	Stamp
}

// IssueKeyRequest issues a key.
type IssueKeyRequest struct {
	// ID names the key in events (api_key_id), logs and metrics; empty: the
	// server makes one up.
	ID string `json:"id,omitempty"`
	// Tenant is whom the key's calls are charged to; required.
	Tenant string `json:"tenant"`
	Name   string `json:"name,omitempty"`
	// Models is required: names or patterns, or ["*"].
	Models    []string `json:"models"`
	Endpoints []string `json:"endpoints,omitempty"`
	// ExpiresAt or ExpiresIn (a Go duration) ends the key by itself;
	// neither: it lasts until revoked.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	ExpiresIn string    `json:"expires_in,omitempty"`
	// Reason is required, for the audit trail.
	Reason string `json:"reason"`
}

// RotateKeyRequest gives a key a new secret.
type RotateKeyRequest struct {
	// Version is the version the caller read; required.
	Version uint64 `json:"version"`
	// Overlap (a Go duration, 0..7 days) keeps the old secret valid that
	// long, for callers to switch; empty or "0s": it stops at once.
	Overlap string `json:"overlap,omitempty"`
	Reason  string `json:"reason"`
}

// RevokeKeyRequest revokes a key for good.
type RevokeKeyRequest struct {
	// Version is the version the caller read; required.
	Version uint64 `json:"version"`
	Reason  string `json:"reason"`
}

// SecretResponse answers an issue or a rotation: Secret is shown this once
// and never again.
type SecretResponse struct {
	Key    Key    `json:"key"`
	Secret string `json:"secret"`
}

// KeyResponse answers GET PathKey and a revocation.
type KeyResponse struct {
	Key Key `json:"key"`
	// LastUseError says why Key.LastUsedAt is not known; empty when it is.
	LastUseError string `json:"last_use_error,omitempty"`
}

// KeyUseLookback is how far back a key's last use is looked for.
const KeyUseLookback = 90 * 24 * time.Hour

// KeysResponse answers GET PathKeys.
type KeysResponse struct {
	// Keys are sorted by tenant and id; never null.
	Keys []Key `json:"keys"`
	// LastUseError says why the keys' LastUsedAt are not known; empty
	// when they are.
	LastUseError string `json:"last_use_error,omitempty"`
}

// Change is one field a change set: its JSON name, and its values before
// and after as JSON ("" for none).
type Change struct {
	Field string `json:"field"`
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
}

// AuditEntry is one change of the audit trail.
type AuditEntry struct {
	Time      time.Time `json:"time"`
	Actor     string    `json:"actor"`
	Action    Action    `json:"action"`
	Tenant    string    `json:"tenant"`
	APIKeyID  string    `json:"api_key_id,omitempty"`
	Reason    string    `json:"reason"`
	RequestID string    `json:"request_id"`
	// Version is the record's version after the change.
	Version uint64   `json:"version,omitempty"`
	Changes []Change `json:"changes"`
	// Refused: the change was audited, then refused (not in force); Error
	// says why.
	Refused bool   `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`
}

// AuditResponse answers GET PathKeyAudit, oldest first.
type AuditResponse struct {
	Entries []AuditEntry `json:"entries"`
}

// KeyPath returns route (PathKey, PathKeyRotate, ...) for key id (ids are
// [A-Za-z0-9._-], nothing to escape).
func KeyPath(route, id string) string { return strings.Replace(route, "{id}", id, 1) }

// IssueKey issues a key; the answer's Secret is shown once.
func (c *Client) IssueKey(ctx context.Context, req IssueKeyRequest) (SecretResponse, error) {
	var r SecretResponse
	err := c.post(ctx, PathKeys, req, &r)
	return r, err
}

// Keys lists keys; tenant "" lists every tenant's the token may see.
func (c *Client) Keys(ctx context.Context, tenant string) ([]Key, error) {
	r, err := c.KeyList(ctx, tenant)
	return r.Keys, err
}

// KeyList is Keys with what the answer says of the keys' last use.
func (c *Client) KeyList(ctx context.Context, tenant string) (KeysResponse, error) {
	var r KeysResponse
	err := c.get(ctx, PathKeys, tenant, &r)
	return r, err
}

// Key returns one key.
func (c *Client) Key(ctx context.Context, id string) (Key, error) {
	var r KeyResponse
	err := c.get(ctx, KeyPath(PathKey, id), "", &r)
	return r.Key, err
}

// RotateKey gives key id a new secret, shown once.
func (c *Client) RotateKey(ctx context.Context, id string, req RotateKeyRequest) (SecretResponse, error) {
	var r SecretResponse
	err := c.post(ctx, KeyPath(PathKeyRotate, id), req, &r)
	return r, err
}

// RevokeKey revokes key id.
func (c *Client) RevokeKey(ctx context.Context, id string, req RevokeKeyRequest) (Key, error) {
	var r KeyResponse
	err := c.post(ctx, KeyPath(PathKeyRevoke, id), req, &r)
	return r.Key, err
}

// KeyAudit returns key id's audit trail, oldest first.
func (c *Client) KeyAudit(ctx context.Context, id string) ([]AuditEntry, error) {
	var r AuditResponse
	err := c.get(ctx, KeyPath(PathKeyAudit, id), "", &r)
	return r.Entries, err
}

func (c *Client) post(ctx context.Context, path string, req, out any) error {
	return c.send(ctx, http.MethodPost, path, req, out)
}
