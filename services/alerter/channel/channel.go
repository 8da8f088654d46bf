// Package channel is the registry of the alerter's direct channel kinds
// (DingTalk robots, Slack webhooks, …): for each kind, how its settings
// from the policy or the alerter configuration are checked, how its sender
// is built, and the delivery settings that suit its receiver.
//
// A kind lives in a package of its own that describes it as a Kind; the alerter
// registers the kinds it delivers to in one Registry. Nothing else knows
// the kinds: the policy stores channel definitions by kind and name without
// interpreting them, and the engine and the dispatcher see channel names
// (<kind>:<name>) only. See services/alerter/README.md for the steps of
// adding a kind.
package channel

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/alerter/message"
	"github.com/sluicehq/sluice/services/alerter/notify"
)

// Settings are one channel's settings as the policy or the alerter
// configuration spells them, for example webhook and secret.
type Settings = policy.ChannelSettings

// Deps are what every sender may use, shared by all channels.
type Deps struct {
	// Render turns alerts into titles and texts in the kind's format.
	Render *message.Renderer
	// Client posts to receivers.
	Client *http.Client
}

// Kind is one sort of direct channel, described by its parts. Kinds
// differ in their name, delivery defaults, settings and sender; the checks
// every kind needs (no unknown setting, a well-formed receiver URL) are
// done here once, by Check, and a kind adds its own with CheckValues.
type Kind struct {
	// Name is the kind's key under channels (channels.<name>.<channel> in
	// the policy) and the prefix of its channel references (<name>:<channel>).
	// It is lowercase letters, digits and underscores.
	Name string
	// Delivery is the kind's default delivery settings, chiefly the rate
	// its receivers accept; alerter.delivery.<name> overrides them. Every
	// field must be set: notify.ChannelConfig.Or over
	// notify.DefaultChannelConfig gives a kind the defaults it does not
	// change.
	Delivery notify.ChannelConfig
	// Keys are the settings the kind takes; Check rejects any other.
	Keys []string
	// URL is the setting that must hold the receiver's http(s) URL (and so
	// is required); Check checks it with CheckURL.
	URL string
	// CheckValues, if set, checks what Keys and URL leave: the form of the
	// kind's other settings. It must not do I/O and names the setting at
	// fault with *policy.SettingError; nil errors in its result are
	// ignored.
	CheckValues func(s Settings) []error
	// New returns the sender of one channel. It is called only with
	// settings Check accepted.
	New func(s Settings, d Deps) (notify.Sender, error)
}

// Check validates one channel's settings of kind k without I/O: the keys
// (CheckKeys), the URL (CheckURL) and then CheckValues. Every error names
// the setting at fault with *policy.SettingError.
func (k Kind) Check(s Settings) error {
	errs := []error{CheckKeys(s, k.Keys...), CheckURL(s, k.URL)}
	if k.CheckValues != nil {
		errs = append(errs, k.CheckValues(s)...)
	}
	return errors.Join(errs...)
}

// Registry holds the kinds the alerter delivers to. It is immutable after
// NewRegistry and safe for concurrent use.
type Registry struct {
	kinds map[string]Kind
}

// NewRegistry returns a registry of kinds. It fails on a kind name that is
// not lowercase letters, digits and underscores, on "alertmanager" (which
// is not a direct channel), on a name given twice, and on a kind whose URL
// is not among its Keys, whose New is nil or whose Delivery is not valid.
func NewRegistry(kinds ...Kind) (*Registry, error) {
	r := &Registry{kinds: make(map[string]Kind, len(kinds))}
	for _, k := range kinds {
		name := k.Name
		if probs := policy.CheckChannels(policy.Channels{name: nil}, nil); len(probs) > 0 {
			return nil, fmt.Errorf("channel kind %q: %s", name, probs[0].Msg)
		}
		if _, dup := r.kinds[name]; dup {
			return nil, fmt.Errorf("channel kind %q registered twice", name)
		}
		// A kind without these would fail only when a policy first defines
		// a channel of it, or at the first delivery; refuse it at start.
		if k.URL == "" || !slices.Contains(k.Keys, k.URL) || k.New == nil {
			return nil, fmt.Errorf("channel kind %q: Keys must include URL, and New must be set", name)
		}
		if err := k.Delivery.Validate("channel kind " + name + " delivery"); err != nil {
			return nil, err
		}
		k.Keys = slices.Clone(k.Keys) // the registry is immutable
		r.kinds[name] = k
	}
	return r, nil
}

// MustRegistry is NewRegistry for a package-level registry, where a bad or
// repeated kind is a programming error.
func MustRegistry(kinds ...Kind) *Registry {
	r, err := NewRegistry(kinds...)
	if err != nil {
		panic(err)
	}
	return r
}

// Names returns the registered kind names, sorted.
func (r *Registry) Names() []string { return slices.Sorted(maps.Keys(r.kinds)) }

// Kind returns the kind called name.
func (r *Registry) Kind(name string) (Kind, bool) {
	k, ok := r.kinds[name]
	return k, ok
}

// Check validates the settings of a channel of kind; it is the
// policy.ChannelCheck the alerter parses its policy with.
func (r *Registry) Check(kind string, s Settings) error {
	k, ok := r.kinds[kind]
	if !ok {
		return fmt.Errorf("unknown channel kind %q; the alerter knows %s", kind, strings.Join(r.Names(), ", "))
	}
	return k.Check(s)
}

// New checks s and returns the sender of a channel of kind.
func (r *Registry) New(kind string, s Settings, d Deps) (notify.Sender, error) {
	if err := r.Check(kind, s); err != nil {
		return nil, err
	}
	return r.kinds[kind].New(s, d)
}

// CheckRef checks a channel reference: alertmanager, or <kind>:<name> of a
// registered kind. Whether the name is defined is known only once the
// policy is loaded; a message for an undefined one is dropped and counted.
func (r *Registry) CheckRef(ref string) error {
	kind, name, _ := strings.Cut(ref, ":")
	if _, known := r.kinds[kind]; ref == policy.AlertmanagerChannel || (name != "" && known) {
		return nil
	}
	forms := []string{policy.AlertmanagerChannel}
	for _, n := range r.Names() {
		forms = append(forms, n+":<name>")
	}
	return fmt.Errorf("%q is not a channel; use %s or %s", ref,
		strings.Join(forms[:len(forms)-1], ", "), forms[len(forms)-1])
}

// CheckURL checks that setting key of s is an http(s) URL, with
// notify.ParseURL, the alerter's one URL check.
func CheckURL(s Settings, key string) error {
	if _, err := notify.ParseURL(s[key]); err != nil {
		return &policy.SettingError{Key: key, Err: err}
	}
	return nil
}

// CheckKeys rejects the settings of s that are not among known, so that a
// misspelt key (webhok) fails at load instead of being ignored.
func CheckKeys(s Settings, known ...string) error {
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(s)) {
		if !slices.Contains(known, key) {
			errs = append(errs, &policy.SettingError{Key: key,
				Err: fmt.Errorf("unknown setting; this kind takes %s", strings.Join(known, ", "))})
		}
	}
	return errors.Join(errs...)
}
