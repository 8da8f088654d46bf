package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
)

// KeyStore is where the API keys live: the admin topic, as the enforcer's
// replica reads it.
type KeyStore interface {
	// Key returns key id, or nil.
	Key(id string) *controlplane.Key
	// Keys returns the keys of tenant ("" every tenant).
	Keys(tenant string) []*controlplane.Key
	// PutKey writes k as the version after read (0: a new key) and returns
	// once it is in force on this replica; a change that read an older
	// version than the one in force is refused with controlplane.ErrStale.
	PutKey(ctx context.Context, k *controlplane.Key, read uint64, request string) error
	// Synced returns once the store holds every record the topic held when
	// the replica started, or ctx's error: before, a key would be missing.
	Synced(ctx context.Context) error
}

// KeyAuditReader reads a key's audit trail; *audit.Log is the real one.
type KeyAuditReader interface {
	ByKey(ctx context.Context, apiKeyID string) ([]audit.Entry, error)
}

// KeyUseReader says when the keys of tenants were last used: the time of
// the last usage event of each key id since since; ids without one are
// absent. The enforcer's reads usage_events in ClickHouse.
type KeyUseReader interface {
	LastUse(ctx context.Context, tenants []string, since time.Time) (map[string]time.Time, error)
}

// maxKeyUseTenants bounds the tenants whose keys' last use one listing
// reads, so that listing every tenant's keys does not scan months of
// every tenant's events.
const maxKeyUseTenants = 100

// WithKeyUse fills the keys' LastUsedAt from r.
func (a *API) WithKeyUse(r KeyUseReader) *API {
	a.keyUse = r
	return a
}

// keysWithUse returns the API views of ks with their last use, and why
// it is unknown when the reader fails: a listing still answers while
// ClickHouse is away.
func (a *API) keysWithUse(ctx context.Context, ks []*controlplane.Key) ([]adminapi.Key, string) {
	out := make([]adminapi.Key, len(ks))
	var tenants []string
	seen := map[string]bool{}
	for i, k := range ks {
		out[i] = k.API()
		if !seen[k.Tenant] {
			seen[k.Tenant] = true
			tenants = append(tenants, k.Tenant)
		}
	}
	switch {
	case a.keyUse == nil || len(ks) == 0:
		return out, ""
	case len(tenants) > maxKeyUseTenants:
		return out, fmt.Sprintf("last use unknown: the keys of %d tenants are listed; it is read for at most %d at once (name one: ?tenant=)", len(tenants), maxKeyUseTenants)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	used, err := a.keyUse.LastUse(ctx, tenants, a.now().Add(-adminapi.KeyUseLookback))
	if err != nil {
		a.log.Warn("admin API: keys' last use unknown", "err", err)
		return out, "last use unknown: " + err.Error()
	}
	for i := range out {
		out[i].LastUsedAt = used[out[i].ID]
	}
	return out, ""
}

// WithKeys serves the API key routes (adminapi.PathKeys) from store, with
// the audit trail read from trail.
func (a *API) WithKeys(store KeyStore, trail KeyAuditReader) *API {
	a.keys, a.keyAudit = store, trail
	return a
}

// keyDetails is what admin_audit.details holds for a key change.
type keyDetails struct {
	Version uint64            `json:"version"`
	Changes []adminapi.Change `json:"changes"`
}

func (a *API) keyRoutes(mux *http.ServeMux) {
	route := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, a.syncedOn(a.keys.Synced, h)) }
	route("GET "+adminapi.PathKeys, a.listKeys)
	route("POST "+adminapi.PathKeys, a.issueKey)
	route("GET "+adminapi.PathKey, func(w http.ResponseWriter, r *http.Request) {
		if k := a.visibleKey(w, r); k != nil {
			keys, useErr := a.keysWithUse(r.Context(), []*controlplane.Key{k})
			writeJSON(w, http.StatusOK, adminapi.KeyResponse{Key: keys[0], LastUseError: useErr})
		}
	})
	route("POST "+adminapi.PathKeyRotate, a.rotateKey)
	route("POST "+adminapi.PathKeyRevoke, a.revokeKey)
	route("GET "+adminapi.PathKeyAudit, a.keyTrail)
}

