package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/pricetable"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/config"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/logging"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/reconciler"
	"github.com/sluicehq/sluice/services/reconciler/audit"
	"github.com/sluicehq/sluice/services/reconciler/progress"
)

func init() {
	register("reconcile", "audit counters against the raw events for a day or month; repair and signal drift", runReconcile)
}

// reconcileConfig is `sluicectl reconcile`'s flags (and SLUICE_* variables).
type reconcileConfig struct {
	Log        logging.Config    `yaml:"log"`
	ClickHouse chconn.Config     `yaml:"clickhouse"`
	Kafka      kafkaconn.Config  `yaml:"kafka"`
	Topics     platform.Topics   `yaml:"topics"`
	SignalAuth signalauth.Config `yaml:"signal_auth"`
	// Services holds the reconciler's own section, services.reconciler,
	// as the services read it.
	Services struct {
		Reconciler reconciler.Config `yaml:"reconciler"`
	} `yaml:"services"`
	Policy platform.FileSource `yaml:"policy" help:"the quota policy the services follow"`
	Tenant string              `yaml:"tenant" help:"tenant to reconcile (empty: every tenant in the policy or with events)"`
	Period schemas.Period      `yaml:"period" help:"hour, day or month"`
	At     string              `yaml:"at" help:"the hour (YYYY-MM-DDTHH), day (YYYY-MM-DD) or month (YYYY-MM) to audit, in the tenant's zone (empty: the last closed one)"`
	DryRun bool                `yaml:"dry_run" help:"report drift without repairing or signalling"`
}

func (c *reconcileConfig) Validate() error {
	errs := []error{c.Log.Validate(), c.ClickHouse.Validate(), c.Kafka.Validate(), c.Topics.Check("signals"), c.SignalAuth.Validate(),
		config.Under("services.reconciler", c.Services.Reconciler.Validate())}
	if c.Period != schemas.PeriodHour && c.Period != schemas.PeriodDay && c.Period != schemas.PeriodMonth {
		errs = append(errs, fmt.Errorf("period: %q is not one of hour, day, month", c.Period))
	}
	return errors.Join(errs...)
}

// loadReconcileConfig reads the flags, the environment and the shared
// sections of SLUICE_CONFIG (see loadConfig).
func loadReconcileConfig(args []string) (reconcileConfig, error) {
	cfg := reconcileConfig{Log: logging.Defaults(), ClickHouse: chconn.Defaults(), Kafka: kafkaconn.Defaults(), Topics: platform.DefaultTopics(), Period: schemas.PeriodDay}
	cfg.Services.Reconciler = reconciler.DefaultConfig()
	cfg.Log.Format = "text"
	fs := flag.NewFlagSet("sluicectl reconcile", flag.ContinueOnError)
	if err := loadConfig(&cfg, fs, args); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func runReconcile(ctx context.Context, args []string) error {
	cfg, err := loadReconcileConfig(args)
	if err != nil {
		return err
	}
	log := logging.New(cfg.Log, os.Stderr)
	pol, err := policyInForce(ctx, cfg, log)
	if err != nil {
		return err
	}
	conn, err := chconn.Open(ctx, cfg.ClickHouse)
	if err != nil {
		return err
	}
	defer conn.Close()

	var pub audit.Publisher
	if len(cfg.Kafka.Brokers) > 0 && !cfg.DryRun {
		cl, err := kafkaconn.NewClient(cfg.Kafka, reconciler.ProducerOptions()...)
		if err != nil {
			return err
		}
		defer cl.Close()
		auth, err := signalauth.Open(cfg.SignalAuth, log)
		if err != nil {
			return err
		}
		pub = &reconciler.KafkaPublisher{Client: cl, Topic: cfg.Topics.Signals, Auth: auth}
	} else if !cfg.DryRun {
		log.Warn("no kafka.brokers configured: drift is repaired and recorded but no reconciliation_drift signal is sent")
	}
	if !cfg.DryRun {
		if n, err := pricetable.Sync(ctx, conn, pol.Prices(), time.Now()); err != nil {
			return err
		} else if n > 0 {
			log.Info("prices table updated from the policy", "rows", n)
		}
	}

	tenants := []string{cfg.Tenant}
	if cfg.Tenant == "" {
		list, err := reconciler.Tenants(ctx, conn, pol, time.Now().AddDate(0, -2, 0))
		if err != nil {
			return err
		}
		tenants = tenants[:0]
		for _, t := range list {
			tenants = append(tenants, t.ID)
		}
	}
	opt := cfg.Services.Reconciler.AuditOptions()
	opt.DryRun = cfg.DryRun
	opt.Log = log
	opt.Unpriced = pol.UnpricedPrice
	a := audit.New(conn, pub, opt)
	bar := progress.New(os.Stderr, "reconcile", len(tenants), progress.Options{Terminal: progress.IsTerminal(os.Stderr), Log: log})
	var (
		results []audit.Result
		errs    []error
	)
	for _, id := range tenants {
		t := pol.Tenant(id)
		at, err := auditDate(cfg.Period, cfg.At, t, time.Now())
		if err != nil {
			return err
		}
		res, err := a.Reconcile(ctx, audit.Job{Tenant: t, Period: cfg.Period, At: at})
		bar.Add(1)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			continue
		}
		results = append(results, res)
	}
	bar.Done()
	printResults(os.Stdout, results)
	return errors.Join(errs...)
}

