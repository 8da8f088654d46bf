package feishu

import (
	"errors"

	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the Feishu (Lark) channel kind: channels.feishu.<name> defines a
// custom bot with the settings webhook (its URL, which carries its token;
// required) and secret (for bots with signature verification on),
// referenced as feishu:<name>.
var Kind channel.Kind = kind{}

type kind struct{}

func (kind) Name() string { return "feishu" }

// Delivery: 100 messages a minute with a burst of 5, a custom bot's limit
// (100 a minute, 5 a second).
func (kind) Delivery() notify.ChannelConfig {
	c := notify.DefaultChannelConfig()
	c.RatePerMinute, c.Burst = 100, 5
	return c
}

func (kind) Check(s channel.Settings) error {
	return errors.Join(channel.CheckKeys(s, "webhook", "secret"), channel.CheckURL(s, "webhook"))
}

func (kind) New(s channel.Settings, d channel.Deps) (notify.Sender, error) {
	return New(s["webhook"], s["secret"], d.Render, d.Client)
}