// syncedOn holds a control-plane request until the replica has read the
// admin topic as far as it was at start (synced returns; a restarted
// replica would otherwise answer 404 for a key or tenant it has not read
// yet, or create one that exists), for up to 10 s, then answers 503.
func (a *API) syncedOn(synced func(context.Context) error, next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := synced(ctx); err != nil {
			writeError(w, http.StatusServiceUnavailable, "admin topic: not yet read to its end after a start; retry: "+err.Error())
			return
		}
		next(w, r)
	})
}

func (a *API) listKeys(w http.ResponseWriter, r *http.Request) {
	p, tenant := principalOf(r), r.URL.Query().Get("tenant")
	if p.role == adminapi.RoleTenantAdmin {
		if tenant != "" && tenant != p.tenant {
			writeError(w, http.StatusForbidden, "tenant: token "+p.name+" administers tenant "+p.tenant+" only")
			return
		}
		tenant = p.tenant
	}
	keys, useErr := a.keysWithUse(r.Context(), a.keys.Keys(tenant))
	writeJSON(w, http.StatusOK, adminapi.KeysResponse{Keys: keys, LastUseError: useErr})
}

// visibleKey returns the key the path names, or answers 404: a key of
// another tenant is as unknown to a tenant admin as one that does not
// exist, so that ids of other tenants cannot be probed.
func (a *API) visibleKey(w http.ResponseWriter, r *http.Request) *controlplane.Key {
	id := r.PathValue("id")
	k := a.keys.Key(id)
	if k == nil || !principalOf(r).mayTouch(k.Tenant) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("id: no key %q", id))
		return nil
	}
	return k
}

func (a *API) issueKey(w http.ResponseWriter, r *http.Request) {
	var req adminapi.IssueKeyRequest
	if !decodeBody(w, r, &req) {
		return
	}
	p := principalOf(r)
	if !p.mayTouch(req.Tenant) {
		writeError(w, http.StatusForbidden, "tenant: token "+p.name+" administers tenant "+p.tenant+" only")
		return
	}
	now := a.now().UTC()
	var errs []error
	if req.ID == "" {
		req.ID = controlplane.NewID()
	}
	expires, err := expiry(req.ExpiresAt, req.ExpiresIn, now)
	errs = append(errs, err, checkReason(req.Reason))
	secret, sha, err := controlplane.NewSecret()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	k := &controlplane.Key{SHA256: sha, KeyTerms: adminapi.KeyTerms{ID: req.ID, Tenant: req.Tenant, Name: req.Name,
		Models: req.Models, Endpoints: req.Endpoints, ExpiresAt: expires, Stamp: adminapi.MadeBy(p.name, now)}}
	errs = append(errs, k.Validate())
	if err := errors.Join(errs...); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if a.keys.Key(k.ID) != nil {
		writeError(w, http.StatusConflict, fmt.Sprintf("id: key %q exists; rotate it, or issue under another id", k.ID))
		return
	}
	if a.putKey(w, r, adminapi.ActionKeyIssue, nil, k, 0, req.Reason) {
		writeJSON(w, http.StatusOK, adminapi.SecretResponse{Key: k.API(), Secret: secret})
	}
}

func (a *API) rotateKey(w http.ResponseWriter, r *http.Request) {
	var req adminapi.RotateKeyRequest
	cur := a.keyToChange(w, r, &req, func() uint64 { return req.Version })
	if cur == nil {
		return
	}
	now := a.now().UTC()
	var overlap time.Duration
	var errs []error
	if req.Overlap != "" {
		d, err := time.ParseDuration(req.Overlap)
		if err != nil || d < 0 || d > controlplane.MaxRotateOverlap {
			errs = append(errs, fmt.Errorf("overlap: %q must be a duration from 0s to %s", req.Overlap, controlplane.MaxRotateOverlap))
		}
		overlap = d
	}
	errs = append(errs, checkReason(req.Reason))
	if err := errors.Join(errs...); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if cur.Revoked {
		writeError(w, http.StatusConflict, fmt.Sprintf("id: key %q is revoked; issue a new key", cur.ID))
		return
	}
	secret, sha, err := controlplane.NewSecret()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	next := *cur
	next.SHA256, next.PreviousSHA256, next.PreviousUntil = sha, "", time.Time{}
	if overlap > 0 {
		next.PreviousSHA256, next.PreviousUntil = cur.SHA256, now.Add(overlap)
	}
	next.UpdatedAt, next.UpdatedBy = now, principalOf(r).name
	if a.putKey(w, r, adminapi.ActionKeyRotate, cur, &next, req.Version, req.Reason) {
		writeJSON(w, http.StatusOK, adminapi.SecretResponse{Key: next.API(), Secret: secret})
	}
}

