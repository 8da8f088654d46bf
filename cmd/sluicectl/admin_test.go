package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/schemas"
)

// The server side of these tests decodes into the API's own types, strictly,
// so a flag that stops reaching its field fails here; the client against
// the enforcer's real handler is tested in adminapi.
func TestAdminSendsAuthenticatedActionAndPrintsAnswer(t *testing.T) {
	var got adminapi.Request
	var path, auth string
	var decodeErr error
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, auth = r.URL.Path, r.Header.Get("Authorization")
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		decodeErr = dec.Decode(&got)
		_ = json.NewEncoder(w).Encode(adminapi.ActionResponse{RequestID: "r1", Action: adminapi.ActionSetOverride, Changed: true})
	}))
	defer srv.Close()
	var out bytes.Buffer
	err := runAdminTo(context.Background(), []string{"override", "-url", srv.URL, "-token", "tok", "-tenant", "acme",
		"-model", "gpt-4o", "-quota", "daily_tokens", "-limit", "0", "-expires", "2h", "-reason", "leaked key"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if decodeErr != nil {
		t.Fatalf("request body: %v", decodeErr)
	}
	if path != adminapi.ActionSetOverride.Path() || auth != "Bearer tok" {
		t.Fatalf("path %q auth %q", path, auth)
	}
	if got.Tenant != "acme" || got.Model != "gpt-4o" || got.Quota != schemas.QuotaDailyTokens || got.Limit == nil ||
		*got.Limit != 0 || got.ExpiresIn != "2h" || got.Reason != "leaked key" {
		t.Fatalf("request %+v", got)
	}
	if !strings.Contains(out.String(), `"request_id": "r1"`) {
		t.Fatalf("output %q", out.String())
	}
}

func TestAdminListsThroughTheClient(t *testing.T) {
	var path, query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, query = r.URL.Path, r.URL.RawQuery
		_ = json.NewEncoder(w).Encode(adminapi.BreakersResponse{Breakers: []adminapi.Breaker{{Tenant: "acme", Scope: "*", Kind: "manual"}}})
	}))
	defer srv.Close()
	var out bytes.Buffer
	if err := runAdminTo(context.Background(), []string{"breakers", "-url", srv.URL, "-token", "tok", "-tenant", "acme"}, &out); err != nil {
		t.Fatal(err)
	}
	if path != adminapi.PathBreakers || query != "tenant=acme" {
		t.Fatalf("path %q query %q", path, query)
	}
	var back adminapi.BreakersResponse
	if err := json.Unmarshal(out.Bytes(), &back); err != nil || len(back.Breakers) != 1 || back.Breakers[0].Tenant != "acme" {
		t.Fatalf("output %q: %v", out.String(), err)
	}
}

func TestAdminRefusesIncompleteChangesBeforeCalling(t *testing.T) {
	var called atomic.Bool // the handler runs on the server's goroutine
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called.Store(true) }))
	defer srv.Close()
	err := runAdminTo(context.Background(), []string{"blacklist", "-url", srv.URL, "-token", "tok", "-tenant", "acme"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "-reason") || !strings.Contains(err.Error(), "-expires") {
		t.Fatalf("error %v", err)
	}
	if called.Load() {
		t.Fatal("incomplete request was sent")
	}
}

func TestAdminReportsTheServersError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(adminapi.ErrorResponse{Error: adminapi.ErrorBody{Message: "expires_at: beyond the limit of 90 days ahead"}})
	}))
	defer srv.Close()
	err := runAdminTo(context.Background(), []string{"trip", "-url", srv.URL, "-token", "tok", "-tenant", "acme", "-reason", "x", "-expires", "9999h"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "90 days") || !strings.Contains(err.Error(), "400") {
		t.Fatalf("error %v", err)
	}
}

// TestAdminTrustsCAFile: against an admin API served over TLS with a
// certificate no system root signed, -ca-file makes the call succeed and
// its absence fails on the certificate (never silently skipping checks).
func TestAdminTrustsCAFile(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(adminapi.BreakersResponse{})
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"breakers", "-url", srv.URL, "-token", "tok", "-tenant", "acme"}
	if err := runAdminTo(context.Background(), append(args, "-ca-file", ca), io.Discard); err != nil {
		t.Fatalf("with -ca-file: %v", err)
	}
	if err := runAdminTo(context.Background(), args, io.Discard); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without -ca-file: %v, want a certificate error", err)
	}
	if err := runAdminTo(context.Background(), append(args, "-ca-file", filepath.Join(t.TempDir(), "missing.pem")), io.Discard); err == nil || !strings.Contains(err.Error(), "-ca-file") {
		t.Fatalf("missing CA file: %v, want it named", err)
	}
}

// TestAdminHelpSaysWhatAChangeRequires: trip, blacklist and override are
// refused without -expires; the usage and -expires's own help say so
// before anyone runs them.
func TestAdminHelpSaysWhatAChangeRequires(t *testing.T) {
	usage := adminUsage()
	lines := strings.Split(usage, "\n")
	for i, l := range lines {
		verb := strings.Fields(l)
		if len(verb) == 0 || adminVerbs[verb[0]].summary == "" || !strings.HasPrefix(l, "  "+verb[0]) {
			continue
		}
		v := adminVerbs[verb[0]]
		if v.list != nil {
			continue
		}
		want := "requires -tenant, -reason"
		for _, f := range v.fields {
			if f == "expires" {
				want += " and -expires"
			}
		}
		if i+1 >= len(lines) || !strings.Contains(lines[i+1], want) {
			t.Errorf("usage of %s does not say %q:\n%s", verb[0], want, usage)
		}
	}
	for _, verb := range []string{"trip", "blacklist", "override"} {
		if !strings.Contains(expiresHelp, verb) || !strings.Contains(expiresHelp, "required") {
			t.Errorf("-expires's help %q does not say %s requires it", expiresHelp, verb)
		}
	}
}
