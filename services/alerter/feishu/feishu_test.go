package feishu

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/channel/channeltest"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/message/messagetest"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

const secret = "feishuSECRETqwerty"

// bot stands in for a Feishu custom bot: it checks what Feishu checks (the
// token in the path, the signature and its hour, the message type and the
// card's shape) and answers with Feishu's code convention. It decodes into
// generic maps, not the sender's types, so a misspelt field fails here as
// it would at Feishu.
type bot struct {
	mu    sync.Mutex
	cards []map[string]any
	code  int                // answer this code instead of accepting
	fail  channeltest.Outage // answer 500 to this many requests first
}

func (b *bot) answer(w http.ResponseWriter, code int, msg string) {
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "msg": msg, "data": map[string]any{}})
}

func (b *bot) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail.Answer(w, http.StatusInternalServerError) {
		return
	}
	if r.URL.Path != "/open-apis/bot/v2/hook/tok" {
		b.answer(w, 19001, "param invalid: incoming webhook access token invalid")
		return
	}
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(raw, &body); err != nil || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		b.answer(w, 9499, "Bad Request")
		return
	}
	ts, _ := body["timestamp"].(string)
	sec, err := strconv.ParseInt(ts, 10, 64)
	mac := hmac.New(sha256.New, []byte(ts+"\n"+secret)) // the string is the key; the message is empty
	if err != nil || body["sign"] != base64.StdEncoding.EncodeToString(mac.Sum(nil)) || time.Since(time.Unix(sec, 0)).Abs() > time.Hour {
		b.answer(w, 19021, "sign match fail or timestamp is not within one hour from current time")
		return
	}
	card, _ := body["card"].(map[string]any)
	if body["msg_type"] != "interactive" || card == nil {
		b.answer(w, 9499, "Bad Request")
		return
	}
	if b.code != 0 {
		b.answer(w, b.code, "nope")
		return
	}
	b.cards = append(b.cards, card)
	b.answer(w, 0, "success")
}

func renderer(t *testing.T) *message.Renderer {
	return messagetest.Renderer(t, message.Links{Runbook: "https://rb.example/{rule}"})
}

func sample(lang string) alert.Message {
	return alert.Message{Alerts: []alert.Alert{{Key: alert.Key{Tenant: "acme", Model: "<at id=all></at>", Period: "day", Quota: "daily_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityCritical, Tier: 100, Used: 1000, Limit: 1000, Unit: "tokens", Language: lang}}}
}

func start(t *testing.T, b *bot, secret string) *Sender {
	t.Helper()
	return channeltest.Start(t, b, "/open-apis/bot/v2/hook/tok", func(url string, c *http.Client) (*Sender, error) {
		return New(url, secret, renderer(t), c)
	})
}

func TestSignMatchesFeishusAlgorithm(t *testing.T) {
	// Computed independently: the HMAC key is "1599360473\nsecret", the
	// message empty.
	mac := hmac.New(sha256.New, []byte("1599360473\nsecret"))
	mac.Write(nil)
	if got, want := Sign("secret", 1599360473), base64.StdEncoding.EncodeToString(mac.Sum(nil)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

// TestSendsASignedCard checks the card field by field, in both languages.
func TestSendsASignedCard(t *testing.T) {
	b := &bot{}
	s := start(t, b, secret)
	for _, lang := range []string{"zh", "en"} {
		if err := s.Send(context.Background(), sample(lang)); err != nil {
			t.Fatal(err)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.cards) != 2 {
		t.Fatalf("bot got %d cards", len(b.cards))
	}
	for i, want := range []struct{ title, text string }{
		{"【严重】acme：日 Token 配额已用 100%", "日 Token 配额已用 100%"},
		{"[critical] acme: daily_tokens quota at 100%", "daily_tokens quota at 100%"},
	} {
		card := b.cards[i]
		if cfg, _ := card["config"].(map[string]any); cfg["wide_screen_mode"] != true {
			t.Errorf("config %v", card["config"])
		}
		header, _ := card["header"].(map[string]any)
		title, _ := header["title"].(map[string]any)
		if header["template"] != "red" || title["tag"] != "plain_text" || title["content"] != want.title {
			t.Errorf("header %v, want title %q in red", header, want.title)
		}
		els, _ := card["elements"].([]any)
		if len(els) != 3 {
			t.Fatalf("elements %v", els)
		}
		md, hr, note := els[0].(map[string]any), els[1].(map[string]any), els[2].(map[string]any)
		content, _ := md["content"].(string)
		if md["tag"] != "markdown" || !strings.Contains(content, want.text) || !strings.Contains(content, "](https://rb.example/quota_tier)") {
			t.Errorf("markdown element %v", md)
		}
		// A model name cannot mention everyone: < is no syntax any more.
		if strings.Contains(content, "<at") {
			t.Errorf("markup from a value reached the card: %q", content)
		}
		noteEls, _ := note["elements"].([]any)
		if hr["tag"] != "hr" || note["tag"] != "note" || len(noteEls) != 1 || noteEls[0].(map[string]any)["tag"] != "plain_text" {
			t.Errorf("hr %v note %v", hr, note)
		}
	}
}

func TestUnsignedBotGetsNoSignFields(t *testing.T) {
	var body map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&body)
		_, _ = w.Write([]byte(`{"StatusCode":0,"StatusMessage":"success"}`)) // the older answer
	}))
	defer srv.Close()
	s, _ := New(srv.URL, "", renderer(t), srv.Client())
	if err := s.Send(context.Background(), sample("en")); err != nil {
		t.Fatal(err)
	}
	if _, ok := body["timestamp"]; ok || body["sign"] != nil || body["msg_type"] != "interactive" {
		t.Fatalf("body %v", body)
	}
}

func TestResolvedAndWarningColours(t *testing.T) {
	for _, c := range []struct {
		st   alert.Status
		sev  alert.Severity
		want string
	}{{alert.StatusResolved, alert.SeverityCritical, "green"}, {alert.StatusFiring, alert.SeverityWarning, "orange"}, {alert.StatusFiring, alert.SeverityInfo, "blue"}} {
		if got := Colour(c.st, c.sev); got != c.want {
			t.Errorf("%s %s: %s, want %s", c.st, c.sev, got, c.want)
		}
	}
}

func TestAnswersMapToRetryPolicy(t *testing.T) {
	for _, c := range []struct {
		name      string
		b         *bot
		secret    string
		permanent bool
	}{
		{"wrong secret", &bot{}, "wrong", true},
		{"keyword filter", &bot{code: 19024}, secret, true},
		{"too fast", &bot{code: codeTooFast}, secret, false},
		{"server error", &bot{fail: 1}, secret, false},
	} {
		err := start(t, c.b, c.secret).Send(context.Background(), sample("en"))
		if err == nil || notify.IsPermanent(err) != c.permanent {
			t.Errorf("%s: %v, permanent %v", c.name, err, notify.IsPermanent(err))
		}
	}
}

func TestKindChecksSettings(t *testing.T) {
	if err := Kind.Check(channel.Settings{"webhook": "https://open.feishu.cn/open-apis/bot/v2/hook/TOKEN4711", "secret": "x"}); err != nil {
		t.Fatal(err)
	}
	err := Kind.Check(channel.Settings{"webhook": "open.feishu.cn/open-apis/bot/v2/hook/TOKEN4711", "sign": "x"})
	if err == nil || !strings.Contains(err.Error(), "sign: unknown setting") || !strings.Contains(err.Error(), "webhook: has no scheme") ||
		strings.Contains(err.Error(), "TOKEN4711") {
		t.Fatalf("got %v", err)
	}
}
