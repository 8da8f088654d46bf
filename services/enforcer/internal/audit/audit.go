// Package audit records admin actions in ClickHouse's admin_audit table and
// reads them back, so that the audit log is also the enforcer's memory of
// manual breakers, blacklists and overrides across restarts.
package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Entry is one admin action: who did what to whom, when and why.
type Entry struct {
	Time      time.Time
	Actor     string
	Action    string
	Tenant    string
	Model     string
	APIKeyID  string
	Reason    string
	ExpiresAt time.Time
	// Details is the action's JSON request, enough to replay it.
	Details   string
	RequestID string
}

// Log writes and reads admin_audit.
type Log struct{ conn driver.Conn }

// New returns a Log on conn (admin_audit must exist: migrations 005).
func New(conn driver.Conn) *Log { return &Log{conn: conn} }

// Write inserts e, returning only once ClickHouse has it.
func (l *Log) Write(ctx context.Context, e Entry) error {
	b, err := l.conn.PrepareBatch(ctx, "INSERT INTO admin_audit (time, actor, action, tenant, model, api_key_id, reason, expires_at, details, request_id)")
	if err != nil {
		return fmt.Errorf("audit: prepare: %w", err)
	}
	exp := e.ExpiresAt
	if exp.IsZero() {
		exp = time.Unix(0, 0)
	}
	if err := b.Append(e.Time.UTC(), e.Actor, e.Action, e.Tenant, e.Model, e.APIKeyID, e.Reason, exp.UTC(), e.Details, e.RequestID); err != nil {
		b.Abort()
		return fmt.Errorf("audit: append: %w", err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("audit: insert: %w", err)
	}
	return nil
}

// Since returns the entries from since on, oldest first.
func (l *Log) Since(ctx context.Context, since time.Time) ([]Entry, error) {
	return l.query(ctx, "time >= toDateTime(?)", since.Unix())
}

// ByKey returns the entries of API key apiKeyID (its actions and its
// control-plane changes), oldest first.
func (l *Log) ByKey(ctx context.Context, apiKeyID string) ([]Entry, error) {
	return l.query(ctx, "api_key_id = ?", apiKeyID)
}

// ByTenant returns the entries of tenant (its actions and its
// control-plane changes; a plan's, whose name the tenant column holds),
// oldest first.
func (l *Log) ByTenant(ctx context.Context, tenant string) ([]Entry, error) {
	return l.query(ctx, "tenant = ?", tenant)
}

func (l *Log) query(ctx context.Context, where string, arg any) ([]Entry, error) {
	rows, err := l.conn.Query(ctx, `SELECT time, actor, action, tenant, model, api_key_id, reason, expires_at, details, request_id
FROM admin_audit WHERE `+where+` ORDER BY time, request_id`, arg)
	if err != nil {
		return nil, fmt.Errorf("audit: query: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		if err := rows.Scan(&e.Time, &e.Actor, &e.Action, &e.Tenant, &e.Model, &e.APIKeyID, &e.Reason, &e.ExpiresAt, &e.Details, &e.RequestID); err != nil {
			return nil, fmt.Errorf("audit: scan: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
