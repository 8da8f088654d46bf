package main

// The policy command compares the policy file's tenants and plans with the
// live records of the admin API (docs/controlplane.md) and applies the
// file to them: the file stays a declarative source for those who keep
// configuration in Git.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	register("policy", "policy diff|apply -policy FILE: the file's tenants and plans against the admin API's live records", runPolicy)
}

const policyUsage = `usage: sluicectl policy <diff|apply> -policy FILE [flags]

  diff    per tenant and plan, what differs between FILE and the live records:
          added (only in the file), changed (each field, live -> file),
          only in the records (apply -prune deletes them)
  apply   write FILE's tenants and plans as records, each with the version
          diff read (a record changed since is refused, not overwritten);
          -prune also deletes the records FILE does not define.
          Afterwards diff shows nothing.

-o json prints the differences as JSON. The enforcer's address and token come
from -url/-token or SLUICE_ADMIN_URL/SLUICE_ADMIN_TOKEN.`

// sectionDiff is how one tenant or plan of the file differs from its
// live record.
type sectionDiff struct {
	Kind adminapi.SectionKind `json:"kind"`
	Name string               `json:"name"`
	// State is added (only in the file), changed, or removed (only in the
	// records).
	State   string            `json:"state"`
	Changes []adminapi.Change `json:"changes,omitempty"`
	// Version is the live record's version the diff read (0: none).
	Version uint64 `json:"version,omitempty"`
	body    json.RawMessage
}

func runPolicy(ctx context.Context, args []string) error { return runPolicyTo(ctx, args, os.Stdout) }

func runPolicyTo(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || (args[0] != "diff" && args[0] != "apply") {
		fmt.Fprintln(os.Stderr, policyUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "help") {
			return flag.ErrHelp
		}
		return errors.New("policy: a verb is required: diff or apply")
	}
	verb := args[0]
	fs := flag.NewFlagSet("policy "+verb, flag.ContinueOnError)
	connect := adminConnFlags(fs, "policy")
	file := fs.String("policy", os.Getenv("SLUICE_POLICY_FILE"), "the policy file (SLUICE_POLICY_FILE)")
	format := fs.String("o", "text", "output: text or json")
	prune := fs.Bool("prune", false, "apply: also delete the records the file does not define")
	reason := fs.String("reason", "", "apply: why (recorded in the audit trail; default: sluicectl policy apply FILE)")
	timeout := fs.Duration("timeout", time.Minute, "time for the whole command")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *file == "" {
		return errors.New("policy " + verb + ": -policy FILE is required")
	}
	if *format != "text" && *format != "json" {
		return fmt.Errorf("policy: -o: %q is not text or json", *format)
	}
	data, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("policy %s: %w", verb, err)
	}
	if _, err := policy.Parse(data, *file); err != nil {
		return fmt.Errorf("policy %s: the file does not validate, so it is not compared: %w", verb, err)
	}
	client, err := connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	diffs, err := policyDiff(ctx, client, data)
	if err != nil {
		return fmt.Errorf("policy %s: %w", verb, err)
	}
	if verb == "apply" {
		why := *reason
		if why == "" {
			why = "sluicectl policy apply " + *file
		}
		return policyApply(ctx, client, diffs, *prune, why, out)
	}
	if *format == "json" {
		return writeJSONTo(out, map[string]any{"differences": nonNil(diffs)})
	}
	return writeDiffText(out, diffs)
}

func nonNil(d []sectionDiff) []sectionDiff {
	if d == nil {
		return []sectionDiff{}
	}
	return d
}

