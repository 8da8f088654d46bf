// Comparison: each counter against its truth, confirmed over repeated
// observations, and the verdict on which cells drifted, which moved
// (unsettled), which to repair and which to signal.

package audit

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

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
	billed      bool // a token quota counting billed-equivalent tokens
	// summary is a model's usage_minute day total: it is signalled, and
	// repaired through its minutes.
	summary bool
}

// minuteCells pairs usage_minute rows with per-minute truth, model by model
// ("*" being all models), and adds one summary cell per model for the
// job's period (a day or an hour).
func (a *Auditor) minuteCells(cells map[string]*cell, tr truth, mrows []minuteRow, period schemas.Period, start, end time.Time) {
	type mk struct {
		model string
		at    int64
	}
	counters := map[mk]*minuteRow{}
	own := map[string]bool{}
	for i := range mrows {
		r := &mrows[i]
		counters[mk{r.model, r.minute.Unix()}] = r
		own[r.model] = true
	}
	// The aggregator counts a tenant's models beyond its max_models as
	// model "other" (policy package, "Model cardinality") while their raw
	// events keep the real names. When the counters have "other" rows, the
	// truth of every model without rows of its own belongs to "other";
	// comparing it model by model would call every folded model and
	// "other" drift, and a repair would undo the fold.
	fold := own[policy.OtherModel]
	truthAt := map[mk]usage{}
	for model, buckets := range tr {
		counted := model
		if fold && !own[model] {
			counted = policy.OtherModel
		}
		for at, u := range buckets {
			for _, m := range []string{counted, policy.AllModels} {
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
		c.drifted = cu.counts() != tu.counts()
		c.fingerprint = fmt.Sprintf("%v|%v", cu.counts(), tu.counts())
		cells["m|"+k.model+"|"+strconv.FormatInt(k.at, 10)] = c

		s := summaries[k.model]
		if s == nil {
			s = &cell{summary: true, row: Row{Model: k.model, Quota: UsageMinuteQuota, Period: string(period), PeriodStart: start, PeriodEnd: end, Unit: "tokens"}}
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

// confirm observes until a drift is believed: a cell that drifted must
// show the same counter and truth in two observations ConfirmDelay apart.
// A drifted cell that changed between them is marked unsettled; after
// MaxObservations the cells are returned as they stand.
func (a *Auditor) confirm(ctx context.Context, job Job, start, end time.Time) (map[string]*cell, error) {
	cells, err := a.observe(ctx, job, start, end)
	if err != nil {
		return nil, err
	}
	for n := 2; n <= a.opt.MaxObservations && anyDrift(cells); n++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(a.opt.ConfirmDelay):
		}
		next, err := a.observe(ctx, job, start, end)
		if err != nil {
			return nil, err
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
	return cells, nil
}

// verdict is what the comparison decided to do about the cells.
type verdict struct {
	repair  []*cell
	signals []schemas.Signal
}

// judge marks each cell drifted or unsettled, counts them into res, and
// picks the cells to repair and the signals to send: drift beyond the
// threshold, unless this is a dry run. usage_minute drift is signalled
// once per model and day, through the summary cell, not once per minute;
// the summary is repaired through its minutes.
func (a *Auditor) judge(cells map[string]*cell, keys []string, res *Result, now time.Time) verdict {
	var v verdict
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
					v.repair = append(v.repair, c)
				}
				if !c.minuteCell {
					v.signals = append(v.signals, driftSignal(c.row, res.RunID, now))
				}
			}
		}
	}
	for _, c := range v.repair {
		if c.minuteCell {
			if s := cells[summaryKey(c.row.Model)]; s != nil && !s.drifted && !s.row.Unsettled {
				s.row.Drifted = true
				res.Drifted++
				v.signals = append(v.signals, driftSignal(s.row, res.RunID, now))
			}
		}
	}
	return v
}

// markRepaired marks the repaired cells, and the summary cell of every
// model whose minutes were repaired, and counts them into res.
func markRepaired(cells map[string]*cell, repaired []*cell, res *Result) {
	models := map[string]bool{}
	for _, c := range repaired {
		c.row.Repaired = true
		res.Repaired++
		if c.minuteCell {
			models[c.row.Model] = true
		}
	}
	for m := range models {
		if s := cells[summaryKey(m)]; s != nil {
			s.row.Repaired = true
		}
	}
}

// beyondThreshold reports whether r's drift is worth a repair and a
// signal: above RepairThreshold of the truth (of 1 when the truth is 0).
func (a *Auditor) beyondThreshold(r Row) bool {
	if r.Drift == 0 {
		// A usage_minute row whose tokens agree but whose requests or
		// token split do not: always wrong, never a rounding question.
		return true
	}
	return math.Abs(r.Drift) > a.opt.RepairThreshold*math.Max(math.Abs(r.Truth), 1)
}

// anyDrift reports whether any cell drifted in this observation.
func anyDrift(cells map[string]*cell) bool {
	for _, c := range cells {
		if c.drifted {
			return true
		}
	}
	return false
}

// summaryKey is the cell key of model's usage_minute day summary.
func summaryKey(model string) string { return "m|" + model + "|summary" }

// equal compares amounts computed two ways (integer tokens, or float costs
// summed in a different order), so costs get a relative tolerance.
func equal(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// sortedKeys returns the cell keys in order, so runs report, repair and
// signal in the same order every time.
func sortedKeys(cells map[string]*cell) []string {
	keys := make([]string, 0, len(cells))
	for k := range cells {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
