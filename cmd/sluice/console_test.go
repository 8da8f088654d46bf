package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/demo/mockllm"
	"github.com/sluicehq/sluice/internal/frontend"
	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/lifecycle"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// chromiumPath finds the Debian chromium the services script installs
// (scripts/services.sh install_test_tools), or SLUICE_CHROMIUM. Without
// one the test is skipped on a developer's machine and fails under
// CI=true, like a missing service.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium is not installed; `scripts/services.sh up` installs it (Debian package chromium), or set SLUICE_CHROMIUM"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// testOutputDir is where the browser tests leave their screenshots:
// SLUICE_TEST_OUTPUT, or .services/test-output/console (git ignores
// .services).
func testOutputDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("SLUICE_TEST_OUTPUT")
	if dir == "" {
		dir = filepath.Join("..", "..", ".services", "test-output")
	}
	dir, _ = filepath.Abs(filepath.Join(dir, "console"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// consoleStack is the demo's arrangement in this process, isolated by
// unique topics, groups, database and prefix: ingest, aggregator,
// enforcer (with its admin API), `sluice gateway` and the console.
type consoleStack struct {
	console, gateway, ingest string
	adminToken               string
	// otherToken is a second operator's, for changes made behind the
	// browser's back.
	otherToken string
	// viewerToken and tenantAdminToken (of vip) have those roles;
	// newcoAdminToken is a tenant admin's of newco, which
	// TestConsoleTenantsInABrowser creates.
	viewerToken, tenantAdminToken, newcoAdminToken string
	ingestKey, runawayKey                          string
	prefix                                         string
	cfg                                            sluiceconfig.Config
}

func startConsoleStack(t *testing.T) *consoleStack {
	t.Helper()
	kc, rc, ch := itest.Kafka(t), itest.Redis(t), itest.ClickHouse(t)
	dir := t.TempDir()
	up := httptest.NewServer(mockllm.New(mockllm.Options{}))
	t.Cleanup(up.Close)

	cfg := sluiceconfig.Defaults()
	cfg.Kafka, cfg.Redis, cfg.ClickHouse = kc, rc, ch
	cfg.Log.Format = "text"
	cfg.Ops.Listen = freeAddr(t)
	cfg.SignalAuth = itest.SignalAuth(t)
	s := &consoleStack{prefix: itest.Unique(t, "console") + ":", adminToken: "sk-admin-" + itest.Unique(t, ""), otherToken: "sk-admin-other-" + itest.Unique(t, ""),
		viewerToken: "sk-viewer-" + itest.Unique(t, ""), tenantAdminToken: "sk-vip-admin-" + itest.Unique(t, ""),
		newcoAdminToken: "sk-newco-admin-" + itest.Unique(t, ""),
		ingestKey:       "sk-ingest-" + itest.Unique(t, ""), runawayKey: "sk-ingest-runaway-" + itest.Unique(t, "")}
	cfg.Topics = itest.Topics(t)
	sv := &cfg.Services
	cfg.Redis.KeyPrefix = s.prefix
	sv.Ingest.Listen = freeAddr(t)
	// One key for the gateway (every tenant), one that reports runaway only:
	// runaway's own key for ingest's usage API.
	sv.Ingest.GatewayKeys.File = writeFile(t, dir, "ingest-keys.yaml", fmt.Sprintf("keys:\n  - {id: gw, sha256: %s, tenants: [\"*\"]}\n  - {id: runaway-direct, sha256: %s, tenants: [runaway]}\n",
		sha(s.ingestKey), sha(s.runawayKey)))
	sv.Aggregator.Group = itest.Unique(t, "console_agg")
	sv.Aggregator.FlushInterval = 100 * time.Millisecond
	sv.Enforcer.Group = itest.Unique(t, "console_enf")
	sv.Enforcer.Admin.Listen = freeAddr(t)
	sv.Enforcer.Admin.Tokens = []adminapi.Token{{Name: "browser-test", SHA256: adminapi.HashToken(s.adminToken)},
		{Name: "other-operator", SHA256: adminapi.HashToken(s.otherToken)},
		{Name: "auditor", SHA256: adminapi.HashToken(s.viewerToken), Role: adminapi.RoleViewer},
		{Name: "vip-admin", SHA256: adminapi.HashToken(s.tenantAdminToken), Role: adminapi.RoleTenantAdmin, Tenant: "vip"},
		{Name: "newco-admin", SHA256: adminapi.HashToken(s.newcoAdminToken), Role: adminapi.RoleTenantAdmin, Tenant: "newco"}}
	g := &sv.Gateway
	g.Listen, g.Name = freeAddr(t), s.prefix+"gateway"
	// The gateway accepts the keys the console issues.
	g.FollowAdmin = true
	var keys strings.Builder
	keys.WriteString("keys:\n")
	for _, tn := range demoTenants {
		keys.WriteString(frontend.KeyLine("key-"+tn.Name, tn.APIKey, tn.Name, nil))
	}
	cfg.TenantKeys.File = writeFile(t, dir, "gateway-keys.yaml", keys.String())
	cfg.Policy.File = demoPolicyAt(t, dir, up.URL)
	g.Usage.Sink = frontend.SinkNone
	sv.Console.Listen = freeAddr(t)
	sv.Console.AdminURL = "http://" + sv.Enforcer.Admin.Listen
	// The console lays the records over its policy file, as the gateway.
	sv.Console.FollowAdmin = true
	sv.Console.SampleEvery = time.Second
	s.console, s.gateway, s.ingest, s.cfg = "http://"+sv.Console.Listen, "http://"+g.Listen, "http://"+sv.Ingest.Listen, cfg

	log := itest.Logger(t)
	ctx, stop := context.WithCancel(context.Background())
	p, err := preparePipeline(ctx, &s.cfg, []string{"ingest", "aggregator", "enforcer", "gateway", "console"}, &hostOptions{}, log)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	var runErr error
	ran := make(chan struct{})
	go func() { runErr = lifecycle.Run(ctx, log, 20*time.Second, p.tasks...); close(ran) }()
	t.Cleanup(func() {
		stop()
		<-ran
		if runErr != nil {
			t.Errorf("pipeline: %v", runErr)
		}
		p.close()
	})
	itest.EventuallyNoError(t, 90*time.Second, "the console, gateway, ingest and admin API accept connections", func() error {
		select {
		case <-ran:
			t.Fatalf("the pipeline stopped before it served: %v", runErr)
		default:
		}
		for _, a := range []string{sv.Console.Listen, g.Listen, sv.Ingest.Listen, sv.Enforcer.Admin.Listen} {
			c, err := net.DialTimeout("tcp", a, time.Second)
			if err != nil {
				return err
			}
			c.Close()
		}
		return nil
	})
	return s
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// sendDemoUsage reports the demo tenants' calls of the last minutes to
// ingest: runaway at 94% of its hourly 500,000 tokens, acme light on two
// models, trial with calls its gateway refused.
func (s *consoleStack) sendDemoUsage(t *testing.T, now time.Time) {
	t.Helper()
	hour := now.Truncate(time.Hour)
	at := func(ago time.Duration) time.Time {
		if tm := now.Add(-ago); tm.After(hour) {
			return tm
		}
		return hour.Add(time.Second)
	}
	var evs []schemas.UsageEvent
	id := 0
	add := func(tenant, model string, ago time.Duration, prompt, completion int64, outcome schemas.Outcome) {
		id++
		evs = append(evs, schemas.UsageEvent{ID: fmt.Sprintf("%s-%d", s.prefix, id), Time: at(ago), Tenant: tenant, Model: model,
			PromptTokens: prompt, CompletionTokens: completion, Outcome: outcome})
	}
	for i := range 10 {
		add("runaway", "gpt-4o-mini", time.Duration(9-i)*40*time.Second, 40000, 7000, schemas.OutcomeOK)
	}
	for i := range 6 {
		add("acme", "gpt-4o", time.Duration(5-i)*50*time.Second, 1200, 300, schemas.OutcomeOK)
		add("acme", "gpt-4o-mini", time.Duration(5-i)*50*time.Second, 800, 200, schemas.OutcomeOK)
	}
	add("trial", "gpt-4o-mini", 90*time.Second, 300, 60, schemas.OutcomeOK)
	add("trial", "gpt-4o-mini", 30*time.Second, 0, 0, schemas.OutcomeRejected)
	add("trial", "gpt-4o-mini", 20*time.Second, 0, 0, schemas.OutcomeRejected)
	s.sendUsage(t, evs)
}

// sendUsage posts events to ingest with the gateway's key.
func (s *consoleStack) sendUsage(t *testing.T, evs []schemas.UsageEvent) {
	t.Helper()
	body, _ := json.Marshal(evs)
	req, _ := http.NewRequest(http.MethodPost, s.ingest+"/v1/events", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.ingestKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("ingest answered %s: %s", resp.Status, raw)
	}
}

// usageAnswer is the part of GET /v1/usage's answer the test reads, by
// the field names docs/usage-api.md documents.
type usageAnswer struct {
	Tenant string `json:"tenant"`
	Quotas []struct {
		Model     string            `json:"model"`
		Quota     schemas.QuotaKind `json:"quota"`
		Used      float64           `json:"used"`
		Limit     float64           `json:"limit"`
		Remaining float64           `json:"remaining"`
		ResetsAt  time.Time         `json:"resets_at"`
	} `json:"quotas"`
	RefusedLastHour int64 `json:"refused_last_hour"`
}

// usageOf calls GET /v1/usage at base with key (and query).
func usageOf(t *testing.T, base, key, query string) (usageAnswer, int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/usage"+query, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st usageAnswer
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &st); err != nil {
			t.Fatalf("usage answer %s: %v", raw, err)
		}
	}
	return st, resp.StatusCode
}

// quotaLine is what the console's tenant page and the usage API both say
// of one quota.
type quotaLine struct {
	Model, Quota           string
	Used, Limit, Remaining float64
	ResetsUnix             int64
}

func linesOf(st usageAnswer) []quotaLine {
	var out []quotaLine
	for _, q := range st.Quotas {
		out = append(out, quotaLine{Model: q.Model, Quota: string(q.Quota), Used: q.Used, Limit: q.Limit, Remaining: q.Remaining, ResetsUnix: q.ResetsAt.Unix()})
	}
	return out
}

// TestConsoleInABrowser loads every console page in a headless Chromium
// against the real services with the demo's tenants and checks what an
// operator would see: runaway, at 94% of its hourly quota, highlighted on
// the overview and alone when filtering by tier 90; its chart drawn with
// points, a limit line and the forecast; the tenant page's figures equal
// to what GET /v1/usage answers runaway on the gateway and on ingest; a
// manual trip from the tenant page's form reaching the flag in Redis; the
// pipeline page filled from the services' metrics. Screenshots of each
// page, at desktop and phone widths, are left in the test output folder.
func TestConsoleInABrowser(t *testing.T) {
	s, b := consoleInABrowser(t)
	s.sendDemoUsage(t, time.Now().UTC())

	// The pipeline counted the usage: the tenant's own ingest key reads it.
	var runaway usageAnswer
	itest.Eventually(t, 60*time.Second, "runaway's hourly use reaches 94% in the usage API", func() bool {
		st, code := usageOf(t, s.ingest, s.runawayKey, "")
		for _, q := range st.Quotas {
			if code == http.StatusOK && q.Quota == schemas.QuotaHourlyTokens && q.Used >= 470000 {
				runaway = st
				return true
			}
		}
		return false
	})
	// acme's and trial's rows are in too, and trial's refusals.
	itest.Eventually(t, 30*time.Second, "trial's refused calls are counted", func() bool {
		st, _ := usageOf(t, s.gateway, "sk-demo-trial", "")
		return st.RefusedLastHour == 2
	})

	// Overview: runaway's hourly quota is highlighted, acme's are not.
	b.do("overview", chromedp.Navigate(s.console+"/"), chromedp.WaitVisible(chromedp.ID("quotas")))
	hot := eval[[]string](b, `[...document.querySelectorAll("#quotas tbody tr.hot")].map(r => r.dataset.tenant + "/" + r.dataset.quota)`)
	acmeRows := eval[int](b, `document.querySelectorAll("#quotas tbody tr[data-tenant=acme]").length`)
	b.shot("overview.png")
	if len(hot) != 1 || hot[0] != "runaway/hourly_tokens" {
		t.Errorf("highlighted rows: %v, want runaway/hourly_tokens alone", hot)
	}
	if acmeRows == 0 {
		t.Error("acme has no row on the overview")
	}
	// Filtering by tier 90 leaves runaway's quota alone.
	b.do("overview filtered by tier", chromedp.SetValue(chromedp.ID("tier"), "90"), chromedp.Click(chromedp.ID("filter")))
	itest.Eventually(t, 10*time.Second, "the filtered overview loads", func() bool {
		return strings.Contains(eval[string](b, `location.search`), "tier=90") && eval[string](b, `document.readyState`) == "complete"
	})
	b.do("filtered overview", chromedp.WaitVisible(chromedp.ID("quotas")))
	tenants := eval[[]string](b, `[...document.querySelectorAll("#quotas tbody tr[data-tenant]")].map(r => r.dataset.tenant)`)
	b.shot("overview-tier90.png")
	if len(tenants) != 1 || tenants[0] != "runaway" {
		t.Errorf("tier ≥ 90 shows %v, want [runaway]", tenants)
	}

	// The tenant page: a chart with points, the limit and the forecast; the
	// same figures as the usage API on the gateway and on ingest.
	b.do("runaway's page", chromedp.Navigate(s.console+"/tenants/runaway"), chromedp.WaitVisible(chromedp.ID("tenant-quotas")))
	usedPoints := eval[int](b, `Math.max(0, ...[...document.querySelectorAll("svg.chart polyline[data-series=used]")].map(p => p.points.length))`)
	limitLines := eval[int](b, `document.querySelectorAll("svg.chart line.limit").length`)
	forecastPoints := eval[int](b, `Math.max(0, ...[...document.querySelectorAll("svg.chart polyline[data-series=forecast]")].map(p => p.points.length))`)
	shown := eval[[]quotaLine](b, `[...document.querySelectorAll("#tenant-quotas tbody tr[data-quota]")].map(r => ({Model: r.dataset.model, Quota: r.dataset.quota,
		Used: +r.dataset.used, Limit: +r.dataset.limit, Remaining: +r.dataset.remaining, ResetsUnix: +r.dataset.resets}))`)
	b.shot("tenant-runaway.png")
	if usedPoints < 3 || limitLines == 0 || forecastPoints < 2 {
		t.Errorf("runaway's chart: %d points used, %d limit lines, %d forecast points; want a line of points, a limit and a forecast", usedPoints, limitLines, forecastPoints)
	}
	gw, code := usageOf(t, s.gateway, "sk-demo-runaway", "")
	if code != http.StatusOK {
		t.Fatalf("gateway usage API: %d", code)
	}
	in, code := usageOf(t, s.ingest, s.runawayKey, "")
	if code != http.StatusOK {
		t.Fatalf("ingest usage API: %d", code)
	}
	for name, st := range map[string]usageAnswer{"gateway": gw, "ingest": in, "first read": runaway} {
		if got, want := fmt.Sprint(linesOf(st)), fmt.Sprint(shown); got != want {
			t.Errorf("the %s usage API says\n%s\nthe console shows\n%s", name, got, want)
		}
	}
	// A key of one tenant cannot read another.
	if _, code := usageOf(t, s.ingest, s.runawayKey, "?tenant=acme"); code != http.StatusForbidden {
		t.Errorf("runaway's ingest key reading acme: %d, want 403", code)
	}

	// Acting: log in with the admin token, trip acme from its page; the
	// enforcer writes the manual breaker's flag to Redis.
	b.do("log in", chromedp.Navigate(s.console+"/login?next=/tenants/acme"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.adminToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("form-trip")))
	b.do("trip acme from the console", chromedp.SetValue(chromedp.CSS(`#form-trip select[name=model]`), "*"),
		chromedp.SendKeys(chromedp.CSS(`#form-trip input[name=reason]`), "browser test: stop acme"),
		chromedp.Click(chromedp.CSS(`#form-trip button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("done")))
	if done := b.text(chromedp.ID("done")); !strings.Contains(done, string(adminapi.ActionTrip)) {
		t.Errorf("after the trip the page says %q", done)
	}
	rdb := redisClient(t, s.cfg)
	itest.EventuallyNoError(t, 30*time.Second, "acme's manual flag in Redis", func() error {
		v, err := rdb.HGet(context.Background(), flags.Layout{Prefix: s.cfg.Redis.Prefix(redisconn.FlagKeys)}.TenantKey("acme"), flags.AllModels).Result()
		if err != nil {
			return err
		}
		f, err := flags.Decode(v)
		if err != nil {
			return err
		}
		if f.Kind != flags.KindManual || f.State != flags.StateOpen {
			return fmt.Errorf("flag %+v", f)
		}
		return nil
	})
	b.do("acme's page shows the flag", chromedp.Navigate(s.console+"/tenants/acme"), chromedp.WaitVisible(chromedp.ID("flag-table")))
	flagKinds := eval[[]string](b, `[...document.querySelectorAll("#flag-table tbody tr[data-kind]")].map(r => r.dataset.kind + " " + r.dataset.state)`)
	b.shot("tenant-acme-tripped.png")
	if len(flagKinds) != 1 || flagKinds[0] != "manual open" {
		t.Errorf("acme's flags on its page: %v, want [manual open]", flagKinds)
	}

	// Phone width: nothing wider than the screen.
	b.do("overview on a phone", chromedp.EmulateViewport(390, 844), chromedp.Navigate(s.console+"/"), chromedp.WaitVisible(chromedp.ID("quotas")))
	overflow := eval[int](b, `document.documentElement.scrollWidth - window.innerWidth`)
	b.shot("overview-phone.png")
	b.do("runaway on a phone", chromedp.Navigate(s.console+"/tenants/runaway"), chromedp.WaitVisible(chromedp.ID("tenant-quotas")))
	phoneOverflow := eval[int](b, `document.documentElement.scrollWidth - window.innerWidth`)
	b.shot("tenant-runaway-phone.png")
	if overflow > 0 || phoneOverflow > 0 {
		t.Errorf("at 390 px the overview is %d px and runaway's page %d px wider than the screen", overflow, phoneOverflow)
	}

	// runaway goes past its limit: the enforcer opens its quota breaker
	// (and observes the enforcement lag), the overview shows it refused.
	s.sendUsage(t, []schemas.UsageEvent{{ID: s.prefix + "over", Time: time.Now().UTC(), Tenant: "runaway", Model: "gpt-4o-mini",
		PromptTokens: 30000, CompletionTokens: 5000}})
	b.do("desktop again", chromedp.EmulateViewport(1280, 1000))
	itest.Eventually(t, 30*time.Second, "the overview shows runaway refused by its quota breaker", func() bool {
		b.do("overview", chromedp.Navigate(s.console+"/"), chromedp.WaitVisible(chromedp.ID("quotas")))
		return eval[bool](b, `!!document.querySelector('#quotas tr.hot.refusing[data-tenant=runaway][data-quota=hourly_tokens]')`)
	})
	b.shot("overview-runaway-refused.png")

	// Pipeline: the ingest rate, the flush and enforcement lags from the
	// metrics, the counted events from ClickHouse.
	itest.Eventually(t, 30*time.Second, "the pipeline page shows the ingest rate, the lags and the events counted", func() bool {
		b.do("pipeline", chromedp.Navigate(s.console+"/pipeline"), chromedp.WaitVisible(chromedp.ID("counted")))
		return eval[float64](b, `+(document.querySelector('[data-tile="Ingest rate"]')?.dataset.max || 0)`) > 0 &&
			eval[string](b, `document.querySelector('[data-tile="Flush latency"]')?.dataset.value || ""`) != "" &&
			eval[string](b, `document.querySelector('[data-tile="Enforcement lag"]')?.dataset.value || ""`) != "" &&
			eval[int](b, `+(document.querySelector('#counted svg')?.dataset.points || 0)`) > 0
	})
	b.shot("pipeline.png")
}

// consoleInABrowser starts the console's arrangement (startConsoleStack)
// and a headless chromium, both ended with the test, and returns the
// stack and the browser's tab. It skips in -short mode.
func consoleInABrowser(t *testing.T) (*consoleStack, *page) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the services and a browser")
	}
	chromium := chromiumPath(t)
	out := testOutputDir(t)
	s := startConsoleStack(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000))
	t.Cleanup(cancelAlloc)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(cancelBrowser)
	// The first call starts the browser and must have no deadline of its
	// own (chromedp.Run); every step after it gets one.
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("starting %s: %v", chromium, err)
	}
	return s, &page{t: t, ctx: browser, out: out}
}

// page drives one browser tab for a test, each step under its own
// deadline, failing the test on an error.
type page struct {
	t   *testing.T
	ctx context.Context
	out string
}

const stepTimeout = 30 * time.Second

func (p *page) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		// What the page shows says more than the deadline.
		dctx, dcancel := context.WithTimeout(p.ctx, 5*time.Second)
		defer dcancel()
		body, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		p.t.Fatalf("%s: %v; the page says:\n%.3000s", what, err, body)
	}
}

func (p *page) text(sel chromedp.ID) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		p.t.Fatalf("text of %s: %v", sel, err)
	}
	return v
}

// shot saves a screenshot of the whole page under the output folder.
func (p *page) shot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(p.out, name), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// eval runs a JavaScript expression in the page and decodes its value.
func eval[T any](p *page, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

func redisClient(t *testing.T, cfg sluiceconfig.Config) redis.UniversalClient {
	t.Helper()
	rdb := redisconn.NewClient(cfg.Redis)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
