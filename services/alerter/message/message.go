// Package message renders alerts as text with text/template: titles and
// bodies for DingTalk, Feishu and WeCom (markdown), Slack (mrkdwn) and
// webhooks (plain text), and Alertmanager's summary and description
// annotations. English and Chinese defaults are built in; an operator
// overrides any template by defining it again in <dir>/<language>.tmpl.
//
// Every value that comes from events or signals (tenant, model, reason,
// quota and breaker names, attributes) reaches the templates already escaped
// for the channel's flavour (see Escape), so neither the built-in templates
// nor an operator's override can let a model called "<!channel>" ping a
// Slack channel or "[click](https://evil)" render a disguised link in
// DingTalk. Templates must therefore not escape again.
package message

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/services/alerter/alert"
)

//go:embed templates/*.tmpl
var defaults embed.FS

// Languages lists the built-in languages.
var Languages = []string{"en", "zh"}

// Flavor is the markup a channel understands.
type Flavor string

// The markups.
const (
	// Markdown is DingTalk's (standard) markdown, which Feishu cards and
	// WeCom robots read too.
	Markdown Flavor = "markdown"
	// Slack is Slack's mrkdwn.
	Slack Flavor = "slack"
	// Plain is text without markup, for Alertmanager annotations, Feishu
	// card headers and webhook payloads.
	Plain Flavor = "plain"
)

// Links builds the dashboard and runbook links of an alert. In both,
// {tenant}, {model}, {rule} and {period} are replaced (URL-escaped).
type Links struct {
	Dashboard string `yaml:"dashboard" help:"dashboard URL; {tenant} {model} {rule} {period} are replaced"`
	Runbook   string `yaml:"runbook" help:"runbook URL; {tenant} {model} {rule} {period} are replaced"`
}

// Renderer executes the templates of each language.
type Renderer struct {
	langs    map[string]*template.Template
	fallback string
	links    Links
	// MaxListed bounds the tenants an incident lists by name; the rest are
	// counted, so a 500-tenant incident stays one readable message.
	maxListed int
}

