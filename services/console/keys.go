package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
)

// The states a key is shown in.
const (
	keyActive   = "active"
	keyRotating = "rotating"
	keyRevoked  = "revoked"
	keyExpired  = "expired"
)

// keyView is a key as the pages show it.
type keyView struct {
	adminapi.Key
	// State is keyActive, keyRotating (a rotated-out secret still
	// accepted), keyRevoked or keyExpired.
	State string
	// UseUnknown is why LastUsedAt is not known (the admin API could not
	// read the usage events); empty when it is.
	UseUnknown string
}

func viewKey(k adminapi.Key, now time.Time) keyView {
	v := keyView{Key: k, State: keyActive}
	switch {
	case k.Revoked:
		v.State = keyRevoked
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		v.State = keyExpired
	case k.PreviousFingerprint != "" && now.Before(k.PreviousUntil):
		v.State = keyRotating
	}
	return v
}

// keyURL is key id's page (its details and audit trail) under tenant.
func keyURL(tenant, id string) string { return tenantURL(tenant) + "/keys/" + url.PathEscape(id) }

// The inputs of the key forms, by the admin API's field names.
var (
	issueInputs = map[string]string{"name": "name", "models": "models", "endpoints": "endpoints",
		"expires_at": "expires", "expires_in": "expires", "reason": "reason"}
	rotateInputs = map[string]string{"overlap": "overlap", "reason": "reason"}
	revokeInputs = map[string]string{"reason": "reason"}
)

// keysOf lists tenant's keys for the session, newest change first.
func keysOf(ctx context.Context, sess *session, tenant string, now time.Time) ([]keyView, error) {
	list, err := sess.client.KeyList(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]keyView, 0, len(list.Keys))
	for _, k := range list.Keys {
		v := viewKey(k, now)
		v.UseUnknown = list.LastUseError
		out = append(out, v)
	}
	slices.SortStableFunc(out, func(a, b keyView) int { return b.UpdatedAt.Compare(a.UpdatedAt) })
	return out, nil
}

// keyForm starts every key change: it sends a visitor without a login to
// log in, reads the form, and refuses a role that may not change tenant's
// keys (the enforcer would refuse it too; this says it plainly).
func (s *server) keyForm(w http.ResponseWriter, r *http.Request) (*session, string, bool) {
	tenant := r.PathValue("tenant")
	sess := s.sessions.get(r)
	if sess == nil {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(tenantURL(tenant)), http.StatusSeeOther)
		return nil, "", false
	}
	r.Body = http.MaxBytesReader(w, r.Body, adminapi.MaxBodyBytes)
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusBadRequest, "The form could not be read: "+err.Error())
		return nil, "", false
	}
	if !sess.mayManage(tenant) {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s, %s) may not change the API keys of tenant %s.", sess.who.Name, sess.who.Role, tenant))
		return nil, "", false
	}
	return sess, tenant, true
}

// listOf splits a list input: commas, spaces or lines between entries.
func listOf(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\r' || r == '\t' })
}

// expiryOf reads the expiry input: empty for none, a date (2027-01-31,
// midnight UTC) or a time (RFC 3339), else a duration the API checks.
func expiryOf(v string) (at time.Time, in string) {
	v = strings.TrimSpace(v)
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, ""
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, ""
	}
	return time.Time{}, v
}

