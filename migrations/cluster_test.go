package migrations_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
)

// openEach returns a connection to each server of c, closed when t ends.
func openEach(t *testing.T, c chconn.Config) []driver.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []driver.Conn
	for _, a := range c.Addrs {
		one := c
		one.Addrs, one.Addr = nil, a
		conn, err := chconn.Open(ctx, one)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		out = append(out, conn)
	}
	return out
}

func engines(t *testing.T, conn driver.Conn, db string) map[string]string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "SELECT name, engine FROM system.tables WHERE database = ?", db)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, e string
		if err := rows.Scan(&n, &e); err != nil {
			t.Fatal(err)
		}
		out[n] = e
	}
	return out
}

// insertEvents inserts n usage events of tenants t0..t(k-1) in one batch
// with ids prefix-i; the same arguments give the same bytes.
func insertEvents(ctx context.Context, conn driver.Conn, prefix string, n, k int) error {
	b, err := conn.PrepareBatch(ctx, "INSERT INTO usage_events (id, time, tenant, model, prompt_tokens, completion_tokens, kafka_partition, kafka_offset, ingested_at)")
	if err != nil {
		return err
	}
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for i := 0; i < n; i++ {
		if err := b.Append(fmt.Sprintf("%s-%d", prefix, i), at, fmt.Sprintf("t%d", i%k), "m", uint64(i), uint64(1), int32(0), int64(i), at); err != nil {
			return err
		}
	}
	return b.Send()
}

func count(t *testing.T, conn driver.Conn, q string, args ...any) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestApplyOnReplicatedCluster applies every migration to the services
// script's two ClickHouse 18.16 replicas (clickhouse.cluster) twice: every
// MergeTree table is a Replicated one on both servers, both ledgers hold
// every version, and the second run applies nothing. An insert on one
// replica reaches the other, and the same batch inserted again on the
// other replica — a retry after a failover — is not stored twice.
func TestApplyOnReplicatedCluster(t *testing.T) {
	ctx, cfg, conns, all := migratedCluster(t, itest.ClickHouseCluster)
	for i, conn := range conns {
		e := engines(t, conn, cfg.Database)
		for _, name := range []string{"usage_events", "usage_minute", "quota_state", "tier_transitions", "signals_log", "admin_audit", "reconciliation_runs", "prices", "aggregator_snapshots"} {
			if !strings.HasPrefix(e[name], "Replicated") {
				t.Errorf("server %s: %s has engine %q, want a Replicated one", cfg.Addrs[i], name, e[name])
			}
		}
		if e["schema_migrations"] != "ReplacingMergeTree" || e["usage_priced"] != "View" {
			t.Errorf("server %s: schema_migrations %q (want each server's own ReplacingMergeTree), usage_priced %q", cfg.Addrs[i], e["schema_migrations"], e["usage_priced"])
		}
		applied, err := migrations.Applied(ctx, conn)
		if err != nil {
			t.Fatal(err)
		}
		if len(applied) != len(all) {
			t.Errorf("server %s records %d versions, want %d", cfg.Addrs[i], len(applied), len(all))
		}
		if n := count(t, conn, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = 'usage_events' AND name = 'requested_model'"); n != 1 {
			t.Errorf("server %s: usage_events lacks requested_model (008's ALTER)", cfg.Addrs[i])
		}
	}

	if err := insertEvents(ctx, conns[0], "a", 500, 5); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, time.Minute, "the insert on the first replica reaches the second", func() bool {
		return count(t, conns[1], "SELECT count() FROM usage_events") == 500
	})
	// The same bytes again, on the other replica: deduplicated by the
	// block's hash in ZooKeeper.
	if err := insertEvents(ctx, conns[1], "a", 500, 5); err != nil {
		t.Fatal(err)
	}
	for i, conn := range conns {
		if n := count(t, conn, "SELECT count() FROM usage_events"); n != 500 {
			t.Fatalf("server %s holds %d rows after the retried insert, want 500 (the retry deduplicated)", cfg.Addrs[i], n)
		}
	}
	// A different batch is stored.
	if err := insertEvents(ctx, conns[1], "b", 10, 5); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, time.Minute, "the second batch on both replicas", func() bool {
		return count(t, conns[0], "SELECT count() FROM usage_events") == 510 && count(t, conns[1], "SELECT count() FROM usage_events") == 510
	})
}

