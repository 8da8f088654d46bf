// Package config loads a service's configuration struct from, in increasing
// precedence: the defaults already in the struct, a YAML file, environment
// variables and command-line flags, then validates it.
//
// Every leaf field of the struct gets all three spellings from its yaml tag
// path, so a new field is configurable everywhere without registration:
//
//	type Config struct {
//		Kafka struct {
//			Brokers []string `yaml:"brokers" help:"seed brokers"`
//		} `yaml:"kafka"`
//	}
//
// is `kafka: {brokers: [...]}` in YAML, SLUICE_KAFKA_BROKERS=a,b in the
// environment and -kafka.brokers=a,b on the command line. The YAML file is
// named by -config or SLUICE_CONFIG; unknown YAML keys are errors, so a typo
// is caught at start-up instead of silently ignored.
package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Validator is implemented by configuration structs that check themselves.
// Load calls it last, after every source was applied.
type Validator interface {
	Validate() error
}

// Options adjust where Load looks.
type Options struct {
	// EnvPrefix prefixes environment variables; default "SLUICE".
	EnvPrefix string
	// LookupEnv reads the environment; default os.LookupEnv. Tests replace it.
	LookupEnv func(string) (string, bool)
	// Args are the command-line arguments without the program name.
	Args []string
	// FlagSet receives the flags; default a new ContinueOnError set.
	FlagSet *flag.FlagSet
	// Renamed maps settings that no longer exist (dotted YAML paths) to
	// the ones that replaced them. Load refuses an old setting given in
	// the YAML file, as a flag or as its environment variable with an
	// error naming the new one, instead of the bare "unknown field" a
	// renamed setting would otherwise get (or, in the environment,
	// nothing at all).
	Renamed map[string]string
	// Removed maps settings that no longer exist and have no successor to
	// why they went; Load refuses them the same way.
	Removed map[string]string
}

// Load fills dst, a pointer to a struct holding its defaults, from the YAML
// file, the environment and the flags, then calls dst.Validate if it has one.
// It returns flag.ErrHelp when -h was given, after the usage was printed.
func Load(dst any, opts Options) error {
	root := reflect.ValueOf(dst)
	if root.Kind() != reflect.Pointer || root.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: Load needs a pointer to a struct, got %T", dst)
	}
	if opts.EnvPrefix == "" {
		opts.EnvPrefix = "SLUICE"
	}
	if opts.LookupEnv == nil {
		opts.LookupEnv = os.LookupEnv
	}
	fs := opts.FlagSet
	if fs == nil {
		fs = flag.NewFlagSet("sluice", flag.ContinueOnError)
	}

	var leaves, yamlOnly []leaf
	collect(root.Elem(), "", &leaves, &yamlOnly)
	flagged := make([]*pendingFlag, 0, len(leaves))
	for _, l := range leaves {
		p := &pendingFlag{leaf: l}
		flagged = append(flagged, p)
		fs.Var(p, l.path, l.help)
	}
	// Lists and maps (admin tokens, channels …) have no flag; -h still names
	// them, so an operator reading it learns that they exist.
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		if len(yamlOnly) == 0 {
			return
		}
		fmt.Fprintln(out, "\nSettings only in the YAML file given by -config (lists and maps; see docs/configuration.md):")
		for _, l := range yamlOnly {
			fmt.Fprintf(out, "  %s\n    \t%s\n", l.path, l.help)
		}
	}
	configPath := fs.String("config", "", "YAML configuration file (env "+opts.EnvPrefix+"_CONFIG)")
	if err := renamedFlag(opts.Args, opts.Renamed, opts.Removed); err != nil {
		return err
	}
	if err := fs.Parse(opts.Args); err != nil {
		return err
	}

	path := *configPath
	if path == "" {
		path, _ = opts.LookupEnv(opts.EnvPrefix + "_CONFIG")
	}
	if err := renamedEnv(opts.EnvPrefix, opts.LookupEnv, opts.Renamed, opts.Removed); err != nil {
		return err
	}
	if path != "" {
		if err := loadYAML(path, dst, opts.Renamed, opts.Removed); err != nil {
			return err
		}
	}
	for _, l := range leaves {
		name := envName(opts.EnvPrefix, l.path)
		if v, ok := opts.LookupEnv(name); ok {
			if err := l.set(v); err != nil {
				return fmt.Errorf("config: environment %s=%q: %w", name, v, err)
			}
		}
	}
	for _, p := range flagged {
		if p.given {
			if err := p.leaf.set(p.value); err != nil {
				return fmt.Errorf("config: flag -%s=%q: %w", p.leaf.path, p.value, err)
			}
		}
	}
	if v, ok := dst.(Validator); ok {
		if err := v.Validate(); err != nil {
			if path != "" {
				return fmt.Errorf("config (file %s, env, flags): %w", path, err)
			}
			return fmt.Errorf("config: %w", err)
		}
	}
	return nil
}

func loadYAML(path string, dst any, renamed, removed map[string]string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: read %s: %w", path, err)
	}
	if err := renamedYAML(path, data, renamed, removed); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	// An empty file is "no settings", not an error.
	if err := dec.Decode(dst); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config: %s: %w", path, err)
	}
	return nil
}

func envName(prefix, path string) string {
	r := strings.NewReplacer(".", "_", "-", "_")
	return prefix + "_" + strings.ToUpper(r.Replace(path))
}

// leaf is one settable field, addressed by its dotted yaml path.
type leaf struct {
	path string
	help string
	v    reflect.Value
}

var durationType = reflect.TypeOf(time.Duration(0))

