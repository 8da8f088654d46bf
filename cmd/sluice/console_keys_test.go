package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform/itest"
)

// submit runs steps that post a form and returns the HTTP status of the
// page they load.
func (p *page) submit(what string, steps ...chromedp.Action[chromedp.Void]) int64 {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, stepTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(ctx, steps...)
	if err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
	return resp.Status
}

// TestConsoleKeysInABrowser manages an API key from a tenant's page in a
// headless Chromium against the real services: a bad model pattern and
// expiry come back in place (422, input kept); the issued key's secret is
// shown once, and neither a reload of that answer nor the tenant's page
// shows it again; `sluice gateway` serves the key at once; a revoke posted
// from a page that read an older version is refused in place, saying who
// changed the key; the revoke from a fresh page makes every gateway refuse
// the key; the key's audit trail shows the issue, the rotation and the
// revocation with who, why and the diff.
func TestConsoleKeysInABrowser(t *testing.T) {
	s, b := consoleInABrowser(t)
	const chatBody = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`

	b.do("log in", chromedp.Navigate(s.console+"/login?next=/tenants/vip"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.adminToken), chromedp.Click(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("form-issue")))

	// A bad model pattern and expiry: refused in place, the input kept.
	status := b.submit("issue a bad key", chromedp.SendKeys(chromedp.CSS(`#form-issue input[name=name]`), "browser key"),
		chromedp.SendKeys(chromedp.CSS(`#form-issue input[name=models]`), "gpt-["),
		chromedp.SendKeys(chromedp.CSS(`#form-issue input[name=expires]`), "soon"),
		chromedp.SendKeys(chromedp.CSS(`#form-issue input[name=reason]`), "browser test: onboarding"),
		chromedp.Click(chromedp.CSS(`#form-issue button[type=submit]`)))
	b.do("the refusal", chromedp.WaitVisible(chromedp.CSS(`#form-issue .field-error`)))
	errs := eval[[]string](b, `[...document.querySelectorAll("#form-issue .field-error")].map(e => e.textContent)`)
	kept := eval[[]string](b, `["name", "models", "expires", "reason"].map(n => document.querySelector("#form-issue input[name=" + n + "]").value)`)
	b.shot("keys-refused.png")
	if status != http.StatusUnprocessableEntity || len(errs) != 2 || !strings.HasPrefix(errs[0], "models[0]: ") || !strings.HasPrefix(errs[1], "expires_in: ") {
		t.Errorf("the refused form: status %d, messages %q; want 422 with the models and expiry messages by their inputs", status, errs)
	}
	if strings.Join(kept, "|") != "browser key|gpt-[|soon|browser test: onboarding" {
		t.Errorf("the refused form kept %q", kept)
	}

	// Corrected: issued, the secret shown once.
	status = b.submit("issue the key", chromedp.SetValue(chromedp.CSS(`#form-issue input[name=models]`), "gpt-4o*"),
		chromedp.SetValue(chromedp.CSS(`#form-issue input[name=expires]`), "720h"),
		chromedp.Click(chromedp.CSS(`#form-issue button[type=submit]`)))
	b.do("the secret", chromedp.WaitVisible(chromedp.ID("secret")))
	secret := eval[string](b, `document.getElementById("secret").value`)
	keyID := b.text(chromedp.ID("secret-key-id"))
	warning := b.text(chromedp.ID("secret-warning"))
	b.shot("keys-secret.png")
	if status != http.StatusOK || secret == "" || !strings.Contains(warning, "it will not be shown again") {
		t.Fatalf("the issue's answer: status %d, secret %d bytes, warning %q", status, len(secret), warning)
	}
	// A reload posts the form again: the key is not issued twice and the
	// secret is not shown.
	b.do("reload the secret's page", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("key-detail")))
	reloaded := eval[string](b, `document.documentElement.outerHTML`)
	b.shot("keys-reloaded.png")
	if strings.Contains(reloaded, secret) || !strings.Contains(reloaded, `id="resubmitted"`) {
		t.Errorf("after a reload the page shows the secret or no notice:\n%.3000s", reloaded)
	}
	b.do("vip's page", chromedp.Navigate(s.console+"/tenants/vip"), chromedp.WaitVisible(chromedp.ID("key-table")))
	rows := eval[[]string](b, `[...document.querySelectorAll("#key-table tr[data-key]")].map(r => r.dataset.key + " " + r.dataset.state + " " + r.dataset.version)`)
	if strings.Contains(eval[string](b, `document.documentElement.outerHTML`), secret) || len(rows) != 1 || rows[0] != keyID+" active 1" {
		t.Errorf("vip's keys: %v (or the page shows the secret); want [%s active 1]", rows, keyID)
	}

	// On a phone the keys, their forms open, fit the screen.
	b.do("vip's keys on a phone", chromedp.EmulateViewport(390, 844), chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("key-table")),
		chromedp.Click(chromedp.CSS(`tr[data-key="`+keyID+`"] details:nth-of-type(1) summary`)),
		chromedp.Click(chromedp.CSS(`tr[data-key="`+keyID+`"] details:nth-of-type(2) summary`)))
	overflow := eval[int](b, `document.documentElement.scrollWidth - window.innerWidth`)
	b.shot("keys-phone.png")
	if overflow > 0 {
		t.Errorf("at 390 px vip's page is %d px wider than the screen", overflow)
	}
	b.do("desktop again", chromedp.EmulateViewport(1280, 1000), chromedp.Navigate(s.console+"/tenants/vip"), chromedp.WaitVisible(chromedp.ID("key-table")))

	// The gateway serves the key at once.
	itest.Eventually(t, 10*time.Second, "the gateway serves the issued key", func() bool {
		code, _ := chat(t, s.gateway+"/v1/chat/completions", secret, chatBody)
		return code == http.StatusOK
	})

	// Another operator rotates the key (keeping the old secret an hour)
	// while the page shows version 1: the revoke it posts is refused.
	other, err := adminapi.NewClient(s.cfg.Services.Console.AdminURL, s.otherToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.RotateKey(context.Background(), keyID, adminapi.RotateKeyRequest{Version: 1, Overlap: "1h", Reason: "browser test: rotation"}); err != nil {
		t.Fatal(err)
	}
	revoke := `#form-revoke-` + keyID
	status = b.submit("a stale revoke", chromedp.Click(chromedp.CSS(`tr[data-key="`+keyID+`"] details:nth-of-type(2) summary`)),
		chromedp.SendKeys(chromedp.CSS(revoke+` input[name=reason]`), "browser test: leaked"),
		chromedp.Click(chromedp.CSS(revoke+` button[type=submit]`)))
	b.do("the stale refusal", chromedp.WaitVisible(chromedp.CSS(revoke+` .form-error`)))
	stale := b.text(chromedp.ID("form-revoke-" + keyID))
	b.shot("keys-stale.png")
	if status != http.StatusConflict || !strings.Contains(stale, "changed by other-operator") || !strings.Contains(stale, "This page is reloaded") {
		t.Errorf("the stale revoke: status %d, the form says %q", status, stale)
	}

	// The refused page shows the key as it is now, its forms carrying the
	// new version, the reason kept: submitted again, the revoke is made and
	// the gateway refuses the key.
	b.do("revoke again", chromedp.Click(chromedp.CSS(revoke+` button[type=submit]`)), chromedp.WaitVisible(chromedp.ID("done")))
	if state := eval[string](b, `document.querySelector('#key-table tr[data-key="`+keyID+`"]').dataset.state`); state != "revoked" {
		t.Errorf("after the revoke the key is %q", state)
	}
	b.shot("keys-revoked.png")
	itest.Eventually(t, 10*time.Second, "the gateway refuses the revoked key", func() bool {
		code, _ := chat(t, s.gateway+"/v1/chat/completions", secret, chatBody)
		return code == http.StatusUnauthorized || code == http.StatusForbidden
	})

	// The audit trail: who, why, the version and the diff of each change.
	b.do("the key's audit trail", chromedp.Navigate(s.console+"/tenants/vip/keys/"+keyID), chromedp.WaitVisible(chromedp.ID("audit")))
	trail := eval[[]string](b, `[...document.querySelectorAll("#audit tbody tr[data-action]")].map(r => r.dataset.action + " v" + r.dataset.version + " " +
		r.querySelector("[data-label=Who]").textContent + ": " + r.querySelector("[data-label=Reason]").textContent)`)
	diff := b.text(chromedp.ID("audit"))
	b.shot("keys-audit.png")
	want := []string{"key.issue v1 browser-test: browser test: onboarding", "key.rotate v2 other-operator: browser test: rotation", "key.revoke v3 browser-test: browser test: leaked"}
	if strings.Join(trail, "\n") != strings.Join(want, "\n") {
		t.Errorf("the key's audit trail:\n%s\nwant\n%s", strings.Join(trail, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(diff, "revoked: ∅ → true") || !strings.Contains(diff, "previous_sha256: ∅ → sha256:") {
		t.Errorf("the trail shows no diff of the rotation and revocation:\n%s", diff)
	}
	b.do("vip's recent key changes", chromedp.Navigate(s.console+"/tenants/vip/audit"), chromedp.WaitVisible(chromedp.ID("audit")))
	recent := eval[[]string](b, `[...document.querySelectorAll("#audit tbody tr[data-action]")].map(r => r.dataset.action + " " + r.dataset.key)`)
	if len(recent) != 3 || recent[0] != "key.revoke "+keyID {
		t.Errorf("vip's recent key changes: %v; want the three, the revocation first", recent)
	}

	// A tenant administrator of vip manages vip's keys and sees no other
	// tenant; a viewer sees the keys and no form.
	b.do("log out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.CSS(`a[href="/login"]`)))
	b.do("log in as vip's administrator", chromedp.Navigate(s.console+"/login"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.tenantAdminToken), chromedp.Click(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("form-issue")))
	if loc := eval[string](b, `location.pathname`); loc != "/tenants/vip" || eval[bool](b, `!!document.getElementById("form-trip")`) {
		t.Errorf("vip's administrator lands on %s, or is offered the breaker forms", loc)
	}
	status = b.submit("acme's page as vip's administrator", chromedp.Navigate(s.console+"/tenants/acme"))
	if status != http.StatusForbidden {
		t.Errorf("vip's administrator reading acme's page: %d, want 403", status)
	}
	b.do("log out", chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.CSS(`a[href="/login"]`)))
	b.do("log in as a viewer", chromedp.Navigate(s.console+"/login?next=/tenants/vip"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), s.viewerToken), chromedp.Click(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("key-table")))
	if n := eval[int](b, `document.querySelectorAll("#key-table tr[data-key]").length`); n != 1 || eval[int](b, `document.querySelectorAll("main form").length`) != 0 {
		t.Errorf("a viewer sees %d keys (want 1) or forms", n)
	}
	b.shot("keys-viewer.png")
}