// migratedCluster is the set-up of a cluster test: with the ClickHouse
// engines locked, a database of the test's own on cluster's servers, every
// migration applied to it twice — the first run applies them all, the
// second nothing — and a connection to each server. It returns the
// migrations too.
func migratedCluster(t *testing.T, cluster func(testing.TB) chconn.Config) (context.Context, chconn.Config, []driver.Conn, []migrations.Migration) {
	t.Helper()
	itest.LockEngine(t, itest.EngineClickHouse, false)
	cfg := cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	all := applyTwice(t, func() ([]int, error) { return migrations.ApplyConfig(ctx, cfg, quiet) }, func() {})
	return ctx, cfg, openEach(t, cfg), all
}

// TestApplyOnShardedCluster applies every migration to the same two
// servers as two shards (clickhouse.sharded) twice: tables keyed by tenant
// are Distributed over <table>_local, prices and snapshots replicated to
// both; rows written through the Distributed table land on their tenant's
// shard and every reader's query shape (FINAL, argMax by id, tenant IN a
// subquery of the same table, the report views) reads them whole from
// either server.
func TestApplyOnShardedCluster(t *testing.T) {
	ctx, cfg, conns, _ := migratedCluster(t, itest.ClickHouseSharded)
	for i, conn := range conns {
		e := engines(t, conn, cfg.Database)
		for _, name := range []string{"usage_events", "usage_minute", "quota_state", "signals_log", "admin_audit", "reconciliation_runs", "tier_transitions"} {
			if e[name] != "Distributed" || !strings.HasPrefix(e[name+"_local"], "Replicated") {
				t.Errorf("server %s: %s is %q over %q, want Distributed over a Replicated _local", cfg.Addrs[i], name, e[name], e[name+"_local"])
			}
		}
		for _, name := range []string{"prices", "aggregator_snapshots"} {
			if !strings.HasPrefix(e[name], "Replicated") {
				t.Errorf("server %s: %s is %q, want replicated to every server", cfg.Addrs[i], name, e[name])
			}
		}
	}
	// Through a pool of both servers, as the services connect.
	conn, err := chconn.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := insertEvents(ctx, conn, "s", 400, 8); err != nil {
		t.Fatal(err)
	}
	local0 := count(t, conns[0], "SELECT count() FROM usage_events_local")
	local1 := count(t, conns[1], "SELECT count() FROM usage_events_local")
	if local0+local1 != 400 || local0 == 0 || local1 == 0 {
		t.Fatalf("shards hold %d and %d rows, want 400 split over both (insert_distributed_sync)", local0, local1)
	}
	for i, c := range conns {
		if n := count(t, c, "SELECT count() FROM usage_events FINAL"); n != 400 {
			t.Errorf("server %s: FINAL reads %d, want 400", cfg.Addrs[i], n)
		}
		if n := count(t, c, "SELECT count() FROM (SELECT tenant, id, argMax(prompt_tokens, kafka_offset) FROM usage_events WHERE tenant IN (SELECT tenant FROM usage_events WHERE kafka_partition = 0) GROUP BY tenant, id)"); n != 400 {
			t.Errorf("server %s: the replay's query shape reads %d, want 400", cfg.Addrs[i], n)
		}
		if n := count(t, c, "SELECT sum(requests) FROM usage_daily"); n != 400 {
			t.Errorf("server %s: usage_daily counts %d requests, want 400", cfg.Addrs[i], n)
		}
	}
	// The same batch again is deduplicated on each shard.
	if err := insertEvents(ctx, conn, "s", 400, 8); err != nil {
		t.Fatal(err)
	}
	if n := count(t, conn, "SELECT count() FROM usage_events"); n != 400 {
		t.Fatalf("%d rows after the retried insert, want 400", n)
	}
}

