package admin_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// memKeys stands in for the admin topic: versions checked as PutKey does.
type memKeys struct {
	mu   sync.Mutex
	keys map[string]controlplane.Key
	// failNext refuses the next PutKey with it: a change that passed the
	// API's own version check and lost on the topic.
	failNext error
}

func (m *memKeys) Key(id string) *controlplane.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k, ok := m.keys[id]; ok {
		return &k
	}
	return nil
}

func (m *memKeys) Keys(tenant string) []*controlplane.Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*controlplane.Key
	for _, k := range m.keys {
		if tenant == "" || k.Tenant == tenant {
			out = append(out, &k)
		}
	}
	return out
}

func (m *memKeys) PutKey(_ context.Context, k *controlplane.Key, read uint64, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.failNext; err != nil {
		m.failNext = nil
		return err
	}
	if cur := m.keys[k.ID]; cur.Version != read {
		return fmt.Errorf("%w: at %d, read %d", controlplane.ErrStale, cur.Version, read)
	}
	k.Version = read + 1
	m.keys[k.ID] = *k
	return nil
}

func (m *memKeys) Synced(context.Context) error { return nil }

// trail reads the audit entries memAudit kept, as the key, tenant and plan
// routes read the audit log.
type trail struct{ *memAudit }

// ByKey returns the entries of API key id.
func (t trail) ByKey(_ context.Context, id string) ([]audit.Entry, error) {
	return t.where(func(e audit.Entry) bool { return e.APIKeyID == id }), nil
}

// ByTenant returns the entries of a tenant or plan.
func (t trail) ByTenant(_ context.Context, name string) ([]audit.Entry, error) {
	return t.where(func(e audit.Entry) bool { return e.Tenant == name }), nil
}

// where returns the kept entries that match, in the order written.
func (t trail) where(match func(audit.Entry) bool) []audit.Entry {
	var out []audit.Entry
	for _, e := range t.all() {
		if match(e) {
			out = append(out, e)
		}
	}
	return out
}

// keyServer serves the key (and tenant and plan) routes with an operator, a viewer and a tenant
// admin of tenant "blue"; it returns a client per role.
func keyServer(t *testing.T) (op, viewer, blue *adminapi.Client) {
	op, viewer, blue, _ = keyServerStore(t)
	return op, viewer, blue
}

func keyServerStore(t *testing.T) (op, viewer, blue *adminapi.Client, store *memKeys) {
	t.Helper()
	return keyServerWith(t, nil)
}

// keyServerWith is keyServerStore whose API reads the keys' last use from
// use (nil: none).
func keyServerWith(t *testing.T, use admin.KeyUseReader) (op, viewer, blue *adminapi.Client, store *memKeys) {
	t.Helper()
	aud := &memAudit{}
	store = &memKeys{keys: map[string]controlplane.Key{}}
	tokens := []adminapi.Token{
		{Name: "ops", SHA256: adminapi.HashToken("op-token")},
		{Name: "auditor", SHA256: adminapi.HashToken("viewer-token"), Role: adminapi.RoleViewer},
		{Name: "blue-admin", SHA256: adminapi.HashToken("blue-token"), Role: adminapi.RoleTenantAdmin, Tenant: "blue"},
	}
	api := admin.New(breaker.NewTable(), func(...string) {}, aud, tokens, slog.New(slog.NewTextHandler(io.Discard, nil))).
		WithKeys(store, trail{aud}).WithSections(&memSections{recs: map[string]controlplane.Section{}}, trail{aud})
	if use != nil {
		api.WithKeyUse(use)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	client := func(tok string) *adminapi.Client {
		c, err := adminapi.NewClient(srv.URL, tok, srv.Client())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return client("op-token"), client("viewer-token"), client("blue-token"), store
}

func wantStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var e *adminapi.Error
	if !errors.As(err, &e) || e.StatusCode != status {
		t.Errorf("%s: %v; want %d", what, err, status)
	}
}

// A tenant admin manages its own tenant's keys and cannot list, read or
// change another tenant's; a viewer reads and changes nothing.
func TestTenantAdminSeesOnlyItsTenantAndViewerOnlyReads(t *testing.T) {
	op, viewer, blue := keyServer(t)
	ctx := context.Background()
	red, err := op.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "red", Models: []string{"*"}, Reason: "onboard red"})
	if err != nil {
		t.Fatal(err)
	}
	own, err := blue.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "blue", Models: []string{"gpt-4o"}, Reason: "blue's own"})
	if err != nil {
		t.Fatalf("tenant admin issuing for its tenant: %v", err)
	}

	_, err = blue.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "red", Models: []string{"*"}, Reason: "x"})
	wantStatus(t, "tenant admin issuing for another tenant", err, http.StatusForbidden)
	keys, err := blue.Keys(ctx, "")
	if err != nil || len(keys) != 1 || keys[0].ID != own.Key.ID {
		t.Errorf("tenant admin's list: %+v, %v; want its own key only", keys, err)
	}
	_, err = blue.Keys(ctx, "red")
	wantStatus(t, "tenant admin listing another tenant", err, http.StatusForbidden)
	_, err = blue.Key(ctx, red.Key.ID)
	wantStatus(t, "tenant admin reading another tenant's key", err, http.StatusNotFound)
	_, err = blue.KeyAudit(ctx, red.Key.ID)
	wantStatus(t, "tenant admin reading another tenant's audit", err, http.StatusNotFound)
	_, err = blue.RevokeKey(ctx, red.Key.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "x"})
	wantStatus(t, "tenant admin revoking another tenant's key", err, http.StatusNotFound)
	_, err = blue.RotateKey(ctx, red.Key.ID, adminapi.RotateKeyRequest{Version: 1, Reason: "x"})
	wantStatus(t, "tenant admin rotating another tenant's key", err, http.StatusNotFound)
	_, err = blue.Breakers(ctx, "")
	wantStatus(t, "tenant admin listing the fleet's breakers", err, http.StatusForbidden)
	if k, err := op.Key(ctx, red.Key.ID); err != nil || k.Revoked || k.Version != 1 {
		t.Errorf("red's key after the tenant admin's attempts: %+v, %v", k, err)
	}

	if all, err := viewer.Keys(ctx, ""); err != nil || len(all) != 2 {
		t.Errorf("viewer's list: %+v, %v; want both keys", all, err)
	}
	_, err = viewer.RevokeKey(ctx, red.Key.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "x"})
	wantStatus(t, "viewer revoking", err, http.StatusForbidden)
	_, err = viewer.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "red", Models: []string{"*"}, Reason: "x"})
	wantStatus(t, "viewer issuing", err, http.StatusForbidden)
}

