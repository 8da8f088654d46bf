// Package schedule decides when each tenant's reconciliation is due: once
// a day at a local time of day (00:30 by default) in the tenant's own
// zone, auditing the local day that just ended and, on the first of a
// month, the month that just ended; and, when hourly audits are on, once
// per hour for the hour that closed and settled last, so drift in the
// open day shows within the hour. A run missed while the service was down
// happens at the next check (for hours: only the last one; the nightly
// day audit covers every hour); a run repeated after a restart is
// harmless, because audits are idempotent.
package schedule

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// TimeOfDay is a local wall-clock time.
type TimeOfDay struct{ Hour, Minute int }

// ParseTimeOfDay reads "HH:MM" (24-hour clock).
func ParseTimeOfDay(s string) (TimeOfDay, error) {
	t, err := time.Parse("15:04", s)
	if err != nil {
		return TimeOfDay{}, fmt.Errorf("%q is not a time of day HH:MM between 00:00 and 23:59", s)
	}
	return TimeOfDay{t.Hour(), t.Minute()}, nil
}

func (t TimeOfDay) String() string { return fmt.Sprintf("%02d:%02d", t.Hour, t.Minute) }

// Job is one audit to run: the period (day or month) containing At, in
// the tenant's zone.
type Job struct {
	Tenant string
	Period schemas.Period
	At     time.Time
}

// Due returns the jobs due at now for tenant t whose last nightly run
// was for local date last ("2006-01-02", empty if never), and the local
// date this run stands for. Nothing is due before the time of day, or
// when today's run was done. The month job runs on the first day of the
// tenant's month (its billing day) and audits the month that ended.
func Due(tenant Tenant, now time.Time, at TimeOfDay, last string) (jobs []Job, date string) {
	t := policy.Tenant{ID: tenant.ID, Location: tenant.Location, BillingDay: tenant.BillingDay}
	loc := t.Calendar(schemas.PeriodDay).Location
	lt := now.In(loc)
	date = lt.Format(time.DateOnly)
	dueAt := time.Date(lt.Year(), lt.Month(), lt.Day(), at.Hour, at.Minute, 0, 0, loc)
	if lt.Before(dueAt) || last == date {
		return nil, date
	}
	// Noon of the previous day is inside it whatever DST does.
	yesterday := time.Date(lt.Year(), lt.Month(), lt.Day()-1, 12, 0, 0, 0, loc)
	jobs = append(jobs, Job{Tenant: t.ID, Period: schemas.PeriodDay, At: yesterday})
	if monthStart, _ := t.PeriodBounds(schemas.PeriodMonth, lt); monthStart.Format(time.DateOnly) == date {
		jobs = append(jobs, Job{Tenant: t.ID, Period: schemas.PeriodMonth, At: yesterday})
	}
	return jobs, date
}

// DueHour returns the hour job due at now for a tenant in loc: the latest
// local hour that ended at least settle ago, unless its start is last
// (the hour audited before). key identifies the hour for the next call.
func DueHour(tenant string, now time.Time, loc *time.Location, settle time.Duration, last int64) (job Job, key int64, due bool) {
	start, _ := policy.PeriodBounds(schemas.PeriodHour, now.Add(-settle-time.Hour), loc)
	if start.Unix() == last {
		return Job{}, last, false
	}
	// At is the hour's start: an hour may be shorter than 60 minutes when the
	// zone's offset changes (see policy.PeriodBounds), so start+30m may not
	// be inside it.
	return Job{Tenant: tenant, Period: schemas.PeriodHour, At: start}, start.Unix(), true
}

// Clock is the scheduler's time source, replaced in tests.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// RealClock is the wall clock.
var RealClock Clock = realClock{}

// Tenant is a tenant to schedule, its zone and its billing day (the
// first day of its months; 0 or 1: the calendar month).
type Tenant struct {
	ID         string
	Location   *time.Location
	BillingDay int
}

// Scheduler runs due jobs every Interval until its context ends.
type Scheduler struct {
	At       TimeOfDay
	Interval time.Duration
	Clock    Clock
	// Tenants lists the tenants to consider at each check.
	Tenants func(ctx context.Context) ([]Tenant, error)
	// Run runs one tenant's due jobs; the tenant's nightly run counts as
	// done only when it returns nil, so a failure is retried next check.
	Run func(ctx context.Context, jobs []Job) error
	Log *slog.Logger
	// Hourly adds, at each check, the job of the last closed hour that
	// ended at least Settle ago (see DueHour).
	Hourly bool
	Settle time.Duration

	done     map[string]string // tenant -> local date of its last successful run
	hourDone map[string]int64  // tenant -> start of the last hour audited
}

// Check runs every job due now and returns how many tenants ran.
func (s *Scheduler) Check(ctx context.Context) (int, error) {
	if s.done == nil {
		s.done, s.hourDone = map[string]string{}, map[string]int64{}
	}
	tenants, err := s.Tenants(ctx)
	if err != nil {
		return 0, err
	}
	ran := 0
	for _, t := range tenants {
		if ctx.Err() != nil {
			return ran, ctx.Err()
		}
		now := s.Clock.Now()
		jobs, date := Due(t, now, s.At, s.done[t.ID])
		nightly := len(jobs) > 0
		var hour int64
		if s.Hourly {
			j, key, due := DueHour(t.ID, now, t.Location, s.Settle, s.hourDone[t.ID])
			if due {
				jobs = append(jobs, j)
			}
			hour = key
		}
		if len(jobs) == 0 {
			continue
		}
		ran++
		if err := s.Run(ctx, jobs); err != nil {
			s.Log.Error("reconciliation failed; retrying at the next check", "tenant", t.ID, "date", date, "jobs", len(jobs), "err", err)
			continue
		}
		if nightly {
			s.done[t.ID] = date
		}
		if s.Hourly {
			s.hourDone[t.ID] = hour
		}
	}
	return ran, nil
}

// Loop checks at once and then every Interval until ctx ends.
func (s *Scheduler) Loop(ctx context.Context) error {
	for {
		if _, err := s.Check(ctx); err != nil && ctx.Err() == nil {
			s.Log.Error("reconciliation schedule check failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.Clock.After(s.Interval):
		}
	}
}
