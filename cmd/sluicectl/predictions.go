package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/internal/quotastatus/chstate"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	register("predictions", "each quota's predicted exhaustion with its range and basis, soonest first (table, json)", runPredictions)
}

// predictionsConfig is `sluicectl predictions`' flags.
type predictionsConfig struct {
	ClickHouse chconn.Config       `yaml:"clickhouse"`
	Policy     platform.FileSource `yaml:"policy" help:"the quota policy, for the quotas not used yet this period (with -all); empty: only quotas with use"`
	Tenant     string              `yaml:"tenant" help:"only this tenant (empty: every tenant)"`
	All        bool                `yaml:"all" help:"list the quotas without a prediction too, after those with one"`
	Format     string              `yaml:"format" help:"output format: table or json"`
}

func (c *predictionsConfig) Validate() error {
	errs := []error{c.ClickHouse.Validate()}
	if c.Format != "table" && c.Format != "json" {
		errs = append(errs, fmt.Errorf("format: %q is not one of table, json", c.Format))
	}
	return errors.Join(errs...)
}

func runPredictions(ctx context.Context, args []string) error {
	return runPredictionsTo(ctx, args, os.Stdout)
}

// runPredictionsTo reads every tenant's standing from the same read model
// as the console and GET /v1/usage (internal/quotastatus, on the
// aggregator's quota_state) and writes the quotas' predictions to w.
func runPredictionsTo(ctx context.Context, args []string, w io.Writer) error {
	cfg := predictionsConfig{ClickHouse: chconn.Defaults(), Format: "table"}
	fs := flag.NewFlagSet("sluicectl predictions", flag.ContinueOnError)
	if err := loadConfig(&cfg, fs, args); err != nil {
		return err
	}
	var current func() *policy.Policy
	if cfg.Policy.File != "" {
		pol, err := policy.Load(cfg.Policy.File)
		if err != nil {
			return fmt.Errorf("policy.file: %w", err)
		}
		current = func() *policy.Policy { return pol }
	}
	conn, err := chconn.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()
	// Flags are not shown: no Redis needed.
	svc := quotastatus.New(chstate.New(conn), nil, current)
	var sts []quotastatus.Status
	if cfg.Tenant != "" {
		st, err := svc.Tenant(ctx, cfg.Tenant)
		if err != nil {
			return err
		}
		sts = []quotastatus.Status{st}
	} else if sts, err = svc.Overview(ctx); err != nil {
		return err
	}
	return writePredictions(w, cfg.Format, time.Now(), sts, cfg.All)
}

// predictionLine is one quota of one tenant, as -format json writes it:
// the usage API's quota fields with the tenant.
type predictionLine struct {
	Tenant string `json:"tenant"`
	quotastatus.Quota
}

// writePredictions writes the quotas with a predicted exhaustion (all of
// them with all), the soonest first, then by tenant, model and quota.
func writePredictions(w io.Writer, format string, now time.Time, sts []quotastatus.Status, all bool) error {
	var lines []predictionLine
	for _, st := range sts {
		for _, q := range st.Quotas {
			if q.PredictedExhaustion != nil || all {
				lines = append(lines, predictionLine{Tenant: st.Tenant, Quota: q})
			}
		}
	}
	sort.SliceStable(lines, func(i, j int) bool {
		a, b := lines[i].PredictedExhaustion, lines[j].PredictedExhaustion
		switch {
		case a != nil && b != nil && !a.Equal(*b):
			return a.Before(*b)
		case (a == nil) != (b == nil):
			return a != nil
		}
		if lines[i].Tenant != lines[j].Tenant {
			return lines[i].Tenant < lines[j].Tenant
		}
		if lines[i].Model != lines[j].Model {
			return lines[i].Model < lines[j].Model
		}
		return lines[i].Quota.Quota < lines[j].Quota.Quota
	})
	if format == "json" {
		if lines == nil {
			lines = []predictionLine{}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(lines)
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tMODEL\tQUOTA\tUSED\tRATE/MIN\tEXHAUSTS (range) BASIS\tAT (UTC)")
	for _, l := range lines {
		at := "-"
		if l.PredictedExhaustion != nil {
			at = l.PredictedExhaustion.UTC().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s/%s\t%.1f%%\t%.0f\t%s\t%s\n", l.Tenant, l.Model, l.Quota.Quota, l.Period, l.UsedPercent,
			l.RatePerMinute, l.Prediction(now), at)
	}
	if len(lines) == 0 {
		fmt.Fprintln(tw, "(no quota is predicted to run out before its period ends)")
	}
	return tw.Flush()
}