// A change carries the version it read: one that read an older version is
// refused with 409, so two operators cannot overwrite each other.
func TestAChangeThatReadAnOlderVersionIsRefused(t *testing.T) {
	op, _, _ := keyServer(t)
	ctx := context.Background()
	k, err := op.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "red", Models: []string{"*"}, Reason: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.RotateKey(ctx, k.Key.ID, adminapi.RotateKeyRequest{Version: 1, Reason: "first operator"}); err != nil {
		t.Fatal(err)
	}
	_, err = op.RevokeKey(ctx, k.Key.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "second operator, who read version 1"})
	wantStatus(t, "revoke of version 1 after a rotation", err, http.StatusConflict)
	_, err = op.RevokeKey(ctx, k.Key.ID, adminapi.RevokeKeyRequest{Reason: "no version"})
	wantStatus(t, "revoke without a version", err, http.StatusBadRequest)
	if got, _ := op.Key(ctx, k.Key.ID); got.Revoked || got.Version != 2 {
		t.Fatalf("after the stale revocation: %+v", got)
	}
	_, err = op.IssueKey(ctx, adminapi.IssueKeyRequest{ID: k.Key.ID, Tenant: "red", Models: []string{"*"}, Reason: "r"})
	wantStatus(t, "issue under an existing id", err, http.StatusConflict)
}

// A refused request names every bad field and its limit.
func TestIssueNamesEveryBadFieldAndItsLimit(t *testing.T) {
	op, _, _ := keyServer(t)
	_, err := op.IssueKey(context.Background(), adminapi.IssueKeyRequest{ID: "has space", Tenant: "bad tenant!",
		Models: nil, Endpoints: []string{"chat"}, ExpiresIn: "40000h", Reason: ""})
	var e *adminapi.Error
	if !errors.As(err, &e) || e.StatusCode != http.StatusBadRequest {
		t.Fatalf("%v; want 400", err)
	}
	for _, want := range []string{"id:", "1..64", "tenant:", "models: required", "endpoints[0]:", "expires_at:", "beyond the limit", "reason: required", "1..500"} {
		if !strings.Contains(e.Message, want) {
			t.Errorf("message %q does not mention %q", e.Message, want)
		}
	}
	_, err = op.RotateKey(context.Background(), "nope", adminapi.RotateKeyRequest{Version: 1, Overlap: "9999h", Reason: "r"})
	wantStatus(t, "rotating an unknown key", err, http.StatusNotFound)
}

