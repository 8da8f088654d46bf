package dingtalk

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/channel/channeltest"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/message/messagetest"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

const secret = "SEC0123456789abcdef"

// robot stands in for DingTalk: it checks the signature as DingTalk does
// and answers with DingTalk's errcode convention.
type robot struct {
	mu       sync.Mutex
	payloads []Payload
	fail     channeltest.Outage // answer 500 to this many requests first
	errcode  int
}

func (r *robot) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail.Answer(w, http.StatusInternalServerError) {
		return
	}
	q := req.URL.Query()
	ts, err := strconv.ParseInt(q.Get("timestamp"), 10, 64)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(q.Get("timestamp") + "\n" + secret))
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	if q.Get("access_token") != "tok" || err != nil || q.Get("sign") != want || time.Since(time.UnixMilli(ts)).Abs() > time.Hour {
		_ = json.NewEncoder(w).Encode(map[string]any{"errcode": 310000, "errmsg": "sign not match"})
		return
	}
	body, _ := io.ReadAll(req.Body)
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil || req.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		http.Error(w, "bad", http.StatusBadRequest)
		return
	}
	if r.errcode != 0 {
		_ = json.NewEncoder(w).Encode(map[string]any{"errcode": r.errcode, "errmsg": "nope"})
		return
	}
	r.payloads = append(r.payloads, p)
	_ = json.NewEncoder(w).Encode(map[string]any{"errcode": 0, "errmsg": "ok"})
}

func renderer(t *testing.T) *message.Renderer { return messagetest.Renderer(t, message.Links{}) }

func sample() alert.Message {
	return alert.Message{Alerts: []alert.Alert{{Key: alert.Key{Tenant: "acme", Model: "*", Period: "day", Quota: "daily_tokens", Rule: alert.RuleQuotaTier},
		Status: alert.StatusFiring, Severity: alert.SeverityCritical, Tier: 100, Used: 1000, Limit: 1000, Unit: "tokens", Language: "zh"}}}
}

// start returns a Sender to rb, signing with secret.
func start(t *testing.T, rb *robot, secret string) *Sender {
	t.Helper()
	return channeltest.Start(t, rb, "/robot/send?access_token=tok", func(url string, c *http.Client) (*Sender, error) {
		return New(url, secret, renderer(t), c)
	})
}

func TestSignMatchesDingTalksAlgorithm(t *testing.T) {
	// Computed independently: base64(HMAC-SHA256("secret", "1700000000000\nsecret")).
	mac := hmac.New(sha256.New, []byte("secret"))
	mac.Write([]byte("1700000000000\nsecret"))
	if got, want := Sign("secret", 1700000000000), base64.StdEncoding.EncodeToString(mac.Sum(nil)); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

func TestSendsASignedMarkdownMessage(t *testing.T) {
	rb := &robot{}
	s := start(t, rb, secret)
	if err := s.Send(context.Background(), sample()); err != nil {
		t.Fatal(err)
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.payloads) != 1 {
		t.Fatalf("robot got %d messages", len(rb.payloads))
	}
	p := rb.payloads[0]
	if p.MsgType != "markdown" || !strings.Contains(p.Markdown.Title, "acme") || !strings.Contains(p.Markdown.Text, "日 Token 配额已用 100%") {
		t.Fatalf("payload %+v", p)
	}
}

func TestWrongSecretIsAPermanentError(t *testing.T) {
	s := start(t, &robot{}, "wrong")
	err := s.Send(context.Background(), sample())
	if err == nil || !notify.IsPermanent(err) || !strings.Contains(err.Error(), "310000") {
		t.Fatalf("want a permanent errcode error, got %v", err)
	}
}

func TestRateLimitedRobotAsksToRetryLater(t *testing.T) {
	s := start(t, &robot{errcode: errcodeTooFast}, secret)
	err := s.Send(context.Background(), sample())
	if err == nil || notify.IsPermanent(err) {
		t.Fatalf("errcode 130101 must be retryable, got %v", err)
	}
}

func TestServerErrorsAreRetriedByTheDispatcher(t *testing.T) {
	s := start(t, &robot{fail: 2}, secret)
	err := s.Send(context.Background(), sample())
	if err == nil || notify.IsPermanent(err) {
		t.Fatalf("a 500 must be retryable, got %v", err)
	}
}

func TestNewRejectsABadWebhook(t *testing.T) {
	if _, err := New("not a url", "", nil, nil); err == nil || !strings.Contains(err.Error(), "webhook") {
		t.Fatalf("got %v", err)
	}
}