// New parses the built-in templates, then any overrides in dir (which may
// be empty). fallback is the language of tenants that set none.
func New(fallback, dir string, links Links, maxListed int) (*Renderer, error) {
	r := &Renderer{langs: map[string]*template.Template{}, fallback: fallback, links: links, maxListed: max(maxListed, 1)}
	if dir != "" {
		// A mistyped directory must not silently fall back to the defaults.
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("templates: %q is not a directory", dir)
		}
	}
	for _, lang := range Languages {
		base, err := fs.ReadFile(defaults, "templates/"+lang+".tmpl")
		if err != nil {
			return nil, err
		}
		t, err := template.New(lang).Funcs(funcs).Parse(string(base))
		if err != nil {
			return nil, fmt.Errorf("built-in %s templates: %w", lang, err)
		}
		if dir != "" {
			path := filepath.Join(dir, lang+".tmpl")
			over, err := os.ReadFile(path)
			switch {
			case errors.Is(err, fs.ErrNotExist):
			case err != nil:
				return nil, fmt.Errorf("templates: %w", err)
			default:
				// Parsing into the same set redefines the named templates
				// the file defines and keeps the others.
				if t, err = t.Parse(string(over)); err != nil {
					return nil, fmt.Errorf("templates: %s: %w", path, err)
				}
			}
		}
		r.langs[lang] = t
	}
	if _, ok := r.langs[fallback]; !ok {
		return nil, fmt.Errorf("language: %q is not one of %s", fallback, strings.Join(Languages, ", "))
	}
	// Render a sample with each template now, so a broken override fails
	// at start-up rather than at the first page at 3 a.m.
	sample := alert.Alert{Key: alert.Key{Tenant: "t", Model: "*", Period: "month", Quota: "monthly_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Tier: 90, Used: 90, Limit: 100}
	for lang, t := range r.langs {
		for _, n := range []int{1, 2} {
			for _, f := range []Flavor{Markdown, Slack, Plain} {
				m := alert.Message{Alerts: slices.Repeat([]alert.Alert{sample}, n)}
				d := r.data(&m, f)
				for _, name := range []string{"title", "text"} {
					if _, err := execute(t, name, d); err != nil {
						return nil, fmt.Errorf("%s templates: %w", lang, err)
					}
				}
			}
		}
		for _, name := range []string{"summary", "description"} {
			if _, err := execute(t, name, r.view(&sample, Plain)); err != nil {
				return nil, fmt.Errorf("%s templates: %w", lang, err)
			}
		}
	}
	return r, nil
}

// Data is what the message templates see.
type Data struct {
	// Alerts lists the alerts shown, at most the renderer's MaxListed.
	Alerts []View
	// Count is the number of alerts in the message; More how many of them
	// Alerts leaves out.
	Count, More int
	Incident    bool
	Status      alert.Status
	Flavor      Flavor
}

// View is one alert with its links, as templates see it.
type View struct {
	alert.Alert
	Dashboard, Runbook string
	Flavor             Flavor
}

// Message renders m's title and body in flavor f, in the language of its
// first alert.
func (r *Renderer) Message(m *alert.Message, f Flavor) (title, body string, err error) {
	d := r.data(m, f)
	t := r.template(m)
	if title, err = execute(t, "title", d); err != nil {
		return "", "", err
	}
	body, err = execute(t, "text", d)
	return title, body, err
}

func (r *Renderer) data(m *alert.Message, f Flavor) Data {
	d := Data{Count: len(m.Alerts), Incident: m.Incident(), Status: m.Status(), Flavor: f}
	for i := range m.Alerts {
		if i == r.maxListed {
			d.More = len(m.Alerts) - i
			break
		}
		d.Alerts = append(d.Alerts, r.view(&m.Alerts[i], f))
	}
	return d
}

// Annotations renders an Alertmanager summary and description for a.
func (r *Renderer) Annotations(a *alert.Alert) (summary, description string, err error) {
	t := r.template(&alert.Message{Alerts: []alert.Alert{*a}})
	v := r.view(a, Plain)
	if summary, err = execute(t, "summary", v); err != nil {
		return "", "", err
	}
	description, err = execute(t, "description", v)
	return summary, description, err
}

// Links returns a's dashboard and runbook links.
func (r *Renderer) Links(a *alert.Alert) (dashboard, runbook string) {
	return expand(r.links.Dashboard, a), expand(r.links.Runbook, a)
}

// view copies a with every text field escaped for f. Links are built from
// the raw values (URL-escaped, which also keeps them inside the link
// syntax) and come from the operator's configuration, so they stay live.
func (r *Renderer) view(a *alert.Alert, f Flavor) View {
	v := View{Alert: *a, Flavor: f}
	v.Dashboard, v.Runbook = r.Links(a)
	e := func(s string) string { return Escape(f, s) }
	k := &v.Alert.Key
	k.Tenant, k.Model, k.Period, k.Quota, k.Variant = e(k.Tenant), e(k.Model), e(k.Period), e(k.Quota), e(k.Variant)
	k.Rule = alert.Rule(e(string(k.Rule)))
	v.Unit, v.Mode, v.Reason, v.Language = e(v.Unit), e(v.Mode), e(v.Reason), e(v.Language)
	if len(a.Attributes) > 0 {
		// A new map: the alert's own is shared with the engine's state.
		v.Attributes = make(map[string]string, len(a.Attributes))
		for name, val := range a.Attributes {
			v.Attributes[e(name)] = e(val)
		}
	}
	return v
}

// Escape makes s safe to place in text of flavour f, so that it shows as
// written and cannot become markup:
//
//   - every flavour: control characters (newlines included) and the Unicode
//     line and paragraph separators become spaces, so a value cannot start
//     a line of its own that looks like part of the message;
//   - Slack: &, < and > become &amp;, &lt; and &gt;, the escaping Slack
//     documents; without < no mention (<!channel>, <@U…>) or link
//     (<https://…|text>) can be written. Slack has no escape for *, _ and
//     ~, which only change emphasis;
//   - Markdown (DingTalk, Feishu cards, WeCom): [ ] ( ) < > ` * # | ! \
//     become their full-width forms, which look alike but are no syntax
//     (DingTalk honours neither backslash escapes nor entities reliably);
//     without < no Feishu <at id=all> or WeCom <@userid> mention and no
//     <font> can be written. An underscore stays when it
//     has a letter or digit on both sides, where Markdown does not read it
//     as emphasis, so names like monthly_tokens or acme_prod are shown as
//     they are; any other underscore becomes full-width too;
//   - Plain (Alertmanager annotations, webhook payloads, Feishu card
//     headers): nothing more; the receiver that renders them escapes for
//     its own markup (a Feishu plain_text header is not read as markup).
func Escape(f Flavor, s string) string {
	clean := true
	for _, c := range s {
		if needsEscape(f, c) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i, c := range s {
		switch {
		case c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == '\u2028' || c == '\u2029':
			b.WriteByte(' ')
		case f == Slack && c == '&':
			b.WriteString("&amp;")
		case f == Slack && c == '<':
			b.WriteString("&lt;")
		case f == Slack && c == '>':
			b.WriteString("&gt;")
		case f == Markdown && c == '_':
			if i > 0 && i+1 < len(s) && isAlnum(s[i-1]) && isAlnum(s[i+1]) {
				b.WriteByte('_')
			} else {
				b.WriteRune('\uff3f')
			}
		case f == Markdown && strings.ContainsRune(markdownSyntax, c):
			// The full-width forms sit at a fixed offset from ASCII.
			b.WriteRune(c - '!' + '\uff01')
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// markdownSyntax lists the characters Escape replaces in Markdown.
const markdownSyntax = "[]()<>`*#|!\\"

func needsEscape(f Flavor, c rune) bool {
	if c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0) || c == '\u2028' || c == '\u2029' {
		return true
	}
	switch f {
	case Slack:
		return c == '&' || c == '<' || c == '>'
	case Markdown:
		return c == '_' || strings.ContainsRune(markdownSyntax, c)
	}
	return false
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func (r *Renderer) template(m *alert.Message) *template.Template {
	lang := r.fallback
	if m.Incident() {
		// An incident spans tenants; it speaks the operator's language.
	} else if len(m.Alerts) > 0 && m.Alerts[0].Language != "" {
		lang = m.Alerts[0].Language
	}
	if t, ok := r.langs[lang]; ok {
		return t
	}
	return r.langs[r.fallback]
}

func execute(t *template.Template, name string, data any) (string, error) {
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, name, data); err != nil {
		return "", fmt.Errorf("template %s/%s: %w", t.Name(), name, err)
	}
	return strings.TrimSpace(b.String()), nil
}

func expand(pattern string, a *alert.Alert) string {
	if pattern == "" {
		return ""
	}
	return strings.NewReplacer(
		"{tenant}", url.QueryEscape(a.Key.Tenant),
		"{model}", url.QueryEscape(a.Key.Model),
		"{rule}", url.QueryEscape(string(a.Key.Rule)),
		"{period}", url.QueryEscape(a.Key.Period),
	).Replace(pattern)
}

var funcs = template.FuncMap{
	"num":  num,
	"pct":  func(a View) string { return strconv.FormatFloat(a.Percent(), 'f', 1, 64) + "%" },
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 MST") },
	"bold": func(f Flavor, s string) string {
		switch f {
		case Markdown:
			return "**" + s + "**"
		case Slack:
			return "*" + s + "*"
		}
		return s
	},
	"link": func(f Flavor, url, text string) string {
		switch f {
		case Markdown:
			return "[" + text + "](" + url + ")"
		case Slack:
			return "<" + url + "|" + text + ">"
		}
		return text + ": " + url
	},
}

// num formats an amount readably: integers with thousands separators,
// fractions with two decimals.
func num(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	if v != math.Trunc(v) || math.Abs(v) >= 1e15 {
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	s := strconv.FormatInt(int64(math.Abs(v)), 10)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Truncate shortens s to at most maxBytes bytes without splitting a UTF-8
// character, marking the cut with an ellipsis; receivers reject or cut long
// messages themselves, less gracefully.
func Truncate(s string, maxBytes int) string {
	if len(s) <= maxBytes {
		return s
	}
	const mark = "\n…"
	cut := max(maxBytes-len(mark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
