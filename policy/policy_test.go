package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

func mustLoad(t *testing.T) *Policy {
	t.Helper()
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExampleTenantMergesDefaults(t *testing.T) {
	p := mustLoad(t)
	acme := p.Tenant("acme")
	if acme.Location.String() != "Asia/Shanghai" || acme.FailMode != FailClosed || acme.BurstMultiplier != 1.5 {
		t.Fatalf("acme = %+v", acme)
	}
	if got := acme.Breakers.ErrorRatio; got.Threshold != 0.3 || got.MinRequests != 50 || got.Window != time.Minute {
		t.Fatalf("error_ratio breaker must override two fields and inherit the rest: %+v", got)
	}
	if acme.ModeFor("gpt-4o") != Soft || acme.ModeFor("*") != Hard {
		t.Fatalf("per-model mode: gpt-4o=%s *=%s", acme.ModeFor("gpt-4o"), acme.ModeFor("*"))
	}
	names := map[schemas.QuotaKind]Quota{}
	for _, q := range acme.Quotas("*") {
		names[q.Name] = q
	}
	for _, want := range schemas.QuotaKinds() {
		if _, ok := names[want]; !ok {
			t.Errorf("acme * quotas lack %s: %+v", want, names)
		}
	}
	if q := names[schemas.QuotaRequestsPerMinute]; q.Unit != "requests" || q.Period != schemas.PeriodMinute || q.Limit != 600 {
		t.Errorf("requests_per_minute = %+v", q)
	}
	if q := names[schemas.QuotaBudget]; q.Unit != "currency" || q.Limit != 500 {
		t.Errorf("budget = %+v", q)
	}
}

func TestUnknownTenantGetsDefaults(t *testing.T) {
	p := mustLoad(t)
	u := p.Tenant("someone-new")
	if u.ID != "someone-new" || u.Mode != Hard || len(u.Quotas("*")) != 2 {
		t.Fatalf("unknown tenant = %+v quotas %+v", u, u.Quotas("*"))
	}
	if len(u.Quotas("gpt-4o")) != 0 {
		t.Fatalf("no per-model quota was configured for defaults")
	}
}

func TestPriceEffectiveDates(t *testing.T) {
	p := mustLoad(t)
	before, ok := p.Price("gpt-4o", time.Date(2026, 11, 14, 23, 59, 59, 0, time.UTC))
	after, ok2 := p.Price("gpt-4o", time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC))
	if !ok || !ok2 || before.Prompt != 2.5 || after.Prompt != 2.0 {
		t.Fatalf("price change on 2026-11-15: before %+v after %+v", before, after)
	}
	if _, ok := p.Price("gpt-4o", time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)); ok {
		t.Fatal("no price before the first effective date")
	}
	if c := after.Cost(Tokens{Prompt: 1_000_000, Completion: 1_000_000, Cached: 500_000}); c != 0.5*2.0+0.5*1.0+8 {
		t.Fatalf("cost = %v", c)
	}
}

func TestBrokenPolicyNamesFileLineAndField(t *testing.T) {
	src := `defaults:
  mode: hard
tenants:
  acme:
    timezone: Mars/Olympus
    fail_mode: sideways
    alert_tiers: [90, 70]
    channels: [pager]
    models:
      gpt-4.1:
        monthly_tokens: -5
`
	_, err := Parse([]byte(src), "bad.yaml")
	var pe *Error
	if !errors.As(err, &pe) {
		t.Fatalf("Parse = %v, want *Error", err)
	}
	want := []string{
		"bad.yaml:5: tenants.acme.timezone",
		"bad.yaml:6: tenants.acme.fail_mode",
		"bad.yaml:7: tenants.acme.alert_tiers.1",
		"bad.yaml:8: tenants.acme.channels.0",
		"bad.yaml:11: tenants.acme.models.gpt-4.1.monthly_tokens",
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

func TestUnknownKeyIsRejected(t *testing.T) {
	_, err := Parse([]byte("tenants:\n  acme:\n    monthly_tokens: 5\n"), "typo.yaml")
	if err == nil || !strings.Contains(err.Error(), "typo.yaml") || !strings.Contains(err.Error(), "monthly_tokens") || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("Parse = %v, want an error naming the file, line 3 and the unknown key", err)
	}
}

func TestUndefinedChannelIsRejected(t *testing.T) {
	_, err := Parse([]byte("tenants:\n  acme:\n    channels: [slack:nobody]\n"), "c.yaml")
	if err == nil || !strings.Contains(err.Error(), "slack:nobody is not defined") {
		t.Fatalf("Parse = %v", err)
	}
}

func TestPeriodBoundsAreCalendarAndDSTCorrect(t *testing.T) {
	ny, _ := time.LoadLocation("America/New_York")
	// 2026-03-08 is a 23-hour day in New York.
	s, e := PeriodBounds(schemas.PeriodDay, time.Date(2026, 3, 8, 12, 0, 0, 0, ny), ny)
	if e.Sub(s) != 23*time.Hour {
		t.Fatalf("DST day = %s, want 23h", e.Sub(s))
	}
	s, e = PeriodBounds(schemas.PeriodMonth, time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC), ny)
	if s.Format(time.RFC3339) != "2026-02-01T00:00:00-05:00" || e.Format(time.RFC3339) != "2026-03-01T00:00:00-05:00" {
		t.Fatalf("February in New York = %s .. %s", s, e)
	}
	sh, _ := time.LoadLocation("Asia/Shanghai")
	// 2026-11-30 20:00 UTC is already December 1st in Shanghai.
	s, _ = PeriodBounds(schemas.PeriodMonth, time.Date(2026, 11, 30, 20, 0, 0, 0, time.UTC), sh)
	if s.Month() != time.December {
		t.Fatalf("month start = %s, want December in Shanghai", s)
	}
	kt, _ := time.LoadLocation("Asia/Kathmandu") // +05:45
	s, _ = PeriodBounds(schemas.PeriodHour, time.Date(2026, 1, 1, 10, 20, 0, 0, time.UTC), kt)
	if s.In(kt).Minute() != 0 {
		t.Fatalf("hour start %s is not on the local hour", s.In(kt))
	}
}

