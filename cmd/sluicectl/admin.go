package main

// The admin command talks to the enforcer's admin API (/admin/v1) through
// its typed client: list flags, breakers and overrides; trip and reset
// breakers; blacklist and unblacklist tenants and API keys; set and clear
// temporary quota overrides. Every change needs a reason and is audited by
// the enforcer.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

func init() {
	register("admin", "enforcer admin: flags, breakers, blacklists, overrides (audited)", runAdmin)
}

// adminVerb is one `sluicectl admin <verb>`: a listing (list set) or an
// action (action set).
type adminVerb struct {
	summary string
	list    func(ctx context.Context, c *adminapi.Client, tenant string) (any, error)
	action  adminapi.Action
	// fields lists the request fields the action takes, besides the common
	// tenant and reason; "expires" means -expires is required.
	fields []string
}

var adminVerbs = map[string]adminVerb{
	"flags": {summary: "list the flags gateways see (-tenant filters)",
		list: func(ctx context.Context, c *adminapi.Client, tenant string) (any, error) {
			fl, err := c.Flags(ctx, tenant)
			return adminapi.FlagsResponse{Flags: fl}, err
		}},
	"breakers": {summary: "list open and half-open breakers (-tenant filters)",
		list: func(ctx context.Context, c *adminapi.Client, tenant string) (any, error) {
			bs, err := c.Breakers(ctx, tenant)
			return adminapi.BreakersResponse{Breakers: bs}, err
		}},
	"overrides": {summary: "list temporary quota overrides (-tenant filters)",
		list: func(ctx context.Context, c *adminapi.Client, tenant string) (any, error) {
			ov, err := c.Overrides(ctx, tenant)
			return adminapi.OverridesResponse{Overrides: ov}, err
		}},
	"trip":        {summary: "open a manual breaker on a tenant (-model, -key)", action: adminapi.ActionTrip, fields: []string{"model", "key", "expires"}},
	"reset":       {summary: "close a tenant's breakers (-model, -key, -kind)", action: adminapi.ActionReset, fields: []string{"model", "key", "kind"}},
	"blacklist":   {summary: "block a tenant or one of its API keys (-key)", action: adminapi.ActionBlacklist, fields: []string{"key", "expires"}},
	"unblacklist": {summary: "lift a blacklist (-key)", action: adminapi.ActionUnblacklist, fields: []string{"key"}},
	"override":    {summary: "set a temporary quota limit (-model, -quota, -limit; 0 stops spend)", action: adminapi.ActionSetOverride, fields: []string{"model", "quota", "limit", "expires"}},
	"unoverride":  {summary: "clear a temporary quota limit (-model, -quota)", action: adminapi.ActionClearOverride, fields: []string{"model", "quota"}},
}

// expiresHelp is -expires's help: it has no default, on purpose — an
// operator action that lasted until someone remembered it would outlive
// its reason.
const expiresHelp = "required by trip, blacklist and override: how long the change lasts, e.g. 2h or 72h (at most 90 days), or an RFC 3339 time; there is no default"

