package engine

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/alert"
)

type delivery struct {
	channel string
	msg     alert.Message
}

type recorder struct {
	mu  sync.Mutex
	got []delivery
}

func (r *recorder) Deliver(ch string, m alert.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, delivery{ch, m})
}

// take returns and forgets what was delivered, without Alertmanager
// re-sends unless resends is set.
func (r *recorder) take(resends bool) []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []delivery
	for _, d := range r.got {
		if d.msg.Resend && !resends {
			continue
		}
		out = append(out, d)
	}
	r.got = nil
	return out
}

func byChannel(ds []delivery) map[string][]alert.Message {
	out := map[string][]alert.Message{}
	for _, d := range ds {
		out[d.channel] = append(out[d.channel], d.msg)
	}
	return out
}

var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

func testConfig() Config {
	c := DefaultConfig()
	c.PendingFor = time.Minute
	c.ResolveAfter = 5 * time.Minute
	c.GroupWait = 0
	c.ResendInterval = time.Hour
	return c
}

func newEngine(t *testing.T, cfg Config, route Router) (*Engine, *recorder) {
	t.Helper()
	rec := &recorder{}
	if route == nil {
		route = func(string) Route {
			return Route{Channels: []string{AlertmanagerChannel, "dingtalk:ops"}, Language: "en", Location: time.UTC}
		}
	}
	e, err := New(cfg, route, rec)
	if err != nil {
		t.Fatal(err)
	}
	e.lastResend = t0
	return e, rec
}

var seq int

func tier(tenant string, prev, to int, at time.Time) *schemas.Signal {
	seq++
	dir := schemas.DirectionUp
	if to < prev {
		dir = schemas.DirectionDown
	}
	return &schemas.Signal{
		ID: fmt.Sprintf("sig%d", seq), Kind: schemas.SignalTierCrossed, Time: at, Tenant: tenant, Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth,
		PeriodStart: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), PeriodEnd: time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC),
		Tier: to, PreviousTier: prev, Direction: dir, Used: float64(to) * 1000, Limit: 100000, Unit: schemas.UnitTokens, Mode: schemas.ModeHard,
	}
}

// tickThrough ticks every 10s from from to to inclusive.
func tickThrough(e *Engine, from, to time.Time) {
	for now := from; !now.After(to); now = now.Add(10 * time.Second) {
		e.Tick(now)
	}
}

func TestPendingDurationFiltersBlipsAndFiresAfterHolding(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	e.Observe(tier("blip", 0, 90, t0), t0)
	tickThrough(e, t0, t0.Add(30*time.Second))
	e.Observe(tier("blip", 90, 0, t0.Add(40*time.Second)), t0.Add(40*time.Second))
	tickThrough(e, t0.Add(40*time.Second), t0.Add(10*time.Minute))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("a 40s blip was notified: %+v", got)
	}

	e.Observe(tier("steady", 0, 90, t0), t0)
	tickThrough(e, t0, t0.Add(50*time.Second))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("notified before the pending duration: %+v", got)
	}
	e.Tick(t0.Add(time.Minute))
	got := byChannel(rec.take(false))
	if len(got) != 2 || len(got[AlertmanagerChannel]) != 1 || len(got["dingtalk:ops"]) != 1 {
		t.Fatalf("want one firing message per channel, got %+v", got)
	}
	a := got[AlertmanagerChannel][0].Alerts[0]
	if a.Status != alert.StatusFiring || a.Tier != 90 || a.Severity != alert.SeverityWarning || a.Key.Tenant != "steady" {
		t.Fatalf("wrong alert: %+v", a)
	}
	if s := e.Stats(); s.Firing != 1 || s.Pending != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestOscillatingAroundAThresholdNotifiesOnce(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	now := t0
	e.Observe(tier("osc", 70, 90, now), now)
	// The tier flaps between 70 and 90 every 20s for an hour.
	for i := 0; i < 180; i++ {
		now = now.Add(20 * time.Second)
		if i%2 == 0 {
			e.Observe(tier("osc", 90, 70, now), now)
		} else {
			e.Observe(tier("osc", 70, 90, now), now)
		}
		e.Tick(now)
	}
	got := rec.take(false)
	if len(got) != 2 {
		t.Fatalf("want one notification per channel for an hour of flapping, got %d: %+v", len(got), got)
	}
	for _, d := range got {
		if d.msg.Alerts[0].Status != alert.StatusFiring {
			t.Fatalf("flapping sent %s", d.msg.Alerts[0].Status)
		}
	}
}