// auditDate turns --at into an instant inside tenant t's period to audit;
// empty means the last closed hour, day or month (from its billing day)
// in its zone. A month YYYY-MM is the month that begins in it.
func auditDate(period schemas.Period, at string, t *policy.Tenant, now time.Time) (time.Time, error) {
	loc := t.Calendar(period).Location
	lt := now.In(loc)
	if period == schemas.PeriodHour {
		if at == "" {
			// The start: an hour may be shorter than 60 minutes across an
			// offset change (policy.PeriodBounds).
			start, _ := policy.PeriodBounds(schemas.PeriodHour, now.Add(-time.Hour), loc)
			return start, nil
		}
		h, err := time.ParseInLocation("2006-01-02T15", at, loc)
		if err != nil {
			return time.Time{}, fmt.Errorf("at: %q is not an hour YYYY-MM-DDTHH (for example 2026-11-30T14) in the tenant's zone", at)
		}
		return h, nil
	}
	if at == "" {
		if period == schemas.PeriodMonth {
			start, _ := t.PeriodBounds(schemas.PeriodMonth, now)
			return time.Date(start.Year(), start.Month(), start.Day()-1, 12, 0, 0, 0, loc), nil
		}
		return time.Date(lt.Year(), lt.Month(), lt.Day()-1, 12, 0, 0, 0, loc), nil
	}
	if d, err := time.ParseInLocation(time.DateOnly, at, loc); err == nil {
		return time.Date(d.Year(), d.Month(), d.Day(), 12, 0, 0, 0, loc), nil
	}
	if m, err := time.ParseInLocation("2006-01", at, loc); err == nil && period == schemas.PeriodMonth {
		// The noon of the month's last day is in the period that begins in
		// it, whatever the billing day.
		return time.Date(m.Year(), m.Month()+1, 0, 12, 0, 0, 0, loc), nil
	}
	return time.Time{}, fmt.Errorf("at: %q is not a date YYYY-MM-DD (or a month YYYY-MM with -period month)", at)
}

func printResults(w io.Writer, results []audit.Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPERIOD\tSTART\tCHECKED\tDRIFTED\tREPAIRED\tUNSETTLED\tSIGNALS\tRUN")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Tenant, r.Period, r.Start.Format(time.RFC3339), len(r.Rows),
			r.Drifted, r.Repaired, r.Unsettled, r.Signals, r.RunID)
	}
	var drifted []audit.Row
	for _, r := range results {
		for _, row := range r.Rows {
			if row.Drifted || row.Unsettled {
				drifted = append(drifted, row)
			}
		}
	}
	if len(drifted) > 0 {
		fmt.Fprintln(tw, "\nTENANT\tMODEL\tCOUNTER\tPERIOD START\tCOUNTER VALUE\tTRUTH\tDRIFT\tSTATE")
		for _, d := range drifted {
			state := "drift"
			switch {
			case d.Unsettled:
				state = "unsettled"
			case d.Repaired:
				state = "repaired"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%g\t%+g\t%s\n", d.Tenant, d.Model, d.Quota, d.PeriodStart.Format(time.RFC3339),
				d.Counter, d.Truth, d.Drift, state)
		}
	}
	_ = tw.Flush()
}

// openReporting loads the policy (for tenants' zones) and opens ClickHouse,
// for the read-only report commands.
func openReporting(ctx context.Context, policyPath string, ch chconn.Config) (*policy.Policy, driver.Conn, error) {
	pol, err := policy.Load(policyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("load policy (set -policy.file; it gives each tenant's zone): %w", err)
	}
	conn, err := chconn.Open(ctx, ch)
	if err != nil {
		return nil, nil, err
	}
	return pol, conn, nil
}

// policyInForce is the policy file with the admin API's tenants and plans
// laid over it (topics.admin, read to its end), the policy the services
// count and audit under: a tenant made at runtime is audited in its own
// zone and under its own quotas. Without brokers it is the file alone.
func policyInForce(ctx context.Context, cfg reconcileConfig, log *slog.Logger) (*policy.Policy, error) {
	w, err := policy.NewWatcher(cfg.Policy.File, time.Hour, log)
	if err != nil {
		return nil, fmt.Errorf("load policy (set -policy.file, or policy.file in SLUICE_CONFIG): %w", err)
	}
	if len(cfg.Kafka.Brokers) == 0 {
		log.Warn("no kafka.brokers configured: the tenants and plans made through the admin API are not read; tenants only they define are audited under the policy file's defaults")
		return w.Current(), nil
	}
	// The services' followers create a missing admin topic; a command
	// that may only report (-dry_run) must not, and a missing topic holds
	// no tenant to read anyway.
	if ok, err := kafkaconn.TopicExists(ctx, cfg.Kafka, cfg.Topics.Admin); err != nil {
		return nil, fmt.Errorf("topics.admin: %w", err)
	} else if !ok {
		log.Info("the admin topic does not exist, so no tenant or plan was made through the admin API: the policy file alone applies", "topic", cfg.Topics.Admin)
		return w.Current(), nil
	}
	env := platform.Env{Logger: log, Metrics: prometheus.NewRegistry(), Kafka: cfg.Kafka, Topics: cfg.Topics, SignalAuth: cfg.SignalAuth}
	f, stop, err := controlplane.FollowPolicy(ctx, "sluicectl", env, w, nil)
	if err != nil {
		return nil, fmt.Errorf("admin topic (the records are signed: signal_auth must verify them): %w", err)
	}
	defer stop()
	if err := f.CatchUp(ctx); err != nil {
		return nil, fmt.Errorf("read admin topic %s: %w", cfg.Topics.Admin, err)
	}
	return w.Current(), nil
}