// issueKey issues a key and answers with its secret, in this answer only:
// the secret is never in a URL, a log or a later page. The form carries
// the key id the page made up, so a form posted twice (a reload of the
// answer, a double click) cannot issue a second key: the API refuses the
// id as taken, and the console sends the browser to the key's page, which
// has no secret to show.
func (s *server) issueKey(w http.ResponseWriter, r *http.Request) {
	sess, tenant, ok := s.keyForm(w, r)
	if !ok {
		return
	}
	f := r.PostForm
	req := adminapi.IssueKeyRequest{ID: strings.TrimSpace(f.Get("id")), Tenant: tenant, Name: strings.TrimSpace(f.Get("name")),
		Models: listOf(f.Get("models")), Endpoints: listOf(f.Get("endpoints")), Reason: strings.TrimSpace(f.Get("reason"))}
	req.ExpiresAt, req.ExpiresIn = expiryOf(f.Get("expires"))
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	res, err := sess.client.IssueKey(ctx, req)
	if err != nil {
		var ae *adminapi.Error
		if errors.As(err, &ae) && ae.StatusCode == http.StatusConflict && req.ID != "" {
			if k, kerr := sess.client.Key(ctx, req.ID); kerr == nil && k.Tenant == tenant {
				http.Redirect(w, r, keyURL(tenant, k.ID)+"?resubmitted=1", http.StatusSeeOther)
				return
			}
		}
		s.showTenant(w, r, refusal("issue", f, err, issueInputs))
		return
	}
	s.log.Info("console: API key issued", "tenant", tenant, "key", res.Key.ID, "version", res.Key.Version)
	s.render(w, r, "secret", http.StatusOK, secretPage{Key: viewKey(res.Key, s.now()), Secret: res.Secret, Issued: true})
}

// secretPage shows a secret the one time it exists outside the caller.
type secretPage struct {
	Key    keyView
	Secret string
	// Issued: a new key; else a rotation.
	Issued bool
}

// version reads the version the page showed; 0 (which the API refuses,
// naming the field) when there is none.
func version(f url.Values) uint64 {
	v, _ := strconv.ParseUint(strings.TrimSpace(f.Get("version")), 10, 64)
	return v
}

// rotateKey gives a key a new secret, answered like an issue.
func (s *server) rotateKey(w http.ResponseWriter, r *http.Request) {
	sess, tenant, ok := s.keyForm(w, r)
	if !ok {
		return
	}
	id, f := r.PathValue("id"), r.PostForm
	req := adminapi.RotateKeyRequest{Version: version(f), Overlap: strings.TrimSpace(f.Get("overlap")), Reason: strings.TrimSpace(f.Get("reason"))}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	res, err := sess.client.RotateKey(ctx, id, req)
	if err != nil {
		s.showTenant(w, r, s.keyRefusal(ctx, sess, "rotate:"+id, id, req.Version, f, err, rotateInputs))
		return
	}
	s.log.Info("console: API key rotated", "tenant", tenant, "key", id, "version", res.Key.Version)
	s.render(w, r, "secret", http.StatusOK, secretPage{Key: viewKey(res.Key, s.now()), Secret: res.Secret})
}

// revokeKey revokes a key and comes back to the tenant's page.
func (s *server) revokeKey(w http.ResponseWriter, r *http.Request) {
	sess, tenant, ok := s.keyForm(w, r)
	if !ok {
		return
	}
	id, f := r.PathValue("id"), r.PostForm
	req := adminapi.RevokeKeyRequest{Version: version(f), Reason: strings.TrimSpace(f.Get("reason"))}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	k, err := sess.client.RevokeKey(ctx, id, req)
	if err != nil {
		s.showTenant(w, r, s.keyRefusal(ctx, sess, "revoke:"+id, id, req.Version, f, err, revokeInputs))
		return
	}
	s.log.Info("console: API key revoked", "tenant", tenant, "key", id, "version", k.Version)
	done := fmt.Sprintf("Key %s revoked (version %d): every gateway refuses it within seconds.", id, k.Version)
	http.Redirect(w, r, tenantURL(tenant)+"?done="+url.QueryEscape(done), http.StatusSeeOther)
}

// keyRefusal is refusal for a change of key id that read version: when
// the key changed since the page read it, it says who changed it and when,
// rather than the API's bare version numbers.
func (s *server) keyRefusal(ctx context.Context, sess *session, form, id string, read uint64, f url.Values, err error, inputs map[string]string) formState {
	fs := refusal(form, f, err, inputs)
	if fs.Status != http.StatusConflict {
		return fs
	}
	if k, kerr := sess.client.Key(ctx, id); kerr == nil && k.Version != read {
		// The page rendered with this refusal reads the key anew, so its
		// forms carry the new version: submitting again is a decision made
		// on what the key is now.
		fs.Errors = []string{staleMessage("Key "+id, k.UpdatedBy, k.UpdatedAt, k.Version, read, "the key as it is now")}
	}
	return fs
}