func TestEscalationSupersedesTheLowerTierInAlertmanager(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	e.Observe(tier("esc", 0, 70, t0), t0)
	e.Tick(t0.Add(time.Minute))
	if got := rec.take(false); len(got) != 2 || got[0].msg.Alerts[0].Severity != alert.SeverityInfo {
		t.Fatalf("want a 70%% info alert, got %+v", got)
	}
	at := t0.Add(2 * time.Minute)
	e.Observe(tier("esc", 70, 100, at), at)
	e.Tick(at.Add(30 * time.Second))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("escalation skipped the pending duration: %+v", got)
	}
	e.Tick(at.Add(time.Minute))
	got := byChannel(rec.take(false))
	if len(got[AlertmanagerChannel]) != 1 || len(got["dingtalk:ops"]) != 1 {
		t.Fatalf("want one escalation per channel, got %+v", got)
	}
	am := got[AlertmanagerChannel][0]
	if am.Alerts[0].Tier != 100 || am.Alerts[0].Severity != alert.SeverityCritical {
		t.Fatalf("escalated alert %+v", am.Alerts[0])
	}
	if len(am.Superseded) != 1 || am.Superseded[0].Tier != 70 || am.Superseded[0].Status != alert.StatusResolved {
		t.Fatalf("Alertmanager must be told the 70%% label set ended: %+v", am.Superseded)
	}
}

func TestResolvedAfterTheConditionStaysClear(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	e.Observe(tier("res", 0, 90, t0), t0)
	e.Tick(t0.Add(time.Minute))
	rec.take(false)

	// Clears, comes back within the resolve hold: no news.
	at := t0.Add(10 * time.Minute)
	e.Observe(tier("res", 90, 0, at), at)
	tickThrough(e, at, at.Add(3*time.Minute))
	e.Observe(tier("res", 0, 90, at.Add(3*time.Minute)), at.Add(3*time.Minute))
	tickThrough(e, at.Add(3*time.Minute), at.Add(20*time.Minute))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("a short clear was notified: %+v", got)
	}

	// A period reset clears it for good.
	at = at.Add(30 * time.Minute)
	seq++
	e.Observe(&schemas.Signal{ID: fmt.Sprint("reset", seq), Kind: schemas.SignalPeriodReset, Time: at, Tenant: "res", Model: "*",
		Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth}, at)
	tickThrough(e, at, at.Add(4*time.Minute))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("resolved before the hold: %+v", got)
	}
	e.Tick(at.Add(5 * time.Minute))
	got := rec.take(false)
	if len(got) != 2 || got[0].msg.Alerts[0].Status != alert.StatusResolved || got[0].msg.Alerts[0].EndsAt != at.Add(5*time.Minute) {
		t.Fatalf("want a resolved notice per channel with endsAt, got %+v", got)
	}
	if s := e.Stats(); s.Firing+s.Pending != 0 {
		t.Fatalf("resolved alert still tracked: %+v", s)
	}
}

func TestDuplicateSignalIDsAreIgnored(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	up := tier("dup", 0, 90, t0)
	e.Observe(up, t0)
	e.Tick(t0.Add(time.Minute))
	rec.take(false)
	down := tier("dup", 90, 0, t0.Add(2*time.Minute))
	e.Observe(down, t0.Add(2*time.Minute))
	// A replay of the old "up" must not cancel the clear.
	e.Observe(up, t0.Add(3*time.Minute))
	tickThrough(e, t0.Add(3*time.Minute), t0.Add(8*time.Minute))
	if got := rec.take(false); len(got) != 2 || got[0].msg.Alerts[0].Status != alert.StatusResolved {
		t.Fatalf("want resolved, got %+v", got)
	}
	if e.Stats().DuplicateSignals != 1 {
		t.Fatalf("stats %+v", e.Stats())
	}
}

