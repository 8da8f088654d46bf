package console

import (
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

func TestHistogramQuantileInterpolatesInsideItsBucket(t *testing.T) {
	ub := func(v float64) *float64 { return &v }
	n := func(v uint64) *uint64 { return &v }
	// 100 observations: 50 up to 10 ms, 40 more up to 20 ms, 10 up to 40 ms.
	h := hist{}.add(&dto.Histogram{SampleCount: n(100), SampleSum: func() *float64 { v := 1.5; return &v }(),
		Bucket: []*dto.Bucket{{UpperBound: ub(0.01), CumulativeCount: n(50)}, {UpperBound: ub(0.02), CumulativeCount: n(90)}, {UpperBound: ub(0.04), CumulativeCount: n(100)}}})
	for _, c := range []struct{ q, want float64 }{{0.5, 0.01}, {0.7, 0.015}, {0.95, 0.03}} {
		if got := h.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("q%.2f = %v, want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN((hist{}).quantile(0.5)) {
		t.Error("no observation must give NaN, not a figure")
	}
	// The difference of two readings is what happened between them; a
	// restart (count going down) gives the later reading whole.
	later := h.add(&dto.Histogram{SampleCount: n(10), SampleSum: func() *float64 { v := 0.3; return &v }(),
		Bucket: []*dto.Bucket{{UpperBound: ub(0.01), CumulativeCount: n(0)}, {UpperBound: ub(0.02), CumulativeCount: n(0)}, {UpperBound: ub(0.04), CumulativeCount: n(10)}}})
	d := later.delta(h)
	if d.count != 10 || d.quantile(0.5) <= 0.02 {
		t.Errorf("delta: %+v, p50 %v", d, d.quantile(0.5))
	}
	if r := h.delta(later); r.count != h.count {
		t.Errorf("after a restart the delta is the new reading: %+v", r)
	}
}

func TestOverviewSortsAndKeepsUnpredictedLast(t *testing.T) {
	at := func(m int) *time.Time { v := time.Unix(int64(m)*60, 0); return &v }
	rows := []overviewRow{
		{Tenant: "a", Quota: quotastatus.Quota{UsedPercent: 10}},
		{Tenant: "b", Quota: quotastatus.Quota{UsedPercent: 95, PredictedExhaustion: at(5)}},
		{Tenant: "c", Quota: quotastatus.Quota{UsedPercent: 50, PredictedExhaustion: at(2)}},
	}
	sortRows(rows, "used", true)
	if rows[0].Tenant != "b" || rows[2].Tenant != "a" {
		t.Errorf("by use, descending: %v %v %v", rows[0].Tenant, rows[1].Tenant, rows[2].Tenant)
	}
	for _, desc := range []bool{false, true} {
		sortRows(rows, "exhaustion", desc)
		if rows[2].Tenant != "a" {
			t.Errorf("exhaustion desc=%v: the quota without prediction must come last, got %v %v %v", desc, rows[0].Tenant, rows[1].Tenant, rows[2].Tenant)
		}
	}
	sortRows(rows, "exhaustion", false)
	if rows[0].Tenant != "c" {
		t.Errorf("soonest exhaustion first: %v", rows[0].Tenant)
	}
}

func TestRedirectTargetsStayOnTheConsole(t *testing.T) {
	for in, want := range map[string]string{"/tenants/acme": "/tenants/acme", "": "/", "https://evil.example/": "/",
		"//evil.example/": "/", `/\evil.example`: "/", "tenants": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPagesRenderWithoutAStore renders every template with figures (no
// service behind): a template error fails here rather than in a browser.
func TestPagesRenderWithoutAStore(t *testing.T) {
	s, err := newServer(DefaultConfig(), deps{log: slog.New(slog.NewTextHandler(io.Discard, nil)), sampler: newSampler(nil, nil, 10)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	pred := now.Add(time.Minute)
	q := quotastatus.Quota{Model: "*", Quota: "hourly_tokens", Period: "hour", Unit: "tokens", Limit: 100, Used: 95, Remaining: 5, UsedPercent: 95,
		Tier: 90, ResetsAt: now.Add(time.Hour), PredictedExhaustion: &pred}
	st := quotastatus.Status{Tenant: "acme", Plan: "pro", Quotas: []quotastatus.Quota{q},
		Flags: []quotastatus.Flag{{Model: "*", State: flags.StateOpen, Kind: flags.KindManual, Reason: "ops"}}}
	for name, data := range map[string]any{
		"overview": overviewPage{Rows: []overviewRow{{Tenant: "acme", Quota: q, HasQuota: true, Flag: "open manual", Refusing: true}}, Sort: "used", Order: "desc", Tiers: []int{0, 90}, Now: now},
		"tenant":   tenantPage{Status: st, Now: now, LoggedIn: true, Models: []string{"*"}, Charts: []chartView{s.quotaChart(q, nil, now.Add(-time.Hour), now)}},
		"pipeline": pipelinePage{Tiles: pipelineTiles(nil)},
		"login":    loginPage{Next: "/", Error: "no"},
		"error":    errorPage{Message: "boom"},
	} {
		rec := httptest.NewRecorder()
		s.render(rec, httptest.NewRequest(http.MethodGet, "/", nil), name, http.StatusOK, data)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "</html>") {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body.String())
		}
		if name == "overview" && !strings.Contains(rec.Body.String(), `class="hot refusing"`) {
			t.Errorf("overview: the 95%% row is not highlighted:\n%s", rec.Body.String())
		}
	}
}

// TestActionsNeedALoginAndASameOriginPost: a POST without a session goes
// to the login page; a cross-site POST is refused before any handler.
func TestActionsNeedALoginAndASameOriginPost(t *testing.T) {
	s, err := newServer(DefaultConfig(), deps{log: slog.New(slog.NewTextHandler(io.Discard, nil)), sampler: newSampler(nil, nil, 10), adminURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	req := httptest.NewRequest(http.MethodPost, "/tenants/acme/act", strings.NewReader("action=breaker.trip&reason=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther || !strings.HasPrefix(rec.Header().Get("Location"), "/login?next=") {
		t.Errorf("without a session: %d %s", rec.Code, rec.Header().Get("Location"))
	}
	req = httptest.NewRequest(http.MethodPost, "/tenants/acme/act", strings.NewReader("action=breaker.trip&reason=x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden {
		t.Errorf("cross-site post: %d, want 403", rec.Code)
	}
	// A login with a token the enforcer cannot check is refused, and
	// opens no session.
	req = httptest.NewRequest(http.MethodPost, "/login", strings.NewReader("token=abc"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code == http.StatusSeeOther || len(rec.Result().Cookies()) != 0 {
		t.Errorf("login against an unreachable enforcer: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}
}
