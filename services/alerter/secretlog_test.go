package alerter

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/dingtalk"
	"github.com/sluicehq/sluice/services/alerter/feishu"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
	"github.com/sluicehq/sluice/services/alerter/slack"
	"github.com/sluicehq/sluice/services/alerter/webhook"
	"github.com/sluicehq/sluice/services/alerter/wecom"
)

// TestFailedPostsDoNotLogWebhookSecrets sends to a DingTalk robot, a Slack
// webhook, a Feishu bot, a WeCom robot and a webhook endpoint that refuse
// connections: the failure logs must name the channel and must not carry
// the robot's access_token, its sign, the Slack webhook's secret path, the
// Feishu bot's token, the WeCom robot's key or the webhook's URL token,
// all of which grant posting rights.
func TestFailedPostsDoNotLogWebhookSecrets(t *testing.T) {
	// A port that refuses connections: listen, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	const token, slackPath = "TOKENsecret4711", "T0SECRET/B0SECRET/XSECRETPATH"
	render, err := message.New("en", "", message.Links{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	ding, err := dingtalk.New("http://"+dead+"/robot/send?access_token="+token, robotSecret, render, nil)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := slack.New("http://"+dead+"/services/"+slackPath, render, nil)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := feishu.New("http://"+dead+"/open-apis/bot/v2/hook/"+token, robotSecret, render, nil)
	if err != nil {
		t.Fatal(err)
	}
	wc, err := wecom.New("http://"+dead+"/cgi-bin/webhook/send?key="+token, "", "", render, nil)
	if err != nil {
		t.Fatal(err)
	}
	hook, err := webhook.New("http://"+dead+"/hooks/sluice?token="+token, robotSecret, "", "", render, nil)
	if err != nil {
		t.Fatal(err)
	}
	channels := map[string]notify.Sender{"dingtalk:ops": ding, "slack:noc": sl, "feishu:ops": fs, "wecom:ops": wc, "webhook:billing": hook}

	var logs itest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m, err := notify.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	d := notify.NewDispatcher(log, m)
	cfg := notify.ChannelConfig{QueueSize: 10, RatePerMinute: 6000, Burst: 10, MaxAttempts: 2,
		InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond, Timeout: time.Second}
	for name, s := range channels {
		if err := d.Set(name, s, cfg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx, time.Second); close(done) }()
	defer func() { stop(); <-done }()

	a := alert.Alert{Key: alert.Key{Tenant: "acme", Model: "*", Rule: alert.RuleQuotaTier}, Status: alert.StatusFiring, Tier: 90, Language: "en"}
	for ch := range channels {
		d.Deliver(ch, alert.Message{Alerts: []alert.Alert{a}})
	}
	itest.Eventually(t, 10*time.Second, "every post given up", func() bool {
		for ch := range channels {
			if testutil.ToFloat64(m.Failed.WithLabelValues(ch)) != 1 {
				return false
			}
		}
		return true
	})
	out := logs.String()
	for _, secret := range []string{token, "access_token", "sign=", "SECRET", "/services/", "/hook/", "key=", "token="} {
		if strings.Contains(out, secret) {
			t.Errorf("the log carries %q:\n%s", secret, out)
		}
	}
	for name := range channels {
		name = "channel=" + name
		if !strings.Contains(out, name) {
			t.Errorf("the log does not name the channel (%s):\n%s", name, out)
		}
	}
}
