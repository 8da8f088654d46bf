package migrations

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/sluicehq/sluice/platform/chconn"
)

// Layout says how the migration files become tables. The zero Layout is
// the single-server layout: every statement runs as written. With a
// Cluster, the files stay the same and each statement is rewritten as it
// is applied (Rewrite):
//
//   - CREATE TABLE of a MergeTree-family engine gets the Replicated engine
//     of the same family, with a ZooKeeper path from ReplicationPath and
//     the replica name '{replica}' (each server's macro), plus
//     replicated_deduplication_window = DedupWindow: an insert retried on
//     another replica with the same bytes (the aggregator retries a batch
//     unchanged) is recognised and stored once.
//   - With Sharded, a table keyed by tenant (one with a tenant column) is
//     created as <table>_local, replicated within its shard, and <table>
//     becomes a Distributed table over it sharded by cityHash64(tenant), so
//     every reader and writer keeps the name it uses. Other tables
//     (prices, aggregator snapshots) are replicated whole to every server.
//   - ALTER of a sharded table is applied to <table>_local and then to
//     <table>.
//
// Migrations are applied server by server (ApplyConfig), not ON CLUSTER:
// every server in clickhouse.addrs gets every statement, in file order,
// and keeps its own schema_migrations ledger. A replicated ALTER reaches
// the other replicas through ZooKeeper, so an ALTER of a replicated table
// runs on one server of each shard (of the cluster, for a table replicated
// to every server; Step.Scope), and on the others an ADD COLUMN waits
// until the column has arrived.
type Layout struct {
	// Cluster is the ClickHouse cluster name (remote_servers); empty is
	// the single-server layout.
	Cluster string
	// Sharded splits the tables keyed by tenant over the cluster's shards.
	Sharded bool
	// ReplicationPath is the ZooKeeper path template of a replicated
	// table (chconn.Config.ReplicationPath).
	ReplicationPath string
	// Database fills {database} in ReplicationPath.
	Database string
}

// DedupWindow is the replicated_deduplication_window of every replicated
// table: how many of a table's latest inserts ZooKeeper remembers by
// their blocks' hashes. ClickHouse 18.16's default, 100, is a few seconds
// of the aggregator's inserts at a few thousand events a second, shorter
// than a retry after a replica failover can take.
const DedupWindow = 1000

// LayoutOf returns the layout c's migrations are applied with.
func LayoutOf(c chconn.Config) Layout {
	if c.Cluster == "" {
		return Layout{}
	}
	p := c.ReplicationPath
	if p == "" {
		p = chconn.DefaultReplicationPath
	}
	return Layout{Cluster: c.Cluster, Sharded: c.Sharded, ReplicationPath: p, Database: c.Database}
}

// Step is one statement of a migration as a layout applies it.
type Step struct {
	SQL string
	// Scope says on which servers the statement runs.
	Scope Scope
}

// Scope is where a step runs.
type Scope int

const (
	// OnEveryServer: the statement runs on each server (CREATE, DROP,
	// views, Distributed tables, the single-server layout).
	OnEveryServer Scope = iota
	// OncePerShard: the statement alters a table replicated within each
	// shard, so it runs on one server of each shard and replication
	// brings it to the shard's other replicas; there an ADD COLUMN is
	// waited for.
	OncePerShard
	// OnceInCluster: the statement alters a table replicated to every
	// server, so it runs on one server.
	OnceInCluster
)

var (
	createTable  = regexp.MustCompile(`(?is)^\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)\s*(\(.*\))\s*ENGINE\s*=\s*(\w*MergeTree)\s*\(([^)]*)\)(.*)$`)
	anyCreate    = regexp.MustCompile(`(?is)^\s*CREATE\s+TABLE\b`)
	tenantColumn = regexp.MustCompile(`(?m)^\s*\(?\s*tenant\s+String\b`)
	alterTable   = regexp.MustCompile(`(?is)^(\s*ALTER\s+TABLE\s+)(\w+)(\s.*)$`)
	dropTable    = regexp.MustCompile(`(?is)^\s*DROP\s+TABLE\s+IF\s+EXISTS\s+(\w+)\s*$`)
	settingsPart = regexp.MustCompile(`(?is)\bSETTINGS\b`)
)

// rewriter turns the statements of every migration, in order, into the
// steps of a layout; it remembers which tables it made sharded or
// replicated, so later ALTERs and DROPs follow them.
type rewriter struct {
	l        Layout
	sharded  map[string]bool  // tables with a _local table under a Distributed one
	replicas map[string]Scope // replicated tables (the _local ones included): where an ALTER of them runs
}