func (a *API) revokeKey(w http.ResponseWriter, r *http.Request) {
	var req adminapi.RevokeKeyRequest
	cur := a.keyToChange(w, r, &req, func() uint64 { return req.Version })
	if cur == nil {
		return
	}
	if err := checkReason(req.Reason); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	now := a.now().UTC()
	next := *cur
	next.Revoked, next.RevokedAt, next.UpdatedAt, next.UpdatedBy = true, now, now, principalOf(r).name
	next.PreviousSHA256, next.PreviousUntil = "", time.Time{}
	if a.putKey(w, r, adminapi.ActionKeyRevoke, cur, &next, req.Version, req.Reason) {
		writeJSON(w, http.StatusOK, adminapi.KeyResponse{Key: next.API()})
	}
}

// keyToChange decodes into req a change of the key the path names and
// returns the key, or nil once it has answered: a bad body, no key the
// caller may see, or another version in force than the change read.
func (a *API) keyToChange(w http.ResponseWriter, r *http.Request, req any, read func() uint64) *controlplane.Key {
	if !decodeBody(w, r, req) {
		return nil
	}
	cur := a.visibleKey(w, r)
	if cur == nil || !a.fresh(w, cur, read()) {
		return nil
	}
	return cur
}

// fresh answers 409 and returns false when the change read another version
// than the one in force: another operator changed the key since.
func (a *API) fresh(w http.ResponseWriter, cur *controlplane.Key, read uint64) bool {
	return a.freshVersion(w, "key", cur.ID, adminapi.PathKey, cur.Version, read)
}

// freshVersion answers 400 for a change without the version it read, 409
// for one that read another version than cur, and returns false for both;
// route is the GET that reads what (kind, id).
func (a *API) freshVersion(w http.ResponseWriter, kind, id, route string, cur, read uint64) bool {
	if read == 0 {
		writeError(w, http.StatusBadRequest, "version: required; the version of the "+kind+" you read (GET "+route+")")
		return false
	}
	if read != cur {
		writeError(w, http.StatusConflict, fmt.Sprintf("version: %s %q is at version %d, the change read version %d; read it again and retry", kind, id, cur, read))
		return false
	}
	return true
}

// putKey audits the change from before to after, then writes after as the
// version after read (auditedPut).
func (a *API) putKey(w http.ResponseWriter, r *http.Request, action adminapi.Action, before, after *controlplane.Key, read uint64, reason string) bool {
	details, _ := json.Marshal(keyDetails{Version: read + 1, Changes: controlplane.Diff(before, after)})
	e := audit.Entry{Actor: principalOf(r).name, Action: string(action), Tenant: after.Tenant,
		APIKeyID: after.ID, Reason: reason, ExpiresAt: after.ExpiresAt, Details: string(details)}
	return a.auditedPut(w, r, e, adminapi.ActionKeyRefused, "key "+after.ID, func(ctx context.Context, request string) error {
		return a.keys.PutKey(ctx, after, read, request)
	})
}

