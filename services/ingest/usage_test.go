package ingest

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/usageapi"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
)

// With follow_admin, ingest's usage API answers a tenant made through the
// admin API, without use yet, with its record's quotas, not the file's
// defaults.
func TestUsageAPIFollowsTheAdminTopic(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	chc, _ := migrationtest.Open(t)
	env := platform.Env{Kafka: itest.Kafka(t), ClickHouse: chc, Redis: itest.Redis(t), Topics: itest.Topics(t), SignalAuth: itest.SignalAuth(t)}.Named("ingest")
	tenant := itest.Unique(t, "newco_")
	controlplanetest.ProduceTenant(t, env.Kafka, env.SignalAuth, env.Topics.Admin, tenant, `{"models":{"*":{"monthly_tokens":4242}}}`)
	env.Policy = platform.FileSource{File: filepath.Join(t.TempDir(), "policy.yaml"), Reload: time.Second}
	if err := os.WriteFile(env.Policy.File, []byte("defaults:\n  models:\n    \"*\": {monthly_tokens: 777}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, follow := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.UsageAPI.Enabled, cfg.FollowAdmin = true, follow
		api, _, closeAPI, err := openUsageAPI(context.Background(), cfg, env)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(api.Handler(func(*http.Request) (string, int, string) { return tenant, 0, "" }))
		_, body := itest.Send(t, http.MethodGet, srv.URL+usageapi.Path, "")
		srv.Close()
		closeAPI()
		var st quotastatus.Status
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("follow_admin %v: %v: %s", follow, err, body)
		}
		want := map[bool]float64{false: 777, true: 4242}[follow]
		if len(st.Quotas) != 1 || st.Quotas[0].Quota != schemas.QuotaMonthlyTokens || st.Quotas[0].Limit != want {
			t.Errorf("follow_admin %v: quotas %+v; want monthly_tokens of %v", follow, st.Quotas, want)
		}
	}
}