// collect appends the settable leaves of v to out and, when yamlOnly is
// not nil, the fields only a YAML file can set to yamlOnly.
//
// A struct field's own help tag (on a section such as a shared
// FileSource) introduces the help of each of its leaves, so that one
// struct type can serve several sections and each still reads right.
func collect(v reflect.Value, prefix string, out, yamlOnly *[]leaf) {
	collectUnder(v, prefix, "", out, yamlOnly)
}

func collectUnder(v reflect.Value, prefix, intro string, out, yamlOnly *[]leaf) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && opts == "inline" && f.Type.Kind() == reflect.Struct {
			// An embedded struct's settings are its parent's, as in YAML.
			collectUnder(v.Field(i), prefix, intro, out, yamlOnly)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		fv := v.Field(i)
		help := joinHelp(intro, f.Tag.Get("help"))
		switch {
		case f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Time{}):
			collectUnder(fv, path, help, out, yamlOnly)
		case settable(f.Type):
			*out = append(*out, leaf{path: path, help: help, v: fv})
		case yamlOnly != nil:
			// Maps, struct slices and pointers are YAML-only: they have no
			// sensible single-string spelling.
			*yamlOnly = append(*yamlOnly, leaf{path: path, help: help, v: fv})
			if et := elemStruct(f.Type); et != nil {
				// The fields of each element, for the reference only.
				collect(reflect.New(et).Elem(), path+"[]", yamlOnly, yamlOnly)
			}
		}
	}
}

// joinHelp puts a section's help before a leaf's.
func joinHelp(intro, help string) string {
	switch {
	case intro == "":
		return help
	case help == "":
		return intro
	}
	return intro + ": " + help
}

// elemStruct is the struct type a list or map of structs holds, or nil.
func elemStruct(t reflect.Type) reflect.Type {
	if t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() == reflect.Struct && t != reflect.TypeOf(time.Time{}) {
		return t
	}
	return nil
}

// Setting describes one setting for a reference document.
type Setting struct {
	// Path is the dotted YAML path; "[]" marks the fields of each element
	// of a list or map (`a.tokens[].name`).
	Path string
	// Env is the environment variable, and the flag is -Path; both empty
	// for a YAML-only setting.
	Env string
	// Default is the value in the struct Describe was given, as the flag
	// package prints it; empty for none.
	Default string
	// Help is the field's help tag.
	Help string
	// YAMLOnly is true for maps, lists of structs and pointers, and the
	// fields of their elements: only the YAML file sets them.
	YAMLOnly bool
}

// Describe lists every setting of dst, a pointer to a struct holding its
// defaults, ordered by path: those Load takes from the environment and
// flags, and those only the YAML file can set, so that a reference built
// from it leaves nothing out.
func Describe(dst any, envPrefix string) ([]Setting, error) {
	root := reflect.ValueOf(dst)
	if root.Kind() != reflect.Pointer || root.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("config: Describe needs a pointer to a struct, got %T", dst)
	}
	if envPrefix == "" {
		envPrefix = "SLUICE"
	}
	var leaves, yamlOnly []leaf
	collect(root.Elem(), "", &leaves, &yamlOnly)
	out := make([]Setting, 0, len(leaves)+len(yamlOnly))
	for _, l := range leaves {
		out = append(out, Setting{Path: l.path, Env: envName(envPrefix, l.path), Default: (&pendingFlag{leaf: l}).String(), Help: l.help})
	}
	for _, l := range yamlOnly {
		def := ""
		if !l.v.IsZero() && l.v.Kind() != reflect.Struct {
			def = fmt.Sprint(l.v.Interface())
		}
		out = append(out, Setting{Path: l.path, Default: def, Help: l.help, YAMLOnly: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func settable(t reflect.Type) bool {
	if t == durationType {
		return true
	}
	switch t.Kind() {
	case reflect.String, reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint32, reflect.Uint64, reflect.Float64:
		return true
	case reflect.Slice:
		return t.Elem().Kind() == reflect.String
	}
	return false
}

func (l leaf) set(s string) error {
	v := l.v
	if v.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 500ms or 2m: %w", err)
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("want an integer: %w", err)
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("want a non-negative integer: %w", err)
		}
		v.SetUint(n)
	case reflect.Float64:
		n, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("want a number: %w", err)
		}
		v.SetFloat(n)
	case reflect.Slice:
		var parts []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
		v.Set(reflect.ValueOf(parts))
	}
	return nil
}

// pendingFlag records a flag's value at parse time; Load applies it after the
// YAML file and the environment so that flags win.
type pendingFlag struct {
	leaf  leaf
	value string
	given bool
}

func (p *pendingFlag) String() string {
	if p == nil || !p.leaf.v.IsValid() {
		return ""
	}
	return fmt.Sprint(p.leaf.v.Interface())
}

func (p *pendingFlag) Set(s string) error {
	// Check the spelling now so -h style errors come from the flag package.
	probe := reflect.New(p.leaf.v.Type()).Elem()
	if err := (leaf{v: probe}).set(s); err != nil {
		return err
	}
	p.value, p.given = s, true
	return nil
}

// IsBoolFlag lets boolean fields be given as a bare -flag.
func (p *pendingFlag) IsBoolFlag() bool { return p.leaf.v.Kind() == reflect.Bool }

// Under names every error err holds (one, or several joined by
// errors.Join) as a setting of the section at path: "listen: ..." becomes
// "services.gateway.listen: ...". A section's Validate names its fields
// relative to itself; the host that knows where the section sits calls
// Under, so that every message names the whole YAML path the same way.
func Under(path string, err error) error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, Under(path, e))
		}
		return errors.Join(out...)
	}
	return fmt.Errorf("%s.%w", path, err)
}
