// Package audit is the reconciler's core: for one tenant and one closed
// calendar period it recomputes usage from the raw events (distinct ids,
// the billing truth), compares it with the counters the aggregator keeps
// (quota_state and usage_minute), records every comparison in
// reconciliation_runs, publishes a reconciliation_drift signal for each
// counter that drifted beyond the threshold, and repairs those counters by
// writing the truth as a higher version.
//
// # Safe during live ingestion
//
// Two rules keep in-flight events from looking like drift:
//
//   - Only closed periods are audited: a period qualifies once its end is at
//     least Options.Settle in the past. The one exception is the monthly
//     counters a day job compares month to date (the day's drift is in
//     them too, and the month job comes only after the month); they move
//     while the tenant is active, and the next rule then leaves them
//     unsettled rather than repairing them.
//   - Late events still arrive for closed periods, and the aggregator writes
//     an event and the counters it changes in separate inserts. So a drift is
//     only believed when it is seen twice, Options.ConfirmDelay apart, with
//     the same counter and the same truth both times. A cell that keeps
//     moving is recorded as unsettled (not drift, not repaired) and the next
//     run looks at it again.
//
// # Safe to run twice
//
// Repairs write absolute values with the next version, so a repeated run
// finds counters equal to the truth and changes nothing; signal ids are
// derived from the drift itself, so a re-published signal is dropped by
// consumers as a duplicate.
package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// UsageMinuteQuota is the quota name run records use for the usage_minute
// counters, which belong to no quota of the policy.
const UsageMinuteQuota = "usage_minute"

// ErrOpenPeriod is returned for a period that has not closed and settled
// yet: auditing it would report in-flight events as drift.
var ErrOpenPeriod = errors.New("period is not closed yet")

// Job names one audit: a tenant and the calendar period (hour, day or
// month, in the tenant's zone) that contains At. An hour job audits the
// hourly_tokens counters and the usage_minute rows of one closed hour, so
// drift in today's counters shows (and is repaired) within the hour, not
// at the next nightly run; a day job audits the same and the day's
// counters.
type Job struct {
	Tenant *policy.Tenant
	Period schemas.Period // schemas.PeriodHour, PeriodDay or PeriodMonth
	At     time.Time
}

// Bounds returns the job's period [start, end) in the tenant's zone.
func (j Job) Bounds() (start, end time.Time) {
	return j.Tenant.PeriodBounds(j.Period, j.At)
}

// Row is one comparison of a counter with the truth.
type Row struct {
	Tenant, Model, Quota, Period string
	PeriodStart, PeriodEnd       time.Time
	Unit, Mode                   string
	Limit                        float64
	// Counter is what the aggregator's counter says, Truth what the distinct
	// events say; Drift is Counter - Truth. For usage_minute rows the
	// figures are total tokens, but a row drifts when requests or any token
	// column differs.
	Counter, Truth, Drift float64
	// Drifted is true when the counter disagrees with the truth (confirmed
	// by two observations); Repaired when the reconciler overwrote it.
	Drifted, Repaired bool
	// Unsettled is true for a cell that changed between observations: it is
	// being written to right now and was left for the next run.
	Unsettled bool
}

// Result is what one job found and did.
type Result struct {
	RunID      string
	Tenant     string
	Period     string
	Start, End time.Time
	// Rows lists every period-level comparison and, for usage_minute, every
	// drifted minute.
	Rows      []Row
	Drifted   int
	Repaired  int
	Unsettled int
	Signals   int
}

// Publisher sends reconciliation_drift signals to the alerter.
type Publisher interface {
	Publish(ctx context.Context, signals []schemas.Signal) error
}

// Options tune an Auditor.
type Options struct {
	// Settle is how long after its end a period becomes auditable.
	Settle time.Duration
	// RepairThreshold is the drift, as a fraction of the truth (of 1 when
	// the truth is 0), above which a counter is repaired and a signal sent.
	// 0 repairs any drift.
	RepairThreshold float64
	// ConfirmDelay separates the observations that must agree before a
	// drift is believed.
	ConfirmDelay time.Duration
	// MaxObservations bounds how often a moving period is re-read (at
	// least 2).
	MaxObservations int
	// DryRun records and reports drift but neither repairs nor publishes.
	DryRun bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Log receives warnings about unsettled cells; nil means slog.Default.
	Log *slog.Logger
	// Unpriced is the policy in force's unpriced_price (a reload may change
	// it), at which the aggregator counts models without a price; the
	// truth's cost adds it for the unpriced events so the two agree. nil:
	// unpriced events cost 0.
	Unpriced func() (policy.Price, bool)
}

// Auditor runs jobs against one ClickHouse database.
type Auditor struct {
	conn driver.Conn
	pub  Publisher
	opt  Options
}

// New returns an Auditor. pub may be nil: drift is then recorded and
// repaired but not signalled.
func New(conn driver.Conn, pub Publisher, opt Options) *Auditor {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.MaxObservations < 2 {
		opt.MaxObservations = 2
	}
	return &Auditor{conn: conn, pub: pub, opt: opt}
}

// Reconcile audits one job. It returns ErrOpenPeriod (wrapped) for a period
// that has not settled.
//
// The steps, each in its own file: observe the counters and the truth
// until two observations agree (observe.go, compare.go), sort the cells
// into drifted, unsettled and equal (compare.go), publish the drift
// signals, then repair (repair.go), then record the run (record.go). The
// order is the failure story: a failed publish leaves the counters wrong,
// so the next run finds the drift again and retries both; a failed record
// after a repair loses only the history row, never a counter.
func (a *Auditor) Reconcile(ctx context.Context, job Job) (Result, error) {
	if job.Tenant == nil {
		return Result{}, errors.New("audit: job has no tenant")
	}
	if job.Period != schemas.PeriodHour && job.Period != schemas.PeriodDay && job.Period != schemas.PeriodMonth {
		return Result{}, fmt.Errorf("audit: period %q: use hour, day or month", job.Period)
	}
	start, end := job.Bounds()
	now := a.opt.Now()
	if ready := end.Add(a.opt.Settle); now.Before(ready) {
		return Result{}, fmt.Errorf("audit: %s %s of %s: %w (auditable from %s)", job.Period, start.Format(time.DateOnly), job.Tenant.ID, ErrOpenPeriod, ready.Format(time.RFC3339))
	}
	res := Result{RunID: newRunID(now), Tenant: job.Tenant.ID, Period: string(job.Period), Start: start, End: end}

	cells, err := a.confirm(ctx, job, start, end)
	if err != nil {
		return res, err
	}
	keys := sortedKeys(cells)
	v := a.judge(cells, keys, &res, now)
	if len(v.signals) > 0 && a.pub != nil {
		if err := a.pub.Publish(ctx, v.signals); err != nil {
			return res, fmt.Errorf("audit: publish %d reconciliation_drift signals: %w", len(v.signals), err)
		}
		res.Signals = len(v.signals)
	}
	if err := a.repair(ctx, job.Tenant, v.repair, now); err != nil {
		return res, err
	}
	markRepaired(cells, v.repair, &res)
	for _, k := range keys {
		c := cells[k]
		// Every period-level comparison is recorded; minutes only when
		// they drifted, or a day would write 1,440 rows per model.
		if c.minuteCell && !c.row.Drifted && !c.row.Unsettled {
			continue
		}
		res.Rows = append(res.Rows, c.row)
	}
	if err := a.record(ctx, res, now); err != nil {
		return res, err
	}
	return res, nil
}

// newRunID names a run: its start time, readable and sortable, and a
// random suffix so that two runs in one second stay apart.
func newRunID(now time.Time) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}
