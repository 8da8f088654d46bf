package dingtalk

import (
	"errors"

	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the DingTalk channel kind: channels.dingtalk.<name> defines a
// robot with the settings webhook (its URL with the access_token, required)
// and secret (for robots with signing on), referenced as dingtalk:<name>.
var Kind channel.Kind = kind{}

type kind struct{}

func (kind) Name() string { return "dingtalk" }

// Delivery is the default: 20 messages a minute, a robot's limit.
func (kind) Delivery() notify.ChannelConfig { return notify.DefaultChannelConfig() }

func (kind) Check(s channel.Settings) error {
	return errors.Join(channel.CheckKeys(s, "webhook", "secret"), channel.CheckURL(s, "webhook"))
}

func (kind) New(s channel.Settings, d channel.Deps) (notify.Sender, error) {
	return New(s["webhook"], s["secret"], d.Render, d.Client)
}