func TestSilencesAndQuietHoursHoldNotificationsBack(t *testing.T) {
	route := func(tenant string) Route {
		r := Route{Channels: []string{"slack:x"}, Location: time.UTC}
		switch tenant {
		case "quiet":
			// 12:00–13:00 UTC, only critical gets through.
			r.QuietHours = &QuietHours{Start: 12 * 60, End: 13 * 60, Allow: alert.SeverityCritical}
		case "silenced":
			r.Silences = []Silence{{Rule: alert.RuleQuotaTier, Until: t0.Add(30 * time.Minute)}}
		}
		return r
	}
	e, rec := newEngine(t, testConfig(), route)
	e.Observe(tier("quiet", 0, 90, t0), t0)
	e.Observe(tier("silenced", 0, 90, t0), t0)
	tickThrough(e, t0, t0.Add(29*time.Minute))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("notified during quiet hours or a silence: %+v", got)
	}
	tickThrough(e, t0.Add(29*time.Minute), t0.Add(31*time.Minute))
	got := rec.take(false)
	if len(got) != 1 || got[0].msg.Alerts[0].Key.Tenant != "silenced" {
		t.Fatalf("want the silenced alert once the silence expired, got %+v", got)
	}
	// Critical passes quiet hours.
	at := t0.Add(32 * time.Minute)
	e.Observe(tier("quiet", 90, 100, at), at)
	e.Tick(at.Add(time.Minute))
	got = rec.take(false)
	if len(got) != 1 || got[0].msg.Alerts[0].Tier != 100 {
		t.Fatalf("want the critical alert during quiet hours, got %+v", got)
	}
}

func TestAnEscalationHeldByQuietHoursStillResolvesTheDeliveredAlert(t *testing.T) {
	quietFrom := t0.Add(10 * time.Minute)
	route := func(string) Route {
		r := Route{Channels: []string{AlertmanagerChannel, "slack:x"}, Location: time.UTC}
		r.QuietHours = &QuietHours{Start: 12*60 + 10, End: 12*60 + 40, Allow: alert.SeverityCritical}
		return r
	}
	e, rec := newEngine(t, testConfig(), route)
	e.Observe(tier("q", 0, 70, t0), t0)
	e.Tick(t0.Add(time.Minute))
	if got := rec.take(false); len(got) != 2 {
		t.Fatalf("want the 70%% alert before quiet hours, got %+v", got)
	}
	e.Observe(tier("q", 70, 90, quietFrom), quietFrom)
	tickThrough(e, quietFrom, quietFrom.Add(5*time.Minute))
	if got := rec.take(false); len(got) != 0 {
		t.Fatalf("a warning escalation went out during quiet hours: %+v", got)
	}
	// The delivered 70% alert keeps being re-sent to Alertmanager…
	e.lastResend = time.Time{}
	e.Tick(quietFrom.Add(6 * time.Minute))
	resent := false
	for _, d := range rec.take(true) {
		resent = resent || d.msg.Resend
	}
	if !resent {
		t.Fatal("a delivered alert stopped being re-sent while an escalation waited")
	}
	// …and resolves aloud when it clears, even during quiet hours.
	at := quietFrom.Add(7 * time.Minute)
	e.Observe(tier("q", 90, 0, at), at)
	tickThrough(e, at, at.Add(6*time.Minute))
	got := byChannel(rec.take(false))
	if len(got["slack:x"]) != 1 || got["slack:x"][0].Alerts[0].Status != alert.StatusResolved || got["slack:x"][0].Alerts[0].Tier != 70 {
		t.Fatalf("want the delivered 70%% alert resolved, got %+v", got)
	}
}

func TestQuietHoursSpanningMidnightInTheTenantsZone(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Skip("no time zone database")
	}
	q := QuietHours{Start: 22 * 60, End: 8 * 60, Allow: alert.SeverityCritical}
	for _, c := range []struct {
		utc  string
		want bool
	}{{"2026-03-10T13:59:00Z", false}, {"2026-03-10T14:00:00Z", true}, {"2026-03-10T23:59:00Z", true}, {"2026-03-11T00:00:00Z", false}} {
		at, _ := time.Parse(time.RFC3339, c.utc)
		if got := q.contains(at, shanghai); got != c.want {
			t.Errorf("%s (%s in Shanghai): quiet=%v, want %v", c.utc, at.In(shanghai).Format("15:04"), got, c.want)
		}
	}
}

