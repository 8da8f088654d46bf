package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
)

// keysServer answers the key routes, decoding strictly into the API's own
// types, and records the last request.
type keysServer struct {
	path, auth string
	issue      adminapi.IssueKeyRequest
	rotate     adminapi.RotateKeyRequest
	revoke     adminapi.RevokeKeyRequest
	decodeErr  error
}

func (s *keysServer) start(t *testing.T) string {
	key := adminapi.Key{Fingerprint: "sha256:0123456789ab",
		KeyTerms: adminapi.KeyTerms{ID: "k1", Tenant: "acme", Models: []string{"gpt-4o"}, Stamp: adminapi.Stamp{Version: 2}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.path, s.auth = r.Method+" "+r.URL.Path+"?"+r.URL.RawQuery, r.Header.Get("Authorization")
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		var answer any = adminapi.SecretResponse{Key: key, Secret: "sk-sluice-new"}
		switch {
		case r.Method == http.MethodGet:
			used := key
			used.LastUsedAt = time.Date(2026, 12, 1, 9, 30, 0, 0, time.UTC)
			answer = adminapi.KeysResponse{Keys: []adminapi.Key{used}}
		case r.URL.Path == adminapi.PathKeys:
			s.decodeErr = dec.Decode(&s.issue)
		case strings.HasSuffix(r.URL.Path, "/rotate"):
			s.decodeErr = dec.Decode(&s.rotate)
		default:
			s.decodeErr = dec.Decode(&s.revoke)
			key.Revoked = true
			answer = adminapi.KeyResponse{Key: key}
		}
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestKeysCommandSendsEachVerbAndPrintsTheSecretOnce(t *testing.T) {
	var s keysServer
	url := s.start(t)
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := runKeysTo(context.Background(), append(args, "-url", url, "-token", "tok"), &out); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if s.decodeErr != nil {
			t.Fatalf("%v: request body: %v", args, s.decodeErr)
		}
		return out.String()
	}
	out := run("issue", "-tenant", "acme", "-models", "gpt-4o, gpt-4o-mini*", "-endpoints", "/v1/chat/completions", "-expires", "720h", "-reason", "onboard")
	if s.path != "POST /admin/v1/keys?" || s.auth != "Bearer tok" || s.issue.Tenant != "acme" || len(s.issue.Models) != 2 ||
		s.issue.Models[1] != "gpt-4o-mini*" || s.issue.ExpiresIn != "720h" || s.issue.Reason != "onboard" || len(s.issue.Endpoints) != 1 {
		t.Fatalf("issue sent %s %+v", s.path, s.issue)
	}
	if !strings.Contains(out, "secret (shown once, store it now): sk-sluice-new") || !strings.Contains(out, "k1") {
		t.Fatalf("issue printed %q", out)
	}

	out = run("rotate", "k1", "-version", "2", "-overlap", "24h", "-reason", "yearly", "-o", "json")
	var sr adminapi.SecretResponse
	if err := json.Unmarshal([]byte(out), &sr); err != nil || sr.Secret != "sk-sluice-new" {
		t.Fatalf("rotate -o json printed %q (%v)", out, err)
	}
	if s.path != "POST /admin/v1/keys/k1/rotate?" || s.rotate.Version != 2 || s.rotate.Overlap != "24h" {
		t.Fatalf("rotate sent %s %+v", s.path, s.rotate)
	}

	out = run("revoke", "k1", "-version", "2", "-reason", "leaked")
	if s.path != "POST /admin/v1/keys/k1/revoke?" || s.revoke.Version != 2 || !strings.Contains(out, "revoked") {
		t.Fatalf("revoke sent %s %+v, printed %q", s.path, s.revoke, out)
	}

	out = run("list", "-tenant", "acme", "-o", "json")
	var lr adminapi.KeysResponse
	if err := json.Unmarshal([]byte(out), &lr); err != nil || len(lr.Keys) != 1 || s.path != "GET /admin/v1/keys?tenant=acme" {
		t.Fatalf("list sent %s, printed %q (%v)", s.path, out, err)
	}
	if out = run("list", "-tenant", "acme"); !strings.Contains(out, "LAST USED") || !strings.Contains(out, "2026-12-01T09:30:00Z") {
		t.Fatalf("list printed %q; want the key's last use", out)
	}
}

func TestKeysCommandRefusesAChangeWithoutItsKeyID(t *testing.T) {
	err := runKeysTo(context.Background(), []string{"revoke", "-version", "2", "-reason", "x", "-token", "tok"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "key id is required") {
		t.Fatalf("%v", err)
	}
}
