package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/services/reconciler/progress"
	"github.com/sluicehq/sluice/services/reconciler/report"
)

func init() {
	register("report", "usage and cost of one tenant for a month, in its own zone (table, csv, json)", runReport)
	register("export", "usage and cost of every tenant for a month (csv, json, table)", runExport)
}

// reportConfig is `sluicectl report`'s and `sluicectl export`'s flags.
type reportConfig struct {
	Log        logging.Config      `yaml:"log"`
	ClickHouse chconn.Config       `yaml:"clickhouse"`
	Policy     platform.FileSource `yaml:"policy" help:"the quota policy, for each tenant's time zone"`
	Tenant     string              `yaml:"tenant" help:"tenant to report on (report only)"`
	Month      string              `yaml:"month" help:"calendar month YYYY-MM, in each tenant's zone"`
	Format     string              `yaml:"format" help:"output format: table, csv or json"`
	Out        string              `yaml:"out" help:"write to this file instead of standard output"`
}

func (c *reportConfig) Validate() error {
	errs := []error{c.Log.Validate(), c.ClickHouse.Validate()}
	if c.Month == "" {
		errs = append(errs, errors.New("month: is required, as YYYY-MM"))
	} else if _, _, err := report.ParseMonth(c.Month, nil); err != nil {
		errs = append(errs, err) // names the month and the format
	}
	if !slices.Contains(report.Formats, c.Format) {
		errs = append(errs, fmt.Errorf("format: %q is not one of %s", c.Format, strings.Join(report.Formats, ", ")))
	}
	return errors.Join(errs...)
}

func loadReportConfig(name, format string, args []string) (reportConfig, error) {
	cfg := reportConfig{Log: logging.Defaults(), ClickHouse: chconn.Defaults(), Policy: platform.FileSource{File: "policy.yaml"}, Format: format}
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
	if cfg.Tenant == "" {
		return errors.New("tenant: is required (export reports every tenant)")
	}
	pol, conn, err := openReporting(ctx, cfg.Policy.File, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	m, err := report.Monthly(ctx, conn, cfg.Tenant, cfg.Month, pol.Tenant(cfg.Tenant).Location)
	if err != nil {
		return err
	}
	return writeReport(cfg, []*report.Month{m})
}

func runExport(ctx context.Context, args []string) error {
	cfg, err := loadReportConfig("export", "csv", args)
	if err != nil {
		return err
	}
	log := logging.New(cfg.Log, os.Stderr)
	pol, conn, err := openReporting(ctx, cfg.Policy.File, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	start, end, _ := report.ParseMonth(cfg.Month, nil)
	tenants, err := report.Tenants(ctx, conn, start, end)
	if err != nil {
		return err
	}
	for _, id := range pol.TenantIDs() {
		if !slices.Contains(tenants, id) {
			tenants = append(tenants, id)
		}
	}
	slices.Sort(tenants)
	bar := progress.New(os.Stderr, "export "+cfg.Month, len(tenants), progress.Options{Terminal: progress.IsTerminal(os.Stderr), Log: log})
	months := make([]*report.Month, 0, len(tenants))
	for _, id := range tenants {
		m, err := report.Monthly(ctx, conn, id, cfg.Month, pol.Tenant(id).Location)
		if err != nil {
			return err
		}
		if len(m.Lines) > 0 || len(m.Overages) > 0 {
			months = append(months, m)
		}
		bar.Add(1)
	}
	bar.Done()
	return writeReport(cfg, months)
}

func writeReport(cfg reportConfig, months []*report.Month) error {
	if cfg.Out == "" {
		return report.Write(os.Stdout, cfg.Format, months)
	}
	f, err := os.Create(cfg.Out)
	if err != nil {
		return fmt.Errorf("out: %w", err)
	}
	if err := report.Write(f, cfg.Format, months); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