// auditedPut writes audit entry e (its time and request id set here), then
// makes the control-plane change put under that request id; it answers the
// error itself and returns false when either fails. Audited first, as
// every action: a change that cannot be audited is not made. A change
// refused after its entry was written is marked with an entry of action
// refused and the same request id. what names the record in messages.
func (a *API) auditedPut(w http.ResponseWriter, r *http.Request, e audit.Entry, refused adminapi.Action, what string,
	put func(ctx context.Context, request string) error) bool {
	precise := a.now().UTC()
	e.Time, e.RequestID = precise.Truncate(time.Second), requestID(precise)
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := a.audit.Write(ctx, e); err != nil {
		a.log.Error("admin: audit write failed; control-plane change refused", "action", e.Action, "err", err)
		writeError(w, http.StatusServiceUnavailable, "audit log unavailable, so the change was not made: "+err.Error())
		return false
	}
	if err := put(ctx, e.RequestID); err != nil {
		// The audit entry is written: mark it refused, so that the trail
		// does not show a change that is not in force. Best effort: if
		// this write fails too, the trail shows the attempt as made.
		mark := e
		mark.Action, mark.Reason = string(refused), err.Error()
		if werr := a.audit.Write(ctx, mark); werr != nil {
			a.log.Warn("admin: could not mark a refused control-plane change in the audit log", "request_id", e.RequestID, "err", werr)
		}
		if errors.Is(err, controlplane.ErrStale) {
			writeError(w, http.StatusConflict, "version: "+err.Error()+"; read it again and retry")
			return false
		}
		a.log.Error("admin: publishing a control-plane change failed", "action", e.Action, "record", what, "err", err)
		writeError(w, http.StatusServiceUnavailable, "admin topic: "+err.Error()+"; the change may not be in force (GET it to see), retry")
		return false
	}
	a.log.Info("admin control-plane change", "actor", e.Actor, "action", e.Action, "tenant", e.Tenant, "record", what,
		"reason", e.Reason, "request_id", e.RequestID)
	return true
}

func (a *API) keyTrail(w http.ResponseWriter, r *http.Request) {
	k := a.visibleKey(w, r)
	if k == nil {
		return
	}
	if a.keyAudit == nil {
		writeError(w, http.StatusServiceUnavailable, "audit log: not readable by this enforcer")
		return
	}
	entries, err := a.keyAudit.ByKey(r.Context(), k.ID)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "audit log: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, adminapi.AuditResponse{Entries: trailOf(entries, "key.", adminapi.ActionKeyRefused, k.Tenant)})
}

// trailOf returns the entries of actions prefix* of tenant as the API
// shows them, each change refused after it was audited (an entry of action
// refused with its request id) marked so.
func trailOf(entries []audit.Entry, prefix string, refusedAction adminapi.Action, tenant string) []adminapi.AuditEntry {
	refused := map[string]string{}
	for _, e := range entries {
		if e.Action == string(refusedAction) {
			refused[e.RequestID] = e.Reason
		}
	}
	out := []adminapi.AuditEntry{}
	for _, e := range entries {
		if !strings.HasPrefix(e.Action, prefix) || e.Action == string(refusedAction) || e.Tenant != tenant {
			continue
		}
		var d keyDetails
		_ = json.Unmarshal([]byte(e.Details), &d)
		out = append(out, adminapi.AuditEntry{Time: e.Time, Actor: e.Actor, Action: adminapi.Action(e.Action), Tenant: e.Tenant,
			APIKeyID: e.APIKeyID, Reason: e.Reason, RequestID: e.RequestID, Version: d.Version, Changes: d.Changes})
		if why, ok := refused[e.RequestID]; ok {
			out[len(out)-1].Refused, out[len(out)-1].Error = true, why
		}
	}
	return out
}

// checkReason requires the audit trail's why.
func checkReason(reason string) error {
	if strings.TrimSpace(reason) == "" || len(reason) > adminapi.MaxReasonLen {
		return fmt.Errorf("reason: required, 1..%d bytes (the audit trail says why)", adminapi.MaxReasonLen)
	}
	return nil
}

// expiry turns an expires_at or expires_in into the key's end (zero: none)
// and checks it against controlplane.MaxKeyLifetime.
func expiry(at time.Time, in string, now time.Time) (time.Time, error) {
	if in != "" {
		d, err := time.ParseDuration(in)
		if err != nil || d <= 0 {
			return time.Time{}, fmt.Errorf("expires_in: %q is not a positive duration such as 720h", in)
		}
		at = now.Add(d)
	}
	switch {
	case at.IsZero():
		return at, nil
	case !at.After(now):
		return at, fmt.Errorf("expires_at: %s is not in the future", at.Format(time.RFC3339))
	case at.Sub(now) > controlplane.MaxKeyLifetime:
		return at, fmt.Errorf("expires_at: %s is beyond the limit of %s ahead", at.Format(time.RFC3339), controlplane.MaxKeyLifetime)
	}
	return at, nil
}
