package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/services/reconciler/progress"
	"github.com/sluicehq/sluice/services/reconciler/report"
)

func init() {
	register("report", "usage and cost of one tenant (by key, user or session) or one organization over a month, week or day of its own calendar (table, csv, json)", runReport)
	register("export", "usage and cost of every tenant or organization over a month, week or day (csv, json, table)", runExport)
}

// reportConfig is `sluicectl report`'s and `sluicectl export`'s flags.
type reportConfig struct {
	Log          logging.Config      `yaml:"log"`
	ClickHouse   chconn.Config       `yaml:"clickhouse"`
	Policy       platform.FileSource `yaml:"policy" help:"the quota policy, for each tenant's time zone, week start and organization"`
	Tenant       string              `yaml:"tenant" help:"tenant to report on (report only)"`
	Organization string              `yaml:"organization" help:"organization to report on, with -by organization (report only)"`
	By           string              `yaml:"by" help:"level the usage is grouped by: organization, tenant, key, user or session"`
	Period       string              `yaml:"period" help:"period kind, in each tenant's zone: month (-month), week (from the tenant's week_start) or day (-date)"`
	Month        string              `yaml:"month" help:"calendar month YYYY-MM, with -period month"`
	Date         string              `yaml:"date" help:"a day YYYY-MM-DD of the week or the day reported, with -period week or day"`
	Format       string              `yaml:"format" help:"output format: table, csv or json"`
	Out          string              `yaml:"out" help:"write to this file instead of standard output"`
}

func (c *reportConfig) Validate() error {
	errs := []error{c.Log.Validate(), c.ClickHouse.Validate()}
	if !slices.Contains(report.Levels, c.By) {
		errs = append(errs, fmt.Errorf("by: %q is not one of %s", c.By, strings.Join(report.Levels, ", ")))
	}
	switch {
	case !slices.Contains(report.Periods, c.Period):
		errs = append(errs, fmt.Errorf("period: %q is not one of %s", c.Period, strings.Join(report.Periods, ", ")))
	case c.Period == "month" && c.Month == "":
		errs = append(errs, errors.New("month: is required with -period month, as YYYY-MM"))
	case c.Period == "month" && c.Date != "":
		errs = append(errs, errors.New("date: names a week or a day (-period week or day); a month is named by -month"))
	case c.Period != "month" && c.Date == "":
		errs = append(errs, fmt.Errorf("date: is required with -period %s, as YYYY-MM-DD (a day of it)", c.Period))
	case c.Period != "month" && c.Month != "":
		errs = append(errs, fmt.Errorf("month: names a month (-period month); a %s is named by -date", c.Period))
	default:
		errs = append(errs, c.period().Validate()) // names the month or date and its format
	}
	if !slices.Contains(report.Formats, c.Format) {
		errs = append(errs, fmt.Errorf("format: %q is not one of %s", c.Format, strings.Join(report.Formats, ", ")))
	}
	return errors.Join(errs...)
}

// period is the period the flags name.
func (c *reportConfig) period() report.Period {
	if c.Period == "month" {
		return report.Period{Kind: c.Period, At: c.Month}
	}
	return report.Period{Kind: c.Period, At: c.Date}
}

func loadReportConfig(name, format string, args []string) (reportConfig, error) {
	cfg := reportConfig{Log: logging.Defaults(), ClickHouse: chconn.Defaults(), Policy: platform.FileSource{File: "policy.yaml"},
		By: report.ByTenant, Period: "month", Format: format}
	cfg.Log.Format = "text"
	fs := flag.NewFlagSet("sluicectl "+name, flag.ContinueOnError)
	err := loadConfig(&cfg, fs, args)
	return cfg, err
}

