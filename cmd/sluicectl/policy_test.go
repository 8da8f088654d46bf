package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/ops"
	"github.com/sluicehq/sluice/services/enforcer"
)

const diffPolicy = `
plans:
  gold:
    limits:
      rpm: {unit: requests, sliding_window: {length: 1m, limit: 100}}
tenants:
  acme:
    plan: gold
`

// TestPolicyDiffShowsAHandEditAndApplyMakesItLive: against a real
// enforcer, diff shows the file's tenants and plans the records lack;
// apply writes them and diff is empty. A hand edit of the file is then a
// conflict (the file's definition in force, the gauge counting it) that
// diff shows field by field, until apply makes the records equal.
func TestPolicyDiffShowsAHandEditAndApplyMakesItLive(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	chc, _ := migrationtest.Open(t)
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(diffPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := enforcer.DefaultConfig()
	cfg.Group, cfg.ReplicaID, cfg.Admin.Listen = itest.Unique(t, "enforcer_"), "test", "127.0.0.1:0"
	cfg.Admin.Tokens = []adminapi.Token{{Name: "ops", SHA256: adminapi.HashToken("op-token")}}
	reg := prometheus.NewRegistry()
	env := platform.Env{Logger: slog.New(slog.DiscardHandler), Kafka: itest.Kafka(t), Topics: itest.Topics(t), ClickHouse: chc, Redis: itest.Redis(t),
		SignalAuth: itest.SignalAuth(t), Metrics: reg, Health: ops.NewHealth(), Policy: platform.FileSource{File: file, Reload: 200 * time.Millisecond}}
	svc, err := enforcer.New(cfg, env.Named("enforcer"))
	enf := itest.StartService(t, svc, err)
	run := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := runPolicyTo(context.Background(), append(args, "-policy", file, "-url", "http://"+enf.Addr(), "-token", "op-token"), &out); err != nil {
			t.Fatalf("policy %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}

	if got := run("diff"); !strings.Contains(got, "plan gold: only in the file") || !strings.Contains(got, "tenant acme: only in the file") {
		t.Fatalf("diff before any record:\n%s", got)
	}
	run("apply")
	if got := run("diff"); !strings.Contains(got, "no differences") {
		t.Fatalf("diff after apply:\n%s", got)
	}

	edited := strings.Replace(diffPolicy, "    plan: gold\n", "    plan: gold\n    timezone: Europe/Paris\n", 1)
	if err := os.WriteFile(file, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, 10*time.Second, "the enforcer reporting the conflict", func() bool { return itest.GaugeValue(t, reg, "sluice_enforcer_policy_conflicts") == 1 })
	var diff struct {
		Differences []struct {
			Kind    string            `json:"kind"`
			Name    string            `json:"name"`
			State   string            `json:"state"`
			Version uint64            `json:"version"`
			Changes []adminapi.Change `json:"changes"`
		} `json:"differences"`
	}
	if err := json.Unmarshal([]byte(run("diff", "-o", "json")), &diff); err != nil {
		t.Fatal(err)
	}
	if d := diff.Differences; len(d) != 1 || d[0].Name != "acme" || d[0].State != "changed" || d[0].Version != 1 ||
		len(d[0].Changes) != 1 || d[0].Changes[0].Field != "timezone" || d[0].Changes[0].To != `"Europe/Paris"` {
		t.Fatalf("diff of the hand edit: %+v; want acme's timezone added, against version 1", d)
	}
	run("apply")
	if got := run("diff"); !strings.Contains(got, "no differences") {
		t.Fatalf("diff after applying the edit:\n%s", got)
	}
	itest.Eventually(t, 10*time.Second, "the conflict resolved", func() bool { return itest.GaugeValue(t, reg, "sluice_enforcer_policy_conflicts") == 0 })
}

// apply carries the version diff read, and a record changed since (409)
// is reported as refused, not overwritten.
func TestPolicyApplyCarriesTheVersionItReadAndReportsAStaleOne(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("tenants:\n  acme: {timezone: Europe/Paris}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var sent adminapi.UpdateSectionRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == adminapi.KindTenant.Path():
			_ = json.NewEncoder(w).Encode(adminapi.SectionsResponse{Sections: []adminapi.Section{{Name: "acme", Body: json.RawMessage(`{}`), Stamp: adminapi.Stamp{Version: 7}}}})
		case r.Method == http.MethodGet:
			_ = json.NewEncoder(w).Encode(adminapi.SectionsResponse{Sections: []adminapi.Section{}})
		default:
			_ = json.NewDecoder(r.Body).Decode(&sent)
			w.WriteHeader(http.StatusConflict)
			_, _ = io.WriteString(w, `{"error":{"message":"version: tenant \"acme\" is at version 8, the change read version 7"}}`)
		}
	}))
	t.Cleanup(srv.Close)
	var out bytes.Buffer
	err := runPolicyTo(context.Background(), []string{"apply", "-policy", file, "-url", srv.URL, "-token", "t"}, &out)
	if err == nil || !strings.Contains(err.Error(), "version 8") || !strings.Contains(out.String(), "0 change(s) applied, 1 refused") {
		t.Fatalf("apply over a stale read: %v\n%s", err, out.String())
	}
	if sent.Version != 7 || !strings.Contains(string(sent.Body), "Europe/Paris") {
		t.Fatalf("apply sent %+v; want the file's section at the version read, 7", sent)
	}
}
