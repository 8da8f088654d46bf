package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	register("prices", "prices import FILE: validate a price catalog file and install it as the policy's prices_file", runPrices)
}

// pricesConfig is `sluicectl prices import`'s flags.
type pricesConfig struct {
	Policy platform.FileSource `yaml:"policy" help:"the quota policy the services follow; its prices_file is where the import goes"`
	DryRun bool                `yaml:"dry_run" help:"validate FILE and say where it would go, without writing"`
}

func (c *pricesConfig) Validate() error {
	if c.Policy.File == "" {
		return errors.New("policy.file: required: the policy whose prices_file receives the import")
	}
	return nil
}

func runPrices(ctx context.Context, args []string) error { return runPricesTo(ctx, args, os.Stdout) }

// runPricesTo runs `sluicectl prices import FILE`. The running services
// read prices from the policy (policy package, "Prices"), and a prices
// file is one of its layers: the import validates FILE as a catalog,
// then replaces the file the policy's prices_file names, atomically (a
// rename), so every service's policy watcher reloads it as it would an
// edit of the policy and no reader ever sees half a file.
func runPricesTo(_ context.Context, args []string, w io.Writer) error {
	if len(args) < 2 || args[0] != "import" {
		return errors.New("usage: sluicectl prices import [-policy.file POLICY] [-dry_run] FILE")
	}
	src, flags := args[len(args)-1], args[1:len(args)-1]
	cfg := pricesConfig{}
	fs := flag.NewFlagSet("sluicectl prices import", flag.ContinueOnError)
	if err := loadConfig(&cfg, fs, flags); err != nil {
		return err
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("prices import: %w", err)
	}
	cat, err := policy.ParseCatalog(data, src)
	if err != nil {
		return err
	}
	polData, err := os.ReadFile(cfg.Policy.File)
	if err != nil {
		return fmt.Errorf("policy.file: %w", err)
	}
	dst, err := policy.PricesFileOf(polData, cfg.Policy.File)
	if err != nil {
		return err
	}
	if dst == "" {
		return fmt.Errorf("policy %s names no prices_file: add `prices_file: prices.yaml` to it (relative to the policy), then import again", cfg.Policy.File)
	}
	prices := cat.Prices()
	models := map[string]bool{}
	for _, p := range prices {
		models[p.Model] = true
	}
	if cfg.DryRun {
		fmt.Fprintf(w, "%s is valid: %d prices of %d models as of %s; would replace %s (dry run)\n", src, len(prices), len(models), cat.AsOf.Format("2006-01-02"), dst)
		return nil
	}
	if err := writeAtomically(dst, data); err != nil {
		return fmt.Errorf("prices import: %w", err)
	}
	// The services keep their previous policy if the whole no longer
	// parses; say so now rather than leave it to their logs.
	if _, err := policy.Load(cfg.Policy.File); err != nil {
		return fmt.Errorf("prices written to %s, but the policy does not load with them (the services keep the previous prices): %w", dst, err)
	}
	fmt.Fprintf(w, "imported %d prices of %d models as of %s into %s; services following %s reload them with the policy\n",
		len(prices), len(models), cat.AsOf.Format("2006-01-02"), dst, cfg.Policy.File)
	return nil
}

// writeAtomically replaces path with data through a temporary file in
// the same folder and a rename.
func writeAtomically(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: nothing left to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
