package alerter

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/engine"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Config is the alerter's configuration section.
type Config struct {
	// Consumer: the group that reads the signals (topics.signals). It spreads
	// tenants over alerter replicas; offsets are committed once the alert
	// states they produced are on StateTopic (see persist). When a
	// replica's session lapses, its partitions and the alerts of their
	// tenants move to another replica or to the same one restarted.
	kafkaconn.Consumer `yaml:"consumer"`
	// StateTopic is the compacted topic of alert states, what a restart
	// resumes from. It belongs to one group, so the default derives it from
	// the group: two deployments with different groups must not restore
	// each other's alerts.
	StateTopic string `yaml:"state_topic" help:"compacted topic of alert states and what was notified, so a restart sends nothing twice; empty: sluice.alerter.state.v1 for the default group, sluice.alerter.state.v1.<group> for others"`

	// DefaultChannels route tenants when there is no policy file.
	DefaultChannels []string `yaml:"default_channels" help:"channels of every tenant when no policy_file is set"`
	// OperatorChannels receive every tenant's alerts in addition to the
	// tenant's own channels.
	OperatorChannels []string `yaml:"operator_channels" help:"channels that receive every tenant's alerts, e.g. dingtalk:ops"`

	// Language of tenants that set none, and of incident messages.
	Language     string        `yaml:"language" help:"message language: en or zh"`
	TemplatesDir string        `yaml:"templates_dir" help:"directory with en.tmpl / zh.tmpl overriding built-in templates"`
	Links        message.Links `yaml:"links"`
	// IncidentListMax bounds the tenants an incident message names.
	IncidentListMax int `yaml:"incident_list_max" help:"tenants named in one incident message; the rest are counted"`

	Tick            time.Duration `yaml:"tick" help:"how often pending, resolving and grouped alerts are advanced"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"time allowed at shutdown to send queued notifications"`

	Rules engine.Config `yaml:"rules"`

	Alertmanager AlertmanagerConfig `yaml:"alertmanager"`

	// Delivery tunes the direct channels of each kind, by kind name
	// (delivery: {slack: {rate_per_minute: 30}}). A setting left out, or
	// 0, keeps the kind's default, which suits its receiver: DingTalk
	// robots accept 20 messages a minute, Slack webhooks about one a
	// second.
	Delivery map[string]notify.ChannelConfig `yaml:"delivery" help:"per channel kind: rate_per_minute, burst, retries … (map by kind name)"`

	// Channels defines direct channels by kind and name, in the policy's
	// shape (channels: {slack: {noc: {webhook: …}}}), for setups without a
	// policy file or for operator channels; the policy's definitions win on
	// a name clash.
	Channels policy.Channels `yaml:"channels" help:"operator channels by kind and name, in the policy's shape"`

	// Tenants holds per-tenant alerter settings the policy does not carry:
	// language, quiet hours and silences.
	Tenants map[string]TenantConfig `yaml:"tenants" help:"per-tenant language, quiet hours and silences (map by tenant)"`
}

// AlertmanagerConfig says where Alertmanager is.
type AlertmanagerConfig struct {
	// URL empty disables the Alertmanager channel.
	URL string `yaml:"url" help:"Alertmanager base URL, e.g. http://127.0.0.1:9093; empty disables it"`
	// Hold is the endsAt lead of firing alerts; Alertmanager resolves an
	// alert not re-sent within it, so a dead alerter cannot leave alerts
	// firing forever.
	Hold     time.Duration        `yaml:"hold" help:"endsAt of firing alerts lies this far ahead (several resend intervals)"`
	Delivery notify.ChannelConfig `yaml:"delivery"`
}

// TenantConfig is one tenant's alerter settings.
type TenantConfig struct {
	Language   string            `yaml:"language" help:"en or zh; empty: the alerter's language"`
	QuietHours *QuietHoursConfig `yaml:"quiet_hours" help:"daily window in which only severe alerts are delivered"`
	Silences   []SilenceConfig   `yaml:"silences" help:"mutes until a time, optionally one rule or model"`
	// Timezone is used for quiet hours when the policy has no time zone for
	// the tenant (no policy file).
	Timezone string `yaml:"timezone" help:"IANA zone for quiet hours when the policy has none"`
}

// QuietHoursConfig is a daily window, in the tenant's zone, in which only
// alerts of Allow severity and above are delivered; the others wait for its
// end.
type QuietHoursConfig struct {
	Start string `yaml:"start" help:"HH:MM in the tenant's zone"`
	End   string `yaml:"end" help:"HH:MM; before start spans midnight"`
	Allow string `yaml:"allow" help:"lowest severity delivered inside the window: info, warning or critical (default)"`
}

// SilenceConfig mutes a tenant's alerts (optionally one rule or model)
// until a time.
type SilenceConfig struct {
	Rule    string    `yaml:"rule" help:"rule to mute; empty: all"`
	Model   string    `yaml:"model" help:"model to mute; empty: all"`
	Until   time.Time `yaml:"until" help:"RFC 3339 end of the silence"`
	Comment string    `yaml:"comment" help:"why, for the next operator"`
}

// DefaultConfig returns the defaults: group sluice-alerter, English, 1s
// ticks, Alertmanager off until alertmanager.url is set.
func DefaultConfig() Config {
	am := notify.DefaultChannelConfig()
	am.RatePerMinute, am.Burst = 600, 20
	return Config{
		Consumer:        kafkaconn.Consumer{Group: "sluice-alerter", SessionTimeout: 45 * time.Second},
		DefaultChannels: []string{engine.AlertmanagerChannel},
		Language:        "en",
		IncidentListMax: 50,
		Tick:            time.Second,
		ShutdownTimeout: 10 * time.Second,
		Rules:           engine.DefaultConfig(),
		Alertmanager:    AlertmanagerConfig{Hold: 5 * time.Minute, Delivery: am},
	}
}

