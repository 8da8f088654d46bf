package slack

import (
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the Slack channel kind: channels.slack.<name> defines an incoming
// webhook with the setting webhook (required), referenced as slack:<name>.
var Kind = channel.Kind{
	Name: "slack",
	// The default with 60 messages a minute and a burst of 3: Slack accepts
	// about one message a second per webhook.
	Delivery: notify.ChannelConfig{RatePerMinute: 60, Burst: 3}.Or(notify.DefaultChannelConfig()),
	Keys:     []string{"webhook"},
	URL:      "webhook",
	New: func(s channel.Settings, d channel.Deps) (notify.Sender, error) {
		return New(s["webhook"], d.Render, d.Client)
	},
}
