package authz

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// liveAdmissionPolicy is the policy of the tests that run the whole
// service on the real Redis: acme with a token limit it never meets, trial
// at two requests a minute, strict failing closed.
const liveAdmissionPolicy = `
tenants:
  acme:
    limits:
      acme-tpm: {unit: total_tokens, sliding_window: {length: 1m, limit: 1000000}, exact: true}
  trial:
    limits:
      trial-rpm: {unit: requests, sliding_window: {length: 1m, limit: 2}, exact: true}
  strict:
    fail_mode: closed
    limits:
      strict-rpm: {unit: requests, sliding_window: {length: 1m, limit: 1000}, exact: true}
`

// liveEnv is what a test running the whole service on the real Redis
// gives it: the test keys, liveAdmissionPolicy, its own metrics registry,
// and the test's Redis reached through a proxy the test can cut, with the
// tenant "blocked" blacklisted there as the enforcer writes it. Every key
// under the test's Redis prefix goes when the test ends.
func liveEnv(t *testing.T) (platform.Env, *itest.Proxy) {
	t.Helper()
	rc := itest.Redis(t)
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	t.Cleanup(func() {
		ctx := context.Background()
		_ = flags.ScanKeys(ctx, rdb, rc.KeyPrefix+"*", func(k string) { rdb.Del(ctx, k) })
	})
	layout := flags.Layout{Prefix: rc.Prefix(redisconn.FlagKeys)}
	ctx := context.Background()
	if err := rdb.HSet(ctx, layout.TenantKey("blocked"), flags.VersionField, 1, flags.AllModels,
		flags.Encode(&flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: time.Now().Add(time.Hour), Reason: "case 4411"})).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, layout.VersionKey(), 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(liveAdmissionPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	proxy := itest.NewProxy(t, rc.Addr)
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(), Redis: rc,
		Policy: platform.FileSource{File: policyFile, Reload: time.Second}, TenantKeys: platform.FileSource{File: testKeysFile(t), Reload: time.Second}}
	env.Redis.Addr = proxy.Addr()
	return env, proxy
}

// refusingDecider is the flags' decisions the refusal tests answer: tenant
// "blocked" blacklisted (for reason), "spent" over its daily tokens, both
// until until, and "strict" refused because its flags are stale.
func refusingDecider(until time.Time, reason string) fakeDecider {
	return fakeDecider{
		"blocked": {Outcome: checker.Refused, Flag: &flags.Flag{State: flags.StateBlacklist, Kind: flags.KindBlacklist, Until: until, Reason: reason}},
		"spent": {Outcome: checker.Refused, Flag: &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "daily_tokens", Period: "day",
			Used: 1200, Limit: 1000, Until: until, ResetsAt: until}},
		"strict": {Outcome: checker.RefusedStale},
	}
}
