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

// sectionsFlags are the tenants and plans commands' own flags.
type sectionsFlags struct {
	body, file, from string
}

var sectionVerbs = []string{"list", "get", "create", "update", "delete", "audit"}

func runSectionsTo(ctx context.Context, kind adminapi.SectionKind, args []string, out io.Writer) error {
	from := ""
	if kind == adminapi.KindTenant {
		from = " [-from PLAN]: starts from the plan's section"
	}
	var f sectionsFlags
	return runRecordCommand(ctx, recordCommand{name: string(kind) + "s", usage: fmt.Sprintf(sectionsUsage, kind, from),
		verbs: sectionVerbs, takesName: func(string) bool { return true },
		versionHelp: "update, delete: the version you read (get or list shows it)",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&f.body, "body", "", "create, update: the section, JSON or YAML")
			fs.StringVar(&f.file, "file", "", "create, update: a file holding the section, JSON or YAML")
			fs.StringVar(&f.from, "from", "", "tenants create: the plan to start from")
		},
		request: func(verb, name string, rf recordFlags) (recordCall, error) {
			if verb != "list" && name == "" {
				return nil, fmt.Errorf("the name is required (sluicectl %ss %s NAME ...)", kind, verb)
			}
			body, err := sectionFlagBody(f)
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, c *adminapi.Client) (any, error) {
				return sectionsCall(ctx, c, kind, verb, name, body, f.from, rf)
			}, nil
		},
		text: writeSectionsText}, args, out)
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

func sectionsCall(ctx context.Context, c *adminapi.Client, kind adminapi.SectionKind, verb, name string, body json.RawMessage, from string, f recordFlags) (any, error) {
	one := func(s adminapi.Section, err error) (any, error) { return adminapi.SectionResponse{Section: s}, err }
	switch verb {
	case "list":
		list, err := c.Sections(ctx, kind)
		return adminapi.SectionsResponse{Sections: list}, err
	case "get":
		return one(c.Section(ctx, kind, name))
	case "create":
		return one(c.CreateSection(ctx, kind, adminapi.CreateSectionRequest{Name: name, From: from, Body: body, Reason: f.reason}))
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
