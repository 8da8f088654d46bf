package feishu

import (
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the Feishu (Lark) channel kind: channels.feishu.<name> defines a
// custom bot with the settings webhook (its URL, which carries its token;
// required) and secret (for bots with signature verification on),
// referenced as feishu:<name>.
var Kind = channel.Kind{
	Name: "feishu",
	// 100 messages a minute with a burst of 5, a custom bot's limit (100 a
	// minute, 5 a second).
	Delivery: notify.ChannelConfig{RatePerMinute: 100, Burst: 5}.Or(notify.DefaultChannelConfig()),
	Keys:     []string{"webhook", "secret"},
	URL:      "webhook",
	New: func(s channel.Settings, d channel.Deps) (notify.Sender, error) {
		return New(s["webhook"], s["secret"], d.Render, d.Client)
	},
}
