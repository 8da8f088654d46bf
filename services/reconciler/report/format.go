package report

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats lists what Write accepts.
var Formats = []string{"table", "csv", "json"}

// Write writes reports in format: "table" (aligned text for people), "csv"
// (one row per line, total and overage, with a kind column) or "json" (an
// array of Report objects).
func Write(w io.Writer, format string, reports []*Report) error {
	switch format {
	case "table":
		return writeTable(w, reports)
	case "csv":
		return writeCSV(w, reports)
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if reports == nil {
			reports = []*Report{}
		}
		return enc.Encode(reports)
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

// title is a report's first line in a table: whom, by what, when, where.
func title(m *Report) string {
	who := "tenant " + m.Tenant
	if m.By == ByOrganization {
		who = fmt.Sprintf("organization %s (%s)", groupName(m.Organization), strings.Join(m.Tenants, ", "))
	} else if m.By != ByTenant {
		who += " by " + m.By
	}
	when := m.Label()
	if m.Month == "" {
		when = m.Period + " from " + when
	}
	return fmt.Sprintf("%s, %s (%s)", who, when, m.Zone)
}

// groupName shows a level's empty value (usage without a key, user or
// session; tenants without an organization) as such.
func groupName(g string) string {
	if g == "" {
		return "(none)"
	}
	return g
}

func writeTable(w io.Writer, reports []*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for i, m := range reports {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, title(m))
		_, grouped := levelColumn[m.By]
		head := "MODEL\tCURRENCY\tREQUESTS\tPROMPT\tCOMPLETION\tCACHED\tCACHE WRITE\tREASONING\tTOTAL TOKENS\tCOST\tUNPRICED\t"
		if grouped {
			head = strings.ToUpper(m.By) + "\t" + head
		}
		fmt.Fprintln(tw, head)
		for _, l := range append(append([]Line{}, m.Lines...), m.Totals...) {
			if grouped && l.Model == "TOTAL" {
				fmt.Fprint(tw, "\t")
			} else if grouped {
				fmt.Fprint(tw, groupName(l.Group)+"\t")
			}
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

// CSVHeader is the first row Write prints in csv format. month is the
// period's label (Report.Label: the month, or the week's or day's first
// day); period_kind, by, organization and group say what a row counts.
var CSVHeader = []string{"tenant", "month", "zone", "kind", "model", "currency", "requests", "prompt_tokens", "completion_tokens",
	"cached_tokens", "cache_write_tokens", "reasoning_tokens", "total_tokens", "cost", "unpriced_requests", "quota", "period", "period_start", "unit", "used", "limit", "overage",
	"period_kind", "by", "organization", "group"}

func writeCSV(w io.Writer, reports []*Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for _, m := range reports {
		head := []string{m.Tenant, m.Label(), m.Zone}
		for _, set := range []struct {
			kind  string
			lines []Line
		}{{"usage", m.Lines}, {"total", m.Totals}} {
			for _, l := range set.lines {
				row := append(append([]string{}, head...), set.kind, l.Model, l.Currency, u(l.Requests), u(l.PromptTokens),
					u(l.CompletionTokens), u(l.CachedTokens), u(l.CacheWriteTokens), u(l.ReasoningTokens), u(l.TotalTokens), costText(l, "csv"), u(l.UnpricedRequests),
					"", "", "", "", "", "", "", m.Period, m.By, m.Organization, l.Group)
				if err := cw.Write(row); err != nil {
					return err
				}
			}
		}
		for _, o := range m.Overages {
			row := append(append([]string{}, head...), "overage", o.Model, "", "", "", "", "", "", "", "", "", "",
				o.Quota, o.Period, o.PeriodStart.Format(time.RFC3339), o.Unit, num(o.Used), num(o.Limit), num(o.Overage), m.Period, m.By, m.Organization, "")
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}