func TestWatcherKeepsOldPolicyOnBadReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.yaml")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tenants:\n  acme:\n    models:\n      '*': {monthly_tokens: 100}\n")
	w, err := NewWatcher(path, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	write("tenants:\n  acme:\n    models:\n      '*': {monthly_tokens: 200}\n")
	if !w.Reload() {
		t.Fatal("changed file was not reloaded")
	}
	if got := w.Current().Tenant("acme").Models["*"].MonthlyTokens; got != 200 {
		t.Fatalf("after reload monthly_tokens = %d, want 200", got)
	}
	select {
	case p := <-w.Subscribe():
		if p != w.Current() {
			t.Fatal("subscriber got a different policy")
		}
	default:
		t.Fatal("subscriber was not told about the reload")
	}
	write("tenants:\n  acme:\n    models:\n      '*': {monthly_tokens: -1}\n")
	if w.Reload() {
		t.Fatal("broken file was installed")
	}
	if got := w.Current().Tenant("acme").Models["*"].MonthlyTokens; got != 200 {
		t.Fatalf("broken reload changed the policy: monthly_tokens = %d", got)
	}
	if !strings.Contains(w.LastError(), "p.yaml:4") || w.Failures.Load() != 1 {
		t.Fatalf("LastError = %q failures = %d", w.LastError(), w.Failures.Load())
	}
}

func TestFollowAppliesEachReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(limit int) {
		body := fmt.Sprintf("tenants:\n  acme:\n    models:\n      '*': {monthly_tokens: %d}\n", limit)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(100)
	w, err := NewWatcher(path, 10*time.Millisecond, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	applied := make(chan int64, 4)
	done := make(chan error, 1)
	go func() {
		done <- w.Follow(ctx, func(p *Policy) { applied <- p.Tenant("acme").Models["*"].MonthlyTokens })
	}()
	write(300)
	select {
	case got := <-applied:
		if got != 300 {
			t.Fatalf("Follow applied monthly_tokens %d, want 300", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Follow never applied the changed file")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Follow returned %v after cancel", err)
	}
}

func TestChannelDefinitionsAreKindAgnosticAndCheckedByTheCaller(t *testing.T) {
	src := `defaults:
  channels: [alertmanager, feishu:ops, dingtalk:ops]
channels:
  feishu:
    ops: {webhook: "https://open.feishu.example/hook/x", secret: 42}
  dingtalk:
    ops:
      webhook: "not a url"
`
	// Without a check the definitions are stored as written: a service
	// that sends no alerts need not know the kinds.
	p, err := Parse([]byte(src), "ch.yaml")
	if err != nil {
		t.Fatal(err)
	}
	chans := p.Channels()
	if chans["feishu"]["ops"]["secret"] != "42" || chans["dingtalk"]["ops"]["webhook"] != "not a url" {
		t.Fatalf("channels %v", chans)
	}
	chans["feishu"]["ops"]["webhook"] = "changed"
	if p.Channels()["feishu"]["ops"]["webhook"] == "changed" {
		t.Fatal("Channels handed out the policy's own map")
	}

	// With one, its complaints name the file, the setting's line and field.
	check := func(kind string, s ChannelSettings) error {
		if kind == "feishu" {
			return errors.New("unknown channel kind")
		}
		return errors.Join(&SettingError{Key: "webhook", Err: errors.New("is not an http(s) URL")})
	}
	_, err = Parse([]byte(src), "ch.yaml", WithChannelCheck(check))
	for _, want := range []string{
		"ch.yaml:5: channels.feishu.ops: unknown channel kind",
		"ch.yaml:8: channels.dingtalk.ops.webhook: is not an http(s) URL",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

func TestChannelKindNamesAreChecked(t *testing.T) {
	_, err := Parse([]byte("channels:\n  Bad-Kind: {x: {webhook: y}}\n  alertmanager: {x: {}}\n"), "k.yaml")
	for _, want := range []string{"k.yaml:2: channels.Bad-Kind", "k.yaml:3: channels.alertmanager"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// A tenant's models."*" merges with the defaults' "*" field by field: a
// tenant that sets only an hourly limit keeps the default monthly quota,
// and an explicit 0 removes an inherited one.
func TestModelQuotasMergeFieldByField(t *testing.T) {
	doc := `
defaults:
  models:
    "*": {monthly_tokens: 1000000, tokens_per_minute: 20000}
    gpt-4o: {daily_tokens: 500, mode: soft}
tenants:
  hourly-only:
    models:
      "*": {hourly_tokens: 5000}
  no-monthly:
    models:
      "*": {monthly_tokens: 0}
  model-entry:
    models:
      gpt-4o: {hourly_tokens: 50}
      claude: {hourly_tokens: 70}
`
	p, err := Parse([]byte(doc), "merge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	limits := func(tenant, model string) map[schemas.QuotaKind]float64 {
		out := map[schemas.QuotaKind]float64{}
		for _, q := range p.Tenant(tenant).Quotas(model) {
			out[q.Name] = q.Limit
		}
		return out
	}
	check := func(tenant, model string, want map[schemas.QuotaKind]float64) {
		t.Helper()
		if got := limits(tenant, model); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s %s quotas = %v, want %v", tenant, model, got, want)
		}
	}
	check("hourly-only", "*", map[schemas.QuotaKind]float64{
		schemas.QuotaMonthlyTokens: 1000000, schemas.QuotaHourlyTokens: 5000, schemas.QuotaTokensPerMinute: 20000})
	check("no-monthly", "*", map[schemas.QuotaKind]float64{schemas.QuotaTokensPerMinute: 20000})
	check("model-entry", "gpt-4o", map[schemas.QuotaKind]float64{schemas.QuotaDailyTokens: 500, schemas.QuotaHourlyTokens: 50})
	check("model-entry", "claude", map[schemas.QuotaKind]float64{schemas.QuotaHourlyTokens: 70})
	if m := p.Tenant("model-entry").ModeFor("gpt-4o"); m != Soft {
		t.Errorf("gpt-4o mode = %s, want soft inherited from defaults", m)
	}
	// The example file documents the same rule.
	ex := mustLoad(t)
	if got := ex.Tenant("free-trial").Models["*"]; got.MonthlyTokens != 1000000 || got.DailyTokens != 50000 || got.TokensPerMinute != 20000 {
		t.Errorf("example free-trial * = %+v, want defaults' monthly and tpm plus its daily", got)
	}
	if got := ex.Tenant("internal").Models["*"]; got.MonthlyTokens != 0 || got.TokensPerMinute != 20000 {
		t.Errorf("example internal * = %+v, want monthly removed, tpm inherited", got)
	}
}

func TestMaxModelsInheritsAndIsBounded(t *testing.T) {
	p, err := Parse([]byte("defaults:\n  max_models: 50\ntenants:\n  acme:\n    max_models: 2000\n  beta: {}\n"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if a, b, c := p.Tenant("acme").MaxModels, p.Tenant("beta").MaxModels, p.Tenant("unnamed").MaxModels; a != 2000 || b != 50 || c != 50 {
		t.Fatalf("max_models acme %d beta %d unnamed %d, want 2000 50 50", a, b, c)
	}
	if d := DefaultTenant("x").MaxModels; d != DefaultMaxModels {
		t.Fatalf("built-in max_models %d", d)
	}
	_, err = Parse([]byte("tenants:\n  acme:\n    max_models: 0\n"), "m.yaml")
	if err == nil || !strings.Contains(err.Error(), "tenants.acme.max_models") || !strings.Contains(err.Error(), "1..100000") || !strings.Contains(err.Error(), "m.yaml:3") {
		t.Fatalf("Parse = %v, want an error naming the field, line and range", err)
	}
}

// TestFingerprintFollowsTheDocument: the same bytes give the same
// fingerprint, a change of one limit another.
func TestFingerprintFollowsTheDocument(t *testing.T) {
	doc := "defaults:\n  models:\n    \"*\": {monthly_tokens: 1000}\n"
	a, err := Parse([]byte(doc), "a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte(doc), "b.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]byte(strings.Replace(doc, "1000", "1001", 1)), "a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if a.Fingerprint() == "" || a.Fingerprint() != b.Fingerprint() {
		t.Errorf("same document, fingerprints %q and %q", a.Fingerprint(), b.Fingerprint())
	}
	if a.Fingerprint() == c.Fingerprint() {
		t.Errorf("changed limit, same fingerprint %q", a.Fingerprint())
	}
}
