package usageapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// TestUsageAnswersFromClickHouseAndRedis stores a tenant's quota state the
// way the aggregator does and a flag the way the enforcer does, and reads
// them back through GET /v1/usage: used, remaining, reset, prediction and
// the flag, without the operator's reason.
func TestUsageAnswersFromClickHouseAndRedis(t *testing.T) {
	rc := itest.Redis(t)
	ctx := context.Background()
	ch, conn := migrationtest.Open(t)
	now := time.Now().UTC().Truncate(time.Second)
	start := now.Truncate(time.Hour)
	pred := now.Add(3 * time.Minute)
	b, err := conn.PrepareBatch(ctx, `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used, quota_limit,
 unit, mode, tier, rate_per_minute, predicted_exhaustion, predicted_earliest, predicted_latest, prediction_basis, version, updated_at)`)
	if err != nil {
		t.Fatal(err)
	}
	// Two versions of one row: the higher wins. And an expired period.
	for _, r := range []struct {
		used    float64
		version uint64
		start   time.Time
	}{{100000, 1, start}, {455000, 2, start}, {499999, 3, start.Add(-time.Hour)}} {
		if err := b.Append("acme", "*", "hourly_tokens", "hour", r.start, r.start.Add(time.Hour), r.used, 500000.0,
			"tokens", "hard", uint16(90), 12000.0, pred, pred.Add(-40*time.Second), pred.Add(75*time.Second), "rates", r.version, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	rc.KeyPrefix = itest.Unique(t, "usage") + ":"
	prefix := rc.Prefix(redisconn.FlagKeys)
	rdb := redisconn.NewClient(rc)
	defer rdb.Close()
	until := now.Add(30 * time.Minute).Truncate(time.Millisecond)
	layout := flags.Layout{Prefix: prefix}
	rdb.HSet(ctx, layout.TenantKey("acme"), "gpt-4o", flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindManual, Until: until, Reason: "internal note"}),
		flags.VersionField, "7")
	t.Cleanup(func() { rdb.Del(context.Background(), layout.TenantKey("acme")) })

	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("tenants:\n  acme:\n    models:\n      \"*\": {hourly_tokens: 500000, daily_tokens: 2000000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	api, err := Open(cfg, platform.Env{ClickHouse: ch, Redis: rc, Policy: platform.FileSource{File: pol, Reload: time.Second}}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	srv := httptest.NewServer(api.Handler(func(r *http.Request) (string, int, string) {
		if r.Header.Get("Authorization") != "Bearer k" {
			return "", http.StatusUnauthorized, "send the key"
		}
		return "acme", 0, ""
	}))
	defer srv.Close()

	resp, err := http.Get(srv.URL + Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("without a key: %s", resp.Status)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+Path, nil)
	req.Header.Set("Authorization", "Bearer k")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", resp.Status, raw)
	}
	var st quotastatus.Status
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Tenant != "acme" || len(st.Quotas) != 2 {
		t.Fatalf("answer: %s", raw)
	}
	h, d := st.Quotas[0], st.Quotas[1]
	if h.Quota != "hourly_tokens" || h.Used != 455000 || h.Remaining != 45000 || h.Tier != 90 || !h.ResetsAt.Equal(start.Add(time.Hour)) ||
		h.PredictedExhaustion == nil || !h.PredictedExhaustion.Equal(pred) {
		t.Errorf("hourly quota: %+v", h)
	}
	// The prediction's range and basis, as the aggregator stored them.
	if h.PredictedEarliest == nil || !h.PredictedEarliest.Equal(pred.Add(-40*time.Second)) || h.PredictedLatest == nil ||
		!h.PredictedLatest.Equal(pred.Add(75*time.Second)) || h.PredictionBasis != "rates" {
		t.Errorf("hourly quota's prediction range: %v..%v (%q)", h.PredictedEarliest, h.PredictedLatest, h.PredictionBasis)
	}
	if d.PredictedEarliest != nil || d.PredictedLatest != nil || d.PredictionBasis != "" {
		t.Errorf("a quota without a prediction has a range: %+v", d)
	}
	if d.Quota != "daily_tokens" || d.Used != 0 || d.Remaining != 2000000 || d.PredictedExhaustion != nil {
		t.Errorf("daily quota from the policy: %+v", d)
	}
	if len(st.Flags) != 1 || st.Flags[0].Model != "gpt-4o" || st.Flags[0].State != flags.StateOpen || st.Flags[0].Until == nil || !st.Flags[0].Until.Equal(until) {
		t.Errorf("flags: %+v", st.Flags)
	}
	var rawMap map[string]any
	_ = json.Unmarshal(raw, &rawMap)
	if fl := rawMap["flags"].([]any)[0].(map[string]any); fl["reason"] != nil {
		t.Errorf("the operator's reason reached the tenant: %v", fl)
	}
}
