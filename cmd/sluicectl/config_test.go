package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// servicesYAML is a configuration of the services (cmd/sluice) as an
// operator exports it in SLUICE_CONFIG: shared sections and sections only
// the services know.
const servicesYAML = `
log: {level: info, format: json}
ops: {listen: 127.0.0.1:9464}
kafka:
  brokers: [kafka-1:9092, kafka-2:9092]
clickhouse:
  addr: ch.internal:9000
  database: billing
redis: {addr: redis.internal:6379}
embedded_kafka: {port: 19192}
shutdown_timeout: 15s
migrate: true
policy: {file: /etc/sluice/policy.yaml}
topics: {signals: drift.v1}
services:
  ingest:
    listen: 0.0.0.0:8080
  aggregator:
    consumer: {group: sluice-aggregator}
  reconciler:
    at: "01:00"
`

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSluicectlReadsTheServicesConfig: an exported SLUICE_CONFIG of the
// services used to stop every sluicectl command with "field services not
// found". sluicectl takes the shared sections from it and ignores the
// rest; flags still override the file.
func TestSluicectlReadsTheServicesConfig(t *testing.T) {
	withoutSluiceEnv(t)
	t.Setenv("SLUICE_CONFIG", writeConfig(t, servicesYAML))

	rep, err := loadReportConfig("report", "table", []string{"-month", "2026-11", "-tenant", "acme"})
	if err != nil {
		t.Fatalf("report with the services' SLUICE_CONFIG: %v", err)
	}
	if rep.ClickHouse.Addr != "ch.internal:9000" || rep.ClickHouse.Database != "billing" || rep.Policy.File != "/etc/sluice/policy.yaml" {
		t.Errorf("report took clickhouse %s/%s, policy %s from the file; want ch.internal:9000/billing, /etc/sluice/policy.yaml",
			rep.ClickHouse.Addr, rep.ClickHouse.Database, rep.Policy.File)
	}

	rec, err := loadReconcileConfig([]string{"-period", "month", "-clickhouse.database", "other"})
	if err != nil {
		t.Fatalf("reconcile with the services' SLUICE_CONFIG: %v", err)
	}
	if got := strings.Join(rec.Kafka.Brokers, ","); got != "kafka-1:9092,kafka-2:9092" {
		t.Errorf("reconcile took kafka brokers %q from the file", got)
	}
	if rec.Policy.File != "/etc/sluice/policy.yaml" {
		t.Errorf("reconcile policy file %q, want the file's policy.file", rec.Policy.File)
	}
	// The reconciler's own settings are the services' services.reconciler
	// section: sluicectl reconcile once read a top-level reconciler
	// section no services configuration has, and ignored the operator's.
	if r := rec.Services.Reconciler; r.At != "01:00" || rec.Topics.Signals != "drift.v1" {
		t.Errorf("reconcile took at %q, topics.signals %q; want services.reconciler's 01:00 and drift.v1", r.At, rec.Topics.Signals)
	}
	if rec.ClickHouse.Database != "other" || rec.ClickHouse.Addr != "ch.internal:9000" {
		t.Errorf("reconcile clickhouse %s/%s, want the flag's database over the file's address", rec.ClickHouse.Addr, rec.ClickHouse.Database)
	}

	// -config names the file as well, and wins over SLUICE_CONFIG.
	other := writeConfig(t, "clickhouse: {addr: other:9000}\nservices: {enforcer: {}}\n")
	rep, err = loadReportConfig("report", "table", []string{"-config=" + other, "-month", "2026-11"})
	if err != nil || rep.ClickHouse.Addr != "other:9000" {
		t.Errorf("report -config: addr %q, %v; want other:9000", rep.ClickHouse.Addr, err)
	}
}

// TestSluicectlConfigStillRejectsTyposInSharedSections: ignoring the
// services' sections must not hide a typo in a section sluicectl uses.
func TestSluicectlConfigStillRejectsTyposInSharedSections(t *testing.T) {
	t.Setenv("SLUICE_CONFIG", writeConfig(t, "clickhouse:\n  adr: ch:9000\nservices: {}\n"))
	_, err := loadReportConfig("report", "table", []string{"-month", "2026-11"})
	if err == nil || !strings.Contains(err.Error(), "adr") {
		t.Fatalf("typo clickhouse.adr: error %v, want one naming adr", err)
	}
}

// withoutSluiceEnv unsets every SLUICE_ variable for the test: the
// environment wins over the config file, so a shell with the services'
// addresses exported (scripts/services.sh env) would hide the file's.
func withoutSluiceEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "SLUICE_") {
			t.Setenv(k, "") // restored after the test
			os.Unsetenv(k)
		}
	}
}