func TestABurstOfTenantsBecomesOneIncidentPerDirectChannel(t *testing.T) {
	cfg := testConfig()
	cfg.GroupWait = 30 * time.Second
	cfg.GroupThreshold = 10
	route := func(tenant string) Route {
		if tenant == "loner" {
			return Route{Channels: []string{"slack:loner"}}
		}
		return Route{Channels: []string{AlertmanagerChannel, "dingtalk:ops", "slack:ops"}}
	}
	e, rec := newEngine(t, cfg, route)
	for i := 0; i < 500; i++ {
		e.Observe(tier(fmt.Sprintf("t%03d", i), 90, 100, t0), t0)
	}
	e.Observe(tier("loner", 90, 100, t0), t0)
	tickThrough(e, t0, t0.Add(5*time.Minute))
	per := map[string][]alert.Message{}
	for _, d := range rec.take(false) {
		per[d.channel] = append(per[d.channel], d.msg)
	}
	if n := len(per[AlertmanagerChannel]); n != 1 || len(per[AlertmanagerChannel][0].Alerts) != 500 {
		t.Errorf("Alertmanager got %d messages, want one batch of the 500 alerts (it groups by itself)", n)
	}
	for _, ch := range []string{"dingtalk:ops", "slack:ops"} {
		if len(per[ch]) != 1 || len(per[ch][0].Alerts) != 500 || !per[ch][0].Incident() {
			t.Errorf("%s: want one incident of 500 alerts, got %d messages", ch, len(per[ch]))
		}
	}
	if len(per["slack:loner"]) != 1 || per["slack:loner"][0].Incident() {
		t.Errorf("a channel with one alert gets it alone, got %+v", per["slack:loner"])
	}

	// The incident resolves as one message too.
	at := t0.Add(10 * time.Minute)
	seqBase := seq
	for i := 0; i < 500; i++ {
		e.Observe(&schemas.Signal{ID: fmt.Sprint("r", seqBase, i), Kind: schemas.SignalPeriodReset, Time: at, Tenant: fmt.Sprintf("t%03d", i), Model: "*",
			Quota: schemas.QuotaMonthlyTokens, Period: schemas.PeriodMonth}, at)
	}
	tickThrough(e, at, at.Add(10*time.Minute))
	per = map[string][]alert.Message{}
	for _, d := range rec.take(false) {
		per[d.channel] = append(per[d.channel], d.msg)
	}
	if len(per["dingtalk:ops"]) != 1 || per["dingtalk:ops"][0].Status() != alert.StatusResolved || len(per["dingtalk:ops"][0].Alerts) != 500 {
		t.Errorf("want one resolved incident, got %d messages", len(per["dingtalk:ops"]))
	}
}

func TestAlertmanagerGetsFiringAlertsResentPeriodically(t *testing.T) {
	cfg := testConfig()
	cfg.ResendInterval = time.Minute
	e, rec := newEngine(t, cfg, nil)
	e.Observe(tier("resend", 0, 90, t0), t0)
	tickThrough(e, t0, t0.Add(5*time.Minute+time.Second))
	resends := 0
	for _, d := range rec.take(true) {
		if d.msg.Resend {
			resends++
			if d.channel != AlertmanagerChannel || len(d.msg.Alerts) != 1 || d.msg.Alerts[0].Status != alert.StatusFiring {
				t.Fatalf("bad resend %+v", d)
			}
		}
	}
	if resends < 3 || resends > 5 {
		t.Fatalf("want about one resend a minute over 4 minutes of firing, got %d", resends)
	}
}

func TestExhaustionPredictionSeverityFollowsTheHorizon(t *testing.T) {
	e, rec := newEngine(t, testConfig(), nil)
	predict := func(tenant string, lead time.Duration) {
		seq++
		p := t0.Add(lead)
		e.Observe(&schemas.Signal{ID: fmt.Sprint("p", seq), Kind: schemas.SignalExhaustionPredicted, Time: t0, Tenant: tenant, Model: "gpt-4o",
			Quota: schemas.QuotaDailyTokens, Period: schemas.PeriodDay, Used: 800, Limit: 1000, Rate: 10, PredictedExhaustion: &p}, t0)
	}
	predict("soon", 5*time.Minute)
	predict("later", 20*time.Minute)
	predict("far", 3*time.Hour)
	e.Tick(t0.Add(time.Minute))
	sev := map[string]alert.Severity{}
	for _, d := range rec.take(false) {
		if d.channel == AlertmanagerChannel {
			for _, a := range d.msg.Alerts {
				sev[a.Key.Tenant] = a.Severity
				if a.PredictedExhaustion == nil || a.Key.Rule != alert.RuleExhaustionPredicted {
					t.Errorf("alert lacks its prediction: %+v", a)
				}
			}
		}
	}
	if len(sev) != 2 || sev["soon"] != alert.SeverityCritical || sev["later"] != alert.SeverityWarning {
		t.Fatalf("severities %v", sev)
	}
}