// The audit trail lists every change with its actor, version and diff; a
// change audited and then refused on the topic is listed as refused, not
// as in force.
func TestTheAuditTrailShowsEachChangeAndMarksRefusedOnes(t *testing.T) {
	op, _, _, store := keyServerStore(t)
	ctx := context.Background()
	k, err := op.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "red", Models: []string{"*"}, Reason: "onboard"})
	if err != nil {
		t.Fatal(err)
	}
	store.failNext = fmt.Errorf("%w: another replica wrote version 2 first", controlplane.ErrStale)
	_, err = op.RevokeKey(ctx, k.Key.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "lost the race"})
	wantStatus(t, "revoke that lost on the topic", err, http.StatusConflict)
	if _, err := op.RevokeKey(ctx, k.Key.ID, adminapi.RevokeKeyRequest{Version: 1, Reason: "leaked"}); err != nil {
		t.Fatal(err)
	}
	trail, err := op.KeyAudit(ctx, k.Key.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(trail) != 3 {
		t.Fatalf("trail %+v; want issue, the refused revoke, the revoke", trail)
	}
	issue, lost, revoke := trail[0], trail[1], trail[2]
	if issue.Action != adminapi.ActionKeyIssue || issue.Actor != "ops" || issue.Version != 1 || issue.Refused {
		t.Errorf("issue entry %+v", issue)
	}
	if lost.Action != adminapi.ActionKeyRevoke || !lost.Refused || !strings.Contains(lost.Error, "another replica") {
		t.Errorf("refused entry %+v; want marked refused with its reason", lost)
	}
	if revoke.Refused || revoke.Version != 2 || revoke.Reason != "leaked" || len(revoke.Changes) == 0 {
		t.Errorf("revoke entry %+v", revoke)
	}
	changed := map[string]string{}
	for _, c := range revoke.Changes {
		changed[c.Field] = c.To
	}
	if changed["revoked"] != "true" {
		t.Errorf("revoke's diff %+v does not show revoked: true", revoke.Changes)
	}
}

// Every role may ask who its token is (the console shows each role only
// what it may do), a tenant admin included.
func TestEveryRoleReadsWhoItIs(t *testing.T) {
	op, viewer, blue := keyServer(t)
	for c, want := range map[*adminapi.Client]adminapi.WhoAmIResponse{
		op:     {Name: "ops", Role: adminapi.RoleOperator},
		viewer: {Name: "auditor", Role: adminapi.RoleViewer},
		blue:   {Name: "blue-admin", Role: adminapi.RoleTenantAdmin, Tenant: "blue"},
	} {
		if got, err := c.WhoAmI(context.Background()); err != nil || got != want {
			t.Errorf("whoami: %+v, %v; want %+v", got, err, want)
		}
	}
}

// mustIssue issues a key of tenant for every model.
func mustIssue(t *testing.T, c *adminapi.Client, tenant string) adminapi.SecretResponse {
	t.Helper()
	k, err := c.IssueKey(context.Background(), adminapi.IssueKeyRequest{Tenant: tenant, Models: []string{"*"}, Reason: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// keyUse answers LastUse from used, or fails with err.
type keyUse struct {
	used    map[string]time.Time
	err     error
	tenants []string
}

func (u *keyUse) LastUse(_ context.Context, tenants []string, _ time.Time) (map[string]time.Time, error) {
	u.tenants = tenants
	return u.used, u.err
}

// A key's listing says when it was last used, from the usage events; when
// they cannot be read the listing still answers, saying why the last use
// is unknown, and a listing of more tenants than one read covers says so
// instead of scanning every tenant's events.
func TestKeysTellTheirLastUse(t *testing.T) {
	use := &keyUse{used: map[string]time.Time{}}
	op, _, blue, store := keyServerWith(t, use)
	ctx := context.Background()
	used, idle := mustIssue(t, op, "blue"), mustIssue(t, op, "blue")
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
	use.used[used.Key.ID] = at
	list, err := blue.KeyList(ctx, "")
	if err != nil || list.LastUseError != "" || len(list.Keys) != 2 {
		t.Fatalf("list: %+v, %v", list, err)
	}
	for _, k := range list.Keys {
		if want := map[string]time.Time{used.Key.ID: at, idle.Key.ID: {}}[k.ID]; !k.LastUsedAt.Equal(want) {
			t.Errorf("key %s last used %v; want %v", k.ID, k.LastUsedAt, want)
		}
	}
	if !slices.Equal(use.tenants, []string{"blue"}) {
		t.Errorf("last use read for tenants %v; want the listed keys' [blue]", use.tenants)
	}
	if k, err := op.Key(ctx, used.Key.ID); err != nil || !k.LastUsedAt.Equal(at) {
		t.Errorf("one key: %+v, %v; want last used %v", k, err, at)
	}

	use.err = errors.New("clickhouse: connection refused")
	list, err = op.KeyList(ctx, "blue")
	if err != nil || len(list.Keys) != 2 || !list.Keys[0].LastUsedAt.IsZero() || !strings.Contains(list.LastUseError, "connection refused") {
		t.Errorf("list without ClickHouse: %+v, %v; want the keys, no last use and why", list, err)
	}

	use.err = nil
	for i := range 101 {
		store.keys[fmt.Sprint("k", i)] = controlplane.Key{KeyTerms: adminapi.KeyTerms{ID: fmt.Sprint("k", i), Tenant: fmt.Sprint("t", i), Stamp: adminapi.Stamp{Version: 1}}}
	}
	list, err = op.KeyList(ctx, "")
	if err != nil || !strings.Contains(list.LastUseError, "?tenant=") {
		t.Errorf("a listing of 102 tenants: %q, %v; want it to name ?tenant=", list.LastUseError, err)
	}
}
