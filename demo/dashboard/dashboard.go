// Package dashboard is the demo's live view: for each tenant, the quota
// closest to its limit (used %, rate, predicted exhaustion with its
// range), the breaker a
// gateway sees, how its requests were answered, what admission decided
// before the calls and the alerts firing —
// redrawn in place on a terminal, or as plain log lines when output is not
// one.
package dashboard

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/quotastatus"
)

// Row is one tenant x model line of the view.
type Row struct {
	Tenant, Model string
	Quota, Period string
	Used, Limit   float64
	RatePerMinute float64
	// Exhaustion is the predicted time the quota runs out; zero if none.
	// ExhaustionEarliest and ExhaustionLatest bound it (zero: no bound;
	// a zero latest means the quota may well last its period), and
	// ExhaustionBasis says what it rests on ("rates" in the first minutes
	// of traffic, then "forecast").
	Exhaustion                           time.Time
	ExhaustionEarliest, ExhaustionLatest time.Time
	ExhaustionBasis                      string
	// Breaker is what a gateway's Checker decides now: "closed", or the
	// refusing flag's kind and quota.
	Breaker string
	// Served and Refused count the load generator's answers.
	Served, Refused int64
	// Admitted and AdmissionRefused count the gateway's admission
	// decisions before the call (limits checked in Redis); RefusedBy is
	// the rule of the latest refusal.
	Admitted, AdmissionRefused int64
	RefusedBy                  string
	// Alerts lists the alerts firing for the tenant in Alertmanager.
	Alerts []string
	// Priority is the tenant's class; Fallback counts its answers served
	// by a cheaper model than it asked for.
	Priority string
	Fallback int64
}

// Upstream is one guarded upstream's line: its adaptive concurrency limit
// (and how often it moved), calls in flight, the priority queue per
// class (critical, high, normal, low), degradation and breaker.
type Upstream struct {
	Name              string
	Limit, Changes    int
	InFlight          int
	Waiting           [4]int
	Admitted, Refused [4]uint64
	Level             int
	Breaker           string
	Load              float64
}

// UpstreamSource is a Source that also shows guarded upstreams.
type UpstreamSource interface {
	Upstreams() []Upstream
}

// UsedPercent is Used over Limit, in percent.
func (r Row) UsedPercent() float64 {
	if r.Limit <= 0 {
		return 0
	}
	return 100 * r.Used / r.Limit
}

// Source produces the rows; the demo combines ClickHouse quota state, the
// Checker, the load generator and Alertmanager.
type Source interface {
	Rows(ctx context.Context) ([]Row, error)
}

// Run redraws every interval until ctx ends. On a terminal it repaints the
// screen; otherwise it writes a block of log lines every logEvery. A
// source that is a Noter has its notes printed under the table on a
// terminal, and each once, when reached, otherwise.
func Run(ctx context.Context, w io.Writer, src Source, tty bool, interval, logEvery time.Duration, now func() time.Time) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastLog time.Time
	printed := 0 // notes already written, in plain mode
	for {
		rows, err := src.Rows(ctx)
		var notes []string
		if n, ok := src.(Noter); ok {
			notes = n.Notes()
		}
		switch {
		case err != nil && ctx.Err() == nil:
			fmt.Fprintf(w, "dashboard: %v\n", err)
		case tty:
			fmt.Fprint(w, "\033[H\033[2J")
			Render(w, rows, now())
			renderUpstreams(w, src)
			for _, n := range notes {
				fmt.Fprintln(w, n)
			}
		case now().Sub(lastLog) >= logEvery:
			Render(w, rows, now())
			renderUpstreams(w, src)
			lastLog = now()
		}
		// In plain mode a note is written once, as soon as it is reached,
		// not at the next block.
		if !tty {
			for ; printed < len(notes); printed++ {
				fmt.Fprintln(w, notes[printed])
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			// A select with both ready picks either: a tick must not
			// start another refresh after the end.
			if ctx.Err() != nil {
				return nil
			}
		}
	}
}

