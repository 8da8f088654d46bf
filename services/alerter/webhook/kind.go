package webhook

import (
	"errors"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/alerter/channel"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Kind is the webhook channel kind: channels.webhook.<name> defines a
// receiver with the settings url (required), secret (required, the HMAC
// key: at least 16 bytes, or whsec_<base64>), previous_secret (optional,
// the old key during a rotation: deliveries carry both signatures) and
// tenant (optional: binds the channel to that tenant, so that no other
// tenant's alert reaches it even if an operator channel or another
// tenant's policy names it). It is referenced as webhook:<name>.
var Kind = channel.Kind{
	Name: "webhook",
	// Receivers are the customers' own services, not a chat with a
	// documented limit, so 600 a minute with a burst of 20; and more
	// patience than a chat robot needs: 8 attempts, the back-off doubling
	// from 1s up to 1m (one to two minutes of waiting in all, with jitter),
	// since a missed billing event costs more than a missed chat line.
	Delivery: notify.ChannelConfig{RatePerMinute: 600, Burst: 20, MaxAttempts: 8, MaxBackoff: time.Minute}.
		Or(notify.DefaultChannelConfig()),
	Keys:        []string{"url", "secret", "previous_secret", "tenant"},
	URL:         "url",
	CheckValues: checkValues,
	New: func(s channel.Settings, d channel.Deps) (notify.Sender, error) {
		return New(s["url"], s["secret"], s["previous_secret"], s["tenant"], d.Render, d.Client)
	},
}

// checkValues checks the form of the secrets and of the tenant binding.
func checkValues(s channel.Settings) []error {
	var errs []error
	if _, err := Key(s["secret"]); err != nil {
		if s["secret"] == "" {
			err = errors.New("is required: deliveries are signed with it (at least 16 bytes, or whsec_<base64>)")
		}
		errs = append(errs, &policy.SettingError{Key: "secret", Err: err})
	}
	if p, ok := s["previous_secret"]; ok && p != "" {
		if _, err := Key(p); err != nil {
			errs = append(errs, &policy.SettingError{Key: "previous_secret", Err: err})
		}
	}
	if t, ok := s["tenant"]; ok {
		if msg := schemas.CheckTenant(t); msg != "" {
			errs = append(errs, &policy.SettingError{Key: "tenant", Err: errors.New(msg)})
		}
	}
	return errs
}
