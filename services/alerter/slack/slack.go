// Package slack sends alert messages to a Slack incoming webhook as Block
// Kit blocks (a header, an mrkdwn section and a context line), with the
// title as the notification fallback text.
package slack

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Slack's block limits: header text 150 characters, section text 3000,
// 50 blocks a message.
const (
	MaxHeader  = 150
	MaxSection = 3000
	// MaxSections keeps a message within Slack's 50 blocks, with the header
	// and the context block.
	MaxSections = 40
)

// Sender posts to one incoming webhook.
type Sender struct {
	webhook string
	client  *http.Client
	render  *message.Renderer
}

// New returns a sender to webhook.
func New(webhook string, render *message.Renderer, client *http.Client) (*Sender, error) {
	if _, err := notify.ParseURL(webhook); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Sender{webhook: webhook, client: client, render: render}, nil
}

// Payload is an incoming-webhook message.
type Payload struct {
	Text   string  `json:"text"`
	Blocks []Block `json:"blocks"`
}

// Block is one Block Kit block of the kinds the alerter uses.
type Block struct {
	Type     string `json:"type"`
	Text     *Text  `json:"text,omitempty"`
	Elements []Text `json:"elements,omitempty"`
}

// Text is a Block Kit text object.
type Text struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// Send renders m as mrkdwn and posts it.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	title, text, err := s.render.Message(&m, message.Slack)
	if err != nil {
		return notify.Permanent(err)
	}
	p := Payload{Text: title, Blocks: []Block{{Type: "header", Text: &Text{Type: "plain_text", Text: truncateRunes(title, MaxHeader)}}}}
	for _, part := range sections(text) {
		p.Blocks = append(p.Blocks, Block{Type: "section", Text: &Text{Type: "mrkdwn", Text: part}})
	}
	p.Blocks = append(p.Blocks, Block{Type: "context", Elements: []Text{{Type: "mrkdwn", Text: fmt.Sprintf("Sluice · %s · %d alert(s)", m.Status(), len(m.Alerts))}}})
	if _, err := notify.PostJSON(ctx, s.client, "slack", s.webhook, "application/json", p); err != nil {
		return err
	}
	return nil
}

// sections splits text at line ends into section texts of at most
// MaxSection bytes, at most MaxSections of them, so that an incident's
// tenant list is not cut mid-way by Slack's per-block limit.
func sections(text string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(text) {
		if cur.Len()+len(line) > MaxSection && cur.Len() > 0 {
			out = append(out, strings.TrimRight(cur.String(), "\n"))
			cur.Reset()
		}
		cur.WriteString(message.Truncate(line, MaxSection))
	}
	if cur.Len() > 0 {
		out = append(out, strings.TrimRight(cur.String(), "\n"))
	}
	if len(out) > MaxSections {
		out = append(out[:MaxSections-1], "…")
	}
	return out
}

// truncateRunes cuts s to n characters: Slack counts characters, not bytes.
func truncateRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
