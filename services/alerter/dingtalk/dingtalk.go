// Package dingtalk sends alert messages to a DingTalk custom robot: a
// markdown message to the robot's webhook, signed with the robot's secret
// (timestamp and sign query parameters, sign = base64(HMAC-SHA256(secret,
// timestamp + "\n" + secret))).
package dingtalk

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// MaxText bounds the markdown text in bytes; DingTalk refuses messages
// above 20000 bytes.
const MaxText = 18000

// errcodeTooFast is DingTalk's answer when a robot exceeds 20 messages a
// minute; the robot is throttled for the next minute.
const errcodeTooFast = 130101

// Sender posts to one robot.
type Sender struct {
	webhook *url.URL
	secret  string
	client  *http.Client
	render  *message.Renderer
	now     func() time.Time
}

// New returns a sender to the robot at webhook (its URL with the
// access_token), signing with secret when it is not empty.
func New(webhook, secret string, render *message.Renderer, client *http.Client) (*Sender, error) {
	u, err := notify.ParseURL(webhook)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Sender{webhook: u, secret: secret, client: client, render: render, now: time.Now}, nil
}

// Sign returns the sign parameter for timestamp (milliseconds since the
// epoch, as sent in the timestamp parameter).
func Sign(secret string, timestamp int64) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(strconv.FormatInt(timestamp, 10) + "\n" + secret))
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Payload is the robot's markdown message.
type Payload struct {
	MsgType  string   `json:"msgtype"`
	Markdown Markdown `json:"markdown"`
}

// Markdown is the markdown part of a Payload.
type Markdown struct {
	Title string `json:"title"`
	Text  string `json:"text"`
}

// Send renders m as markdown and posts it.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	title, text, err := s.render.Message(&m, message.Markdown)
	if err != nil {
		return notify.Permanent(err)
	}
	u := *s.webhook
	if s.secret != "" {
		// Signed per attempt: DingTalk refuses timestamps over an hour old.
		ts := s.now().UnixMilli()
		q := u.Query()
		q.Set("timestamp", strconv.FormatInt(ts, 10))
		q.Set("sign", Sign(s.secret, ts))
		u.RawQuery = q.Encode()
	}
	payload := Payload{MsgType: "markdown", Markdown: Markdown{Title: title, Text: message.Truncate(text, MaxText)}}
	raw, err := notify.PostJSON(ctx, s.client, "dingtalk", u.String(), "application/json; charset=utf-8", payload)
	if err != nil {
		return err
	}
	// DingTalk answers 200 and puts the outcome in errcode.
	var r struct {
		ErrCode int    `json:"errcode"`
		ErrMsg  string `json:"errmsg"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("dingtalk: unreadable answer %.200q: %w", raw, err)
	}
	switch {
	case r.ErrCode == 0:
		return nil
	case r.ErrCode == errcodeTooFast:
		return notify.RetryAfter(fmt.Errorf("dingtalk: errcode %d: %s", r.ErrCode, r.ErrMsg), time.Minute)
	default:
		// Bad signature, keyword or IP filters, a removed robot: retrying
		// the same request cannot succeed.
		return notify.Permanent(fmt.Errorf("dingtalk: errcode %d: %s", r.ErrCode, r.ErrMsg))
	}
}