func adminUsage() string {
	names := make([]string, 0, len(adminVerbs))
	for n := range adminVerbs {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: sluicectl admin <verb> [flags]\n\nverbs:\n")
	for _, n := range names {
		v := adminVerbs[n]
		fmt.Fprintf(&b, "  %-12s %s\n", n, v.summary)
		if v.list == nil {
			// A change without these is refused before it is sent: say so
			// up front, -expires above all (every operator action expires).
			req := "-tenant, -reason"
			if slices.Contains(v.fields, "expires") {
				req += " and -expires"
			}
			fmt.Fprintf(&b, "  %-12s   requires %s\n", "", req)
		}
	}
	b.WriteString("\nThe enforcer's address and token come from -url/-token or SLUICE_ADMIN_URL/SLUICE_ADMIN_TOKEN.")
	return b.String()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// quotaNames lists the quota kinds for -quota's help, from the one table
// of kinds.
func quotaNames() string {
	var names []string
	for _, q := range schemas.QuotaKinds() {
		names = append(names, string(q))
	}
	return strings.Join(names, ", ")
}

func runAdmin(ctx context.Context, args []string) error {
	return runAdminTo(ctx, args, os.Stdout)
}

func runAdminTo(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "help" {
		fmt.Fprintln(os.Stderr, adminUsage())
		if len(args) == 0 {
			return errors.New("admin: a verb is required")
		}
		return flag.ErrHelp
	}
	verb := args[0]
	v, ok := adminVerbs[verb]
	if !ok {
		return fmt.Errorf("admin: unknown verb %q\n\n%s", verb, adminUsage())
	}
	fs := flag.NewFlagSet("admin "+verb, flag.ContinueOnError)
	connect := adminConnFlags(fs, "admin")
	tenant := fs.String("tenant", "", "tenant")
	reason := fs.String("reason", "", "why (required for changes; recorded in the audit log)")
	model := fs.String("model", "", `model ("*" or empty: every model)`)
	key := fs.String("key", "", "API key id")
	kind := fs.String("kind", "", "breaker kind to reset: quota, rate, error_ratio, slow_call, manual, blacklist")
	quota := fs.String("quota", "", "quota: "+quotaNames())
	limit := fs.String("limit", "", "temporary limit (0 stops spend, e.g. a leaked key)")
	expires := fs.String("expires", "", expiresHelp)
	timeout := fs.Duration("timeout", 15*time.Second, "request timeout")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	client, err := connect()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	var answer any
	if v.list != nil {
		answer, err = v.list(ctx, client, *tenant)
	} else {
		req, problems := adminRequest(v, verb, adminFlags{tenant: *tenant, reason: *reason, model: *model, key: *key,
			kind: *kind, quota: *quota, limit: *limit, expires: *expires})
		if len(problems) > 0 {
			return errors.New("admin " + verb + ": " + strings.Join(problems, "; "))
		}
		answer, err = client.Do(ctx, v.action, req)
	}
	if err != nil {
		return fmt.Errorf("admin %s: %w", verb, err)
	}
	b, err := json.MarshalIndent(answer, "", "  ")
	if err != nil {
		return err
	}
	_, err = out.Write(append(b, '\n'))
	return err
}

// adminConnFlags defines on fs the flags that reach the admin API (-url,
// -token, -ca-file, each with its environment variable) and returns the
// function that builds the client from them once fs is parsed; cmd names
// the command in errors.
func adminConnFlags(fs *flag.FlagSet, cmd string) func() (*adminapi.Client, error) {
	base := fs.String("url", envOr("SLUICE_ADMIN_URL", "http://127.0.0.1:9471"), "enforcer admin API base URL")
	token := fs.String("token", os.Getenv("SLUICE_ADMIN_TOKEN"), "admin bearer token (prefer SLUICE_ADMIN_TOKEN)")
	caFile := fs.String("ca-file", os.Getenv("SLUICE_ADMIN_CA_FILE"), "PEM CA certificate(s) to trust for an https -url with a private or self-signed certificate (SLUICE_ADMIN_CA_FILE)")
	return func() (*adminapi.Client, error) {
		if *token == "" {
			return nil, errors.New(cmd + ": -token (or SLUICE_ADMIN_TOKEN) is required")
		}
		hc, err := adminapi.TrustingClient(*caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: -ca-file: %w", cmd, err)
		}
		client, err := adminapi.NewClient(*base, *token, hc)
		if err != nil {
			return nil, fmt.Errorf("%s: -url/-token: %w", cmd, err)
		}
		return client, nil
	}
}

// adminFlags are the command-line values an action's request is built from.
type adminFlags struct {
	tenant, reason, model, key, kind, quota, limit, expires string
}

// adminRequest builds v's request from f, listing every flag that is
// missing or not used by verb, so that an incomplete change is refused
// before anything is sent.
func adminRequest(v adminVerb, verb string, f adminFlags) (adminapi.Request, []string) {
	req := adminapi.Request{Tenant: f.tenant, Reason: f.reason}
	takes := func(field string) bool { return slices.Contains(v.fields, field) }
	var problems []string
	set := func(field, val string, dst *string) {
		if val == "" {
			return
		}
		if !takes(field) {
			problems = append(problems, fmt.Sprintf("-%s: not used by %s", field, verb))
			return
		}
		*dst = val
	}
	var kind, quota string
	set("model", f.model, &req.Model)
	set("key", f.key, &req.APIKeyID)
	set("kind", f.kind, &kind)
	set("quota", f.quota, &quota)
	req.Kind, req.Quota = flags.Kind(kind), schemas.QuotaKind(quota)
	if f.limit != "" {
		n, err := strconv.ParseFloat(f.limit, 64)
		if err != nil || !takes("limit") {
			problems = append(problems, fmt.Sprintf("-limit: %q is not a number for %s", f.limit, verb))
		} else {
			req.Limit = &n
		}
	}
	if f.expires != "" {
		if !takes("expires") {
			problems = append(problems, "-expires: not used by "+verb)
		} else if at, err := time.Parse(time.RFC3339, f.expires); err == nil {
			req.ExpiresAt = at
		} else {
			req.ExpiresIn = f.expires
		}
	} else if takes("expires") {
		problems = append(problems, "-expires: required for "+verb+" (e.g. 2h)")
	}
	if f.tenant == "" {
		problems = append(problems, "-tenant: required")
	}
	if strings.TrimSpace(f.reason) == "" {
		problems = append(problems, "-reason: required (the audit log says why)")
	}
	return req, problems
}
