// Package wecom sends alert messages to a WeCom (企业微信) group robot,
// reached by its webhook URL
// (https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=<key>). The key in
// the URL is the robot's only credential: WeCom has no signature, so the
// URL is a secret and never logged.
//
// Messages are markdown (msgtype markdown, content at most 4096 bytes), or
// with msgtype template_card a text_notice template card: the title as
// main_title, the text as sub_title_text, a source line coloured by
// severity, and the whole card linking to the alert's dashboard (the
// alerter's links.dashboard) or the channel's card_url. WeCom requires that
// link, so a message with neither goes as markdown.
package wecom

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// MaxContent bounds the markdown content in bytes, WeCom's limit.
const MaxContent = 4096

// MaxSubtitle bounds a template card's sub_title_text in characters; WeCom
// recommends at most 112 and cuts longer ones.
const MaxSubtitle = 112

// errcodeTooFast is WeCom's answer when a robot exceeds 20 messages a
// minute.
const errcodeTooFast = 45009

// The message types.
const (
	TypeMarkdown     = "markdown"
	TypeTemplateCard = "template_card"
)

// Sender posts to one robot.
type Sender struct {
	webhook string
	msgtype string
	cardURL string
	client  *http.Client
	render  *message.Renderer
}

// New returns a sender to the robot at webhook (its URL with the key)
// sending msgtype (markdown when empty, or template_card, whose click
// target is the alert's dashboard link or else cardURL).
func New(webhook, msgtype, cardURL string, render *message.Renderer, client *http.Client) (*Sender, error) {
	if _, err := notify.ParseURL(webhook); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	if msgtype == "" {
		msgtype = TypeMarkdown
	}
	if msgtype != TypeMarkdown && msgtype != TypeTemplateCard {
		return nil, fmt.Errorf("msgtype: %q is not markdown or template_card", msgtype)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return &Sender{webhook: webhook, msgtype: msgtype, cardURL: cardURL, client: client, render: render}, nil
}

// Markdown is a markdown message.
type Markdown struct {
	MsgType  string          `json:"msgtype"`
	Markdown MarkdownContent `json:"markdown"`
}

// MarkdownContent is the markdown part of a Markdown message.
type MarkdownContent struct {
	Content string `json:"content"`
}

// TemplateCard is a template card message.
type TemplateCard struct {
	MsgType      string   `json:"msgtype"`
	TemplateCard TextCard `json:"template_card"`
}

// TextCard is a text_notice template card, with the fields the alerter
// fills.
type TextCard struct {
	CardType     string     `json:"card_type"`
	Source       Source     `json:"source"`
	MainTitle    MainTitle  `json:"main_title"`
	SubTitleText string     `json:"sub_title_text"`
	CardAction   CardAction `json:"card_action"`
}

// Source is the card's source line; DescColor 0 grey, 1 black, 2 red,
// 3 green.
type Source struct {
	Desc      string `json:"desc"`
	DescColor int    `json:"desc_color"`
}

// MainTitle is the card's title.
type MainTitle struct {
	Title string `json:"title"`
}

// CardAction is what a click on the card does: type 1 opens URL.
type CardAction struct {
	Type int    `json:"type"`
	URL  string `json:"url"`
}

// Send renders m and posts it.
func (s *Sender) Send(ctx context.Context, m alert.Message) error {
	if len(m.Alerts) == 0 {
		return nil
	}
	payload, err := s.payload(&m)
	if err != nil {
		return notify.Permanent(err)
	}
	raw, err := notify.PostJSON(ctx, s.client, "wecom", s.webhook, "application/json; charset=utf-8", payload)
	if err != nil {
		return err
	}
	// WeCom answers 200 and puts the outcome in errcode.
	var r struct {
		ErrCode *int   `json:"errcode"`
		ErrMsg  string `json:"errmsg"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.ErrCode == nil {
		return fmt.Errorf("wecom: unreadable answer %.200q", raw)
	}
	switch *r.ErrCode {
	case 0:
		return nil
	case errcodeTooFast:
		return notify.RetryAfter(fmt.Errorf("wecom: errcode %d: %s", *r.ErrCode, r.ErrMsg), time.Minute)
	default:
		// An invalid key (93000), a malformed message, a removed robot:
		// the same request cannot succeed.
		return notify.Permanent(fmt.Errorf("wecom: errcode %d: %s", *r.ErrCode, r.ErrMsg))
	}
}

func (s *Sender) payload(m *alert.Message) (any, error) {
	if s.msgtype == TypeTemplateCard {
		// An incident spans tenants: card_url, when set, fits it better
		// than the first tenant's dashboard.
		link, _ := s.render.Links(&m.Alerts[0])
		if link == "" || (m.Incident() && s.cardURL != "") {
			link = s.cardURL
		}
		if link != "" {
			// The card shows text as written: render it without markup.
			title, text, err := s.render.Message(m, message.Plain)
			if err != nil {
				return nil, err
			}
			return TemplateCard{MsgType: TypeTemplateCard, TemplateCard: TextCard{
				CardType:     "text_notice",
				Source:       Source{Desc: "Sluice", DescColor: colour(m)},
				MainTitle:    MainTitle{Title: title},
				SubTitleText: truncateRunes(text, MaxSubtitle),
				CardAction:   CardAction{Type: 1, URL: link},
			}}, nil
		}
	}
	_, text, err := s.render.Message(m, message.Markdown)
	if err != nil {
		return nil, err
	}
	return Markdown{MsgType: TypeMarkdown, Markdown: MarkdownContent{Content: message.Truncate(text, MaxContent)}}, nil
}

// colour is the source line's colour: green when resolved, red when
// critical, grey otherwise.
func colour(m *alert.Message) int {
	switch {
	case m.Status() == alert.StatusResolved:
		return 3
	case m.Alerts[0].Severity >= alert.SeverityCritical:
		return 2
	}
	return 0
}

// truncateRunes cuts s to n characters: WeCom counts characters here.
func truncateRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
