package admin_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

// memAudit keeps audit entries in memory, standing in for ClickHouse.
type memAudit struct {
	mu      sync.Mutex
	entries []audit.Entry
	fail    error
}

func (m *memAudit) Write(_ context.Context, e audit.Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.entries = append(m.entries, e)
	return nil
}

func (m *memAudit) all() []audit.Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]audit.Entry(nil), m.entries...)
}

const token = "s3cret"

// server is the enforcer's real admin handler over a fresh breaker table.
func server(t *testing.T) (*adminapi.Client, *breaker.Table, *memAudit, *httptest.Server) {
	t.Helper()
	table := breaker.NewTable()
	aud := &memAudit{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	api := admin.New(table, func(...string) {}, aud, []adminapi.Token{{Name: "alice", SHA256: adminapi.HashToken(token)}}, log)
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	cl, err := adminapi.NewClient(srv.URL+"/", token, srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	return cl, table, aud, srv
}

// Every action and listing, through the Client, against the real server:
// the typed request reaches the breaker table, the typed answer comes back.
func TestClientDrivesEveryActionOfTheServer(t *testing.T) {
	cl, table, aud, _ := server(t)
	ctx := context.Background()

	r, err := cl.Trip(ctx, adminapi.Request{Tenant: "acme", Model: "gpt-4o", Reason: "incident 42", ExpiresIn: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Action != adminapi.ActionTrip || !r.Changed || r.RequestID == "" || len(r.Breakers) != 1 ||
		r.Breakers[0].Kind != flags.KindManual || r.Breakers[0].Scope != "gpt-4o" || r.Breakers[0].Actor != "alice" ||
		r.Breakers[0].State != flags.StateOpen {
		t.Fatalf("trip answered %+v", r)
	}
	bs, err := cl.Breakers(ctx, "acme")
	if err != nil || len(bs) != 1 || bs[0].Reason != "incident 42" || !bs[0].Until.After(time.Now().Add(59*time.Minute)) {
		t.Fatalf("breakers %+v, %v", bs, err)
	}
	fl, err := cl.Flags(ctx, "acme")
	if err != nil || len(fl) != 1 || fl[0].Tenant != "acme" || fl[0].Field != "gpt-4o" || fl[0].Kind != flags.KindManual {
		t.Fatalf("flags %+v, %v", fl, err)
	}

	r, err = cl.Reset(ctx, adminapi.Request{Tenant: "acme", Model: "gpt-4o", Kind: flags.KindManual, Reason: "resolved"})
	if err != nil || !r.Changed || len(r.Breakers) != 0 {
		t.Fatalf("reset answered %+v, %v", r, err)
	}
	// A reset with nothing to close says so.
	if r, err = cl.Reset(ctx, adminapi.Request{Tenant: "acme", Reason: "again"}); err != nil || r.Changed {
		t.Fatalf("second reset answered %+v, %v", r, err)
	}

	if _, err := cl.Blacklist(ctx, adminapi.Request{Tenant: "acme", APIKeyID: "key-7", Reason: "leaked", ExpiresIn: "24h"}); err != nil {
		t.Fatal(err)
	}
	if bs := table.Breakers("acme"); len(bs) != 1 || bs[0].Kind != flags.KindBlacklist {
		t.Fatalf("after blacklist: %+v", bs)
	}
	if r, err := cl.Unblacklist(ctx, adminapi.Request{Tenant: "acme", APIKeyID: "key-7", Reason: "rotated"}); err != nil || !r.Changed {
		t.Fatalf("unblacklist answered %+v, %v", r, err)
	}
	if bs := table.Breakers("acme"); len(bs) != 0 {
		t.Fatalf("after unblacklist: %+v", bs)
	}

	limit := 5000.0
	if _, err := cl.SetOverride(ctx, adminapi.Request{Tenant: "globex", Quota: schemas.QuotaDailyTokens, Limit: &limit, Reason: "promotion", ExpiresIn: "2h"}); err != nil {
		t.Fatal(err)
	}
	ov, err := cl.Overrides(ctx, "globex")
	if err != nil || len(ov) != 1 || ov[0].Quota != "daily_tokens" || ov[0].Model != "*" || ov[0].Limit != 5000 || ov[0].Actor != "alice" {
		t.Fatalf("overrides %+v, %v", ov, err)
	}
	if r, err := cl.ClearOverride(ctx, adminapi.Request{Tenant: "globex", Quota: schemas.QuotaDailyTokens, Reason: "promotion over"}); err != nil || !r.Changed {
		t.Fatalf("clear override answered %+v, %v", r, err)
	}
	if ov, err := cl.Overrides(ctx, ""); err != nil || len(ov) != 0 {
		t.Fatalf("overrides after clearing %+v, %v", ov, err)
	}

	// Every action was audited, by its wire name, with a replayable request.
	var got []string
	for _, e := range aud.all() {
		got = append(got, e.Action)
		if e.Actor != "alice" || e.Details == "" {
			t.Errorf("audit entry %+v", e)
		}
	}
	want := "breaker.trip breaker.reset breaker.reset blacklist.add blacklist.remove override.set override.clear"
	if strings.Join(got, " ") != want {
		t.Fatalf("audited %v, want %s", got, want)
	}
}

// The server's explanation reaches the caller, with the status.
func TestClientErrorCarriesTheServersMessage(t *testing.T) {
	cl, _, aud, srv := server(t)
	ctx := context.Background()
	_, err := cl.SetOverride(ctx, adminapi.Request{Tenant: "acme", Quota: "weekly_tokens", Reason: "x", ExpiresIn: "1h"})
	var ae *adminapi.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
		t.Fatalf("error %v", err)
	}
	// The message lists every quota kind from the one table of kinds.
	for _, q := range schemas.QuotaKinds() {
		if !strings.Contains(ae.Message, string(q)) {
			t.Errorf("message %q does not list quota %s", ae.Message, q)
		}
	}
	if !strings.Contains(ae.Message, "limit: required") {
		t.Errorf("message %q does not name the missing limit", ae.Message)
	}

	aud.mu.Lock()
	aud.fail = errors.New("clickhouse down")
	aud.mu.Unlock()
	_, err = cl.Trip(ctx, adminapi.Request{Tenant: "acme", Reason: "x", ExpiresIn: "1h"})
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusServiceUnavailable || !strings.Contains(ae.Message, "clickhouse down") {
		t.Fatalf("unaudited action: %v", err)
	}

	bad, err := adminapi.NewClient(srv.URL, "wrong", srv.Client())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Breakers(ctx, ""); !errors.As(err, &ae) || ae.StatusCode != http.StatusUnauthorized || ae.Message == "" {
		t.Fatalf("unknown token: %v", err)
	}
	// Without any token the server asks for one.
	resp, err := srv.Client().Get(srv.URL + adminapi.PathBreakers)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Fatalf("no token: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

func TestNewClientRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct{ url, token, want string }{
		{"127.0.0.1:9471", token, "http(s) URL"},
		{"ftp://x", token, "http(s) URL"},
		{"http://127.0.0.1:9471", "", "token"},
	} {
		if _, err := adminapi.NewClient(tc.url, tc.token, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewClient(%q, %q): %v, want an error about %s", tc.url, tc.token, err, tc.want)
		}
	}
}
