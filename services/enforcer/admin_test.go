package enforcer

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway/checker"
	"github.com/sluicehq/sluice/gateway/flags"
	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/services/enforcer/adminapi"
	"github.com/sluicehq/sluice/services/enforcer/internal/admin"
	"github.com/sluicehq/sluice/services/enforcer/internal/audit"
	"github.com/sluicehq/sluice/services/enforcer/internal/breaker"
)

func post(t *testing.T, url, token string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("response %d is not JSON: %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// Admin actions change what Checkers see, are refused without a valid token
// or with bad input (naming the field), land in admin_audit with who, what,
// when and why, and replay from it after a restart.
func TestAdminActionsAreAuditedAndEnforced(t *testing.T) {
	rc := itest.Redis(t)
	chc := itest.ClickHouse(t)
	ctx := context.Background()
	conn, err := chconn.Open(ctx, chc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := migrations.Apply(ctx, conn, quietLog()); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	rdb := redisconn.NewClient(rc)
	defer rdb.Close()
	cleanupPrefix(t, rdb, cfg.KeyPrefix)
	c, _ := startCore(t, cfg, rdb)
	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)

	const token = "s3cret-token"
	api := admin.New(c.table, c.writer.MarkDirty, audit.New(conn), []adminapi.Token{{Name: "alice", SHA256: adminapi.HashToken(token)}}, cfg.FlagTTL, quietLog())
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	base := srv.URL + "/admin/v1"

	if code, _ := post(t, base+"/breakers/trip", "", map[string]any{"tenant": "acme"}); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d", code)
	}
	if code, _ := post(t, base+"/breakers/trip", "wrong", map[string]any{"tenant": "acme"}); code != http.StatusUnauthorized {
		t.Fatalf("bad token: %d", code)
	}
	code, body := post(t, base+"/blacklist/add", token, map[string]any{"tenant": "acme", "expires_in": "2400h"})
	msg, _ := json.Marshal(body)
	if code != http.StatusBadRequest || !strings.Contains(string(msg), "reason") || !strings.Contains(string(msg), "90 days") {
		t.Fatalf("bad input: %d %s", code, msg)
	}

	steps := []struct {
		path string
		body map[string]any
	}{
		{"/breakers/trip", map[string]any{"tenant": "acme", "model": "gpt-4o", "reason": "incident 42", "expires_in": "1h"}},
		{"/blacklist/add", map[string]any{"tenant": "acme", "api_key_id": "key-7", "reason": "key leaked on github", "expires_in": "24h"}},
		{"/overrides/set", map[string]any{"tenant": "globex", "model": "*", "quota": "daily_tokens", "limit": 0, "reason": "leaked key: stop spend", "expires_in": "2h"}},
		{"/blacklist/add", map[string]any{"tenant": "initech", "reason": "unpaid", "expires_in": "24h"}},
		{"/blacklist/remove", map[string]any{"tenant": "initech", "reason": "paid"}},
	}
	for _, s := range steps {
		if code, body := post(t, base+s.path, token, s.body); code != http.StatusOK {
			t.Fatalf("%s: %d %v", s.path, code, body)
		}
	}
	waitFor(t, "manual breaker visible", func() bool {
		d := ch.Check("acme", "gpt-4o", "")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindManual
	})
	waitFor(t, "key blacklist visible", func() bool {
		d := ch.Check("acme", "other-model", "key-7")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindBlacklist
	})
	waitFor(t, "zero override visible", func() bool {
		d := ch.Check("globex", "any", "")
		return d.Outcome == checker.Refused && d.Flag.Quota == "daily_tokens" && d.Flag.Limit == 0
	})
	if d := ch.Check("acme", "other-model", "key-8"); !d.Allowed() {
		t.Fatalf("other key refused: %+v", d)
	}
	waitFor(t, "unblacklisted tenant served", func() bool { return ch.Check("initech", "m", "").Allowed() })

	entries, err := audit.New(conn).Since(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(steps) {
		t.Fatalf("%d audit rows, want %d: %+v", len(entries), len(steps), entries)
	}
	e := entries[1]
	if e.Actor != "alice" || e.Action != string(adminapi.ActionBlacklist) || e.Tenant != "acme" || e.APIKeyID != "key-7" ||
		e.Reason != "key leaked on github" || e.ExpiresAt.Sub(e.Time) != 24*time.Hour || e.RequestID == "" {
		t.Fatalf("audit row: %+v", e)
	}

	// A restarted enforcer rebuilds the same breakers from the audit log.
	fresh := breaker.NewTable()
	admin.Replay(fresh, entries, time.Now(), quietLog())
	got, want := summarize(fresh.Breakers("")), summarize(c.table.Breakers(""))
	if got != want {
		t.Fatalf("replayed breakers\n got %s\nwant %s", got, want)
	}
}

func summarize(bs []breaker.Breaker) string {
	var sb strings.Builder
	for _, b := range bs {
		sb.WriteString(b.Tenant + "/" + b.Scope + "/" + string(b.Kind) + "/" + b.Quota + "/" + string(b.State) + "/" + b.Actor + ";")
	}
	return sb.String()
}
