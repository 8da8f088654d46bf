package alerter

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

func TestExampleConfigLoads(t *testing.T) {
	cfg := DefaultConfig()
	err := config.Load(&cfg, config.Options{Args: []string{"-config", "testdata/alerter.yaml"}, LookupEnv: func(string) (string, bool) { return "", false }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Rules.PendingFor != 5*time.Minute || cfg.Language != "zh" || cfg.delivery("slack").RatePerMinute != 60 || cfg.delivery("slack").Burst != 3 || cfg.delivery("slack").MaxAttempts != 8 || cfg.Alertmanager.URL == "" {
		t.Fatalf("loaded %+v", cfg)
	}
	r, err := cfg.Tenants["acme"].route("acme", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if r.QuietHours == nil || r.QuietHours.Start != 22*60 || r.QuietHours.End != 8*60 || r.QuietHours.Allow != alert.SeverityCritical ||
		len(r.Silences) != 1 || r.Silences[0].Model != "gpt-4o" {
		t.Fatalf("route %+v", r)
	}
}

func TestChannelDefinitionsAndDeliveryAreCheckedByKind(t *testing.T) {
	c := DefaultConfig()
	c.Channels = policy.Channels{
		"slack":    {"noc": {"webhook": "hooks.slack.com/x"}},
		"dingtalk": {"ops": {"webhook": "https://oapi.dingtalk.com/robot/send?access_token=x", "secrte": "SEC"}},
		"pager":    {"x": {}},
		"webhook":  {"billing": {"url": "https://billing.example/hooks?token=TOKEN4711", "secret": "SHORTSECRET"}, "crm": {"url": "https://crm.example/x"}},
		"feishu":   {"ops": {"webhook": "https://open.feishu.cn/open-apis/bot/v2/hook/x", "secret": "s", "at": "all"}},
		"wecom":    {"ops": {"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?token=KEY4711"}},
	}
	c.Delivery = map[string]notify.ChannelConfig{"slack": {Burst: -1}, "teams": {}}
	err := c.Validate()
	for _, want := range []string{
		`channels.slack.noc.webhook: has no scheme and host`,
		"channels.dingtalk.ops.secrte: unknown setting; this kind takes webhook, secret",
		`channels.pager.x: unknown channel kind "pager"; the alerter knows dingtalk, feishu, slack, webhook, wecom`,
		"channels.webhook.billing.secret: a key of 11 bytes is too short",
		"channels.webhook.crm.secret: is required",
		"channels.feishu.ops.at: unknown setting; this kind takes webhook, secret",
		"channels.wecom.ops.webhook: has no key parameter",
		"delivery.slack.burst: -1 must be at least 1",
		"delivery.teams: unknown channel kind",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	for _, secret := range []string{"TOKEN4711", "SHORTSECRET", "KEY4711"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error quotes a credential (%s):\n%v", secret, err)
		}
	}
}

func TestThePolicyIsLoadedWithTheChannelKindsChecks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	body := "channels:\n  dingtalk:\n    ops:\n      webhook: oapi.dingtalk.com/robot\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	env := testEnv()
	env.Policy, env.Topics = platform.FileSource{File: path, Reload: time.Second}, itest.Topics(t)
	svc, err := New(DefaultConfig(), env)
	if err != nil {
		t.Fatal(err)
	}
	err = svc.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "policy.yaml:4: channels.dingtalk.ops.webhook") {
		t.Fatalf("Start = %v, want the bad webhook named with its line", err)
	}
}
