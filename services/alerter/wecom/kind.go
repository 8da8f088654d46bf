package wecom

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the WeCom channel kind: channels.wecom.<name> defines a group
// robot with the settings webhook (its URL with the key; required),
// msgtype (markdown, the default, or template_card) and card_url (where a
// template card links when the alert has no dashboard link), referenced as
// wecom:<name>.
var Kind = channel.Kind{
	Name: "wecom",
	// The default: 20 messages a minute, a robot's limit.
	Delivery:    notify.DefaultChannelConfig(),
	Keys:        []string{"webhook", "msgtype", "card_url"},
	URL:         "webhook",
	CheckValues: checkValues,
	New: func(s channel.Settings, d channel.Deps) (notify.Sender, error) {
		return New(s["webhook"], s["msgtype"], s["card_url"], d.Render, d.Client)
	},
}

// checkValues checks the robot's key in the webhook URL, the msgtype and
// the card_url.
func checkValues(s channel.Settings) []error {
	var errs []error
	if u, err := notify.ParseURL(s["webhook"]); err == nil && u.Query().Get("key") == "" {
		// The value is not quoted: the URL is the robot's credential.
		errs = append(errs, &policy.SettingError{Key: "webhook", Err: errors.New("has no key parameter; a WeCom robot's URL ends in /cgi-bin/webhook/send?key=…")})
	}
	if t := s["msgtype"]; t != "" && t != TypeMarkdown && t != TypeTemplateCard {
		errs = append(errs, &policy.SettingError{Key: "msgtype", Err: fmt.Errorf("%q is not markdown or template_card", t)})
	}
	if _, ok := s["card_url"]; ok {
		errs = append(errs, channel.CheckURL(s, "card_url"))
	}
	return errs
}
