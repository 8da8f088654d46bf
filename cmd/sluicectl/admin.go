package main

// The admin command talks to the enforcer's admin API (/admin/v1): list
// flags, breakers and overrides; trip and reset breakers; blacklist and
// unblacklist tenants and API keys; set and clear temporary quota
// overrides. Every change needs a reason and is audited by the enforcer.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

func init() {
	register("admin", "enforcer admin: flags, breakers, blacklists, overrides (audited)", runAdmin)
}

// adminAction is one `sluicectl admin <verb>`.
type adminAction struct {
	summary string
	method  string
	path    string
	// fields lists the request fields the verb takes, besides the common
	// tenant and reason; "expires" means -expires is required.
	fields []string
}

var adminActions = map[string]adminAction{
	"flags":       {"list the flags gateways see (-tenant filters)", http.MethodGet, "/admin/v1/flags", nil},
	"breakers":    {"list open and half-open breakers (-tenant filters)", http.MethodGet, "/admin/v1/breakers", nil},
	"overrides":   {"list temporary quota overrides (-tenant filters)", http.MethodGet, "/admin/v1/overrides", nil},
	"trip":        {"open a manual breaker on a tenant (-model, -key)", http.MethodPost, "/admin/v1/breakers/trip", []string{"model", "key", "expires"}},
	"reset":       {"close a tenant's breakers (-model, -key, -kind)", http.MethodPost, "/admin/v1/breakers/reset", []string{"model", "key", "kind"}},
	"blacklist":   {"block a tenant or one of its API keys (-key)", http.MethodPost, "/admin/v1/blacklist/add", []string{"key", "expires"}},
	"unblacklist": {"lift a blacklist (-key)", http.MethodPost, "/admin/v1/blacklist/remove", []string{"key"}},
	"override":    {"set a temporary quota limit (-model, -quota, -limit; 0 stops spend)", http.MethodPost, "/admin/v1/overrides/set", []string{"model", "quota", "limit", "expires"}},
	"unoverride":  {"clear a temporary quota limit (-model, -quota)", http.MethodPost, "/admin/v1/overrides/clear", []string{"model", "quota"}},
}

func adminUsage() string {
	names := make([]string, 0, len(adminActions))
	for n := range adminActions {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("usage: sluicectl admin <verb> [flags]\n\nverbs:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-12s %s\n", n, adminActions[n].summary)
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
	act, ok := adminActions[verb]
	if !ok {
		return fmt.Errorf("admin: unknown verb %q\n\n%s", verb, adminUsage())
	}
	fs := flag.NewFlagSet("admin "+verb, flag.ContinueOnError)
	base := fs.String("url", envOr("SLUICE_ADMIN_URL", "http://127.0.0.1:9471"), "enforcer admin API base URL")
	token := fs.String("token", os.Getenv("SLUICE_ADMIN_TOKEN"), "admin bearer token (prefer SLUICE_ADMIN_TOKEN)")
	tenant := fs.String("tenant", "", "tenant")
	reason := fs.String("reason", "", "why (required for changes; recorded in the audit log)")
	model := fs.String("model", "", `model ("*" or empty: every model)`)
	key := fs.String("key", "", "API key id")
	kind := fs.String("kind", "", "breaker kind to reset: quota, rate, error_ratio, slow_call, manual, blacklist")
	quota := fs.String("quota", "", "quota: monthly_tokens, daily_tokens, hourly_tokens, tokens_per_minute, requests_per_minute, budget")
	limit := fs.String("limit", "", "temporary limit (0 stops spend, e.g. a leaked key)")
	expires := fs.String("expires", "", "how long the change lasts, e.g. 2h or 72h (at most 90 days), or an RFC 3339 time")
	timeout := fs.Duration("timeout", 15*time.Second, "request timeout")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *token == "" {
		return errors.New("admin: -token (or SLUICE_ADMIN_TOKEN) is required")
	}
	u, err := url.Parse(strings.TrimRight(*base, "/") + act.path)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("admin: -url %q is not an http(s) URL", *base)
	}
	var body io.Reader
	if act.method == http.MethodGet {
		if *tenant != "" {
			u.RawQuery = url.Values{"tenant": {*tenant}}.Encode()
		}
	} else {
		req := map[string]any{"tenant": *tenant, "reason": *reason}
		takes := func(f string) bool {
			for _, x := range act.fields {
				if x == f {
					return true
				}
			}
			return false
		}
		var problems []string
		set := func(f, v, jsonName string) {
			if v == "" {
				return
			}
			if !takes(f) {
				problems = append(problems, fmt.Sprintf("-%s: not used by %s", f, verb))
				return
			}
			req[jsonName] = v
		}
		set("model", *model, "model")
		set("key", *key, "api_key_id")
		set("kind", *kind, "kind")
		set("quota", *quota, "quota")
		if *limit != "" {
			n, err := strconv.ParseFloat(*limit, 64)
			if err != nil || !takes("limit") {
				problems = append(problems, fmt.Sprintf("-limit: %q is not a number for %s", *limit, verb))
			} else {
				req["limit"] = n
			}
		}
		if *expires != "" {
			switch {
			case !takes("expires"):
				problems = append(problems, "-expires: not used by "+verb)
			case isRFC3339(*expires):
				req["expires_at"] = *expires
			default:
				req["expires_in"] = *expires
			}
		} else if takes("expires") {
			problems = append(problems, "-expires: required for "+verb+" (e.g. 2h)")
		}
		if *tenant == "" {
			problems = append(problems, "-tenant: required")
		}
		if strings.TrimSpace(*reason) == "" {
			problems = append(problems, "-reason: required (the audit log says why)")
		}
		if len(problems) > 0 {
			return errors.New("admin " + verb + ": " + strings.Join(problems, "; "))
		}
		b, _ := json.Marshal(req)
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, act.method, u.String(), body)
	if err != nil {
		return err
	}
	hreq.Header.Set("Authorization", "Bearer "+*token)
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 32<<20))
	if err != nil {
		return fmt.Errorf("admin: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("admin %s: %s: %s", verb, resp.Status, e.Error.Message)
		}
		return fmt.Errorf("admin %s: %s", verb, resp.Status)
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, raw, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(raw)
	}
	_, err = out.Write(pretty.Bytes())
	return err
}

func isRFC3339(s string) bool {
	_, err := time.Parse(time.RFC3339, s)
	return err == nil
}
