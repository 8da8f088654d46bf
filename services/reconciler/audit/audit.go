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
//     least Options.Settle in the past. The open period is never compared,
//     because its counter and its events move all the time.
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
	"math"
	"sort"
	"strconv"
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

// Job names one audit: a tenant and the calendar period (day or month, in
// the tenant's zone) that contains At.
type Job struct {
	Tenant *policy.Tenant
	Period schemas.Period // schemas.PeriodDay or schemas.PeriodMonth
	At     time.Time
}

// Bounds returns the job's period [start, end) in the tenant's zone.
func (j Job) Bounds() (start, end time.Time) {
	return policy.PeriodBounds(j.Period, j.At, j.Tenant.Location)
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

// cell is one counter compared with its truth in one observation.
type cell struct {
	row Row
	// fingerprint is every compared figure, so that two observations can be
	// told equal exactly.
	fingerprint string
	drifted     bool
	quota       *quotaRow  // existing quota_state row, nil if missing
	minute      *minuteRow // existing usage_minute row, nil if missing
	truth       usage
	minuteCell  bool // a per-minute usage_minute cell
	// summary is a model's usage_minute day total: it is signalled, and
	// repaired through its minutes.
	summary bool
}

// Reconcile audits one job. It returns ErrOpenPeriod (wrapped) for a period
// that has not settled.
func (a *Auditor) Reconcile(ctx context.Context, job Job) (Result, error) {
	if job.Tenant == nil {
		return Result{}, errors.New("audit: job has no tenant")
	}
	if job.Period != schemas.PeriodDay && job.Period != schemas.PeriodMonth {
		return Result{}, fmt.Errorf("audit: period %q: use day or month", job.Period)
	}
	start, end := job.Bounds()
	now := a.opt.Now()
	if ready := end.Add(a.opt.Settle); now.Before(ready) {
		return Result{}, fmt.Errorf("audit: %s %s of %s: %w (auditable from %s)", job.Period, start.Format(time.DateOnly), job.Tenant.ID, ErrOpenPeriod, ready.Format(time.RFC3339))
	}
	res := Result{RunID: newRunID(now), Tenant: job.Tenant.ID, Period: string(job.Period), Start: start, End: end}

	cells, err := a.observe(ctx, job, start, end)
	if err != nil {
		return res, err
	}
	for n := 2; n <= a.opt.MaxObservations && anyDrift(cells); n++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(a.opt.ConfirmDelay):
		}
		next, err := a.observe(ctx, job, start, end)
		if err != nil {
			return res, err
		}
		settled := true
		for k, c := range next {
			if !c.drifted {
				continue
			}
			if prev, ok := cells[k]; !ok || !prev.drifted || prev.fingerprint != c.fingerprint {
				c.row.Unsettled = true
				settled = false
			}
		}
		cells = next
		if settled {
			break
		}
	}

	keys := make([]string, 0, len(cells))
	for k := range cells {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var toRepair []*cell
	var signals []schemas.Signal
	for _, k := range keys {
		c := cells[k]
		switch {
		case c.row.Unsettled:
			c.row.Drifted = false
			res.Unsettled++
			a.opt.Log.Warn("reconcile: counter moved between observations; left for the next run",
				"tenant", c.row.Tenant, "model", c.row.Model, "quota", c.row.Quota, "period_start", c.row.PeriodStart)
		case c.drifted:
			c.row.Drifted = true
			res.Drifted++
			if a.beyondThreshold(c.row) && !a.opt.DryRun {
				if !c.summary {
					toRepair = append(toRepair, c)
				}
				if !c.minuteCell {
					signals = append(signals, driftSignal(c.row, res.RunID, now))
				}
			}
		}
	}
	// usage_minute repairs are signalled once per model and day, through
	// the summary cell, not once per minute.
	for _, c := range toRepair {
		if c.minuteCell {
			if s := cells[summaryKey(c.row.Model)]; s != nil && !s.drifted && !s.row.Unsettled {
				s.row.Drifted = true
				res.Drifted++
				signals = append(signals, driftSignal(s.row, res.RunID, now))
			}
		}
	}

	// Signals go out before the repair: if publishing fails the counters
	// stay wrong, so the next run finds the drift again and retries both.
	if len(signals) > 0 && a.pub != nil {
		if err := a.pub.Publish(ctx, signals); err != nil {
			return res, fmt.Errorf("audit: publish %d reconciliation_drift signals: %w", len(signals), err)
		}
		res.Signals = len(signals)
	}
	if err := a.repair(ctx, job.Tenant, toRepair, now); err != nil {
		return res, err
	}
	repairedModels := map[string]bool{}
	for _, c := range toRepair {
		c.row.Repaired = true
		res.Repaired++
		if c.minuteCell {
			repairedModels[c.row.Model] = true
		}
	}
	for m := range repairedModels {
		if s := cells[summaryKey(m)]; s != nil {
			s.row.Repaired = true
		}
	}
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

func (a *Auditor) beyondThreshold(r Row) bool {
	if r.Drift == 0 {
		// A usage_minute row whose tokens agree but whose requests or
		// token split do not: always wrong, never a rounding question.
		return true
	}
	return math.Abs(r.Drift) > a.opt.RepairThreshold*math.Max(math.Abs(r.Truth), 1)
}

func anyDrift(cells map[string]*cell) bool {
	for _, c := range cells {
		if c.drifted {
			return true
		}
	}
	return false
}

func summaryKey(model string) string { return "m|" + model + "|summary" }

// equal compares amounts computed two ways (integer tokens, or float costs
// summed in a different order), so costs get a relative tolerance.
func equal(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// observe reads the counters and the truth once and pairs them up.
func (a *Auditor) observe(ctx context.Context, job Job, start, end time.Time) (map[string]*cell, error) {
	t := job.Tenant
	day := job.Period == schemas.PeriodDay
	periods := []string{string(schemas.PeriodMonth)}
	quotas := map[string]bool{string(schemas.QuotaMonthlyTokens): true, string(schemas.QuotaBudget): true}
	if day {
		periods = []string{string(schemas.PeriodDay), string(schemas.PeriodHour)}
		quotas = map[string]bool{string(schemas.QuotaDailyTokens): true, string(schemas.QuotaHourlyTokens): true}
	}
	// Counters first, then the truth: an event that lands in between makes
	// the truth run ahead, never behind, and confirmation sorts it out.
	qrows, err := readQuotaState(ctx, a.conn, t.ID, periods, start, end)
	if err != nil {
		return nil, err
	}
	var mrows []minuteRow
	if day {
		if mrows, err = readUsageMinute(ctx, a.conn, t.ID, start, end); err != nil {
			return nil, err
		}
	}
	tr, err := readTruth(ctx, a.conn, t.ID, start, end, day)
	if err != nil {
		return nil, err
	}

	cells := map[string]*cell{}
	qkey := func(model, quota string, ps time.Time) string {
		return "q|" + model + "|" + quota + "|" + strconv.FormatInt(ps.Unix(), 10)
	}
	for i := range qrows {
		r := &qrows[i]
		if !quotas[r.quota] {
			continue // rate windows are not period totals
		}
		cells[qkey(r.model, r.quota, r.start)] = &cell{quota: r, row: Row{Model: r.model, Quota: r.quota, Period: r.period,
			PeriodStart: r.start, PeriodEnd: r.end, Unit: r.unit, Mode: r.mode, Limit: r.limit, Counter: r.used}}
	}
	// Quotas of the policy whose counter is missing: a counter the
	// aggregator never wrote while events exist is drift too.
	models := []string{policy.AllModels}
	for m := range t.Models {
		if m != policy.AllModels {
			models = append(models, m)
		}
	}
	for _, m := range models {
		for _, q := range t.Quotas(m) {
			if !quotas[string(q.Name)] {
				continue
			}
			for ps := start; ps.Before(end); {
				s, e := policy.PeriodBounds(q.Period, ps, t.Location)
				k := qkey(m, string(q.Name), s)
				if cells[k] == nil {
					cells[k] = &cell{row: Row{Model: m, Quota: string(q.Name), Period: string(q.Period), PeriodStart: s, PeriodEnd: e,
						Unit: string(q.Unit), Mode: string(q.Mode), Limit: q.Limit}}
				}
				ps = e
			}
		}
	}
	for k, c := range cells {
		u := tr.sum(c.row.Model, c.row.PeriodStart, c.row.PeriodEnd)
		c.truth = u
		c.row.Truth = float64(u.tokens())
		if c.row.Quota == string(schemas.QuotaBudget) {
			c.row.Truth = u.cost
		}
		if c.quota == nil && c.row.Truth == 0 {
			delete(cells, k) // nothing counted, nothing used: nothing to compare
			continue
		}
		c.drifted = !equal(c.row.Counter, c.row.Truth)
		c.fingerprint = fmt.Sprintf("%v/%v", c.row.Counter, c.row.Truth)
	}

	if day {
		a.minuteCells(cells, tr, mrows, start, end)
	}
	for _, c := range cells {
		c.row.Tenant = t.ID
		c.row.Drift = c.row.Counter - c.row.Truth
	}
	return cells, nil
}

// minuteCells pairs usage_minute rows with per-minute truth, model by model
// ("*" being all models), and adds one summary cell per model for the day.
func (a *Auditor) minuteCells(cells map[string]*cell, tr truth, mrows []minuteRow, start, end time.Time) {
	type mk struct {
		model string
		at    int64
	}
	counters := map[mk]*minuteRow{}
	for i := range mrows {
		r := &mrows[i]
		counters[mk{r.model, r.minute.Unix()}] = r
	}
	truthAt := map[mk]usage{}
	for model, buckets := range tr {
		for at, u := range buckets {
			for _, m := range []string{model, policy.AllModels} {
				v := truthAt[mk{m, at}]
				v.add(u)
				truthAt[mk{m, at}] = v
			}
		}
	}
	keys := map[mk]bool{}
	for k := range counters {
		keys[k] = true
	}
	for k := range truthAt {
		keys[k] = true
	}
	summaries := map[string]*cell{}
	driftedMinutes := map[string][]string{}
	for k := range keys {
		cu := usage{}
		r := counters[k]
		if r != nil {
			cu = r.u
		}
		tu := truthAt[k]
		at := time.Unix(k.at, 0).UTC()
		c := &cell{minute: r, truth: tu, minuteCell: true, row: Row{Model: k.model, Quota: UsageMinuteQuota, Period: string(schemas.PeriodMinute),
			PeriodStart: at, PeriodEnd: at.Add(time.Minute), Unit: "tokens",
			Counter: float64(cu.tokens()), Truth: float64(tu.tokens())}}
		c.drifted = cu.requests != tu.requests || cu.prompt != tu.prompt || cu.completion != tu.completion || cu.cached != tu.cached
		c.fingerprint = fmt.Sprintf("%d/%d/%d/%d|%d/%d/%d/%d", cu.requests, cu.prompt, cu.completion, cu.cached, tu.requests, tu.prompt, tu.completion, tu.cached)
		cells["m|"+k.model+"|"+strconv.FormatInt(k.at, 10)] = c

		s := summaries[k.model]
		if s == nil {
			s = &cell{summary: true, row: Row{Model: k.model, Quota: UsageMinuteQuota, Period: string(schemas.PeriodDay), PeriodStart: start, PeriodEnd: end, Unit: "tokens"}}
			summaries[k.model] = s
		}
		s.row.Counter += c.row.Counter
		s.row.Truth += c.row.Truth
		if c.drifted {
			driftedMinutes[k.model] = append(driftedMinutes[k.model], strconv.FormatInt(k.at, 10)+"="+c.fingerprint)
		}
	}
	for m, s := range summaries {
		// The summary itself drifts when the day's sums differ; drifted
		// minutes that cancel out are marked through the repair.
		s.drifted = s.row.Counter != s.row.Truth
		sort.Strings(driftedMinutes[m])
		s.fingerprint = fmt.Sprintf("%v/%v|%v", s.row.Counter, s.row.Truth, driftedMinutes[m])
		cells[summaryKey(m)] = s
	}
}

func newRunID(now time.Time) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}