// Validate checks every field and names the field and its limit.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := c.Consumer.Validate("consumer"); err != nil {
		errs = append(errs, err)
	}
	if !slices.Contains(message.Languages, c.Language) {
		add("language: %q is not one of %s", c.Language, strings.Join(message.Languages, ", "))
	}
	if c.IncidentListMax < 1 || c.IncidentListMax > 1000 {
		add("incident_list_max: %d is outside 1..1000", c.IncidentListMax)
	}
	if c.Tick < 10*time.Millisecond || c.Tick > time.Minute {
		add("tick: %v is outside 10ms..1m", c.Tick)
	}
	if c.ShutdownTimeout <= 0 {
		add("shutdown_timeout: %v must be positive", c.ShutdownTimeout)
	}
	if err := c.Rules.Validate(); err != nil {
		add("rules: %w", err)
	}
	for _, ch := range append(slices.Clone(c.DefaultChannels), c.OperatorChannels...) {
		if err := channelKinds.CheckRef(ch); err != nil {
			add("default_channels/operator_channels: %w", err)
		}
	}
	if c.Alertmanager.URL != "" {
		if _, err := notify.ParseURL(c.Alertmanager.URL); err != nil {
			add("alertmanager.url: %w", err)
		}
		if c.Alertmanager.Hold < 2*c.Rules.ResendInterval {
			add("alertmanager.hold: %v must be at least twice rules.resend_interval (%v), or alerts flap between re-sends", c.Alertmanager.Hold, c.Rules.ResendInterval)
		}
	}
	if err := c.Alertmanager.Delivery.Validate("alertmanager.delivery"); err != nil {
		errs = append(errs, err)
	}
	for _, kind := range slices.Sorted(maps.Keys(c.Delivery)) {
		if _, ok := channelKinds.Kind(kind); !ok {
			add("delivery.%s: unknown channel kind; the alerter knows %s", kind, strings.Join(channelKinds.Names(), ", "))
			continue
		}
		if err := c.delivery(kind).Validate("delivery." + kind); err != nil {
			errs = append(errs, err)
		}
	}
	for _, pr := range policy.CheckChannels(c.Channels, channelKinds.Check) {
		add("%s: %s", pr.Field, pr.Msg)
	}
	for id, t := range c.Tenants {
		if _, err := t.route(id, nil); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stateTopic is StateTopic, or the default for the group when it is empty.
func (c Config) stateTopic() string {
	switch {
	case c.StateTopic != "":
		return c.StateTopic
	case c.Group == DefaultConfig().Group:
		return DefaultStateTopic
	}
	return DefaultStateTopic + "." + c.Group
}

// delivery returns the delivery settings of the channels of kind: the
// kind's defaults under what alerter.delivery.<kind> sets.
func (c Config) delivery(kind string) notify.ChannelConfig {
	k, ok := channelKinds.Kind(kind)
	if !ok {
		return c.Delivery[kind]
	}
	return c.Delivery[kind].Or(k.Delivery)
}

// route turns t into the engine's per-tenant settings; loc is the policy's
// time zone for the tenant, if any.
func (t TenantConfig) route(id string, loc *time.Location) (engine.Route, error) {
	var r engine.Route
	var errs []error
	prefix := "tenants." + id
	r.Language = t.Language
	if t.Language != "" && !slices.Contains(message.Languages, t.Language) {
		errs = append(errs, fmt.Errorf("%s.language: %q is not one of %s", prefix, t.Language, strings.Join(message.Languages, ", ")))
	}
	r.Location = loc
	if t.Timezone != "" {
		l, err := time.LoadLocation(t.Timezone)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s.timezone: %q is not an IANA time zone", prefix, t.Timezone))
		} else if loc == nil {
			r.Location = l
		}
	}
	if q := t.QuietHours; q != nil {
		start, err1 := engine.ParseClock(q.Start)
		end, err2 := engine.ParseClock(q.End)
		for _, err := range []error{err1, err2} {
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.quiet_hours: %w", prefix, err))
			}
		}
		allow := alert.SeverityCritical
		if q.Allow != "" {
			var ok bool
			if allow, ok = policy.ParseSeverity(q.Allow); !ok {
				errs = append(errs, fmt.Errorf("%s.quiet_hours.allow: %q is not info, warning or critical", prefix, q.Allow))
			}
		}
		r.QuietHours = &engine.QuietHours{Start: start, End: end, Allow: allow}
	}
	for i, s := range t.Silences {
		if s.Until.IsZero() {
			errs = append(errs, fmt.Errorf("%s.silences[%d].until: is required (RFC 3339); a silence must end", prefix, i))
		}
		if s.Rule != "" && !slices.Contains(rules, alert.Rule(s.Rule)) {
			errs = append(errs, fmt.Errorf("%s.silences[%d].rule: %q is not one of %v", prefix, i, s.Rule, rules))
		}
		r.Silences = append(r.Silences, engine.Silence{Rule: alert.Rule(s.Rule), Model: s.Model, Until: s.Until})
	}
	return r, errors.Join(errs...)
}

var rules = []alert.Rule{alert.RuleQuotaTier, alert.RuleExhaustionPredicted, alert.RuleRateExceeded,
	alert.RuleBreakerOpen, alert.RuleAnomaly, alert.RuleReconciliationDrift}
