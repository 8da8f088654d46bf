package alerter

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/channel/channeltest"
	"github.com/sluicehq/sluice/services/alerter/notify"
	"github.com/sluicehq/sluice/services/alerter/webhook"
)

const robotSecret = "SECtest0123456789"

// receiver stands in for a DingTalk robot, a Slack webhook, a Feishu bot,
// a WeCom robot or a webhook endpoint: it records what arrives, checks
// signatures (DingTalk's, Feishu's, the webhook kind's) as the real ones
// do, and can fail the first requests with a 500.
type receiver struct {
	kind string // "dingtalk", "slack", "feishu", "wecom" or "webhook"
	mu   sync.Mutex
	fail channeltest.Outage // answer 500 to this many requests first
	// titles holds the message titles, in arrival order.
	titles []string
	bodies []string
	errs   []string
	// events holds the event ids of webhook deliveries, in arrival order.
	events []string
	srv    *httptest.Server
}

func newReceiver(t *testing.T, kind string) *receiver {
	r := &receiver{kind: kind}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) url() string {
	switch r.kind {
	case "dingtalk":
		return r.srv.URL + "/robot/send?access_token=tok"
	case "feishu":
		return r.srv.URL + "/open-apis/bot/v2/hook/tok"
	case "wecom":
		return r.srv.URL + "/cgi-bin/webhook/send?key=tok"
	case "webhook":
		return r.srv.URL + "/hooks/sluice"
	}
	return r.srv.URL + "/services/T0/B0/x"
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail.Answer(w, http.StatusInternalServerError) {
		return
	}
	body, _ := io.ReadAll(req.Body)
	switch r.kind {
	case "dingtalk":
		q := req.URL.Query()
		mac := hmac.New(sha256.New, []byte(robotSecret))
		mac.Write([]byte(q.Get("timestamp") + "\n" + robotSecret))
		if q.Get("sign") != base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
			r.errs = append(r.errs, "bad signature")
			_, _ = w.Write([]byte(`{"errcode":310000,"errmsg":"sign not match"}`))
			return
		}
		var p struct {
			MsgType  string `json:"msgtype"`
			Markdown struct{ Title, Text string }
		}
		if err := json.Unmarshal(body, &p); err != nil || p.MsgType != "markdown" || p.Markdown.Text == "" {
			r.errs = append(r.errs, "bad payload: "+string(body))
			_, _ = w.Write([]byte(`{"errcode":40035,"errmsg":"bad"}`))
			return
		}
		r.titles = append(r.titles, p.Markdown.Title)
		r.bodies = append(r.bodies, p.Markdown.Text)
		_, _ = w.Write([]byte(`{"errcode":0,"errmsg":"ok"}`))
	case "feishu":
		var p struct {
			Timestamp, Sign string
			MsgType         string `json:"msg_type"`
			Card            struct {
				Header struct {
					Title struct{ Tag, Content string }
				}
				Elements []struct{ Tag, Content string }
			}
		}
		_ = json.Unmarshal(body, &p)
		mac := hmac.New(sha256.New, []byte(p.Timestamp+"\n"+robotSecret)) // Feishu: the string is the key
		if p.Sign == "" || p.Sign != base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
			r.errs = append(r.errs, "bad signature")
			_, _ = w.Write([]byte(`{"code":19021,"msg":"sign match fail or timestamp is not within one hour from current time"}`))
			return
		}
		if p.MsgType != "interactive" || p.Card.Header.Title.Tag != "plain_text" || len(p.Card.Elements) == 0 || p.Card.Elements[0].Tag != "markdown" {
			r.errs = append(r.errs, "bad payload: "+string(body))
			_, _ = w.Write([]byte(`{"code":9499,"msg":"Bad Request"}`))
			return
		}
		r.titles = append(r.titles, p.Card.Header.Title.Content)
		r.bodies = append(r.bodies, p.Card.Elements[0].Content)
		_, _ = w.Write([]byte(`{"code":0,"msg":"success","data":{}}`))
	case "wecom":
		var p struct {
			MsgType      string `json:"msgtype"`
			TemplateCard struct {
				CardType  string `json:"card_type"`
				MainTitle struct {
					Title string `json:"title"`
				} `json:"main_title"`
				SubTitleText string `json:"sub_title_text"`
				CardAction   struct {
					Type int    `json:"type"`
					URL  string `json:"url"`
				} `json:"card_action"`
			} `json:"template_card"`
		}
		c := &p.TemplateCard
		if req.URL.Query().Get("key") != "tok" || json.Unmarshal(body, &p) != nil || p.MsgType != "template_card" ||
			c.CardType != "text_notice" || c.MainTitle.Title == "" || c.CardAction.Type != 1 || c.CardAction.URL == "" {
			r.errs = append(r.errs, "bad request: "+string(body))
			_, _ = w.Write([]byte(`{"errcode":40058,"errmsg":"invalid"}`))
			return
		}
		r.titles = append(r.titles, c.MainTitle.Title)
		r.bodies = append(r.bodies, c.SubTitleText)
		_, _ = w.Write([]byte(`{"errcode":0,"errmsg":"ok"}`))
	case "webhook":
		if err := webhook.Verify(robotSecret, req.Header, body, time.Now(), 5*time.Minute); err != nil {
			r.errs = append(r.errs, err.Error())
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var p webhook.Payload
		if err := json.Unmarshal(body, &p); err != nil || p.ID != req.Header.Get(webhook.HeaderID) || len(p.Events) == 0 {
			r.errs = append(r.errs, "bad payload: "+string(body))
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		r.titles = append(r.titles, p.Title)
		r.bodies = append(r.bodies, p.Text)
		for _, e := range p.Events {
			r.events = append(r.events, e.ID)
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		var p struct {
			Text   string `json:"text"`
			Blocks []struct {
				Type string `json:"type"`
				Text struct{ Type, Text string }
			} `json:"blocks"`
		}
		if err := json.Unmarshal(body, &p); err != nil || len(p.Blocks) < 2 || p.Blocks[1].Text.Type != "mrkdwn" {
			r.errs = append(r.errs, "bad payload: "+string(body))
			http.Error(w, "invalid_payload", http.StatusBadRequest)
			return
		}
		var text []string
		for _, b := range p.Blocks {
			if b.Type == "section" {
				text = append(text, b.Text.Text)
			}
		}
		r.titles = append(r.titles, p.Text)
		r.bodies = append(r.bodies, strings.Join(text, "\n"))
		_, _ = w.Write([]byte("ok"))
	}
}

// eventIDs returns the event ids a webhook receiver got, in arrival order.
func (r *receiver) eventIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func (r *receiver) got() (titles, bodies, errs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.titles...), append([]string(nil), r.bodies...), append([]string(nil), r.errs...)
}

