package main

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
)

// TestConsoleTenantsInABrowser manages a tenant record from the console in
// a headless Chromium against the real services: the create form (linked
// from the overview) offers the file's plans and the records'; a bad time zone comes back next to its
// input (422, input kept); the tenant is created from a plan; its page
// edits monthly_tokens and a limit (an unknown unit refused in place
// first); `sluice gateway` enforces the lowered limit; an edit from a page
// older than a change made through the API meanwhile is refused in place
// saying who made it, the form then showing the tenant as it is now; the
// tenant's changes page shows every change; newco's own administrator
// sets a budget per end user in the Sub-budgets form, every other setting
// kept, and is refused a tenant-wide limit in place.
func TestConsoleTenantsInABrowser(t *testing.T) {
	s, b := consoleInABrowser(t)
	ctx := context.Background()
	other, err := adminapi.NewClient(s.cfg.Services.Console.AdminURL, s.otherToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.CreateSection(ctx, adminapi.KindPlan, adminapi.CreateSectionRequest{Name: "gold", Body: json.RawMessage(`{"priority":"high"}`),
		Reason: "browser test: plans"}); err != nil {
		t.Fatal(err)
	}

	const create = `#form-create-tenant`
	b.do("log in", chromedp.Navigate(s.console+"/login"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.adminToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("new-tenant")), chromedp.Click(chromedp.ID("new-tenant")), chromedp.WaitVisible(chromedp.CSS(create)))
	plans := eval[[]string](b, `[...document.querySelectorAll("#form-create-tenant select[name=plan] option")].map(o => o.textContent)`)
	if got := strings.Join(plans, "|"); !strings.Contains(got, "starter (policy file)") || !strings.Contains(got, "gold (admin API)") {
		t.Errorf("the plans offered: %q; want the file's starter and the records' gold", plans)
	}

	// A bad time zone: refused next to its input, what was typed kept.
	status := b.submit("create with a bad time zone", chromedp.SendKeys(chromedp.CSS(create+` input[name=name]`), "newco"),
		chromedp.SetValue(chromedp.CSS(create+` select[name=plan]`), "starter"),
		chromedp.SendKeys(chromedp.CSS(create+` input[name=timezone]`), "Mars/Olympus"),
		chromedp.SendKeys(chromedp.CSS(create+` input[name=monthly_tokens]`), "1000000"),
		chromedp.SendKeys(chromedp.CSS(create+` input[name=reason]`), "browser test: onboarding"),
		chromedp.Click(chromedp.CSS(create+` button[type=submit]`)))
	b.do("the refusal", chromedp.WaitVisible(chromedp.CSS(create+` .field-error`)))
	tzErr := eval[string](b, `document.querySelector("#form-create-tenant input[name=timezone]").closest("label").nextElementSibling?.textContent || ""`)
	kept := eval[[]string](b, `["name", "plan", "timezone", "monthly_tokens", "reason"].map(n => document.querySelector("#form-create-tenant [name=" + n + "]").value)`)
	b.shot("tenants-refused.png")
	if status != http.StatusUnprocessableEntity || !strings.HasPrefix(tzErr, "tenants.newco.timezone: ") {
		t.Errorf("the refused create: status %d, next to the time zone %q; want 422 naming tenants.newco.timezone", status, tzErr)
	}
	if strings.Join(kept, "|") != "newco|starter|Mars/Olympus|1000000|browser test: onboarding" {
		t.Errorf("the refused form kept %q", kept)
	}

	// Corrected: created, on its page with its settings' form.
	const edit = `#form-section`
	b.do("create the tenant", chromedp.SetValue(chromedp.CSS(create+` input[name=timezone]`), "Europe/Berlin"),
		chromedp.Click(chromedp.CSS(create+` button[type=submit]`)), chromedp.WaitVisible(chromedp.CSS(edit)))
	if done := b.text(chromedp.ID("done")); !strings.Contains(done, "Tenant newco created (version 1)") {
		t.Errorf("after the create the page says %q", done)
	}
	rec, err := other.Section(ctx, adminapi.KindTenant, "newco")
	if err != nil || !strings.Contains(string(rec.Body), `"plan":"starter"`) || !strings.Contains(string(rec.Body), `"monthly_tokens":1000000`) {
		t.Fatalf("newco's record: %s, %v", rec.Body, err)
	}
	// Without use yet, newco's quota table shows its record's quotas, not
	// the file's: the console lays the records over its policy file.
	itest.Eventually(t, 10*time.Second, "newco's quota table shows its record's monthly_tokens", func() bool {
		b.do("newco's page again", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(edit)))
		return eval[string](b, `document.querySelector('tr[data-model="*"][data-quota="monthly_tokens"]')?.dataset.limit || ""`) == "1e+06"
	})

	// An unknown unit in a limit: refused next to the limits, kept.
	limits := `{"newco-rpm": {"unit": "calls", "sliding_window": {"length": "1m", "limit": 1}, "exact": true}}`
	status = b.submit("a limit with an unknown unit", chromedp.SetValue(chromedp.CSS(edit+` input[name=monthly_tokens]`), "500000"),
		chromedp.SetValue(chromedp.CSS(edit+` textarea[name=limits]`), limits),
		chromedp.SetValue(chromedp.CSS(edit+` input[name=reason]`), "browser test: tighter"),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)))
	b.do("the refusal", chromedp.WaitVisible(chromedp.CSS(edit+` .field-error`)))
	limErr := eval[string](b, `document.querySelector("#form-section textarea[name=limits]").closest("label").nextElementSibling?.textContent || ""`)
	keptLimits := eval[string](b, `document.querySelector("#form-section textarea[name=limits]").value`)
	b.shot("tenants-limit-refused.png")
	if status != http.StatusUnprocessableEntity || !strings.HasPrefix(limErr, "tenants.newco.limits.newco-rpm.unit: ") || keptLimits != limits {
		t.Errorf("the refused edit: status %d, next to the limits %q, kept %q", status, limErr, keptLimits)
	}
	b.do("edit monthly_tokens and the limit", chromedp.SetValue(chromedp.CSS(edit+` textarea[name=limits]`), strings.Replace(limits, "calls", "requests", 1)),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("done")))
	if done := b.text(chromedp.ID("done")); !strings.Contains(done, "Tenant newco updated (version 2)") {
		t.Errorf("after the edit the page says %q", done)
	}

	// The gateway enforces the lowered limit: one request a minute.
	key, err := other.IssueKey(ctx, adminapi.IssueKeyRequest{Tenant: "newco", Models: []string{"*"}, Reason: "browser test: a key of newco"})
	if err != nil {
		t.Fatal(err)
	}
	const chatBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
	var codes []int
	refusal := ""
	itest.Eventually(t, 10*time.Second, "the gateway refuses newco's second request of the minute", func() bool {
		code, answer := chat(t, s.gateway+"/v1/chat/completions", key.Secret, chatBody)
		codes, refusal = append(codes, code), answer
		return code == http.StatusTooManyRequests
	})
	// The key was served (once the gateway had it), then refused by the
	// limit the console set.
	if !slices.Contains(codes, http.StatusOK) || !strings.Contains(refusal, `"rule":"newco-rpm"`) {
		t.Errorf("newco's calls answered %v, the last %.300s; want one served, then refused by newco-rpm", codes, refusal)
	}

	// Another operator changes newco while the page shows version 2: the
	// page's edit is refused in place, saying who changed it.
	if _, err := other.UpdateSection(ctx, adminapi.KindTenant, "newco", adminapi.UpdateSectionRequest{Version: 2,
		Body: json.RawMessage(`{"plan":"starter","timezone":"Europe/Berlin","models":{"*":{"monthly_tokens":400000}}}`), Reason: "browser test: meanwhile"}); err != nil {
		t.Fatal(err)
	}
	status = b.submit("a stale edit", chromedp.SetValue(chromedp.CSS(edit+` input[name=daily_tokens]`), "100000"),
		chromedp.SetValue(chromedp.CSS(edit+` input[name=reason]`), "browser test: daily"),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)))
	b.do("the stale refusal", chromedp.WaitVisible(chromedp.CSS(edit+` .form-error`)))
	stale := b.text(chromedp.ID("form-section"))
	b.shot("tenants-stale.png")
	if status != http.StatusConflict || !strings.Contains(stale, "changed by other-operator") || !strings.Contains(stale, "This page is reloaded") {
		t.Errorf("the stale edit: status %d, the form says %q", status, stale)
	}
	// The refused page shows newco as it is now, with the version in
	// force: the edit made again on it is made.
	if now := eval[string](b, `document.querySelector("#form-section input[name=monthly_tokens]").value`); now != "400000" {
		t.Errorf("after the stale refusal the form shows monthly_tokens %q, want the other operator's 400000", now)
	}
	b.do("edit again", chromedp.SetValue(chromedp.CSS(edit+` input[name=daily_tokens]`), "100000"),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("done")))
	if done := b.text(chromedp.ID("done")); !strings.Contains(done, "(version 4)") {
		t.Errorf("after the second edit the page says %q", done)
	}

	// On a phone the settings form fits the screen.
	b.do("newco on a phone", chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(edit)))
	overflow := eval[int](b, `document.documentElement.scrollWidth - window.innerWidth`)
	b.shot("tenants-phone.png")
	if overflow > 0 {
		t.Errorf("at 390 px newco's page is %d px wider than the screen", overflow)
	}
	b.do("desktop again", chromedp.EmulateViewport(1280, 1000))

	// The changes page: every change, who, why, the version and the diff.
	b.do("newco's changes", chromedp.Navigate(s.console+"/tenants/newco/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
	trail := eval[[]string](b, `[...document.querySelectorAll("#audit tbody tr[data-action]")].map(r => r.dataset.action + " v" + r.dataset.version + " " +
		r.querySelector("[data-label=Who]").textContent + ": " + r.querySelector("[data-label=Reason]").textContent)`)
	diff := b.text(chromedp.ID("audit"))
	b.shot("tenants-audit.png")
	want := []string{"tenant.update v4 browser-test: browser test: daily", "tenant.update v3 other-operator: browser test: meanwhile",
		"key.issue v1 other-operator: browser test: a key of newco", "tenant.update v2 browser-test: browser test: tighter",
		"tenant.create v1 browser-test: browser test: onboarding"}
	if got := strings.Join(trail, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("newco's changes, newest first:\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	if !strings.Contains(diff, "limits") || !strings.Contains(diff, "newco-rpm") {
		t.Errorf("the trail shows no diff of the limits:\n%s", diff)
	}

	subBudgets(t, s, b, other)
}

// subBudgets logs newco's administrator in: its page offers the limits
// alone; a tenant-wide limit is refused in place (403, naming the limit);
// a budget per end user is saved over the record as it is, the operators'
// quotas kept.
func subBudgets(t *testing.T, s *consoleStack, b *page, operator *adminapi.Client) {
	t.Helper()
	const edit = `#form-section`
	b.do("log out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.CSS(`a[href="/login"]`)))
	b.do("log in as newco's administrator", chromedp.Navigate(s.console+"/login?next=/tenants/newco"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.newcoAdminToken), chromedp.Click(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("section-sub-budgets")))
	if eval[bool](b, `!!document.querySelector("#form-section input[name=monthly_tokens]")`) {
		t.Error("newco's administrator is offered the quotas")
	}
	status := b.submit("a tenant-wide limit", chromedp.SetValue(chromedp.CSS(edit+` textarea[name=limits]`),
		`{"all": {"unit": "requests", "sliding_window": {"length": "1m", "limit": 1000}}}`),
		chromedp.SetValue(chromedp.CSS(edit+` input[name=reason]`), "browser test: a sub-budget"),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)))
	b.do("the refusal", chromedp.WaitVisible(chromedp.CSS(edit+` .form-error`)))
	if refused := b.text(chromedp.ID("form-section")); status != http.StatusForbidden || !strings.Contains(refused, "limits.all is not scoped by user, key or session") {
		t.Errorf("a tenant-wide limit from newco's administrator: status %d, the form says %q", status, refused)
	}
	b.do("a budget per end user", chromedp.SetValue(chromedp.CSS(edit+` textarea[name=limits]`),
		`{"per-user": {"scope": {"user": "*"}, "unit": "requests", "sliding_window": {"length": "1m", "limit": 100}}}`),
		chromedp.Click(chromedp.CSS(edit+` button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("done")))
	b.shot("tenants-sub-budgets.png")
	rec, err := operator.Section(context.Background(), adminapi.KindTenant, "newco")
	if err != nil || rec.UpdatedBy != "newco-admin" || !strings.Contains(string(rec.Body), `"per-user":{`) ||
		!strings.Contains(string(rec.Body), `"models":{"*":{"daily_tokens":100000,"monthly_tokens":400000}}`) {
		t.Errorf("newco after its administrator's save: by %s %s, %v; want the per-user limit beside the operators' quotas", rec.UpdatedBy, rec.Body, err)
	}
}
