package wecom

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/channel/channeltest"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/message/messagetest"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// robot stands in for a WeCom group robot: it checks the key in the URL
// and the documented rules of each message type, and answers with WeCom's
// errcode convention. It decodes into generic maps, so a misspelt field
// fails here as it would at WeCom.
type robot struct {
	mu   sync.Mutex
	msgs []map[string]any
	code int
	fail channeltest.Outage // answer 502 to this many requests first
}

func (rb *robot) answer(w http.ResponseWriter, code int, msg string) {
	_ = json.NewEncoder(w).Encode(map[string]any{"errcode": code, "errmsg": msg})
}

func (rb *robot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.fail.Answer(w, http.StatusBadGateway) {
		return
	}
	if r.URL.Path != "/cgi-bin/webhook/send" || r.URL.Query().Get("key") != "k-123" {
		rb.answer(w, 93000, "invalid webhook url")
		return
	}
	raw, _ := io.ReadAll(r.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		rb.answer(w, 40001, "invalid json")
		return
	}
	switch m["msgtype"] {
	case "markdown":
		md, _ := m["markdown"].(map[string]any)
		content, _ := md["content"].(string)
		if content == "" || len(content) > 4096 {
			rb.answer(w, 40058, "markdown.content exceed max length 4096")
			return
		}
	case "template_card":
		c, _ := m["template_card"].(map[string]any)
		title, _ := c["main_title"].(map[string]any)
		action, _ := c["card_action"].(map[string]any)
		if c["card_type"] != "text_notice" || (title["title"] == "" && c["sub_title_text"] == "") ||
			action["type"] != float64(1) || action["url"] == "" || action["url"] == nil {
			rb.answer(w, 40058, "template_card invalid")
			return
		}
	default:
		rb.answer(w, 40008, "invalid message type")
		return
	}
	if rb.code != 0 {
		rb.answer(w, rb.code, "nope")
		return
	}
	rb.msgs = append(rb.msgs, m)
	rb.answer(w, 0, "ok")
}

func sample(tenant, lang string) alert.Alert {
	return alert.Alert{Key: alert.Key{Tenant: tenant, Model: "<@all>", Period: "month", Quota: "budget", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityWarning, Tier: 90, Used: 90, Limit: 100, Unit: "currency", Language: lang}
}

func start(t *testing.T, rb *robot, msgtype, cardURL string, links message.Links) *Sender {
	t.Helper()
	return channeltest.Start(t, rb, "/cgi-bin/webhook/send?key=k-123", func(url string, c *http.Client) (*Sender, error) {
		return New(url, msgtype, cardURL, messagetest.Renderer(t, links), c)
	})
}

func TestSendsMarkdown(t *testing.T) {
	rb := &robot{}
	s := start(t, rb, "", "", message.Links{Dashboard: "https://grafana.example/d?tenant={tenant}"})
	if err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{sample("acme", "zh")}}); err != nil {
		t.Fatal(err)
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.msgs) != 1 || len(rb.msgs[0]) != 2 {
		t.Fatalf("robot got %v", rb.msgs)
	}
	content := rb.msgs[0]["markdown"].(map[string]any)["content"].(string)
	for _, want := range []string{"**【acme】**预算已用 90%", "[监控大盘](https://grafana.example/d?tenant=acme)"} {
		if !strings.Contains(content, want) {
			t.Errorf("content %q lacks %q", content, want)
		}
	}
	// A model name cannot mention the group: < is no syntax any more.
	if strings.Contains(content, "<@") {
		t.Errorf("markup from a value reached the robot: %q", content)
	}
}

func TestLongMarkdownIsCutToWeComsLimit(t *testing.T) {
	rb := &robot{}
	s := start(t, rb, TypeMarkdown, "", message.Links{})
	var as []alert.Alert
	for i := range 200 {
		as = append(as, sample("tenant-"+strings.Repeat("x", 30)+string(rune('a'+i%26)), "en"))
	}
	if err := s.Send(context.Background(), alert.Message{Alerts: as}); err != nil {
		t.Fatal(err)
	}
}

