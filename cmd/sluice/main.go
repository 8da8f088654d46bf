// Command sluice runs Sluice's services — any or all of them in one process —
// and applies the ClickHouse migrations.
//
//	sluice migrate [flags]            apply ClickHouse migrations (idempotent)
//	sluice run [flags] [service ...]  run the named services (default: the pipeline;
//	                                  the gateway, authz and console run when named)
//	sluice services                   list the services
//
// Configuration comes from a YAML file (-config or SLUICE_CONFIG), SLUICE_*
// environment variables and flags, in increasing precedence; `sluice run -h`
// lists every setting.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/lifecycle"
)

func main() {
	// Stop signals are caught from the start: one that arrives while a
	// service still waits for ClickHouse or migrates ends that wait, and
	// the process says so, instead of dying silently by the signal.
	ctx, stop := lifecycle.OnStopSignal(context.Background())
	err := run(ctx, os.Args[1:])
	signalled := ctx.Err() != nil
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		if signalled {
			fmt.Fprintln(os.Stderr, "sluice: stopped by a signal:", err)
		} else {
			fmt.Fprintln(os.Stderr, "sluice:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: sluice <command> [flags]

commands:
  migrate    apply ClickHouse migrations (safe to repeat)
  run        run services: sluice run [flags] [service ...] (default: all but gateway, authz and console, which run when named)
  demo       the whole pipeline with a mock LLM, sluice gateway in front of it, load and a live view (make run)
  services   list the services this binary can run
  config-reference  print every setting as a Markdown table (docs/configuration.md)
  healthcheck URL   exit 0 if URL answers 2xx (for container healthchecks)

Flags, environment (SLUICE_*) and YAML (-config) are listed by "sluice run -h".`

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "migrate":
		cfg, _, err := loadConfig(args[1:])
		if err != nil {
			return err
		}
		return migrate(ctx, cfg)
	case "run":
		cfg, names, err := loadConfig(args[1:])
		if err != nil {
			return err
		}
		return runServices(ctx, cfg, names)
	case "config-reference":
		return writeReference(os.Stdout)
	case "demo":
		return demo(ctx, args[1:])
	case "services":
		names := make([]string, 0, len(sluiceconfig.Services))
		for _, s := range sluiceconfig.Services {
			names = append(names, fmt.Sprintf("%-11s %s", s.Name, s.About))
		}
		sort.Strings(names)
		fmt.Println(strings.Join(names, "\n"))
		return nil
	case "healthcheck":
		// For container healthchecks in images without curl or wget.
		if len(args) != 2 {
			return errors.New("usage: sluice healthcheck URL")
		}
		return healthcheck(ctx, args[1])
	case "-h", "--help", "help":
		fmt.Println(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func healthcheck(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}
