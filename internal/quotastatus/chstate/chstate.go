// Package chstate reads quota status from ClickHouse: the aggregator's
// quota_state rows of the open periods and the refused calls of
// usage_events (the quotastatus.StateStore), plus what the console draws
// beside them: per-minute usage by model (usage_minute) and the recent
// signals of a tenant (signals_log).
//
// Every table it reads is a ReplacingMergeTree whose rows a later version
// replaces, so each query folds versions itself (argMax by version,
// DISTINCT on replayed signals) instead of relying on FINAL, and each runs
// on ClickHouse 18.16 as on current releases.
package chstate

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/internal/quotastatus"
	"github.com/sluicehq/sluice/schemas"
)

// Store reads from one ClickHouse database. It is safe for concurrent use.
type Store struct {
	conn driver.Conn
}

// New returns a Store on conn (platform/chconn.Open).
func New(conn driver.Conn) *Store { return &Store{conn: conn} }

var _ quotastatus.StateStore = (*Store)(nil)

// Aliases differ from column names: ClickHouse 18.16 resolves a WHERE
// column to a same-named aggregate alias. A period is open from its start
// to its end; rows of a later period (events stamped ahead) wait for it.
const quotasQuery = `
SELECT tenant, model, quota, period, period_start, pe, u, l, un, md, tr, rt, px, plo, phi, pb, upd FROM (
  SELECT tenant, model, quota, period, period_start,
         any(period_end) AS pe, argMax(used, version) AS u, argMax(quota_limit, version) AS l,
         argMax(unit, version) AS un, argMax(mode, version) AS md, argMax(tier, version) AS tr,
         argMax(rate_per_minute, version) AS rt, argMax(predicted_exhaustion, version) AS px,
         argMax(predicted_earliest, version) AS plo, argMax(predicted_latest, version) AS phi,
         argMax(prediction_basis, version) AS pb,
         max(updated_at) AS upd
  FROM quota_state
  WHERE period_end > toDateTime(?) AND period_start <= toDateTime(?) %s
  GROUP BY tenant, model, quota, period, period_start
)`

// Quotas returns the quotas of the periods open at now (see
// quotastatus.StateStore).
func (s *Store) Quotas(ctx context.Context, tenant string, now time.Time) ([]quotastatus.TenantQuota, error) {
	args := []any{now.Unix(), now.Unix()}
	filter := ""
	if tenant != "" {
		filter, args = "AND tenant = ?", append(args, tenant)
	}
	return query(ctx, s.conn, "quota_state", fmt.Sprintf(quotasQuery, filter), args, scanQuota)
}

func scanQuota(rows driver.Rows) (quotastatus.TenantQuota, error) {
	var (
		r                 quotastatus.TenantQuota
		quota, period     string
		unit, mode        string
		tier              uint16
		pred, upd, pe, ps time.Time
		lo, hi            time.Time
	)
	if err := rows.Scan(&r.Tenant, &r.Model, &quota, &period, &ps, &pe, &r.Used, &r.Limit, &unit, &mode, &tier,
		&r.RatePerMinute, &pred, &lo, &hi, &r.PredictionBasis, &upd); err != nil {
		return r, err
	}
	r.Quota.Quota, r.Period, r.Unit, r.Mode = schemas.QuotaKind(quota), schemas.Period(period), schemas.Unit(unit), schemas.Mode(mode)
	r.Tier, r.PeriodStart, r.ResetsAt = int(tier), ps.UTC(), pe.UTC()
	// The aggregator stores "no prediction" as the epoch.
	if pred.Unix() > 0 {
		r.PredictedExhaustion = utcOrNil(pred)
		r.PredictedEarliest, r.PredictedLatest = utcOrNil(lo), utcOrNil(hi)
	} else {
		r.PredictionBasis = ""
	}
	if upd.Unix() > 0 {
		u := upd.UTC()
		r.UpdatedAt = &u
	}
	return r, nil
}

// query runs q and scans each of its rows with scan, naming table in its
// errors: the reads of this package differ only in their SQL and columns.
func query[T any](ctx context.Context, conn driver.Conn, table, q string, args []any, scan func(driver.Rows) (T, error)) ([]T, error) {
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", table, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", table, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", table, err)
	}
	return out, nil
}

// utcOrNil is t in UTC, or nil for the epoch: how the aggregator stores
// "none".
func utcOrNil(t time.Time) *time.Time {
	if t.Unix() <= 0 {
		return nil
	}
	u := t.UTC()
	return &u
}

