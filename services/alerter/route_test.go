package alerter

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/controlplane/controlplanetest"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
)

func TestRoutingFollowsAHotReloadedPolicy(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(`defaults: {channels: [alertmanager]}
tenants:
  acme: {timezone: Asia/Shanghai}
`)
	w, err := policy.NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.OperatorChannels = []string{"slack:noc"}
	cfg.Channels = policy.Channels{"slack": {"noc": {"webhook": "https://hooks.example/noc"}}}
	cfg.Tenants = map[string]TenantConfig{"acme": {Language: "zh"}}
	p, err := newPipeline(cfg, testEnv(), w)
	if err != nil {
		t.Fatal(err)
	}
	r := p.route("acme")
	if !slices.Equal(r.Channels, []string{"alertmanager", "slack:noc"}) || r.Language != "zh" || r.Location.String() != "Asia/Shanghai" {
		t.Fatalf("route %+v", r)
	}
	if r := p.route("unknown"); r.Language != "en" || !slices.Equal(r.Channels, []string{"alertmanager", "slack:noc"}) {
		t.Fatalf("unknown tenant route %+v", r)
	}

	write(fmt.Sprintf(`defaults: {channels: [alertmanager]}
tenants:
  acme: {timezone: Asia/Shanghai, channels: [dingtalk:acme]}
channels:
  dingtalk: {acme: {webhook: %q, secret: "SECx"}}
`, "https://oapi.example/robot/send?access_token=x"))
	if !w.Reload() {
		t.Fatalf("reload failed: %s", w.LastError())
	}
	if err := p.syncChannels(w.Current()); err != nil {
		t.Fatal(err)
	}
	if r := p.route("acme"); !slices.Equal(r.Channels, []string{"dingtalk:acme", "slack:noc"}) {
		t.Fatalf("route after reload %+v", r.Channels)
	}
	if !slices.Contains(p.dispatch.Channels(), "dingtalk:acme") {
		t.Fatalf("the new robot has no channel: %v", p.dispatch.Channels())
	}
}

// Review finding: the alerter read the policy file only, so a tenant made
// through the admin API was alerted in the defaults' channels, not its
// own. Its record is laid over the policy before any signal is routed.
func TestARecordTenantIsAlertedInItsOwnChannels(t *testing.T) {
	kc, sa, topics := itest.Kafka(t), itest.SignalAuth(t), itest.Topics(t)
	tenant := itest.Unique(t, "record_")
	controlplanetest.ProduceTenant(t, kc, sa, topics.Admin, tenant, `{"channels":["slack:ops"]}`)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte("defaults:\n  channels: [alertmanager]\nchannels:\n  slack: {ops: {webhook: \"https://hooks.example/ops\"}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := policy.NewWatcher(path, time.Second, nil, policy.WithChannelCheck(channelKinds.Check))
	if err != nil {
		t.Fatal(err)
	}
	env := testEnv()
	env.Kafka, env.Topics, env.SignalAuth = kc, topics, sa
	_, stop, err := readRecords(context.Background(), env, w)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	p := runningPipeline(t, DefaultConfig(), w)
	if r := p.route(tenant); !slices.Equal(r.Channels, []string{"slack:ops"}) {
		t.Fatalf("the record tenant is routed to %v; want its record's [slack:ops]", r.Channels)
	}
	if r := p.route("file-default"); !slices.Equal(r.Channels, []string{"alertmanager"}) {
		t.Fatalf("a tenant of neither is routed to %v; want the defaults' [alertmanager]", r.Channels)
	}
}
