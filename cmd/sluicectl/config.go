package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/platform/config"
)

// loadConfig is config.Load for sluicectl. The file named by -config or
// SLUICE_CONFIG is the services' configuration (see docs/configuration.md),
// which an operator usually has exported already; config.Load would reject
// its services, ops and redis sections as unknown keys. So sluicectl takes
// from that file the top-level sections it shares with the services — the
// keys dst also has: log, clickhouse, kafka, policy — and ignores the
// others, which only the services read; of the services section it takes
// the services dst has (sluicectl reconcile: services.reconciler). Inside a
// shared section an unknown key is still an error naming it. The
// environment and flags override the file, as everywhere.
func loadConfig(dst any, fs *flag.FlagSet, args []string) error {
	return loadConfigEnv(dst, fs, args, os.LookupEnv)
}

func loadConfigEnv(dst any, fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	path, rest := configFlag(args)
	if path == "" {
		path, _ = lookup("SLUICE_CONFIG")
	}
	if path != "" {
		if err := loadShared(path, dst); err != nil {
			return err
		}
	}
	// The file is read: config.Load gets neither -config nor SLUICE_CONFIG,
	// so it does not read it again, strictly.
	hide := func(k string) (string, bool) {
		if k == "SLUICE_CONFIG" {
			return "", false
		}
		return lookup(k)
	}
	return config.Load(dst, config.Options{Args: rest, FlagSet: fs, LookupEnv: hide})
}

// configFlag finds -config (or --config, with = or as the next argument)
// among args and returns its value and the other arguments.
func configFlag(args []string) (path string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return path, append(rest, args[i:]...)
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "config" {
			rest = append(rest, a)
			continue
		}
		if !hasVal && i+1 < len(args) {
			i++
			val = args[i]
		}
		path = val
	}
	return path, rest
}

// loadShared decodes the top-level keys of the YAML file at path that dst
// has into dst and skips the rest.
func loadShared(path string, dst any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: read %s (named by -config or SLUICE_CONFIG): %w", path, err)
	}
	var doc map[string]yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	known := yamlKeys(reflect.TypeOf(dst).Elem())
	shared := map[string]*yaml.Node{}
	for k := range doc {
		if ft, ok := known[k]; ok {
			n := doc[k]
			if k == "services" {
				n = keepKeys(n, yamlKeys(ft))
			}
			shared[k] = &n
		}
	}
	if len(shared) == 0 {
		return nil
	}
	b, err := yaml.Marshal(shared)
	if err != nil {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	return nil
}

// yamlKeys are the YAML keys of struct type t, each with its field's type.
func yamlKeys(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name != "-" && f.IsExported() {
			out[name] = f.Type
		}
	}
	return out
}

// keepKeys returns mapping node n with only the keys in keep.
func keepKeys(n yaml.Node, keep map[string]reflect.Type) yaml.Node {
	if n.Kind != yaml.MappingNode {
		return n
	}
	out := n
	out.Content = nil
	for i := 0; i+1 < len(n.Content); i += 2 {
		if _, ok := keep[n.Content[i].Value]; ok {
			out.Content = append(out.Content, n.Content[i], n.Content[i+1])
		}
	}
	return out
}
