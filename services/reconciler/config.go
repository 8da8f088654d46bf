package reconciler

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/services/reconciler/audit"
	"github.com/sluicehq/sluice/services/reconciler/schedule"
)

// Config is the reconciler's section of the configuration.
type Config struct {
	At              string        `yaml:"at" help:"local time of day (HH:MM) at which each tenant's previous day is reconciled, in the tenant's zone"`
	Hourly          bool          `yaml:"hourly" help:"also audit every closed hour (hourly_tokens and minute rollups) once it settled, so drift in the open day shows within the hour instead of after the next nightly run"`
	CheckInterval   time.Duration `yaml:"check_interval" help:"how often the schedule is checked for due tenants"`
	Settle          time.Duration `yaml:"settle" help:"a period is audited only once it ended at least this long ago"`
	RepairThreshold float64       `yaml:"repair_threshold" help:"repair and alert when |counter - truth| exceeds this fraction of the truth (0: any drift)"`
	ConfirmDelay    time.Duration `yaml:"confirm_delay" help:"pause between the two observations that must agree before a drift is believed"`
	MaxObservations int           `yaml:"max_observations" help:"how often a period that keeps changing is re-read before it is left for the next run"`
	TenantLookback  time.Duration `yaml:"tenant_lookback" help:"tenants with events this far back are reconciled even when the policy does not name them"`
	JobTimeout      time.Duration `yaml:"job_timeout" help:"deadline for one tenant's nightly jobs"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" help:"how long an in-flight job may run on after shutdown begins"`
}

// DefaultConfig reconciles at 00:30 local time, after a 15-minute settle.
func DefaultConfig() Config {
	return Config{
		At:              "00:30",
		Hourly:          true,
		CheckInterval:   time.Minute,
		Settle:          15 * time.Minute,
		RepairThreshold: 0,
		ConfirmDelay:    5 * time.Second,
		MaxObservations: 3,
		TenantLookback:  72 * time.Hour,
		JobTimeout:      30 * time.Minute,
		ShutdownTimeout: 30 * time.Second,
	}
}

// Validate names each bad field and its limit.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	at, err := schedule.ParseTimeOfDay(c.At)
	if err != nil {
		bad("at: %v", err)
	}
	if c.CheckInterval < time.Second || c.CheckInterval > time.Hour {
		bad("check_interval: %s is outside 1s..1h", c.CheckInterval)
	}
	if c.Settle < 0 || c.Settle > 24*time.Hour {
		bad("settle: %s is outside 0..24h", c.Settle)
	}
	if err == nil && time.Duration(at.Hour)*time.Hour+time.Duration(at.Minute)*time.Minute < c.Settle {
		bad("at: %s is earlier than settle (%s) after midnight; the day would not be auditable yet", c.At, c.Settle)
	}
	if c.RepairThreshold < 0 || c.RepairThreshold > 1 {
		bad("repair_threshold: %v is outside 0..1", c.RepairThreshold)
	}
	if c.ConfirmDelay < 0 || c.ConfirmDelay > 5*time.Minute {
		bad("confirm_delay: %s is outside 0..5m", c.ConfirmDelay)
	}
	if c.MaxObservations < 2 || c.MaxObservations > 10 {
		bad("max_observations: %d is outside 2..10", c.MaxObservations)
	}
	if c.TenantLookback < 0 {
		bad("tenant_lookback: %s must not be negative", c.TenantLookback)
	}
	if c.JobTimeout < time.Second {
		bad("job_timeout: %s is below the minimum of 1s", c.JobTimeout)
	}
	if c.ShutdownTimeout < 0 {
		bad("shutdown_timeout: %s must not be negative", c.ShutdownTimeout)
	}
	return errors.Join(errs...)
}

// AuditOptions turns c into the audit's options.
func (c Config) AuditOptions() audit.Options {
	return audit.Options{Settle: c.Settle, RepairThreshold: c.RepairThreshold, ConfirmDelay: c.ConfirmDelay, MaxObservations: c.MaxObservations}
}
