package dingtalk

import (
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the DingTalk channel kind: channels.dingtalk.<name> defines a
// robot with the settings webhook (its URL with the access_token, required)
// and secret (for robots with signing on), referenced as dingtalk:<name>.
var Kind = channel.Kind{
	Name: "dingtalk",
	// The default: 20 messages a minute, a robot's limit.
	Delivery: notify.DefaultChannelConfig(),
	Keys:     []string{"webhook", "secret"},
	URL:      "webhook",
	New: func(s channel.Settings, d channel.Deps) (notify.Sender, error) {
		return New(s["webhook"], s["secret"], d.Render, d.Client)
	},
}