// staleMessage says that what (a key, a tenant) changed since the page
// read it: by whom, when, and the versions.
func staleMessage(what, by string, at time.Time, now, read uint64, shows string) string {
	return fmt.Sprintf("%s was changed by %s at %s since you loaded the page (it is at version %d, your page read version %d), so nothing was done. "+
		"This page is reloaded and shows %s: check the change, then submit again if you still mean it.",
		what, by, at.UTC().Format("2006-01-02 15:04:05 MST"), now, read, shows)
}

// auditPage is a key's audit trail, or a tenant's recent changes (its
// record's and its keys').
type auditPage struct {
	Tenant string
	// Key is the key whose trail this is; nil for the tenant's.
	Key     *keyView
	Entries []adminapi.AuditEntry
	// Resubmitted: the issue form was posted again; its secret is not
	// shown again.
	Resubmitted bool
	Error       string
}

// auditSession returns the session that may read tenant's keys, or
// answers: a login first; a tenant administrator of another tenant is
// refused.
func (s *server) auditSession(w http.ResponseWriter, r *http.Request, tenant string) *session {
	sess := s.sessions.get(r)
	if sess == nil {
		http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.Path), http.StatusSeeOther)
		return nil
	}
	if !sess.maySee(tenant) {
		s.fail(w, r, http.StatusForbidden, fmt.Sprintf("Your token (%s) administers tenant %s only.", sess.who.Name, sess.who.Tenant))
		return nil
	}
	return sess
}

// keyPage shows a key and its audit trail, oldest change first.
func (s *server) keyPage(w http.ResponseWriter, r *http.Request) {
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	sess := s.auditSession(w, r, tenant)
	if sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	k, err := sess.client.Key(ctx, id)
	var ae *adminapi.Error
	switch {
	case errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound, err == nil && k.Tenant != tenant:
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("Tenant %s has no key %q.", tenant, id))
		return
	case err != nil:
		s.fail(w, r, http.StatusBadGateway, "Reading the key failed: "+err.Error())
		return
	}
	kv := viewKey(k, s.now())
	pg := auditPage{Tenant: tenant, Key: &kv, Resubmitted: r.URL.Query().Get("resubmitted") != ""}
	if pg.Entries, err = sess.client.KeyAudit(ctx, id); err != nil {
		pg.Error = err.Error()
	}
	s.render(w, r, "audit", http.StatusOK, pg)
}

// Bounds of a tenant's recent key changes: the trails of its most
// recently changed keys, so that a tenant with many keys costs a bounded
// number of reads.
const (
	auditKeys    = 20
	auditEntries = 100
)

// tenantAudit shows a tenant's recent changes, newest first: its record's
// (its settings) and its keys'.
func (s *server) tenantAudit(w http.ResponseWriter, r *http.Request) {
	tenant := r.PathValue("tenant")
	sess := s.auditSession(w, r, tenant)
	if sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readTimeout)
	defer cancel()
	pg := auditPage{Tenant: tenant}
	keys, err := keysOf(ctx, sess, tenant, s.now())
	if err != nil {
		pg.Error = err.Error()
	}
	if es, err := tenantTrail(ctx, sess, tenant); err != nil {
		pg.Error = err.Error()
	} else {
		pg.Entries = es
	}
	for _, k := range keys[:min(len(keys), auditKeys)] {
		es, err := sess.client.KeyAudit(ctx, k.ID)
		if err != nil {
			pg.Error = err.Error()
			break
		}
		pg.Entries = append(pg.Entries, es...)
	}
	// The trail's times are whole seconds; request ids sort by the precise
	// time within one.
	slices.SortStableFunc(pg.Entries, func(a, b adminapi.AuditEntry) int {
		return cmp.Or(b.Time.Compare(a.Time), strings.Compare(b.RequestID, a.RequestID))
	})
	pg.Entries = pg.Entries[:min(len(pg.Entries), auditEntries)]
	s.render(w, r, "audit", http.StatusOK, pg)
}