func TestAnomaliesAutoResolveAndOldOnesAreIgnored(t *testing.T) {
	cfg := testConfig()
	cfg.AutoResolveAfter = 10 * time.Minute
	cfg.ResolveAfter = time.Minute
	e, rec := newEngine(t, cfg, nil)
	e.Observe(&schemas.Signal{ID: "old", Kind: schemas.SignalAnomaly, Time: t0.Add(-time.Hour), Tenant: "an", Model: "*",
		Attributes: map[string]string{"type": "rate_spike"}}, t0)
	e.Observe(&schemas.Signal{ID: "brk", Kind: schemas.SignalAnomaly, Time: t0, Tenant: "an", Model: "gpt-4o",
		Attributes: map[string]string{"breaker": "error_ratio"}}, t0)
	tickThrough(e, t0, t0.Add(2*time.Minute))
	got := rec.take(false)
	if len(got) != 2 || got[0].msg.Alerts[0].Key.Rule != alert.RuleBreakerOpen || got[0].msg.Alerts[0].Severity != alert.SeverityCritical {
		t.Fatalf("want only the breaker alert (the hour-old anomaly is stale), got %+v", got)
	}
	tickThrough(e, t0.Add(2*time.Minute), t0.Add(12*time.Minute))
	got = rec.take(false)
	if len(got) != 2 || got[0].msg.Alerts[0].Status != alert.StatusResolved {
		t.Fatalf("want the breaker alert auto-resolved, got %+v", got)
	}
}

func TestMaxAlertsBoundsTrackedAlerts(t *testing.T) {
	cfg := testConfig()
	cfg.MaxAlerts = 3
	e, _ := newEngine(t, cfg, nil)
	for i := 0; i < 5; i++ {
		e.Observe(tier(fmt.Sprint("m", i), 0, 90, t0), t0)
	}
	if s := e.Stats(); s.Pending != 3 || s.DroppedNewAlerts != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestConfigValidateNamesFieldAndLimit(t *testing.T) {
	c := DefaultConfig()
	c.GroupThreshold = 0
	c.ExhaustionCritical = 2 * c.ExhaustionWarning
	c.ResendInterval = 0
	err := c.Validate()
	for _, want := range []string{"group_threshold: 0 must be at least 1", "exhaustion_critical", "at most exhaustion_warning", "resend_interval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestUnpricedModelSignalNotifies: the aggregator's unpriced-model signal
// (an anomaly with detector and type unpriced_model, tally.unpricedEvent)
// becomes a warning alert of its own variant, so operators learn a model
// is being counted without a price.
func TestUnpricedModelSignalNotifies(t *testing.T) {
	cfg := testConfig()
	e, rec := newEngine(t, cfg, nil)
	e.Observe(&schemas.Signal{ID: "unpriced-mystery", Kind: schemas.SignalAnomaly, Time: t0, Tenant: "acme", Model: "mystery",
		Reason:     "model mystery has no price",
		Attributes: map[string]string{"detector": "unpriced_model", "type": "unpriced_model", "state": "firing"}}, t0)
	tickThrough(e, t0, t0.Add(2*time.Minute))
	got := rec.take(false)
	if len(got) == 0 {
		t.Fatal("no notification for the unpriced model")
	}
	a := got[0].msg.Alerts[0]
	if a.Key.Rule != alert.RuleAnomaly || a.Key.Variant != "unpriced_model" || a.Key.Model != "mystery" || a.Severity != alert.SeverityWarning {
		t.Errorf("alert %+v, want anomaly/unpriced_model warning for model mystery", a)
	}
}
