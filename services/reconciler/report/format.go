package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// Formats lists what Write accepts.
var Formats = []string{"table", "csv", "json"}

// Write writes months in format: "table" (aligned text for people), "csv"
// (one row per line, total and overage, with a kind column) or "json" (an
// array of Month objects).
func Write(w io.Writer, format string, months []*Month) error {
	switch format {
	case "table":
		return writeTable(w, months)
	case "csv":
		return writeCSV(w, months)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if months == nil {
			months = []*Month{}
		}
		return enc.Encode(months)
	}
	return fmt.Errorf("format %q: use one of table, csv, json", format)
}

func currencyName(c string) string {
	if c == "" {
		return "(unpriced)"
	}
	return c
}

// costText is a line's cost for people: usage no price covered is its own
// line, and its cost reads "unpriced", never a 0 a reader would take for
// free (the pipeline counted it at the policy's unpriced_price, if any:
// policy package, "Prices").
func costText(l Line, format string) string {
	if l.Currency == "" {
		if format == "csv" {
			return ""
		}
		return "unpriced"
	}
	if format == "csv" {
		return num(l.Cost)
	}
	return fmt.Sprintf("%.6f", l.Cost)
}

func writeTable(w io.Writer, months []*Month) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, m := range months {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "tenant %s, %s (%s)\n", m.Tenant, m.Month, m.Zone)
		fmt.Fprintln(tw, "MODEL\tCURRENCY\tREQUESTS\tPROMPT\tCOMPLETION\tCACHED\tCACHE WRITE\tREASONING\tTOTAL TOKENS\tCOST\tUNPRICED\t")
		for _, l := range append(append([]Line{}, m.Lines...), m.Totals...) {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t\n", l.Model, currencyName(l.Currency), l.Requests, l.PromptTokens,
				l.CompletionTokens, l.CachedTokens, l.CacheWriteTokens, l.ReasoningTokens, l.TotalTokens, costText(l, "table"), l.UnpricedRequests)
		}
		if len(m.Overages) > 0 {
			fmt.Fprintln(tw, "SOFT-QUOTA OVERAGE\tQUOTA\tPERIOD START\tUSED\tLIMIT\tOVERAGE\tUNIT\t")
			for _, o := range m.Overages {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", o.Model, o.Quota, o.PeriodStart.Format("2006-01-02 15:04"),
					num(o.Used), num(o.Limit), num(o.Overage), o.Unit)
			}
		}
	}
	return tw.Flush()
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// CSVHeader is the first row Write prints in csv format.
var CSVHeader = []string{"tenant", "month", "zone", "kind", "model", "currency", "requests", "prompt_tokens", "completion_tokens",
	"cached_tokens", "cache_write_tokens", "reasoning_tokens", "total_tokens", "cost", "unpriced_requests", "quota", "period", "period_start", "unit", "used", "limit", "overage"}

func writeCSV(w io.Writer, months []*Month) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for _, m := range months {
		for _, set := range []struct {
			kind  string
			lines []Line
		}{{"usage", m.Lines}, {"total", m.Totals}} {
			for _, l := range set.lines {
				if err := cw.Write([]string{m.Tenant, m.Month, m.Zone, set.kind, l.Model, l.Currency, u(l.Requests), u(l.PromptTokens),
					u(l.CompletionTokens), u(l.CachedTokens), u(l.CacheWriteTokens), u(l.ReasoningTokens), u(l.TotalTokens), costText(l, "csv"), u(l.UnpricedRequests), "", "", "", "", "", "", ""}); err != nil {
					return err
				}
			}
		}
		for _, o := range m.Overages {
			if err := cw.Write([]string{m.Tenant, m.Month, m.Zone, "overage", o.Model, "", "", "", "", "", "", "", "", "", "",
				o.Quota, o.Period, o.PeriodStart.Format(time.RFC3339), o.Unit, num(o.Used), num(o.Limit), num(o.Overage)}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