// TestClusterLayoutRunsOnCurrentClickHouse runs the statements the cluster
// layouts make (replicated, and sharded) through chdb, a current
// ClickHouse, with an in-memory keeper and the same macros and clusters
// as deploy/clickhouse/cluster.xml: every rewritten statement must run
// there as well as on 18.16.
func TestClusterLayoutRunsOnCurrentClickHouse(t *testing.T) {
	py := chdbPython(t)
	all, err := migrations.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []migrations.Layout{
		{Cluster: "sluice_replicated", ReplicationPath: chconn.DefaultReplicationPath, Database: "sluice"},
		{Cluster: "sluice_sharded", Sharded: true, ReplicationPath: "/clickhouse/tables/{sharded_shard}/{database}/{table}", Database: "sluice"},
	} {
		steps, err := l.Rewrite(all)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		var unseen []string // columns of ALTERs chdb cannot run
		for i, m := range all {
			var b strings.Builder
			for _, st := range steps[i] {
				if st.Scope != migrations.OnEveryServer {
					// chdb (clickhouse-local) never activates a
					// replicated table, so it stays read-only and
					// refuses an ALTER; the statement is the
					// single-server one, which the plain check runs.
					if c := addColumn.FindStringSubmatch(st.SQL); c != nil {
						unseen = append(unseen, c[1])
					}
					continue
				}
				if readsAny(st.SQL, unseen) {
					// A view over such a column cannot be created
					// here; views are not rewritten by a layout, and the
					// plain check creates this one.
					continue
				}
				b.WriteString(st.SQL + ";\n")
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%03d_%s.sql", m.Version, m.Name)), []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cfg := filepath.Join(t.TempDir(), "chdb.xml")
		if err := os.WriteFile(cfg, []byte(chdbClusterConfig), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(py, "chdb_check.py", dir, "--config", cfg, "--once").CombinedOutput()
		if err != nil {
			t.Fatalf("chdb check of the %s layout failed: %v\n%s", l.Cluster, err, out)
		}
		t.Logf("%s: %s", l.Cluster, out)
	}
}

var (
	addColumn  = regexp.MustCompile(`(?is)^\s*ALTER\s+TABLE\s+\w+\s+ADD\s+COLUMN\s+(\w+)\s`)
	createView = regexp.MustCompile(`(?is)^\s*CREATE\s+VIEW\s`)
)

// readsAny reports whether stmt creates a view that names one of columns.
func readsAny(stmt string, columns []string) bool {
	if !createView.MatchString(stmt) {
		return false
	}
	for _, c := range columns {
		if regexp.MustCompile(`\b` + c + `\b`).MatchString(stmt) {
			return true
		}
	}
	return false
}

// chdbClusterConfig gives chdb what the cluster layouts name: a keeper
// (ClickHouse's in-memory test keeper), the macros and both clusters.
const chdbClusterConfig = `<clickhouse>
  <zookeeper><implementation>testkeeper</implementation></zookeeper>
  <macros><shard>01</shard><replica>ch1</replica><sharded_shard>01</sharded_shard></macros>
  <remote_servers>
    <sluice_replicated><shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>9000</port></replica></shard></sluice_replicated>
    <sluice_sharded><shard><internal_replication>true</internal_replication><replica><host>127.0.0.1</host><port>9000</port></replica></shard></sluice_sharded>
  </remote_servers>
</clickhouse>
`

// chdbPython returns the Python interpreter with chdb (`make chdb`, or
// SLUICE_CHDB_PYTHON); without one the test skips, and fails in CI.
func chdbPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("SLUICE_CHDB_PYTHON")
	if py == "" {
		py = filepath.Join("..", ".services", "venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		msg := "chdb interpreter " + py + " missing; run `make chdb`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return py
}
