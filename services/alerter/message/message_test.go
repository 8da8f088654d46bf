package message

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

func sampleAlert(lang string) alert.Alert {
	p := time.Date(2026, 3, 10, 15, 30, 0, 0, time.UTC)
	return alert.Alert{
		Key:    alert.Key{Tenant: "acme", Model: "gpt-4o", Period: "month", Quota: "monthly_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityWarning, Tier: 90,
		Used: 9_100_000, Limit: 10_000_000, Rate: 12_500, Unit: "tokens", Mode: "hard",
		PredictedExhaustion: &p, Language: lang,
	}
}

func newRenderer(t *testing.T, dir string) *Renderer {
	t.Helper()
	r, err := New("en", dir, Links{Dashboard: "https://grafana.example/d/sluice?var-tenant={tenant}&var-model={model}", Runbook: "https://runbooks.example/{rule}"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDefaultTemplatesCarryTheFiguresInBothLanguages(t *testing.T) {
	r := newRenderer(t, "")
	for _, c := range []struct {
		lang  string
		title []string
		body  []string
	}{
		{"en", []string{"[warning] acme", "monthly_tokens quota at 90%"}, []string{"**[warning] acme**", "9,100,000 of 10,000,000 tokens (91.0%)", "rate 12,500 tokens/min", "runs out at 2026-03-10 15:30 UTC", "[dashboard](https://grafana.example/d/sluice?var-tenant=acme&var-model=gpt-4o)", "[runbook](https://runbooks.example/quota_tier)"}},
		{"zh", []string{"【警告】acme", "月度 Token 配额已用 90%"}, []string{"已用 9,100,000 / 10,000,000 tokens（91.0%）", "预计耗尽时间 2026-03-10 15:30 UTC", "[监控大盘](https://grafana.example"}},
	} {
		a := sampleAlert(c.lang)
		title, body, err := r.Message(&alert.Message{Alerts: []alert.Alert{a}}, Markdown)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range c.title {
			if !strings.Contains(title, w) {
				t.Errorf("%s title %q lacks %q", c.lang, title, w)
			}
		}
		for _, w := range c.body {
			if !strings.Contains(body, w) {
				t.Errorf("%s body lacks %q:\n%s", c.lang, w, body)
			}
		}
	}
}

func TestSlackFlavorUsesMrkdwn(t *testing.T) {
	r := newRenderer(t, "")
	a := sampleAlert("en")
	_, body, err := r.Message(&alert.Message{Alerts: []alert.Alert{a}}, Slack)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body, "*[warning] acme*") || !strings.Contains(body, "<https://runbooks.example/quota_tier|runbook>") || strings.Contains(body, "**") {
		t.Fatalf("not Slack mrkdwn:\n%s", body)
	}
}

func TestIncidentListsABoundedNumberOfTenants(t *testing.T) {
	r := newRenderer(t, "")
	var m alert.Message
	for i := 0; i < 500; i++ {
		a := sampleAlert("zh") // an incident speaks the operator's language, not a tenant's
		a.Key.Tenant = fmt.Sprintf("t%03d", i)
		a.Severity, a.Tier = alert.SeverityCritical, 100
		m.Alerts = append(m.Alerts, a)
	}
	title, body, err := r.Message(&m, Markdown)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(title, "Incident: 500 tenants") || !strings.Contains(body, "t002 / gpt-4o") || strings.Contains(body, "t003") || !strings.Contains(body, "and 497 more") {
		t.Fatalf("incident:\n%s\n%s", title, body)
	}
}

func TestResolvedAndAnnotations(t *testing.T) {
	r := newRenderer(t, "")
	a := sampleAlert("en")
	a.Status = alert.StatusResolved
	title, _, err := r.Message(&alert.Message{Alerts: []alert.Alert{a}}, Markdown)
	if err != nil || !strings.HasPrefix(title, "[RESOLVED] acme") {
		t.Fatalf("title %q, %v", title, err)
	}
	sum, desc, err := r.Annotations(&a)
	if err != nil || sum != "acme/gpt-4o: monthly_tokens quota at 90%" || !strings.Contains(desc, "used 9,100,000 of 10,000,000 tokens") {
		t.Fatalf("summary %q description %q %v", sum, desc, err)
	}
}

func TestOverridesReplaceOnlyTheTemplatesTheyDefine(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "en.tmpl"), []byte(`{{define "summary"}}QUOTA {{.Key.Tenant}} {{.Tier}}{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRenderer(t, dir)
	a := sampleAlert("en")
	sum, desc, err := r.Annotations(&a)
	if err != nil || sum != "QUOTA acme 90" || !strings.Contains(desc, "Tenant acme") {
		t.Fatalf("summary %q description %q %v", sum, desc, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "zh.tmpl"), []byte(`{{define "title"}}{{.Nope}}{{end}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New("en", dir, Links{}, 3); err == nil || !strings.Contains(err.Error(), "zh") {
		t.Fatalf("a broken override must fail at start-up naming it, got %v", err)
	}
}

func TestMissingTemplatesDirIsAnError(t *testing.T) {
	if _, err := New("en", filepath.Join(t.TempDir(), "nope"), Links{}, 3); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("got %v", err)
	}
}

func TestTruncateKeepsUTF8Valid(t *testing.T) {
	s := strings.Repeat("配额", 100)
	got := Truncate(s, 50)
	if len(got) > 50 || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Fatalf("Truncate = %q (%d bytes)", got, len(got))
	}
	if Truncate("short", 50) != "short" {
		t.Fatal("short strings change")
	}
}

// TestHostileNamesRenderAsText: values from events and signals (model,
// tenant, reason, quota and breaker names, attributes) with Slack mentions,
// Slack and Markdown links, emphasis and newlines render as visible text in
// every flavour: no live mention or link besides the operator's dashboard
// and runbook links, and no extra lines.
func TestHostileNamesRenderAsText(t *testing.T) {
	r := newRenderer(t, "")
	hostile := []string{"<!channel>", "<https://evil.example|click>", "[click](https://evil.example)", "a\nb\r\nc\u2028d",
		"<@U123> & <!here>", "![img](https://evil.example/x.png)", "**bold** `code` # head _x_"}
	for _, lang := range Languages {
		for _, name := range hostile {
			benign := sampleAlert(lang)
			a := sampleAlert(lang)
			a.Key.Model, a.Reason = name, name
			a.Attributes = map[string]string{"note": name}
			b := benign
			b.Reason = "plain"
			for _, inc := range []bool{false, true} {
				m, mb := alert.Message{Alerts: []alert.Alert{a}}, alert.Message{Alerts: []alert.Alert{b}}
				if inc { // an incident lists tenants and models
					a2, b2 := a, b
					a2.Key.Tenant, a2.Key.Model, b2.Key.Tenant = name, name, "other"
					m.Alerts, mb.Alerts = append(m.Alerts, a2), append(mb.Alerts, b2)
				}
				for _, f := range []Flavor{Slack, Markdown} {
					title, body, err := r.Message(&m, f)
					if err != nil {
						t.Fatal(err)
					}
					wantTitle, want, _ := r.Message(&mb, f)
					out := title + "\n" + body
					where := fmt.Sprintf("%s %s incident=%v name %q", lang, f, inc, name)
					if strings.Contains(title, "\n") || strings.Count(body, "\n") != strings.Count(want, "\n") {
						t.Errorf("%s: a newline in a value made new lines:\n%s", where, out)
					}
					// The hostile value may add text, never a markup character:
					// each appears as often as in the benign message (which has
					// the template's own and the operator's links).
					syntax := "<>"
					if f == Markdown {
						syntax = "[]()<>`*#|!\\"
					}
					for _, c := range syntax {
						if n, w := strings.Count(out, string(c)), strings.Count(wantTitle+"\n"+want, string(c)); n != w {
							t.Errorf("%s: %d %q in the message, %d without the hostile name:\n%s", where, n, c, w, out)
						}
					}
				}
			}
			_, desc, err := r.Annotations(&a)
			if err != nil || strings.Contains(desc, "\n") || !strings.Contains(desc, "https://evil") && strings.Contains(name, "evil") {
				t.Errorf("%s plain: description %q (%v): one line, the text kept", lang, desc, err)
			}
		}
	}
}

func TestEscapeKeepsNamesReadable(t *testing.T) {
	for _, c := range []struct {
		f       Flavor
		in, out string
	}{
		{Slack, "monthly_tokens", "monthly_tokens"},
		{Slack, "a<b>&c", "a&lt;b&gt;&amp;c"},
		{Markdown, "acme_prod gpt-4o_mini", "acme_prod gpt-4o_mini"},
		{Markdown, "_x_ *y* [z](u)", "＿x＿ ＊y＊ ［z］（u）"},
		{Plain, "<!channel>\nx", "<!channel> x"},
	} {
		if got := Escape(c.f, c.in); got != c.out {
			t.Errorf("Escape(%s, %q) = %q, want %q", c.f, c.in, got, c.out)
		}
	}
}
