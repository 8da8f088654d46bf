package engine

import (
	"errors"
	"fmt"
	"time"
)

// Config tunes the state machine.
type Config struct {
	// PendingFor is how long a condition (or a higher tier) must hold before
	// it is notified; shorter blips are never sent.
	PendingFor time.Duration `yaml:"pending_for" help:"how long a condition must hold before it is notified"`
	// ResolveAfter is how long a firing condition must stay clear before the
	// resolved notice goes out; a condition that returns sooner keeps the
	// alert firing without a new notification.
	ResolveAfter time.Duration `yaml:"resolve_after" help:"how long a firing condition must stay clear before the resolved notice"`
	// AutoResolveAfter ends alerts of rules that have no "clear" signal
	// (rate_exceeded, anomaly, breaker_open, reconciliation_drift) when no
	// signal refreshed them for this long.
	AutoResolveAfter time.Duration `yaml:"auto_resolve_after" help:"end anomaly, rate and drift alerts not refreshed by a signal for this long"`
	// ExhaustionWarning and ExhaustionCritical are the horizons within which
	// a predicted exhaustion is a warning or a critical alert; a prediction
	// beyond ExhaustionWarning clears the alert, and so does a predicted
	// time more than ExhaustionCritical in the past (it did not come true).
	ExhaustionWarning  time.Duration `yaml:"exhaustion_warning" help:"predicted exhaustion within this is a warning"`
	ExhaustionCritical time.Duration `yaml:"exhaustion_critical" help:"predicted exhaustion within this is critical"`
	// GroupWait is how long direct-channel notifications are held to be
	// grouped; 0 sends each at once.
	GroupWait time.Duration `yaml:"group_wait" help:"how long direct-channel notifications are held for grouping (0: no grouping)"`
	// GroupThreshold: when more than this many alerts of one rule, severity
	// and status are held for a channel in one window, they go out as one
	// incident message.
	GroupThreshold int `yaml:"group_threshold" help:"more alerts than this of one rule in a grouping window become one incident message"`
	// ResendInterval is how often firing alerts are re-sent to Alertmanager;
	// keep it well under Alertmanager's resolve_timeout.
	ResendInterval time.Duration `yaml:"resend_interval" help:"how often firing alerts are re-sent to Alertmanager (keep under its resolve_timeout)"`
	// MaxAlerts bounds the alerts tracked at once; signals for new keys
	// beyond it are dropped and counted (existing alerts keep updating).
	MaxAlerts int `yaml:"max_alerts" help:"alerts tracked at once; signals for new keys beyond it are dropped and counted"`
	// MaxGroupBuffer bounds the notifications held per channel for grouping;
	// a full buffer is flushed early rather than grown.
	MaxGroupBuffer int `yaml:"max_group_buffer" help:"notifications held per channel for grouping before an early flush"`
	// DedupSignals is how many recent signal IDs are remembered to drop
	// replayed signals.
	DedupSignals int `yaml:"dedup_signals" help:"recent signal IDs remembered to drop replays"`
}

// DefaultConfig returns the defaults: 1m pending, 5m resolve hold, 15m
// auto-resolve, 30m/10m exhaustion horizons, 30s grouping above 10 tenants,
// 1m Alertmanager re-send.
func DefaultConfig() Config {
	return Config{
		PendingFor:         time.Minute,
		ResolveAfter:       5 * time.Minute,
		AutoResolveAfter:   15 * time.Minute,
		ExhaustionWarning:  30 * time.Minute,
		ExhaustionCritical: 10 * time.Minute,
		GroupWait:          30 * time.Second,
		GroupThreshold:     10,
		ResendInterval:     time.Minute,
		MaxAlerts:          200000,
		MaxGroupBuffer:     10000,
		DedupSignals:       100000,
	}
}

// Validate checks every field and names the field and its limit.
func (c Config) Validate() error {
	var errs []error
	nonNeg := func(name string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative", name, d))
		}
	}
	nonNeg("pending_for", c.PendingFor)
	nonNeg("resolve_after", c.ResolveAfter)
	nonNeg("group_wait", c.GroupWait)
	if c.AutoResolveAfter <= 0 {
		errs = append(errs, fmt.Errorf("auto_resolve_after: %v must be positive", c.AutoResolveAfter))
	}
	if c.ExhaustionWarning <= 0 {
		errs = append(errs, fmt.Errorf("exhaustion_warning: %v must be positive", c.ExhaustionWarning))
	}
	if c.ExhaustionCritical <= 0 || c.ExhaustionCritical > c.ExhaustionWarning {
		errs = append(errs, fmt.Errorf("exhaustion_critical: %v must be positive and at most exhaustion_warning (%v)", c.ExhaustionCritical, c.ExhaustionWarning))
	}
	if c.GroupThreshold < 1 {
		errs = append(errs, fmt.Errorf("group_threshold: %d must be at least 1", c.GroupThreshold))
	}
	if c.ResendInterval < time.Second {
		errs = append(errs, fmt.Errorf("resend_interval: %v must be at least 1s", c.ResendInterval))
	}
	if c.MaxAlerts < 1 {
		errs = append(errs, fmt.Errorf("max_alerts: %d must be at least 1", c.MaxAlerts))
	}
	if c.MaxGroupBuffer < 1 {
		errs = append(errs, fmt.Errorf("max_group_buffer: %d must be at least 1", c.MaxGroupBuffer))
	}
	if c.DedupSignals < 0 {
		errs = append(errs, fmt.Errorf("dedup_signals: %d must not be negative", c.DedupSignals))
	}
	return errors.Join(errs...)
}
