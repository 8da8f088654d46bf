// Package feishu sends alert messages to a Feishu (Lark) custom bot, a
// group robot reached by its webhook URL
// (https://open.feishu.cn/open-apis/bot/v2/hook/<token>, or
// open.larksuite.com for Lark), as an interactive message card: a header
// coloured by severity with the title as plain text, the body as card
// markdown, and a note naming Sluice.
//
// A bot with signature verification on takes timestamp and sign in the
// body: timestamp is Unix seconds as a string, and sign is
// base64(HMAC-SHA256(key = timestamp + "\n" + secret, message = empty)) —
// the string is the HMAC's key, not its message, unlike DingTalk's. Feishu
// refuses a timestamp more than an hour from its clock.
package feishu

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// MaxText bounds the card's markdown in bytes: Feishu refuses a custom
// bot's request body above 20 KB, and the card around the text needs room.
const MaxText = 15000

// codeTooFast is Feishu's answer when a bot exceeds its rate (100
// messages a minute, 5 a second).
const codeTooFast = 11232

// Sender posts to one bot.
type Sender struct {
	webhook string
	secret  string
	client  *http.Client
	render  *message.Renderer
	now     func() time.Time
}

// New returns a sender to the bot at webhook, signing with secret when it
// is not empty.
func New(webhook, secret string, render *message.Renderer, client *http.Client) (*Sender, error) {
	if _, err := notify.ParseURL(webhook); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Sender{webhook: webhook, secret: secret, client: client, render: render, now: time.Now}, nil
}

// Sign returns the sign field for timestamp (Unix seconds).
func Sign(secret string, timestamp int64) string {
	mac := hmac.New(sha256.New, []byte(strconv.FormatInt(timestamp, 10)+"\n"+secret))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Payload is a custom bot's interactive message.
type Payload struct {
	// Timestamp and Sign are present when the bot verifies signatures.
	Timestamp string `json:"timestamp,omitempty"`
	Sign      string `json:"sign,omitempty"`
	MsgType   string `json:"msg_type"`
	Card      Card   `json:"card"`
}

// Card is a message card (card JSON 1.0, which custom bots take in card).
type Card struct {
	Config   Config    `json:"config"`
	Header   Header    `json:"header"`
	Elements []Element `json:"elements"`
}

// Config is the card's configuration.
type Config struct {
	WideScreenMode bool `json:"wide_screen_mode"`
}

// Header is the card's title bar; Template is its colour.
type Header struct {
	Title    Text   `json:"title"`
	Template string `json:"template"`
}

// Text is a text object: tag plain_text (shown as written) or lark_md.
type Text struct {
	Tag     string `json:"tag"`
	Content string `json:"content"`
}

// Element is one card element of the kinds the alerter uses: markdown
// (Content), hr, and note (Elements).
type Element struct {
	Tag      string `json:"tag"`
	Content  string `json:"content,omitempty"`
	Elements []Text `json:"elements,omitempty"`
}

// Colour returns the header template of a message of status and severity:
// green when resolved, red for critical, orange for a warning, blue for
// information.
func Colour(status alert.Status, sev alert.Severity) string {
	switch {
	case status == alert.StatusResolved:
		return "green"
	case sev >= alert.SeverityCritical:
		return "red"
	case sev >= alert.SeverityWarning:
		return "orange"
	}
	return "blue"
}

// Send renders m as a card and posts it.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	if len(m.Alerts) == 0 {
		return nil
	}
	// The header is plain_text, which Feishu shows as written: render the
	// title without markup. The body is card markdown.
	title, _, err := s.render.Message(&m, message.Plain)
	if err != nil {
		return notify.Permanent(err)
	}
	_, text, err := s.render.Message(&m, message.Markdown)
	if err != nil {
		return notify.Permanent(err)
	}
	p := Payload{MsgType: "interactive", Card: Card{
		Config: Config{WideScreenMode: true},
		Header: Header{Title: Text{Tag: "plain_text", Content: title}, Template: Colour(m.Status(), m.Alerts[0].Severity)},
		Elements: []Element{
			{Tag: "markdown", Content: message.Truncate(text, MaxText)},
			{Tag: "hr"},
			{Tag: "note", Elements: []Text{{Tag: "plain_text", Content: fmt.Sprintf("Sluice · %s · %d", m.Status(), len(m.Alerts))}}},
		},
	}}
	if s.secret != "" {
		// Signed per attempt: Feishu refuses timestamps over an hour old.
		ts := s.now().Unix()
		p.Timestamp, p.Sign = strconv.FormatInt(ts, 10), Sign(s.secret, ts)
	}
	raw, err := notify.PostJSON(ctx, s.client, "feishu", s.webhook, "application/json; charset=utf-8", p)
	if err != nil {
		return err
	}
	// Feishu answers 200 and puts the outcome in code (StatusCode in its
	// older answers).
	var r struct {
		Code       *int   `json:"code"`
		StatusCode *int   `json:"StatusCode"`
		Msg        string `json:"msg"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || (r.Code == nil && r.StatusCode == nil) {
		return fmt.Errorf("feishu: unreadable answer %.200q", raw)
	}
	code := r.Code
	if code == nil {
		code = r.StatusCode
	}
	switch *code {
	case 0:
		return nil
	case codeTooFast:
		return notify.RetryAfter(fmt.Errorf("feishu: code %d: %s", *code, r.Msg), time.Minute)
	default:
		// A bad signature (19021), a keyword or IP filter (19024, 19022),
		// a removed bot (19001), a malformed card: the same request cannot
		// succeed.
		return notify.Permanent(fmt.Errorf("feishu: code %d: %s", *code, r.Msg))
	}
}