func runReport(ctx context.Context, args []string) error {
	cfg, err := loadReportConfig("report", "table", args)
	if err != nil {
		return err
	}
	byOrg := cfg.By == report.ByOrganization
	switch {
	case byOrg && (cfg.Organization == "" || cfg.Tenant != ""):
		return errors.New("organization: is required with -by organization, and -tenant is not (export reports every organization)")
	case !byOrg && (cfg.Tenant == "" || cfg.Organization != ""):
		return fmt.Errorf("tenant: is required with -by %s, and -organization is not (export reports every tenant)", cfg.By)
	}
	pol, conn, err := openReporting(ctx, cfg.Policy.File, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	if !byOrg {
		r, err := report.Build(ctx, conn, pol.Tenant(cfg.Tenant), cfg.By, cfg.period())
		if err != nil {
			return err
		}
		return writeReport(cfg, []*report.Report{r})
	}
	tenants, err := reportedTenants(ctx, conn, pol, cfg.period())
	if err != nil {
		return err
	}
	teams, err := buildEach(ctx, conn, pol, report.ByTenant, cfg.period(), byOrganization(pol, tenants)[cfg.Organization], nil)
	if err != nil {
		return err
	}
	return writeReport(cfg, []*report.Report{report.Organization(cfg.Organization, teams)})
}

// reportedTenants lists the tenants with events around period (report.Tenants)
// and those the policy names, sorted.
func reportedTenants(ctx context.Context, conn driver.Conn, pol *policy.Policy, period report.Period) ([]string, error) {
	start, end, err := period.Bounds(&policy.Tenant{})
	if err != nil {
		return nil, err
	}
	tenants, err := report.Tenants(ctx, conn, start, end)
	if err != nil {
		return nil, err
	}
	for _, id := range pol.TenantIDs() {
		if !slices.Contains(tenants, id) {
			tenants = append(tenants, id)
		}
	}
	slices.Sort(tenants)
	return tenants, nil
}

// byOrganization groups tenants by their organization ("" for none).
func byOrganization(pol *policy.Policy, tenants []string) map[string][]string {
	out := map[string][]string{}
	for _, id := range tenants {
		org := pol.OrganizationOf(id)
		out[org] = append(out[org], id)
	}
	return out
}

// buildEach builds each tenant's report by level over period, counting
// each built on bar when there is one.
func buildEach(ctx context.Context, conn driver.Conn, pol *policy.Policy, by string, period report.Period, tenants []string, bar *progress.Bar) ([]*report.Report, error) {
	out := make([]*report.Report, 0, len(tenants))
	for _, id := range tenants {
		r, err := report.Build(ctx, conn, pol.Tenant(id), by, period)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
		if bar != nil {
			bar.Add(1)
		}
	}
	return out, nil
}

func runExport(ctx context.Context, args []string) error {
	cfg, err := loadReportConfig("export", "csv", args)
	if err != nil {
		return err
	}
	if cfg.Tenant != "" || cfg.Organization != "" {
		return errors.New("tenant, organization: export reports every tenant or organization; use report for one")
	}
	log := logging.New(cfg.Log, os.Stderr)
	pol, conn, err := openReporting(ctx, cfg.Policy.File, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	tenants, err := reportedTenants(ctx, conn, pol, cfg.period())
	if err != nil {
		return err
	}
	bar := progress.New(os.Stderr, "export "+cfg.period().At, len(tenants), progress.Options{Terminal: progress.IsTerminal(os.Stderr), Log: log})
	by := cfg.By
	if by == report.ByOrganization {
		by = report.ByTenant
	}
	all, err := buildEach(ctx, conn, pol, by, cfg.period(), tenants, bar)
	bar.Done()
	if err != nil {
		return err
	}
	reports := make([]*report.Report, 0, len(all))
	if cfg.By == report.ByOrganization {
		orgs := byOrganization(pol, tenants)
		for _, org := range slices.Sorted(maps.Keys(orgs)) {
			var teams []*report.Report
			for _, r := range all {
				if slices.Contains(orgs[org], r.Tenant) {
					teams = append(teams, r)
				}
			}
			if r := report.Organization(org, teams); len(r.Lines) > 0 {
				reports = append(reports, r)
			}
		}
		return writeReport(cfg, reports)
	}
	for _, r := range all {
		if len(r.Lines) > 0 || len(r.Overages) > 0 {
			reports = append(reports, r)
		}
	}
	return writeReport(cfg, reports)
}

func writeReport(cfg reportConfig, reports []*report.Report) error {
	if cfg.Out == "" {
		return report.Write(os.Stdout, cfg.Format, reports)
	}
	f, err := os.Create(cfg.Out)
	if err != nil {
		return fmt.Errorf("out: %w", err)
	}
	if err := report.Write(f, cfg.Format, reports); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