func newRewriter(l Layout) *rewriter {
	return &rewriter{l: l, sharded: map[string]bool{}, replicas: map[string]Scope{}}
}

// Rewrite returns the steps of every migration under l, in order, one
// list per migration. It must see every migration, applied or not, so
// that a later ALTER knows what an earlier CREATE made.
func (l Layout) Rewrite(all []Migration) ([][]Step, error) {
	r := newRewriter(l)
	out := make([][]Step, len(all))
	for i, m := range all {
		for j, st := range m.Statements {
			steps, err := r.rewrite(m.Version, st)
			if err != nil {
				return nil, fmt.Errorf("migrations: %03d_%s statement %d: %w", m.Version, m.Name, j+1, err)
			}
			out[i] = append(out[i], steps...)
		}
	}
	return out, nil
}

func (r *rewriter) rewrite(version int, stmt string) ([]Step, error) {
	if r.l.Cluster == "" {
		return []Step{{SQL: stmt}}, nil
	}
	if m := createTable.FindStringSubmatch(stmt); m != nil {
		name, cols, engine, args, rest := m[1], m[2], m[3], strings.TrimSpace(m[4]), m[5]
		shard := r.l.Sharded && tenantColumn.MatchString(cols)
		local := name
		if shard {
			local = name + "_local"
		}
		path := r.path(version, name, !shard && r.l.Sharded)
		eargs := fmt.Sprintf("'%s', '{replica}'", path)
		if args != "" {
			eargs += ", " + args
		}
		if settingsPart.MatchString(rest) {
			rest = strings.TrimRight(rest, " \n\t") + fmt.Sprintf(", replicated_deduplication_window = %d", DedupWindow)
		} else {
			rest = strings.TrimRight(rest, " \n\t") + fmt.Sprintf("\nSETTINGS replicated_deduplication_window = %d", DedupWindow)
		}
		steps := []Step{{SQL: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s\n%s\nENGINE = Replicated%s(%s)%s", local, cols, engine, eargs, rest)}}
		r.replicas[local] = OncePerShard
		if !shard && r.l.Sharded {
			r.replicas[local] = OnceInCluster
		}
		delete(r.sharded, name)
		if shard {
			r.sharded[name] = true
			steps = append(steps, Step{SQL: fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s AS %s\nENGINE = Distributed(%s, %s, %s, cityHash64(tenant))",
				name, local, r.l.Cluster, r.l.Database, local)})
		}
		return steps, nil
	}
	if anyCreate.MatchString(stmt) {
		return nil, fmt.Errorf("a CREATE TABLE the cluster layout cannot rewrite: write it as CREATE TABLE IF NOT EXISTS <name> (<columns>) ENGINE = <X>MergeTree(<args>) ..., or teach migrations.Layout the new form")
	}
	if m := alterTable.FindStringSubmatch(stmt); m != nil {
		name := m[2]
		if r.sharded[name] {
			return []Step{
				{SQL: m[1] + name + "_local" + m[3], Scope: OncePerShard},
				{SQL: stmt},
			}, nil
		}
		return []Step{{SQL: stmt, Scope: r.replicas[name]}}, nil
	}
	if m := dropTable.FindStringSubmatch(stmt); m != nil {
		name := m[1]
		if r.sharded[name] {
			delete(r.sharded, name)
			delete(r.replicas, name+"_local")
			return []Step{{SQL: stmt}, {SQL: "DROP TABLE IF EXISTS " + name + "_local"}}, nil
		}
		delete(r.replicas, name)
		return []Step{{SQL: stmt}}, nil
	}
	return []Step{{SQL: stmt}}, nil
}

// path is the ZooKeeper path of table, created by migration version:
// {database} and {table} filled in, the table with the migration's number
// so that a table dropped and created again by a later migration never
// meets the metadata its former self left. A table replicated whole to
// every server of a sharded cluster has a path without the servers'
// macros ({shard} and the like become "all").
func (r *rewriter) path(version int, table string, everywhere bool) string {
	p := strings.NewReplacer("{database}", r.l.Database, "{table}", fmt.Sprintf("%s_%03d", table, version)).Replace(r.l.ReplicationPath)
	if everywhere {
		p = macro.ReplaceAllString(p, "all")
	}
	return p
}

var macro = regexp.MustCompile(`\{[A-Za-z_][A-Za-z0-9_]*\}`)