func TestSendsATemplateCard(t *testing.T) {
	rb := &robot{}
	s := start(t, rb, TypeTemplateCard, "https://ops.example/sluice", message.Links{Dashboard: "https://grafana.example/d?tenant={tenant}"})
	single := alert.Message{Alerts: []alert.Alert{sample("acme", "en")}}
	incident := alert.Message{Alerts: []alert.Alert{sample("a", "en"), sample("b", "en")}}
	resolved := alert.Message{Alerts: []alert.Alert{sample("acme", "en")}}
	resolved.Alerts[0].Status, resolved.Alerts[0].Severity = alert.StatusResolved, alert.SeverityCritical
	for _, m := range []alert.Message{single, incident, resolved} {
		if err := s.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	for i, want := range []struct {
		title, url string
		colour     float64
	}{
		{"[warning] acme: budget quota at 90%", "https://grafana.example/d?tenant=acme", 0},
		{"[warning] Incident: 2 tenants, budget quota at 90%", "https://ops.example/sluice", 0},
		{"[RESOLVED] acme: budget quota at 90%", "https://grafana.example/d?tenant=acme", 3},
	} {
		c := rb.msgs[i]["template_card"].(map[string]any)
		src := c["source"].(map[string]any)
		sub, _ := c["sub_title_text"].(string)
		if c["main_title"].(map[string]any)["title"] != want.title || c["card_action"].(map[string]any)["url"] != want.url ||
			src["desc"] != "Sluice" || src["desc_color"] != want.colour || sub == "" || len([]rune(sub)) > MaxSubtitle {
			t.Errorf("card %d: %v", i, c)
		}
	}
}

// A template card needs a link; without a dashboard or card_url the
// message goes as markdown.
func TestTemplateCardWithoutALinkFallsBackToMarkdown(t *testing.T) {
	rb := &robot{}
	s := start(t, rb, TypeTemplateCard, "", message.Links{})
	if err := s.Send(context.Background(), alert.Message{Alerts: []alert.Alert{sample("acme", "en")}}); err != nil {
		t.Fatal(err)
	}
	if rb.msgs[0]["msgtype"] != "markdown" {
		t.Fatalf("sent %v", rb.msgs[0])
	}
}

func TestAnswersMapToRetryPolicy(t *testing.T) {
	for _, c := range []struct {
		name      string
		rb        *robot
		permanent bool
	}{{"too fast", &robot{code: errcodeTooFast}, false}, {"bad gateway", &robot{fail: 1}, false}, {"removed robot", &robot{code: 93000}, true}} {
		err := start(t, c.rb, "", "", message.Links{}).Send(context.Background(), alert.Message{Alerts: []alert.Alert{sample("acme", "en")}})
		if err == nil || notify.IsPermanent(err) != c.permanent {
			t.Errorf("%s: %v, permanent %v", c.name, err, notify.IsPermanent(err))
		}
	}
}

func TestKindChecksSettings(t *testing.T) {
	good := channel.Settings{"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=KEY4711", "msgtype": "template_card", "card_url": "https://ops.example"}
	if err := Kind.Check(good); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    channel.Settings
		want string
	}{
		{channel.Settings{"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?token=KEY4711"}, "webhook: has no key parameter"},
		{channel.Settings{"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=KEY4711", "msgtype": "news"}, `msgtype: "news" is not markdown or template_card`},
		{channel.Settings{"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=KEY4711", "card_url": "/relative"}, "card_url: has no scheme"},
		{channel.Settings{"webhook": "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=KEY4711", "secret": "x"}, "secret: unknown setting"},
	} {
		err := Kind.Check(c.s)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "KEY4711") {
			t.Errorf("%v: %v, want %q and no key", c.s, err, c.want)
		}
	}
}