// Render writes the table.
func Render(w io.Writer, rows []Row, now time.Time) {
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Tenant != rows[j].Tenant {
			return rows[i].Tenant < rows[j].Tenant
		}
		return rows[i].Model < rows[j].Model
	})
	fmt.Fprintf(w, "Sluice demo — %s   (Ctrl-C stops everything)\n\n", now.UTC().Format("15:04:05 MST"))
	fmt.Fprintf(w, "%-10s %-8s %-8s %-20s %7s %-22s %11s %-24s %-26s %8s %8s %8s  %-24s  %s\n",
		"TENANT", "PRIORITY", "MODEL", "QUOTA", "USED", "", "RATE/MIN", "EXHAUSTS (range)", "GATEWAY", "SERVED", "FALLBACK", "REFUSED", "ADMISSION ok/refused", "ALERTS")
	for _, r := range rows {
		exh := exhausts(r, now)
		adm := fmt.Sprintf("%d/%d", r.Admitted, r.AdmissionRefused)
		if r.RefusedBy != "" {
			adm += " " + r.RefusedBy
		}
		fmt.Fprintf(w, "%-10s %-8s %-8s %-20s %6.1f%% %-22s %11.0f %-24s %-26s %8d %8d %8d  %-24s  %s\n",
			clip(r.Tenant, 10), clip(r.Priority, 8), clip(r.Model, 8), clip(r.Quota+"/"+r.Period, 20), r.UsedPercent(), bar(r.UsedPercent(), 20),
			r.RatePerMinute, exh, clip(r.Breaker, 26), r.Served, r.Fallback, r.Refused, clip(adm, 24), strings.Join(r.Alerts, ","))
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "(waiting for the first aggregates...)")
	}
	fmt.Fprintln(w)
}

// exhausts is the EXHAUSTS cell: "-" without a prediction, "now" once it
// is due, else the time left and its range, "in 1m5s (50s-1m40s)", with
// an open end when the quota may well last its period ("(50s-)"), as the
// console and sluicectl write it (quotastatus.Quota.Prediction).
func exhausts(r Row, now time.Time) string {
	var q quotastatus.Quota
	if !r.Exhaustion.IsZero() {
		q.PredictedExhaustion = &r.Exhaustion
		if !r.ExhaustionEarliest.IsZero() {
			q.PredictedEarliest = &r.ExhaustionEarliest
		}
		if !r.ExhaustionLatest.IsZero() {
			q.PredictedLatest = &r.ExhaustionLatest
		}
	}
	return q.Prediction(now)
}

func renderUpstreams(w io.Writer, src Source) {
	if us, ok := src.(UpstreamSource); ok {
		RenderUpstreams(w, us.Upstreams())
	}
}

// RenderUpstreams writes the guarded upstreams' lines: the adaptive
// limit, the queue and refusals per class (critical/high/normal/low) —
// low is shed first — and degradation.
func RenderUpstreams(w io.Writer, ups []Upstream) {
	if len(ups) == 0 {
		return
	}
	fmt.Fprintf(w, "%-10s %6s %7s %8s  %-19s  %-27s  %-27s  %5s %4s  %s\n",
		"UPSTREAM", "LIMIT", "MOVED", "INFLIGHT", "WAITING c/h/n/l", "ADMITTED c/h/n/l", "REFUSED c/h/n/l", "LOAD", "LVL", "BREAKER")
	for _, u := range ups {
		fmt.Fprintf(w, "%-10s %6d %6dx %8d  %-19s  %-27s  %-27s  %4.0f%% %4d  %s\n",
			clip(u.Name, 10), u.Limit, u.Changes, u.InFlight, byClass(u.Waiting[:]), byClass(u.Admitted[:]), byClass(u.Refused[:]),
			100*u.Load, u.Level, u.Breaker)
	}
	fmt.Fprintln(w)
}

// byClass writes four counts, critical first.
func byClass[T int | uint64](v []T) string {
	return fmt.Sprintf("%d/%d/%d/%d", v[0], v[1], v[2], v[3])
}

func bar(pct float64, width int) string {
	n := int(pct / 100 * float64(width))
	n = max(0, min(n, width))
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