// Refused counts the distinct refused calls (outcome rejected: the event a
// gateway reports for each call its flags or admission refused) since
// since, by tenant.
func (s *Store) Refused(ctx context.Context, tenant string, since time.Time) (map[string]int64, error) {
	q := `SELECT tenant, uniqExact(id) FROM usage_events WHERE outcome = ? AND time >= toDateTime(?)`
	args := []any{string(schemas.OutcomeRejected), since.Unix()}
	if tenant != "" {
		q, args = q+" AND tenant = ?", append(args, tenant)
	}
	rows, err := s.conn.Query(ctx, q+" GROUP BY tenant", args...)
	if err != nil {
		return nil, fmt.Errorf("usage_events: refused calls: %w", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var t string
		var n uint64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, fmt.Errorf("usage_events: refused calls: %w", err)
		}
		out[t] = int64(n)
	}
	return out, rows.Err()
}

// Minute is one model's usage in one minute.
type Minute struct {
	Model    string
	Minute   time.Time
	Requests float64
	// Tokens are prompt plus completion tokens, what token quotas count.
	Tokens float64
	// Cost is in the price table's currency, what budgets count.
	Cost float64
}

// Value returns the minute's figure in unit.
func (m Minute) Value(unit schemas.Unit) float64 {
	switch unit {
	case schemas.UnitRequests:
		return m.Requests
	case schemas.UnitCurrency:
		return m.Cost
	}
	return m.Tokens
}

// Minutes returns a tenant's per-minute usage in [from, to), every model
// and the "*" total, ordered by model then minute.
func (s *Store) Minutes(ctx context.Context, tenant string, from, to time.Time) ([]Minute, error) {
	return query(ctx, s.conn, "usage_minute", `
SELECT model, minute, rq, tk, cs FROM (
  SELECT model, minute, argMax(requests, version) AS rq,
         argMax(prompt_tokens + completion_tokens, version) AS tk, argMax(cost, version) AS cs
  FROM usage_minute
  WHERE tenant = ? AND minute >= toDateTime(?) AND minute < toDateTime(?)
  GROUP BY model, minute
) ORDER BY model, minute`, []any{tenant, from.Unix(), to.Unix()},
		func(rows driver.Rows) (Minute, error) {
			var m Minute
			var rq, tk uint64
			err := rows.Scan(&m.Model, &m.Minute, &rq, &tk, &m.Cost)
			m.Minute, m.Requests, m.Tokens = m.Minute.UTC(), float64(rq), float64(tk)
			return m, err
		})
}

// Signal is one signal of the signals log, as the console lists a tenant's
// recent alerts.
type Signal struct {
	Time         time.Time
	Kind         schemas.SignalKind
	Model, Quota string
	Tier         int
	Used, Limit  float64
	Reason       string
}

// Signals returns a tenant's latest signals, newest first, at most limit.
func (s *Store) Signals(ctx context.Context, tenant string, limit int) ([]Signal, error) {
	return query(ctx, s.conn, "signals_log", `
SELECT DISTINCT id, time, kind, model, quota, tier, used, quota_limit, reason
FROM signals_log WHERE tenant = ? ORDER BY time DESC, id LIMIT ?`, []any{tenant, limit},
		func(rows driver.Rows) (Signal, error) {
			var (
				sg       Signal
				id, kind string
				tier     uint16
			)
			err := rows.Scan(&id, &sg.Time, &kind, &sg.Model, &sg.Quota, &tier, &sg.Used, &sg.Limit, &sg.Reason)
			sg.Time, sg.Kind, sg.Tier = sg.Time.UTC(), schemas.SignalKind(kind), int(tier)
			return sg, err
		})
}

// Throughput returns, per minute in [from, to), the requests and tokens
// counted for every tenant together (the "*" rows of usage_minute).
func (s *Store) Throughput(ctx context.Context, from, to time.Time) ([]Minute, error) {
	return query(ctx, s.conn, "usage_minute", `
SELECT minute, sum(rq), sum(tk) FROM (
  SELECT tenant, minute, argMax(requests, version) AS rq, argMax(prompt_tokens + completion_tokens, version) AS tk
  FROM usage_minute
  WHERE model = '*' AND minute >= toDateTime(?) AND minute < toDateTime(?)
  GROUP BY tenant, minute
) GROUP BY minute ORDER BY minute`, []any{from.Unix(), to.Unix()},
		func(rows driver.Rows) (Minute, error) {
			m := Minute{Model: "*"}
			var rq, tk uint64
			err := rows.Scan(&m.Minute, &rq, &tk)
			m.Minute, m.Requests, m.Tokens = m.Minute.UTC(), float64(rq), float64(tk)
			return m, err
		})
}
