// Package migrations holds Sluice's ClickHouse schema as numbered SQL files
// and applies them in order, recording each applied version in the
// schema_migrations table so that applying again changes nothing.
//
// Every file must run on ClickHouse 18.16 (what Debian ships and the tests
// use: no TTL, no DateTime64, no Map, LowCardinality only behind a setting)
// and on current ClickHouse (checked through chdb by chdb_check.py). Files
// are never edited once released: a change is a new file. Apply refuses to
// run when an applied file's checksum changed, rather than guess.
//
// Number ranges keep parallel work apart: 001-009 foundation, 010-019
// aggregator, 020-029 enforcer, 030-039 alerter, 040-049 reconciler and
// reports.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/platform/chconn"
)

//go:embed sql/*.sql
var files embed.FS

// FS returns the embedded migration files, for tools that check them
// elsewhere (the chdb check reads the same folder from disk).
func FS() fs.FS {
	sub, _ := fs.Sub(files, "sql")
	return sub
}

// Migration is one numbered SQL file.
type Migration struct {
	Version    int
	Name       string
	Statements []string
	Checksum   string
}

var fileName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.sql$`)

// Load parses every embedded migration, ordered by version.
func Load() ([]Migration, error) { return load(FS()) }

func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, err
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrations: %s: name must be NNN_lower_snake.sql", e.Name())
		}
		v, _ := strconv.Atoi(m[1])
		if prev, ok := seen[v]; ok {
			return nil, fmt.Errorf("migrations: %s and %s share version %d", prev, e.Name(), v)
		}
		seen[v] = e.Name()
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, err
		}
		stmts := SplitStatements(string(body))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("migrations: %s has no statements", e.Name())
		}
		for i, st := range stmts {
			_, _, one := addedColumn(st)
			if n := len(anyAddColumn.FindAllString(st, -1)); n > 1 || (n == 1 && !one) {
				return nil, fmt.Errorf("migrations: %s statement %d: add one column per statement, as ALTER TABLE <table> ADD COLUMN <name> ... without IF NOT EXISTS (ClickHouse 18.16 has none; Apply skips the statement when the column exists)", e.Name(), i+1)
			}
		}
		sum := sha256.Sum256(body)
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(path.Base(e.Name()), ".sql"), Statements: stmts, Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// SplitStatements splits a file into statements at semicolons that end a
// line, dropping comment-only lines. Migrations keep one statement per
// semicolon-terminated block; string literals never end a line with ';'.
func SplitStatements(sql string) []string {
	var (
		out []string
		cur strings.Builder
	)
	for _, line := range strings.Split(sql, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			stmt := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")
			out = append(out, stmt)
			cur.Reset()
		}
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		out = append(out, rest)
	}
	return out
}

const createLedger = `CREATE TABLE IF NOT EXISTS schema_migrations
(
    version    UInt32,
    name       String,
    checksum   String,
    applied_at DateTime
)
ENGINE = ReplacingMergeTree()
ORDER BY version`

// Apply runs every migration not yet recorded in schema_migrations, in
// order, and returns the versions it applied, in the single-server layout
// on conn. A migration is recorded only after all its statements
// succeeded; statements use IF NOT EXISTS (or add one column each, skipped
// when it exists: see addColumn), so a migration interrupted half-way is
// safe to run again.
func Apply(ctx context.Context, conn driver.Conn, log *slog.Logger) ([]int, error) {
	return applyServers(ctx, []server{{conn: conn}}, Layout{}, log)
}

// ApplyConfig applies the migrations as c asks: on the one server of c in
// the single-server layout, or, with c.Cluster, on every server of
// c.Servers() in the cluster layout (Layout), each with its own ledger.
// Every server must be up: one that is not fails the run, naming it, and
// a later run completes it. It returns the versions applied on any server.
func ApplyConfig(ctx context.Context, c chconn.Config, log *slog.Logger) ([]int, error) {
	addrs := []string{""}
	if c.Cluster != "" {
		addrs = c.Servers()
	}
	var servers []server
	defer func() {
		for _, s := range servers {
			s.conn.Close()
		}
	}()
	for _, a := range addrs {
		one := c
		if a != "" {
			one.Addrs, one.Addr = nil, a
		}
		conn, err := chconn.Open(ctx, one)
		if err != nil {
			return nil, fmt.Errorf("migrations: %w", err)
		}
		srv := server{addr: a, conn: conn}
		if c.Cluster != "" {
			if srv.shard, err = shardOf(ctx, conn, c.Cluster, a); err != nil {
				conn.Close()
				return nil, fmt.Errorf("migrations: server %s: %w", a, err)
			}
		}
		servers = append(servers, srv)
	}
	return applyServers(ctx, servers, LayoutOf(c), log)
}

// shardOf returns the shard of the server at addr in cluster, as the
// server's own remote_servers say, and checks that it knows the cluster:
// a typo in clickhouse.cluster would otherwise surface only as a
// Distributed table that cannot be read. A server whose address the
// cluster names otherwise (a host name for an IP, say) is a shard of its
// own: it gets every replicated ALTER too, which its ADD COLUMN check
// makes harmless.
func shardOf(ctx context.Context, conn driver.Conn, cluster, addr string) (int, error) {
	host, port, _ := net.SplitHostPort(addr)
	rows, err := conn.Query(ctx, "SELECT shard_num, host_name, host_address, toString(port) FROM system.clusters WHERE cluster = ?", cluster)
	if err != nil {
		return 0, fmt.Errorf("look up cluster %s: %w", cluster, err)
	}
	defer rows.Close()
	known, shard := false, -1
	for rows.Next() {
		var (
			num                  uint32
			name, address, port2 string
		)
		if err := rows.Scan(&num, &name, &address, &port2); err != nil {
			return 0, err
		}
		known = true
		if port2 == port && (name == host || address == host) {
			shard = int(num)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if !known {
		return 0, fmt.Errorf("clickhouse.cluster: the server has no cluster %q in its remote_servers", cluster)
	}
	if shard < 0 {
		shardless++
		shard = -shardless
	}
	return shard, nil
}

// shardless numbers the servers shardOf could not place (negative).
var shardless int

// server is one ClickHouse server migrations are applied to.
type server struct {
	addr    string // "" in the single-server layout
	conn    driver.Conn
	shard   int // its shard in the cluster (0 in the single-server layout)
	applied map[int]string
}

func (s server) name() string {
	if s.addr == "" {
		return "clickhouse"
	}
	return s.addr
}

// columnArrival bounds the wait, on a replica after the first, for a
// column another replica's ALTER added to a replicated table.
const columnArrival = time.Minute

func applyServers(ctx context.Context, servers []server, layout Layout, log *slog.Logger) ([]int, error) {
	all, err := Load()
	if err != nil {
		return nil, err
	}
	steps, err := layout.Rewrite(all)
	if err != nil {
		return nil, err
	}
	for i := range servers {
		s := &servers[i]
		if err := s.conn.Exec(ctx, createLedger); err != nil {
			return nil, fmt.Errorf("migrations: %s: create schema_migrations: %w", s.name(), err)
		}
		if s.applied, err = Applied(ctx, s.conn); err != nil {
			return nil, err
		}
	}
	var done []int
	for k, m := range all {
		var pending []*server
		for i := range servers {
			s := &servers[i]
			if sum, ok := s.applied[m.Version]; ok {
				if sum != m.Checksum {
					return done, fmt.Errorf("migrations: %03d_%s changed after it was applied (checksum %s, recorded %s); never edit an applied migration, add a new one", m.Version, m.Name, m.Checksum[:12], sum[:12])
				}
				continue
			}
			pending = append(pending, s)
		}
		if len(pending) == 0 {
			continue
		}
		for i, st := range steps[k] {
			ran := map[int]bool{} // shards whose replicated table took the step
			for n, s := range pending {
				first := n == 0
				if st.Scope == OncePerShard {
					first = !ran[s.shard]
					ran[s.shard] = true
				}
				if err := runStep(ctx, s.conn, st, first); err != nil {
					where := ""
					if s.addr != "" {
						where = " on " + s.addr
					}
					return done, fmt.Errorf("migrations: %03d_%s step %d%s: %w", m.Version, m.Name, i+1, where, err)
				}
			}
		}
		for _, s := range pending {
			// Batches, not INSERT ... VALUES: on 18.16 an Exec with
			// literal values hangs until its deadline.
			b, err := s.conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, checksum, applied_at)")
			if err != nil {
				return done, fmt.Errorf("migrations: record %03d on %s: %w", m.Version, s.name(), err)
			}
			if err := b.Append(uint32(m.Version), m.Name, m.Checksum, time.Now().UTC()); err != nil {
				return done, fmt.Errorf("migrations: record %03d on %s: %w", m.Version, s.name(), err)
			}
			if err := b.Send(); err != nil {
				return done, fmt.Errorf("migrations: record %03d on %s: %w", m.Version, s.name(), err)
			}
			if s.addr == "" {
				log.Info("migration applied", "version", m.Version, "name", m.Name)
			} else {
				log.Info("migration applied", "version", m.Version, "name", m.Name, "server", s.addr)
			}
		}
		done = append(done, m.Version)
	}
	return done, nil
}

// runStep runs one step on one server. A step altering a replicated table
// runs on the first server of its scope that applies the migration only
// (first); on the others replication brings it, and an ADD COLUMN is
// waited for so that the statements after it find the column.
func runStep(ctx context.Context, conn driver.Conn, st Step, first bool) error {
	if st.Scope == OnEveryServer || first {
		return execIdempotent(ctx, conn, st.SQL)
	}
	table, column, ok := addedColumn(st.SQL)
	if !ok {
		return nil
	}
	deadline := time.Now().Add(columnArrival)
	for {
		has, err := hasColumn(ctx, conn, table, column)
		if err != nil {
			return err
		}
		if has {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("column %s.%s added on another replica has not arrived here after %s (is replication running? system.replication_queue)", table, column, columnArrival)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func hasColumn(ctx context.Context, conn driver.Conn, table, column string) (bool, error) {
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = ? AND name = ?", table, column).Scan(&n); err != nil {
		return false, fmt.Errorf("look up column %s.%s: %w", table, column, err)
	}
	return n > 0, nil
}

// addColumn is the one form a statement adding a column may take:
// ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS, so instead of the
// clause execIdempotent skips the statement when the table already has
// the column (a migration interrupted after it runs again). anyAddColumn
// finds every ADD COLUMN, so that load can refuse other forms.
var (
	addColumn    = regexp.MustCompile(`(?is)^\s*ALTER\s+TABLE\s+(\w+)\s+ADD\s+COLUMN\s+(\w+)\s`)
	anyAddColumn = regexp.MustCompile(`(?i)\bADD\s+COLUMN\b`)
)

// addedColumn returns the table and column of a statement of addColumn's
// form.
func addedColumn(stmt string) (table, column string, ok bool) {
	m := addColumn.FindStringSubmatch(stmt)
	if m == nil || strings.EqualFold(m[2], "IF") {
		return "", "", false
	}
	return m[1], m[2], true
}

// execIdempotent runs one migration statement; an ADD COLUMN of a column
// the table has already is skipped (see addColumn).
func execIdempotent(ctx context.Context, conn driver.Conn, stmt string) error {
	if table, column, ok := addedColumn(stmt); ok {
		has, err := hasColumn(ctx, conn, table, column)
		if err != nil || has {
			return err
		}
	}
	return conn.Exec(ctx, stmt)
}

// Applied returns the recorded versions and their checksums.
func Applied(ctx context.Context, conn driver.Conn) (map[int]string, error) {
	rows, err := conn.Query(ctx, "SELECT version, argMax(checksum, applied_at) FROM schema_migrations GROUP BY version")
	if err != nil {
		return nil, fmt.Errorf("migrations: read schema_migrations: %w", err)
	}
	defer rows.Close()
	out := map[int]string{}
	for rows.Next() {
		var (
			v   uint32
			sum string
		)
		if err := rows.Scan(&v, &sum); err != nil {
			return nil, err
		}
		out[int(v)] = sum
	}
	return out, rows.Err()
}
