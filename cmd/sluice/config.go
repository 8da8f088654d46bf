package main

import (
	"os"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
)

// loadConfig reads the configuration from flags, the environment and YAML
// over the defaults; the remaining arguments are service names.
func loadConfig(args []string) (sluiceconfig.Config, []string, error) {
	cfg := sluiceconfig.Defaults()
	names, err := sluiceconfig.Load(&cfg, args, os.LookupEnv)
	return cfg, names, err
}
