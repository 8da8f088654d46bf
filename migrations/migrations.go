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
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
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
// order, and returns the versions it applied. A migration is recorded only
// after all its statements succeeded; statements use IF NOT EXISTS (or add
// one column each, skipped when it exists: see addColumn), so a migration
// interrupted half-way is safe to run again.
func Apply(ctx context.Context, conn driver.Conn, log *slog.Logger) ([]int, error) {
	all, err := Load()
	if err != nil {
		return nil, err
	}
	if err := conn.Exec(ctx, createLedger); err != nil {
		return nil, fmt.Errorf("migrations: create schema_migrations: %w", err)
	}
	applied, err := Applied(ctx, conn)
	if err != nil {
		return nil, err
	}
	var done []int
	for _, m := range all {
		if sum, ok := applied[m.Version]; ok {
			if sum != m.Checksum {
				return done, fmt.Errorf("migrations: %03d_%s changed after it was applied (checksum %s, recorded %s); never edit an applied migration, add a new one", m.Version, m.Name, m.Checksum[:12], sum[:12])
			}
			continue
		}
		for i, stmt := range m.Statements {
			if err := execIdempotent(ctx, conn, stmt); err != nil {
				return done, fmt.Errorf("migrations: %03d_%s statement %d: %w", m.Version, m.Name, i+1, err)
			}
		}
		// Batches, not INSERT ... VALUES: on 18.16 an Exec with literal
		// values hangs until its deadline.
		b, err := conn.PrepareBatch(ctx, "INSERT INTO schema_migrations (version, name, checksum, applied_at)")
		if err != nil {
			return done, fmt.Errorf("migrations: record %03d: %w", m.Version, err)
		}
		if err := b.Append(uint32(m.Version), m.Name, m.Checksum, time.Now().UTC()); err != nil {
			return done, fmt.Errorf("migrations: record %03d: %w", m.Version, err)
		}
		if err := b.Send(); err != nil {
			return done, fmt.Errorf("migrations: record %03d: %w", m.Version, err)
		}
		log.Info("migration applied", "version", m.Version, "name", m.Name)
		done = append(done, m.Version)
	}
	return done, nil
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
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = ? AND name = ?", table, column).Scan(&n); err != nil {
			return fmt.Errorf("look up column %s.%s: %w", table, column, err)
		}
		if n > 0 {
			return nil
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
