package slack

import (
	"errors"

	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the Slack channel kind: channels.slack.<name> defines an incoming
// webhook with the setting webhook (required), referenced as slack:<name>.
var Kind channel.Kind = kind{}

type kind struct{}

func (kind) Name() string { return "slack" }

// Delivery is the default with 60 messages a minute and a burst of 3:
// Slack accepts about one message a second per webhook.
func (kind) Delivery() notify.ChannelConfig {
	c := notify.DefaultChannelConfig()
	c.RatePerMinute, c.Burst = 60, 3
	return c
}

func (kind) Check(s channel.Settings) error {
	return errors.Join(channel.CheckKeys(s, "webhook"), channel.CheckURL(s, "webhook"))
}

func (kind) New(s channel.Settings, d channel.Deps) (notify.Sender, error) {
	return New(s["webhook"], d.Render, d.Client)
}
