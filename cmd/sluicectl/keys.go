package main

// The keys command manages the API keys the enforcer's admin API issues
// (docs/controlplane.md): issue (the secret printed once), list, rotate
// with an overlap, revoke. Gateways following the admin topic accept or
// refuse a key within seconds.

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/adminapi"
)

func init() {
	register("keys", "API keys managed at runtime: issue (secret shown once), list, rotate, revoke (audited)", runKeys)
}

const keysUsage = `usage: sluicectl keys <verb> [flags]

verbs:
  issue    issue a key: -tenant, -models and -reason required; -id, -name, -endpoints, -expires
           (the secret is printed once; store it now)
  list     list keys (-tenant filters)
  rotate   give a key a new secret: <id> -version and -reason required; -overlap keeps the old one valid
  revoke   revoke a key for good: <id> -version and -reason required

-o json prints the API's answer as JSON (default: text).
-version is the key's version as list shows it: a change that read an older
version is refused (another operator changed the key since).
The enforcer's address and token come from -url/-token or SLUICE_ADMIN_URL/SLUICE_ADMIN_TOKEN.`

func runKeys(ctx context.Context, args []string) error { return runKeysTo(ctx, args, os.Stdout) }

// keysFlags are the keys command's own flags; each verb uses some of them.
type keysFlags struct {
	tenant, id, name, models, endpoints, expires, overlap string
}

var keyVerbs = []string{"issue", "list", "rotate", "revoke"}

func runKeysTo(ctx context.Context, args []string, out io.Writer) error {
	var f keysFlags
	named := func(verb string) bool { return verb == "rotate" || verb == "revoke" }
	return runRecordCommand(ctx, recordCommand{name: "keys", usage: keysUsage, verbs: keyVerbs, takesName: named,
		versionHelp: "rotate, revoke: the key's version you read (list shows it)",
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&f.tenant, "tenant", "", "tenant (issue: required; list: filter)")
			fs.StringVar(&f.id, "id", "", "issue: the key id (default: one is made up)")
			fs.StringVar(&f.name, "name", "", "issue: a name for people")
			fs.StringVar(&f.models, "models", "", `issue: comma-separated models or patterns the key may call, or "*"`)
			fs.StringVar(&f.endpoints, "endpoints", "", "issue: comma-separated URL paths the key may call (default: every endpoint)")
			fs.StringVar(&f.expires, "expires", "", "issue: when the key ends, a duration (720h) or an RFC 3339 time (default: never)")
			fs.StringVar(&f.overlap, "overlap", "", "rotate: how long the old secret stays valid, e.g. 24h (default: it stops at once)")
		},
		request: func(verb, id string, rf recordFlags) (recordCall, error) {
			if named(verb) && id == "" {
				return nil, fmt.Errorf("the key id is required (sluicectl keys %s <id> -version N -reason WHY)", verb)
			}
			return func(ctx context.Context, c *adminapi.Client) (any, error) { return keysCall(ctx, c, verb, id, f, rf) }, nil
		},
		text: writeKeysText}, args, out)
}

// keysCall performs verb and returns the API's answer.
func keysCall(ctx context.Context, c *adminapi.Client, verb, id string, f keysFlags, rf recordFlags) (any, error) {
	switch verb {
	case "list":
		return c.KeyList(ctx, f.tenant)
	case "issue":
		req := adminapi.IssueKeyRequest{ID: f.id, Tenant: f.tenant, Name: f.name, Models: splitList(f.models),
			Endpoints: splitList(f.endpoints), Reason: rf.reason}
		if at, err := time.Parse(time.RFC3339, f.expires); err == nil {
			req.ExpiresAt = at
		} else {
			req.ExpiresIn = f.expires
		}
		return c.IssueKey(ctx, req)
	case "rotate":
		return c.RotateKey(ctx, id, adminapi.RotateKeyRequest{Version: rf.version, Overlap: f.overlap, Reason: rf.reason})
	case "revoke":
		k, err := c.RevokeKey(ctx, id, adminapi.RevokeKeyRequest{Version: rf.version, Reason: rf.reason})
		return adminapi.KeyResponse{Key: k}, err
	}
	return nil, fmt.Errorf("unknown verb %q", verb)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// writeKeysText writes an answer for people: a table of keys, and a
// secret on a line of its own with the warning that it is shown once.
func writeKeysText(out io.Writer, answer any) error {
	var keys []adminapi.Key
	secret, useErr := "", ""
	switch a := answer.(type) {
	case adminapi.KeysResponse:
		keys, useErr = a.Keys, a.LastUseError
	case adminapi.KeyResponse:
		keys = []adminapi.Key{a.Key}
	case adminapi.SecretResponse:
		keys, secret = []adminapi.Key{a.Key}, a.Secret
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tNAME\tVERSION\tSTATE\tMODELS\tEXPIRES\tLAST USED\tFINGERPRINT")
	for _, k := range keys {
		state := "active"
		switch {
		case k.Revoked:
			state = "revoked"
		case !k.ExpiresAt.IsZero() && !time.Now().Before(k.ExpiresAt):
			state = "expired"
		case k.PreviousFingerprint != "":
			state = "rotating until " + k.PreviousUntil.Format(time.RFC3339)
		}
		expires := "never"
		if !k.ExpiresAt.IsZero() {
			expires = k.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Tenant, k.Name, k.Version, state,
			strings.Join(k.Models, ","), expires, lastUsed(k, useErr), k.Fingerprint)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if useErr != "" {
		fmt.Fprintf(out, "\n%s\n", useErr)
	}
	if secret != "" {
		_, err := fmt.Fprintf(out, "\nsecret (shown once, store it now): %s\n", secret)
		return err
	}
	return nil
}

// lastUsed is a key's LAST USED column: its last metered call, "-" for
// none in adminapi.KeyUseLookback, "?" when the API could not tell.
func lastUsed(k adminapi.Key, useErr string) string {
	switch {
	case !k.LastUsedAt.IsZero():
		return k.LastUsedAt.Format(time.RFC3339)
	case useErr != "":
		return "?"
	}
	return "-"
}
