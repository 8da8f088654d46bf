package alertmanager

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
)

// gettable is the part of Alertmanager's gettableAlert the tests read.
type gettable struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
	Status      struct {
		State string `json:"state"`
	} `json:"status"`
}

// active lists the tenant's alerts Alertmanager holds as active.
func active(t *testing.T, base, tenant string) []gettable {
	t.Helper()
	resp, err := http.Get(base + "/api/v2/alerts?filter=" + url.QueryEscape(`tenant="`+tenant+`"`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []gettable
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAlertsAppearWithLabelsAndAnnotationsThenResolve(t *testing.T) {
	base := itest.Alertmanager(t)
	tenant := itest.Unique(t, "am_")
	render, err := message.New("en", "", message.Links{
		Dashboard: "https://grafana.example/d/sluice?var-tenant={tenant}", Runbook: "https://runbooks.example/{rule}"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(base, 5*time.Minute, render, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now().UTC().Truncate(time.Second)
	pred := start.Add(20 * time.Minute)
	a := alert.Alert{
		Key:    alert.Key{Tenant: tenant, Model: "gpt-4o", Period: "month", Quota: "monthly_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityWarning, Tier: 90, StartsAt: start,
		Used: 9_000_000, Limit: 10_000_000, Rate: 50_000, Unit: "tokens", PredictedExhaustion: &pred,
	}
	if err := s.Send(ctx, alert.Message{Alerts: []alert.Alert{a}}); err != nil {
		t.Fatal(err)
	}
	var got []gettable
	itest.Eventually(t, 30*time.Second, "the alert in Alertmanager", func() bool { got = active(t, base, tenant); return len(got) == 1 })
	g := got[0]
	for k, v := range map[string]string{"alertname": "SluiceQuotaTier", "tenant": tenant, "model": "gpt-4o", "period": "month",
		"tier": "90", "severity": "warning", "quota": "monthly_tokens"} {
		if g.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, g.Labels[k], v)
		}
	}
	if g.Status.State != "active" {
		t.Errorf("state %q", g.Status.State)
	}
	if !strings.Contains(g.Annotations["summary"], "monthly_tokens quota at 90%") {
		t.Errorf("summary %q", g.Annotations["summary"])
	}
	for _, w := range []string{"9,000,000 of 10,000,000 tokens", "rate 50,000 tokens/min", "runs out at " + pred.Format("2006-01-02 15:04")} {
		if !strings.Contains(g.Annotations["description"], w) {
			t.Errorf("description %q lacks %q", g.Annotations["description"], w)
		}
	}
	if g.Annotations["dashboard"] != "https://grafana.example/d/sluice?var-tenant="+tenant || g.Annotations["runbook_url"] != "https://runbooks.example/quota_tier" ||
		g.Annotations["predicted_exhaustion"] != pred.Format(time.RFC3339) || g.Annotations["limit"] != "10000000" || g.Annotations["used"] != "9000000" {
		t.Errorf("annotations %v", g.Annotations)
	}
	if d := time.Until(g.EndsAt); d < 3*time.Minute || d > 6*time.Minute {
		t.Errorf("a firing alert's endsAt must lie about the hold ahead; it is %v away", d)
	}

	// Escalation to 100%: the 90% label set ends, the 100% one starts.
	esc := a
	esc.Tier, esc.Severity = 100, alert.SeverityCritical
	old := a
	old.Status, old.EndsAt = alert.StatusResolved, time.Now()
	if err := s.Send(ctx, alert.Message{Alerts: []alert.Alert{esc}, Superseded: []alert.Alert{old}}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 30*time.Second, "only the 100% alert", func() bool {
		got = active(t, base, tenant)
		return len(got) == 1 && got[0].Labels["tier"] == "100" && got[0].Labels["severity"] == "critical"
	})

	// Resolve: endsAt = now, and Alertmanager stops listing it as active.
	res := esc
	res.Status, res.EndsAt = alert.StatusResolved, time.Now()
	if err := s.Send(ctx, alert.Message{Alerts: []alert.Alert{res}}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 30*time.Second, "the alert resolved", func() bool { return len(active(t, base, tenant)) == 0 })
}

// TestLargeResendsAreBatched: a re-send of more than MaxBatch alerts goes
// out as several POSTs of at most MaxBatch alerts each, and Alertmanager
// receives every alert. The Sender talks to Alertmanager through a
// recording proxy, so a Sender that posts everything at once fails here.
func TestLargeResendsAreBatched(t *testing.T) {
	base := itest.Alertmanager(t)
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		posts []int // alerts per POST to /api/v2/alerts
	)
	upstream := httputil.NewSingleHostReverseProxy(target)
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/api/v2/alerts" {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var alerts []json.RawMessage
			if err := json.Unmarshal(body, &alerts); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			posts = append(posts, len(alerts))
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		upstream.ServeHTTP(w, r)
	}))
	defer rec.Close()
	takePosts := func() []int {
		mu.Lock()
		defer mu.Unlock()
		p := posts
		posts = nil
		return p
	}

	tenant := itest.Unique(t, "amb_")
	render, _ := message.New("en", "", message.Links{}, 10)
	s, _ := New(rec.URL, 5*time.Minute, render, nil)
	const n = MaxBatch + 20
	var m alert.Message
	for i := 0; i < n; i++ {
		m.Alerts = append(m.Alerts, alert.Alert{Key: alert.Key{Tenant: tenant, Model: "m" + strconv.Itoa(i), Rule: alert.RuleAnomaly, Variant: "rate_spike"},
			Status: alert.StatusFiring, Severity: alert.SeverityWarning, StartsAt: time.Now()})
	}
	m.Resend = true
	checkBatches := func(what string) {
		t.Helper()
		got := takePosts() // Send has returned: every POST it made is recorded
		sum := 0
		for _, k := range got {
			sum += k
			if k > MaxBatch {
				t.Errorf("%s: a POST carried %d alerts, above MaxBatch = %d (all POSTs: %v)", what, k, MaxBatch, got)
			}
		}
		if len(got) != 2 || sum != n {
			t.Errorf("%s: POSTs carried %v alerts, want 2 POSTs with %d in all", what, got, n)
		}
	}
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	checkBatches("firing")
	itest.Eventually(t, 30*time.Second, "every alert", func() bool { return len(active(t, base, tenant)) == n })
	for i := range m.Alerts {
		m.Alerts[i].Status, m.Alerts[i].EndsAt = alert.StatusResolved, time.Now()
	}
	if err := s.Send(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	checkBatches("resolved")
	itest.Eventually(t, 30*time.Second, "all resolved", func() bool { return len(active(t, base, tenant)) == 0 })
}

func TestRejectsANonHTTPURL(t *testing.T) {
	if _, err := New("127.0.0.1:9093", time.Minute, nil, nil); err == nil || !strings.Contains(err.Error(), "alertmanager.url") {
		t.Fatalf("got %v", err)
	}
}