func testEnv() platform.Env {
	return platform.Env{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: prometheus.NewRegistry(), Health: ops.NewHealth(),
		SignalAuth: testSignalAuth}
}

// setup builds a pipeline whose policy routes every tenant to Alertmanager,
// one DingTalk robot and one Slack webhook, and runs its dispatcher.
func setup(t *testing.T, mutate func(*Config)) (*pipeline, *receiver, *receiver) {
	t.Helper()
	ding, sl := newReceiver(t, "dingtalk"), newReceiver(t, "slack")
	pol := fmt.Sprintf(`defaults:
  channels: [alertmanager, dingtalk:ops, slack:ops]
channels:
  dingtalk: {ops: {webhook: %q, secret: %q}}
  slack: {ops: {webhook: %q}}
`, ding.url(), robotSecret, sl.url())
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := policy.NewWatcher(path, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Alertmanager.URL = itest.Alertmanager(t)
	// Retries in milliseconds, so that the retry tests stay fast.
	fast := func(c *Config) {
		// Only the back-off: the kinds' other delivery defaults stay.
		retry := notify.ChannelConfig{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
		c.Delivery = map[string]notify.ChannelConfig{"dingtalk": retry, "slack": retry}
		c.Alertmanager.Delivery.InitialBackoff, c.Alertmanager.Delivery.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	fast(&cfg)
	if mutate != nil {
		mutate(&cfg)
	}
	return runningPipeline(t, cfg, w), ding, sl
}

// runningPipeline returns the pipeline of cfg and w, its dispatcher
// running until t ends.
func runningPipeline(t *testing.T, cfg Config, w *policy.Watcher) *pipeline {
	t.Helper()
	p, err := newPipeline(cfg, testEnv(), w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.dispatch.Run(ctx, 10*time.Second); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

var sigSeq int

func tierSignal(tenant string, prev, to int, at time.Time) *schemas.Signal {
	sigSeq++
	dir := schemas.DirectionUp
	if to < prev {
		dir = schemas.DirectionDown
	}
	start := time.Date(at.Year(), at.Month(), 1, 0, 0, 0, 0, time.UTC)
	return &schemas.Signal{ID: fmt.Sprintf("s%d", sigSeq), Kind: schemas.SignalTierCrossed, Time: at, Tenant: tenant, Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth, PeriodStart: start, PeriodEnd: start.AddDate(0, 1, 0),
		Tier: to, PreviousTier: prev, Direction: dir, Used: float64(to) * 10000, Limit: 1000000, Unit: schemas.UnitTokens, Mode: schemas.ModeHard}
}

// amAlert is the part of Alertmanager's gettableAlert the tests read.
type amAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// amAlerts lists the active Alertmanager alerts that matcher selects
// (a label matcher such as tenant="acme").
func amAlerts(t *testing.T, base, matcher string) []amAlert {
	t.Helper()
	resp, err := http.Get(base + "/api/v2/alerts?filter=" + url.QueryEscape(matcher))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []amAlert
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sentinel fires an alert for a fresh tenant and waits until both
// receivers have it: channels deliver in order, so everything queued before
// it has been delivered by then.
func sentinel(t *testing.T, p *pipeline, now time.Time, recv ...*receiver) time.Time {
	t.Helper()
	tenant := itest.Unique(t, "sentinel_")
	p.engine.Observe(tierSignal(tenant, 0, 70, now), now)
	for i := 0; i < 20; i++ {
		now = now.Add(10 * time.Second)
		p.engine.Tick(now)
	}
	for _, r := range recv {
		itest.Eventually(t, 30*time.Second, r.kind+" sentinel", func() bool {
			titles, _, _ := r.got()
			return len(titles) > 0 && strings.Contains(titles[len(titles)-1], tenant)
		})
	}
	return now
}

func TestOscillatingTenantIsNotifiedOnceOnEveryChannel(t *testing.T) {
	p, ding, sl := setup(t, nil)
	tenant := itest.Unique(t, "osc_")
	now := time.Now().UTC()
	p.engine.Observe(tierSignal(tenant, 70, 90, now), now)
	// An hour of the tier flapping 70 ↔ 90 every 20 seconds, never holding
	// 90 for the pending minute; it ends at 70 so the sentinel's ticks do
	// not escalate it.
	for i := 0; i < 181; i++ {
		now = now.Add(20 * time.Second)
		if i%2 == 0 {
			p.engine.Observe(tierSignal(tenant, 90, 70, now), now)
		} else {
			p.engine.Observe(tierSignal(tenant, 70, 90, now), now)
		}
		p.engine.Tick(now)
	}
	sentinel(t, p, now, ding, sl)
	for _, r := range []*receiver{ding, sl} {
		titles, bodies, errs := r.got()
		n := 0
		for i, title := range titles {
			if strings.Contains(title, tenant) {
				n++
				// ≥70% held all along; ≥90% never held for the pending minute.
				if !strings.Contains(title, "70%") || !strings.Contains(bodies[i], "of 1,000,000 tokens") {
					t.Errorf("%s message lacks the figures: %q\n%s", r.kind, title, bodies[i])
				}
			}
		}
		if n != 1 || len(errs) != 0 {
			t.Errorf("%s: %d notifications for the flapping tenant, want 1 (receiver errors: %v)", r.kind, n, errs)
		}
	}
	// The sentinel proves the direct channels delivered; Alertmanager's
	// channel has its own worker, so wait for what it holds.
	am := itest.Alertmanager(t)
	itest.Eventually(t, 30*time.Second, "the one firing alert in Alertmanager", func() bool {
		return len(amAlerts(t, am, `tenant="`+tenant+`"`)) == 1
	})
}

func TestDirectChannelsRetryAfterServerErrors(t *testing.T) {
	p, ding, sl := setup(t, nil)
	ding.fail, sl.fail = 2, 2
	tenant := itest.Unique(t, "retry_")
	now := time.Now().UTC()
	p.engine.Observe(tierSignal(tenant, 90, 100, now), now)
	for i := 0; i < 20; i++ {
		now = now.Add(10 * time.Second)
		p.engine.Tick(now)
	}
	for _, r := range []*receiver{ding, sl} {
		itest.Eventually(t, 30*time.Second, r.kind+" delivery after two 500s", func() bool { titles, _, _ := r.got(); return len(titles) == 1 })
		if titles, _, errs := r.got(); !strings.Contains(titles[0], tenant) || len(errs) != 0 {
			t.Errorf("%s: %v %v", r.kind, titles, errs)
		}
	}
	for _, ch := range []string{"dingtalk:ops", "slack:ops"} {
		if got := testutil.ToFloat64(p.metrics.Retries.WithLabelValues(ch)); got != 2 {
			t.Errorf("%s: %v retries, want 2", ch, got)
		}
		if got := testutil.ToFloat64(p.metrics.Failed.WithLabelValues(ch)); got != 0 {
			t.Errorf("%s: %v failures, want 0", ch, got)
		}
	}
}

func TestBurstOf500TenantsYieldsOneIncidentPerChannel(t *testing.T) {
	p, ding, sl := setup(t, func(c *Config) { c.Rules.GroupWait = 30 * time.Second; c.Rules.GroupThreshold = 10 })
	prefix := itest.Unique(t, "burst_")
	now := time.Now().UTC()
	for i := 0; i < 500; i++ {
		p.engine.Observe(tierSignal(fmt.Sprintf("%s_%03d", prefix, i), 90, 100, now), now)
	}
	for i := 0; i < 12; i++ { // two minutes: pending, then the grouping window
		now = now.Add(10 * time.Second)
		p.engine.Tick(now)
	}
	sentinel(t, p, now, ding, sl)
	for _, r := range []*receiver{ding, sl} {
		titles, bodies, _ := r.got()
		if len(titles) != 2 {
			t.Fatalf("%s got %d messages for a 500-tenant burst (plus the sentinel), want 2: %q", r.kind, len(titles), titles)
		}
		if !strings.Contains(titles[0], "Incident: 500 tenants") || !strings.Contains(bodies[0], prefix+"_000") || !strings.Contains(bodies[0], "and 450 more") {
			t.Errorf("%s incident:\n%s\n%s", r.kind, titles[0], bodies[0])
		}
	}
	am := itest.Alertmanager(t)
	itest.Eventually(t, 30*time.Second, "500 alerts in Alertmanager", func() bool { return len(amAlerts(t, am, `tenant=~"`+prefix+`_.*"`)) == 500 })
}

func TestConfigValidateNamesFieldsAndLimits(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Language = "fr"
	c.Tick = 0
	c.OperatorChannels = []string{"pager:ops"}
	c.Alertmanager.URL = "127.0.0.1:9093"
	c.Rules.GroupThreshold = 0
	c.Tenants = map[string]TenantConfig{"acme": {
		QuietHours: &QuietHoursConfig{Start: "25:00", End: "08:00", Allow: "loud"},
		Silences:   []SilenceConfig{{Rule: "nope"}},
	}}
	err := c.Validate()
	for _, want := range []string{
		`: "fr" is not one of en, zh`,
		": 0s is outside 10ms..1m",
		`"pager:ops" is not a channel`,
		"",
		" group_threshold: 0 must be at least 1",
		`.acme.quiet_hours: "25:00" is not a time of day`,
		`.acme.quiet_hours.allow: "loud"`,
		".acme.silences[0].until: is required",
		`.acme.silences[0].rule: "nope"`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

func TestPoisonRecordsAreCountedAndSkipped(t *testing.T) {
	p, _, _ := setup(t, nil)
	before := testutil.ToFloat64(p.invalid)
	for _, v := range []string{`{`, `{"id":"x"}`, `[]`, ``} {
		p.handle(testSigner.Record("", nil, []byte(v)), time.Now())
	}
	if got := testutil.ToFloat64(p.invalid) - before; got != 4 {
		t.Fatalf("invalid count %v, want 4", got)
	}
}

// TestTenantPartitionsStayBoundedUnderTenantChurn: the alerter remembers
// the signals partition of a tenant only while it holds state of it (a
// tracked alert, a change not yet written, a held notice); signals of
// 20,000 passing tenants that leave no alert do not grow that memory past
// its floor, and the tenants with alerts keep their partition, so their
// state is still written where their new owner restores it.
func TestTenantPartitionsStayBoundedUnderTenantChurn(t *testing.T) {
	p, _, _ := setup(t, func(c *Config) { c.Rules.MaxAlerts = 100 })
	prefix := itest.Unique(t, "churn_")
	now := time.Now().UTC()
	var alerted []string
	for i := range 20 {
		tenant := fmt.Sprintf("%s_alert_%d", prefix, i)
		alerted = append(alerted, tenant)
		r := signed(t, tierSignal(tenant, 0, 90, now))
		r.Partition = 3
		p.handle(r, now)
	}
	for i := range 20000 {
		s := tierSignal(fmt.Sprintf("%s_%05d", prefix, i), 70, 0, now) // down to tier 0: nothing to alert on
		if i%2 == 0 {
			s.Kind, s.Tier, s.PreviousTier, s.Direction = schemas.SignalLateEvent, 0, 0, "" // never alerted on
		}
		r := signed(t, s)
		r.Partition = int32(i % 4)
		p.handle(r, now)
	}
	p.partMu.Lock()
	n := len(p.tenantPart)
	p.partMu.Unlock()
	if n > minPartitionPrune {
		t.Errorf("%d tenant partitions remembered after 20,020 tenants signalled and 20 have alerts, want at most %d", n, minPartitionPrune)
	}
	for _, tenant := range alerted {
		if part, ok := p.partitionOf(tenant); !ok || part != 3 {
			t.Errorf("tenant %s with an alert: partition %d, %v; want 3", tenant, part, ok)
		}
	}
}
