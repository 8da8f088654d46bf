package main

// The tenants and plans commands manage the tenants and plans the
// enforcer's admin API keeps as records (docs/controlplane.md): list, get,
// create (a tenant -from a plan), update, delete, audit. Every service
// following the admin topic lays them over its policy file within seconds.

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
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/policy"
)

func init() {
	register("tenants", "tenants managed at runtime: list, get, create (-from a plan), update, delete, audit (versioned, audited)",
		func(ctx context.Context, args []string) error {
			return runSectionsTo(ctx, adminapi.KindTenant, args, os.Stdout)
		})
	register("plans", "plans (tenant templates) managed at runtime: list, get, create, update, delete, audit",
		func(ctx context.Context, args []string) error {
			return runSectionsTo(ctx, adminapi.KindPlan, args, os.Stdout)
		})
}

const sectionsUsage = `usage: sluicectl %[1]ss <verb> [NAME] [flags]

verbs:
  list     list the %[1]ss in force
  get      NAME: one %[1]s, its section as JSON and its version
  create   NAME -reason WHY [-body JSON|YAML] [-file FILE]%[2]s
  update   NAME -version N -reason WHY -body JSON|YAML | -file FILE: replace its section
  delete   NAME -version N -reason WHY
  audit    NAME: its audit trail, each change with the fields it changed

The section is the %[1]s's settings exactly as under %[1]ss: in the policy
file (limits, models, budget, timezone, plan, fail_mode, priority, ...).
-version is the version get or list shows: a change that read an older
version is refused (another operator changed it since).
-o json prints the API's answer as JSON (default: text).
The enforcer's address and token come from -url/-token or SLUICE_ADMIN_URL/SLUICE_ADMIN_TOKEN.`

type sectionsFlags struct {
	out, body, file, from, reason string
	version                       uint64
}

var sectionVerbs = []string{"list", "get", "create", "update", "delete", "audit"}

func runSectionsTo(ctx context.Context, kind adminapi.SectionKind, args []string, out io.Writer) error {
	cmd := string(kind) + "s"
	if len(args) == 0 || args[0] == "-h" || args[0] == "help" {
		from := ""
		if kind == adminapi.KindTenant {
			from = " [-from PLAN]: starts from the plan's section"
		}
		fmt.Fprintf(os.Stderr, sectionsUsage+"\n", kind, from)
		if len(args) == 0 {
			return errors.New(cmd + ": a verb is required")
		}
		return flag.ErrHelp
	}
	verb, rest := args[0], args[1:]
	if !slices.Contains(sectionVerbs, verb) {
		return fmt.Errorf("%s: unknown verb %q; the verbs are %s (sluicectl %s help)", cmd, verb, strings.Join(sectionVerbs, ", "), cmd)
	}
	var name string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	fs := flag.NewFlagSet(cmd+" "+verb, flag.ContinueOnError)
	connect := adminConnFlags(fs, cmd)
	var f sectionsFlags
	fs.StringVar(&f.out, "o", "text", "output: text or json")
	fs.StringVar(&f.body, "body", "", "create, update: the section, JSON or YAML")
	fs.StringVar(&f.file, "file", "", "create, update: a file holding the section, JSON or YAML")
	fs.StringVar(&f.from, "from", "", "tenants create: the plan to start from")
	fs.Uint64Var(&f.version, "version", 0, "update, delete: the version you read (get or list shows it)")
	fs.StringVar(&f.reason, "reason", "", "why (required for changes; recorded in the audit trail)")
	timeout := fs.Duration("timeout", 15*time.Second, "request timeout")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if f.out != "text" && f.out != "json" {
		return fmt.Errorf("%s: -o: %q is not text or json", cmd, f.out)
	}
	if verb != "list" && name == "" {
		return fmt.Errorf("%s %s: the name is required (sluicectl %s %s NAME ...)", cmd, verb, cmd, verb)
	}
	body, err := sectionFlagBody(f)
	if err != nil {
		return fmt.Errorf("%s %s: %w", cmd, verb, err)
	}
	client, err := connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	answer, err := sectionsCall(ctx, client, kind, verb, name, body, f)
	if err != nil {
		return fmt.Errorf("%s %s: %w", cmd, verb, err)
	}
	if f.out == "json" {
		return writeJSONTo(out, answer)
	}
	return writeSectionsText(out, answer)
}

// sectionFlagBody reads -body or -file.
func sectionFlagBody(f sectionsFlags) (json.RawMessage, error) {
	raw := []byte(f.body)
	if f.file != "" {
		if f.body != "" {
			return nil, errors.New("-body and -file: give one")
		}
		var err error
		if raw, err = os.ReadFile(f.file); err != nil {
			return nil, fmt.Errorf("-file: %w", err)
		}
	}
	if len(raw) == 0 {
		return nil, nil
	}
	c, err := policy.Canonical(raw)
	if err != nil {
		return nil, fmt.Errorf("the section: %w", err)
	}
	return c, nil
}

func sectionsCall(ctx context.Context, c *adminapi.Client, kind adminapi.SectionKind, verb, name string, body json.RawMessage, f sectionsFlags) (any, error) {
	one := func(s adminapi.Section, err error) (any, error) { return adminapi.SectionResponse{Section: s}, err }
	switch verb {
	case "list":
		list, err := c.Sections(ctx, kind)
		return adminapi.SectionsResponse{Sections: list}, err
	case "get":
		return one(c.Section(ctx, kind, name))
	case "create":
		return one(c.CreateSection(ctx, kind, adminapi.CreateSectionRequest{Name: name, From: f.from, Body: body, Reason: f.reason}))
	case "update":
		return one(c.UpdateSection(ctx, kind, name, adminapi.UpdateSectionRequest{Version: f.version, Body: body, Reason: f.reason}))
	case "delete":
		return one(c.DeleteSection(ctx, kind, name, adminapi.DeleteSectionRequest{Version: f.version, Reason: f.reason}))
	case "audit":
		entries, err := c.SectionAudit(ctx, kind, name)
		return adminapi.AuditResponse{Entries: entries}, err
	}
	return nil, fmt.Errorf("unknown verb %q", verb)
}

func writeJSONTo(out io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}

// writeSectionsText writes an answer for people: a table of names,
// versions and sections, or of audit entries.
func writeSectionsText(out io.Writer, answer any) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	var list []adminapi.Section
	switch a := answer.(type) {
	case adminapi.SectionsResponse:
		list = a.Sections
	case adminapi.SectionResponse:
		list = []adminapi.Section{a.Section}
	case adminapi.AuditResponse:
		fmt.Fprintln(tw, "TIME\tACTOR\tACTION\tVERSION\tREASON\tCHANGES")
		for _, e := range a.Entries {
			var ch []string
			for _, c := range e.Changes {
				ch = append(ch, c.Field+": "+orNone(c.From)+" -> "+orNone(c.To))
			}
			action := string(e.Action)
			if e.Refused {
				action += " (refused: " + e.Error + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", e.Time.Format(time.RFC3339), e.Actor, action, e.Version, e.Reason, strings.Join(ch, "; "))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tBY\tSECTION")
	for _, s := range list {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", s.Name, s.Version, s.UpdatedAt.Format(time.RFC3339), s.UpdatedBy, s.Body)
	}
	return tw.Flush()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
