package alerter

import (
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/dingtalk"
	"github.com/sluicehq/sluice/services/alerter/feishu"
	"github.com/sluicehq/sluice/services/alerter/slack"
	"github.com/sluicehq/sluice/services/alerter/webhook"
	"github.com/sluicehq/sluice/services/alerter/wecom"
)

// channelKinds are the direct channel kinds the alerter delivers to, the
// one place a kind is registered: its package describes it as a
// channel.Kind, and this list makes the policy, the configuration and the
// dispatcher know it (see README.md, "Adding a channel kind").
var channelKinds = channel.MustRegistry(
	dingtalk.Kind,
	feishu.Kind,
	slack.Kind,
	webhook.Kind,
	wecom.Kind,
)
