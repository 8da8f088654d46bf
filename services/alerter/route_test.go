package alerter

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

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
