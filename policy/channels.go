package policy

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// This file is the policy's side of alert channels: definitions are stored
// by kind and name without interpretation, tenants' references are checked
// against them, and the settings are checked by whoever knows the kinds
// (the alerter) through WithChannelCheck.

// AlertmanagerChannel is the channel reference of Alertmanager. It needs no
// definition here: the alerter's configuration says where Alertmanager is.
const AlertmanagerChannel = "alertmanager"

var (
	channelKind = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	channelRef  = regexp.MustCompile(`^(alertmanager|[a-z][a-z0-9_]{0,31}:[A-Za-z0-9._-]{1,64})$`)
)

// Option adjusts how Parse, Load and NewWatcher read a policy.
type Option func(*options)

type options struct {
	checkChannel ChannelCheck
}

func newOptions(opts []Option) options {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// ChannelCheck validates the settings of one channel definition of kind.
// Its error is reported at channels.<kind>.<name>, or at the setting's own
// line when it is (or joins) *SettingError values.
type ChannelCheck func(kind string, settings ChannelSettings) error

// WithChannelCheck has every channel definition checked by check when the
// file is parsed, so that a bad webhook fails the load with file and line
// (and a bad reload keeps the previous policy) instead of failing later when
// the alerter builds its senders. Without it, definitions are only stored:
// services that send no alerts need not know the channel kinds.
func WithChannelCheck(check ChannelCheck) Option {
	return func(o *options) { o.checkChannel = check }
}

// SettingError is a ChannelCheck's complaint about one setting.
type SettingError struct {
	// Key is the setting, e.g. webhook.
	Key string
	Err error
}

func (e *SettingError) Error() string { return e.Key + ": " + e.Err.Error() }

func (e *SettingError) Unwrap() error { return e.Err }

// CheckChannels checks every definition of defs with check (nil checks only
// the kind names) and returns the problems, each naming its field
// (channels.<kind>.<name>, or .<setting> under it); File and Line are left
// to the caller. Parse uses it for the policy file; the alerter uses it for
// the definitions of its own configuration, so both report alike.
func CheckChannels(defs Channels, check ChannelCheck) []Problem {
	var out []Problem
	for _, kind := range sortedKeys(defs) {
		path := "channels." + kind
		if kind == AlertmanagerChannel || !channelKind.MatchString(kind) {
			out = append(out, Problem{Field: path, Msg: fmt.Sprintf("%q is not a channel kind: a kind is lowercase (%s) and not alertmanager, which is configured in the alerter", kind, channelKind)})
			continue
		}
		if check == nil {
			continue
		}
		for _, name := range sortedKeys(defs[kind]) {
			for _, err := range flatten(check(kind, defs[kind][name])) {
				field := path + "." + name
				var se *SettingError
				if errors.As(err, &se) {
					field += "." + se.Key
					err = se.Err
				}
				out = append(out, Problem{Field: field, Msg: err.Error()})
			}
		}
	}
	return out
}

// flatten lists the errors err joins (errors.Join), or err itself.
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	j, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range j.Unwrap() {
		out = append(out, flatten(e)...)
	}
	return out
}

// channels stores the definitions, checks them, and checks that every
// tenant's references name a definition.
func (v *validator) channels(p *Policy, raw Channels, check ChannelCheck, tenants []*Tenant) {
	for _, pr := range CheckChannels(raw, check) {
		v.fail(pr.Field, "%s", pr.Msg)
	}
	p.channels = raw.clone()
	for _, t := range tenants {
		for _, ch := range t.Channels {
			kind, name, ok := strings.Cut(ch, ":")
			if !ok {
				continue // alertmanager, or a malformed reference already reported
			}
			if _, defined := p.channels[kind][name]; !defined {
				field := "defaults.channels"
				if t.ID != "" {
					field = "tenants." + t.ID + ".channels"
				}
				v.fail(field, "channel %s is not defined under channels.%s", ch, kind)
			}
		}
	}
}

// checkRefs checks the syntax of a tenant's channel references.
func (v *validator) checkRefs(path string, refs []string) {
	if len(refs) > maxChannelCount {
		v.fail(path, "has %d channels, at most %d are allowed", len(refs), maxChannelCount)
	}
	for i, c := range refs {
		if !channelRef.MatchString(c) {
			v.fail(fmt.Sprintf("%s.%d", path, i), "%q is not alertmanager or <kind>:<name> (for example dingtalk:ops)", c)
		}
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