// policyDiff compares the file's plans, then tenants, with the live ones.
func policyDiff(ctx context.Context, c *adminapi.Client, data []byte) ([]sectionDiff, error) {
	file, err := policy.SectionsOf(data)
	if err != nil {
		return nil, err
	}
	var out []sectionDiff
	for _, k := range []adminapi.SectionKind{adminapi.KindPlan, adminapi.KindTenant} {
		want := file.Tenants
		if k == adminapi.KindPlan {
			want = file.Plans
		}
		live, err := c.Sections(ctx, k)
		if err != nil {
			return nil, fmt.Errorf("listing the live %ss: %w", k, err)
		}
		have := map[string]adminapi.Section{}
		for _, s := range live {
			have[s.Name] = s
		}
		for _, name := range sortedNames(want) {
			s, ok := have[name]
			switch {
			case !ok:
				out = append(out, sectionDiff{Kind: k, Name: name, State: "added", Changes: controlplane.Diff(nil, want[name]), body: want[name]})
			default:
				if ch := controlplane.Diff(s.Body, want[name]); len(ch) > 0 {
					out = append(out, sectionDiff{Kind: k, Name: name, State: "changed", Changes: ch, Version: s.Version, body: want[name]})
				}
			}
		}
		for _, s := range live {
			if _, ok := want[s.Name]; !ok {
				out = append(out, sectionDiff{Kind: k, Name: s.Name, State: "removed", Version: s.Version})
			}
		}
	}
	return out, nil
}

func sortedNames(m map[string]json.RawMessage) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// policyApply makes each difference: plans before the tenants that may
// take them, and, with prune, deletes tenants before the plans they take.
func policyApply(ctx context.Context, c *adminapi.Client, diffs []sectionDiff, prune bool, reason string, out io.Writer) error {
	var errs []error
	done := 0
	ordered := slices.Clone(diffs)
	// Deletions last, tenants' first (diffs list plans before tenants).
	slices.SortStableFunc(ordered, func(a, b sectionDiff) int {
		da, db := a.State == "removed", b.State == "removed"
		switch {
		case da && !db:
			return 1
		case !da && db:
			return -1
		case da && db && a.Kind != b.Kind:
			return strings.Compare(string(b.Kind), string(a.Kind)) // tenant before plan
		}
		return 0
	})
	for _, d := range ordered {
		var err error
		switch d.State {
		case "added":
			_, err = c.CreateSection(ctx, d.Kind, adminapi.CreateSectionRequest{Name: d.Name, Body: d.body, Reason: reason})
		case "changed":
			_, err = c.UpdateSection(ctx, d.Kind, d.Name, adminapi.UpdateSectionRequest{Version: d.Version, Body: d.body, Reason: reason})
		case "removed":
			if !prune {
				fmt.Fprintf(out, "%s %s: only in the records, left (-prune deletes it)\n", d.Kind, d.Name)
				continue
			}
			_, err = c.DeleteSection(ctx, d.Kind, d.Name, adminapi.DeleteSectionRequest{Version: d.Version, Reason: reason})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", d.Kind, d.Name, err))
			continue
		}
		done++
		fmt.Fprintf(out, "%s %s: %s\n", d.Kind, d.Name, map[string]string{"added": "created", "changed": "updated", "removed": "deleted"}[d.State])
	}
	fmt.Fprintf(out, "%d change(s) applied, %d refused\n", done, len(errs))
	return errors.Join(errs...)
}

func writeDiffText(out io.Writer, diffs []sectionDiff) error {
	if len(diffs) == 0 {
		_, err := fmt.Fprintln(out, "no differences: the live records define every tenant and plan of the file as it does")
		return err
	}
	for _, d := range diffs {
		what := map[string]string{"added": "only in the file (apply creates it)", "changed": fmt.Sprintf("differs from the live version %d (apply updates it)", d.Version),
			"removed": "only in the records (apply -prune deletes it)"}[d.State]
		fmt.Fprintf(out, "%s %s: %s\n", d.Kind, d.Name, what)
		for _, c := range d.Changes {
			fmt.Fprintf(out, "  %s: %s -> %s\n", c.Field, orNone(c.From), orNone(c.To))
		}
	}
	return nil
}
