package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/platform/itest"
)

// TestControlPlaneSurvivesRestartingEveryService (issue 33): a plan, a
// tenant made from it and the tenant's key, all created through the admin
// API, drive every service — the gateway serves the key at once, the
// aggregator counts the tenant against the plan's monthly quota (the
// policy file knows neither) and the enforcer's flag makes the gateway
// refuse it — and after every service (ingest, aggregator, enforcer,
// alerter, gateway) is stopped and started again, the records, their
// versions and audit trail, and the enforcement they caused are all still
// there; a revocation after the restart is refused by the gateway too.
func TestControlPlaneSurvivesRestartingEveryService(t *testing.T) {
	if testing.Short() {
		t.Skip("starts every service")
	}
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	t.Cleanup(up.Close)
	pol := "defaults:\n  timezone: UTC\n"
	s := newStack(t, stackOptions{Policy: pol})
	s.writePolicy(pol + fmt.Sprintf("upstreams:\n  mock:\n    base_url: %q\n    models: [gpt-4o-mini]\n", up.URL+"/v1"))
	writeFileT(t, filepath.Join(s.dir, "gateway-keys.yaml"), "keys: []\n")
	gw := freeAddr(t)
	services := []string{"ingest", "aggregator", "enforcer", "alerter"}
	startAll := func() {
		s.startAll(services...)
		s.waitReady(s.spawnAs("gateway", "gateway", "-services.gateway.listen="+gw, "-services.gateway.follow_admin",
			"-services.gateway.usage.sink=kafka"))
	}
	startAll()

	ctx := context.Background()
	admin, err := adminapi.NewClient("http://"+s.adminAddr, s.adminToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	tenant := "cp-team" // the stack's admin topic, Redis prefix and database are its own
	plan, err := admin.CreateSection(ctx, adminapi.KindPlan, adminapi.CreateSectionRequest{Name: "starter",
		Body: json.RawMessage(`{"models": {"*": {"monthly_tokens": 600}}}`), Reason: "e2e: a plan"})
	if err != nil {
		t.Fatal(err)
	}
	team, err := admin.CreateSection(ctx, adminapi.KindTenant, adminapi.CreateSectionRequest{Name: tenant, From: plan.Name, Reason: "e2e: onboarding"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := admin.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: tenant, Models: []string{"*"}, Reason: "e2e: the team's key"})
	if err != nil {
		t.Fatal(err)
	}
	call := func() int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+gw+"/v1/chat/completions",
			strings.NewReader(`{"model":"gpt-4o-mini","max_tokens":20,"messages":[{"role":"user","content":"hello there"}]}`))
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	itest.Eventually(t, 5*time.Second, "the gateway serving the new key", func() bool { return call() == http.StatusOK })
	// The plan's 600 tokens a month, about 30 a call: the pipeline counts
	// them and the enforcer's quota flag refuses the tenant at the gateway.
	itest.Eventually(t, waitTimeout, "the plan's monthly quota refusing the tenant", func() bool { return call() == http.StatusTooManyRequests })

	for _, n := range append(services, "gateway") {
		s.proc(n).stop()
	}
	startAll()

	if got, err := admin.Section(ctx, adminapi.KindTenant, tenant); err != nil || got.Version != team.Version {
		t.Fatalf("after the restart the tenant reads %+v, %v; want version %d", got, err, team.Version)
	}
	if got, err := admin.Key(ctx, key.Key.ID); err != nil || got.Version != key.Key.Version || got.Revoked {
		t.Fatalf("after the restart the key reads %+v, %v; want version %d, not revoked", got, err, key.Key.Version)
	} else if got.LastUsedAt.IsZero() || got.LastUsedAt.After(time.Now()) {
		// Its calls were metered before the quota refused them.
		t.Errorf("the key's last use reads %v; want the time of its last metered call", got.LastUsedAt)
	}
	if st := call(); st != http.StatusTooManyRequests {
		t.Fatalf("after the restart the exhausted tenant's call answered %d; want 429", st)
	}
	revoked, err := admin.RevokeKey(ctx, key.Key.ID, adminapi.RevokeKeyRequest{Version: key.Key.Version, Reason: "e2e: after the restart"})
	if err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 5*time.Second, "the gateway refusing the revoked key", func() bool { return call() == http.StatusUnauthorized })
	trail, err := admin.SectionAudit(ctx, adminapi.KindTenant, tenant)
	if err != nil || len(trail) == 0 {
		t.Fatalf("the tenant's audit trail: %v, %v", trail, err)
	}
	keyTrail, err := admin.KeyAudit(ctx, revoked.ID)
	if err != nil || len(keyTrail) != 2 {
		t.Fatalf("the key's audit trail: %+v, %v; want its issue and its revocation", keyTrail, err)
	}
}
