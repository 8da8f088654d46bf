package helm

import (
	"testing"

	"github.com/sluicehq/sluice/internal/sluiceconfig"
	"github.com/sluicehq/sluice/platform/config"
)

// loadBinaryConfig loads args (after the command) and the environment the
// way `sluice run` and `sluice migrate` do — with the binary's own root
// configuration, defaults and loader — and returns the configuration and
// the service names.
func loadBinaryConfig(args []string, env map[string]string) (sluiceconfig.Config, []string, error) {
	cfg := sluiceconfig.Defaults()
	names, err := sluiceconfig.Load(&cfg, args, func(k string) (string, bool) {
		v, ok := env[k]
		return v, ok
	})
	return cfg, names, err
}

// knownEnv lists the SLUICE_* variables the loader reads.
func knownEnv(t testing.TB) map[string]bool {
	cfg := sluiceconfig.Defaults()
	settings, err := config.Describe(&cfg, "SLUICE")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"SLUICE_CONFIG": true}
	for _, s := range settings {
		if !s.YAMLOnly {
			known[s.Env] = true
		}
	}
	return known
}
