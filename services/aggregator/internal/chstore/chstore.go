// Package chstore is the aggregator's ClickHouse side: it writes a
// partition batch (raw events, minute rollups, quota state, signals log) as
// column batches, and reads back the distinct events a restarted instance
// replays to rebuild its state.
//
// Every table written is a ReplacingMergeTree and every row is absolute
// (totals, not deltas), versioned by the Kafka offset it covers, so writing
// the same batch twice — a retry after a timeout, a replay after a crash —
// changes nothing a FINAL or argMax read sees.
package chstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// Event is a counted usage event with where it was read from.
type Event struct {
	schemas.UsageEvent
	Partition int32
	Offset    int64
}

// Batch is what one flush writes. Version must grow with the offsets the
// batch covers (the aggregator uses the highest offset plus one).
type Batch struct {
	tally.Rows
	Version uint64
	Events  []Event
	Signals []schemas.Signal
}

// Reset empties b, keeping its buffers.
func (b *Batch) Reset() {
	for i := range b.Events {
		b.Events[i] = Event{} // drop references to decoded records
	}
	b.Rows.Reset()
	b.Events, b.Signals = b.Events[:0], b.Signals[:0]
	b.Version = 0
}

// CostFunc prices one event, as the aggregator's state does.
type CostFunc func(model string, at time.Time, prompt, completion, cached int64) float64

// Store writes to and reads from one ClickHouse database.
type Store struct {
	conn       driver.Conn
	cost       func() CostFunc
	slowCallMS int64
}

// New returns a Store on conn. cost returns the pricing in force, used to
// recompute late minutes; slowCallMS is the slow-call threshold.
func New(conn driver.Conn, cost func() CostFunc, slowCallMS int64) *Store {
	return &Store{conn: conn, cost: cost, slowCallMS: slowCallMS}
}

const insertEvents = `INSERT INTO usage_events (id, time, time_ms, tenant, model, prompt_tokens, completion_tokens, cached_tokens,
 user, api_key_id, provider, endpoint, status, outcome, latency_ms, priority, session_id, estimated, gateway,
 attribute_keys, attribute_values, kafka_partition, kafka_offset, ingested_at)`

const insertMinutes = `INSERT INTO usage_minute (tenant, model, minute, requests, prompt_tokens, completion_tokens,
 cached_tokens, errors, slow_calls, cost, version, updated_at)`

const insertQuotas = `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used, quota_limit,
 unit, mode, tier, rate_per_minute, predicted_exhaustion, version, updated_at)`

const insertSignals = `INSERT INTO signals_log (id, kind, time, tenant, model, quota, period, period_start, tier,
 previous_tier, used, quota_limit, rate_per_minute, predicted_exhaustion, reason, payload)`

// Write stores b: raw events first (late minutes are recomputed from them),
// then rollups, quota state and the signals log. It is idempotent.
func (s *Store) Write(ctx context.Context, b *Batch) error {
	now := time.Now().UTC().Truncate(time.Second)
	if len(b.Events) > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertEvents)
		if err != nil {
			return fmt.Errorf("usage_events: prepare: %w", err)
		}
		for i := range b.Events {
			e := &b.Events[i]
			keys, vals := attrs(e.Attributes)
			est := uint8(0)
			if e.Estimated {
				est = 1
			}
			if err := batch.Append(e.ID, e.Time.UTC(), uint16(e.Time.Nanosecond()/1e6), e.Tenant, e.Model,
				uint64(e.PromptTokens), uint64(e.CompletionTokens), uint64(e.CachedTokens),
				e.User, e.APIKeyID, e.Provider, e.Endpoint, uint16(e.Status), string(e.Outcome), uint32(e.LatencyMS),
				string(e.Priority), e.SessionID, est, e.Gateway, keys, vals, e.Partition, e.Offset, now); err != nil {
				batch.Abort()
				return fmt.Errorf("usage_events: append: %w", err)
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("usage_events: send %d rows: %w", len(b.Events), err)
		}
	}
	minutes, quotas := b.Minutes, b.Quotas
	if len(b.MinuteRepairs) > 0 {
		fixed, err := s.recompute(ctx, b.MinuteRepairs)
		if err != nil {
			return err
		}
		minutes = append(minutes[:len(minutes):len(minutes)], fixed...)
	}
	if len(b.QuotaRepairs) > 0 {
		fixed, err := s.recomputeQuotas(ctx, b.QuotaRepairs)
		if err != nil {
			return err
		}
		quotas = append(quotas[:len(quotas):len(quotas)], fixed...)
	}
	if len(minutes) > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertMinutes)
		if err != nil {
			return fmt.Errorf("usage_minute: prepare: %w", err)
		}
		for _, m := range minutes {
			if err := batch.Append(m.Tenant, m.Model, m.Minute, m.Requests, m.PromptTokens, m.CompletionTokens,
				m.CachedTokens, m.Errors, m.SlowCalls, m.Cost, b.Version, now); err != nil {
				batch.Abort()
				return fmt.Errorf("usage_minute: append: %w", err)
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("usage_minute: send %d rows: %w", len(minutes), err)
		}
	}
	if len(quotas) > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertQuotas)
		if err != nil {
			return fmt.Errorf("quota_state: prepare: %w", err)
		}
		for _, q := range quotas {
			pred := q.PredictedExhaustion
			if pred.IsZero() {
				pred = time.Unix(0, 0).UTC()
			}
			if err := batch.Append(q.Tenant, q.Model, q.Quota, q.Period, q.PeriodStart, q.PeriodEnd, q.Used, q.Limit,
				q.Unit, q.Mode, q.Tier, q.Rate, pred, b.Version, now); err != nil {
				batch.Abort()
				return fmt.Errorf("quota_state: append: %w", err)
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("quota_state: send %d rows: %w", len(quotas), err)
		}
	}
	if len(b.Signals) > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertSignals)
		if err != nil {
			return fmt.Errorf("signals_log: prepare: %w", err)
		}
		for i := range b.Signals {
			sg := &b.Signals[i]
			payload, err := schemas.EncodeSignal(sg)
			if err != nil {
				batch.Abort()
				return fmt.Errorf("signals_log: signal %s: %w", sg.ID, err)
			}
			pred := time.Unix(0, 0).UTC()
			if sg.PredictedExhaustion != nil {
				pred = sg.PredictedExhaustion.UTC()
			}
			start := sg.PeriodStart
			if start.IsZero() {
				start = time.Unix(0, 0).UTC()
			}
			if err := batch.Append(sg.ID, string(sg.Kind), sg.Time, sg.Tenant, sg.Model, string(sg.Quota), string(sg.Period),
				start, uint16(sg.Tier), uint16(sg.PreviousTier), sg.Used, sg.Limit, sg.Rate, pred, sg.Reason, string(payload)); err != nil {
				batch.Abort()
				return fmt.Errorf("signals_log: append: %w", err)
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("signals_log: send %d rows: %w", len(b.Signals), err)
		}
	}
	return nil
}

func attrs(m map[string]string) (keys, vals []string) {
	keys = make([]string, 0, len(m))
	vals = make([]string, 0, len(m))
	for k, v := range m {
		keys = append(keys, k)
		vals = append(vals, v)
	}
	return keys, vals
}

// distinctEvents selects each id's latest version (highest offset) among
// the stored events of one partition below an offset: exactly what a clean
// run had counted when it reached that offset.
const distinctEvents = `SELECT id, tenant,
 argMax(model, kafka_offset), argMax(time, kafka_offset), argMax(time_ms, kafka_offset),
 argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset), argMax(cached_tokens, kafka_offset),
 argMax(status, kafka_offset), argMax(outcome, kafka_offset), argMax(latency_ms, kafka_offset),
 argMax(estimated, kafka_offset), max(kafka_offset) AS off
FROM usage_events
WHERE %s
GROUP BY tenant, id
ORDER BY off`

// Replay calls fn, in offset order, with every distinct event stored for
// partition below offset before whose time is at or after the start of the
// previous calendar month (in any time zone) of the latest stored event:
// enough to rebuild every open period and the one before it.
func (s *Store) Replay(ctx context.Context, partition int32, before int64, fn func(ev *schemas.UsageEvent, offset int64)) (int, error) {
	var latest time.Time
	if err := s.conn.QueryRow(ctx, "SELECT max(time) FROM usage_events WHERE kafka_partition = ? AND kafka_offset < ?", partition, before).Scan(&latest); err != nil {
		return 0, fmt.Errorf("replay partition %d: latest event: %w", partition, err)
	}
	if latest.Unix() <= 0 {
		return 0, nil
	}
	l := latest.UTC()
	since := time.Date(l.Year(), l.Month()-1, 1, 0, 0, 0, 0, time.UTC).Add(-15 * time.Hour) // UTC+14 is the earliest zone
	where := fmt.Sprintf("kafka_partition = %d AND kafka_offset < %d AND time >= toDateTime(%d)", partition, before, since.Unix())
	return s.scan(ctx, fmt.Sprintf(distinctEvents, where), fn)
}

func (s *Store) scan(ctx context.Context, query string, fn func(ev *schemas.UsageEvent, offset int64)) (int, error) {
	rows, err := s.conn.Query(ctx, query)
	if err != nil {
		return 0, fmt.Errorf("read events: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			ev                         schemas.UsageEvent
			tms, status                uint16
			prompt, completion, cached uint64
			latency                    uint32
			outcome                    string
			est                        uint8
			off                        int64
		)
		if err := rows.Scan(&ev.ID, &ev.Tenant, &ev.Model, &ev.Time, &tms, &prompt, &completion, &cached, &status, &outcome, &latency, &est, &off); err != nil {
			return n, fmt.Errorf("read events: scan: %w", err)
		}
		ev.Time = ev.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
		ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens = int64(prompt), int64(completion), int64(cached)
		ev.Status, ev.Outcome, ev.LatencyMS, ev.Estimated = int(status), schemas.Outcome(outcome), int64(latency), est == 1
		fn(&ev, off)
		n++
	}
	if err := rows.Err(); err != nil {
		return n, fmt.Errorf("read events: %w", err)
	}
	return n, nil
}

// recompute rebuilds the rollups of minutes whose in-memory rollup was gone
// when a late event arrived, from the distinct stored events.
func (s *Store) recompute(ctx context.Context, repairs []tally.LateMinute) ([]tally.MinuteRow, error) {
	seen := map[tally.LateMinute]bool{}
	var out []tally.MinuteRow
	cost := s.cost()
	for _, r := range repairs {
		if seen[r] {
			continue
		}
		seen[r] = true
		cond := fmt.Sprintf("tenant = '%s' AND time >= toDateTime(%d) AND time < toDateTime(%d)", quote(r.Tenant), r.Minute.Unix(), r.Minute.Unix()+60)
		row := tally.MinuteRow{Tenant: r.Tenant, Model: r.Model, Minute: r.Minute}
		_, err := s.scan(ctx, fmt.Sprintf(distinctEvents, cond), func(ev *schemas.UsageEvent, _ int64) {
			if r.Model != "*" && ev.Model != r.Model {
				return
			}
			row.Requests++
			row.PromptTokens += uint64(ev.PromptTokens)
			row.CompletionTokens += uint64(ev.CompletionTokens)
			row.CachedTokens += uint64(ev.CachedTokens)
			if ev.Outcome == schemas.OutcomeError || ev.Outcome == schemas.OutcomeTimeout || ev.Status >= 500 {
				row.Errors++
			}
			if s.slowCallMS > 0 && ev.LatencyMS >= s.slowCallMS {
				row.SlowCalls++
			}
			if cost != nil {
				row.Cost += cost(ev.Model, ev.Time, ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("usage_minute: recompute %s/%s %s: %w", r.Tenant, r.Model, r.Minute.Format(time.RFC3339), err)
		}
		out = append(out, row)
	}
	return out, nil
}

// recomputeQuotas fills Used of closed periods' quota rows from the
// distinct stored events.
func (s *Store) recomputeQuotas(ctx context.Context, repairs []tally.QuotaRow) ([]tally.QuotaRow, error) {
	type key struct {
		tenant, model, quota string
		start                int64
	}
	seen := map[key]bool{}
	var out []tally.QuotaRow
	cost := s.cost()
	for _, r := range repairs {
		k := key{r.Tenant, r.Model, r.Quota, r.PeriodStart.Unix()}
		if seen[k] {
			continue
		}
		seen[k] = true
		cond := fmt.Sprintf("tenant = '%s' AND time >= toDateTime(%d) AND time < toDateTime(%d)", quote(r.Tenant), r.PeriodStart.Unix(), r.PeriodEnd.Unix())
		r.Used = 0
		_, err := s.scan(ctx, fmt.Sprintf(distinctEvents, cond), func(ev *schemas.UsageEvent, _ int64) {
			if r.Model != "*" && ev.Model != r.Model {
				return
			}
			switch r.Unit {
			case "requests":
				r.Used++
			case "currency":
				if cost != nil {
					r.Used += cost(ev.Model, ev.Time, ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens)
				}
			default:
				r.Used += float64(ev.PromptTokens + ev.CompletionTokens)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("quota_state: recompute %s/%s %s %s: %w", r.Tenant, r.Model, r.Quota, r.PeriodStart.Format(time.RFC3339), err)
		}
		out = append(out, r)
	}
	return out, nil
}

// quote escapes a string literal; tenant names are validated to
// [A-Za-z0-9._:-] already, this is defence in depth.
func quote(s string) string {
	return strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s)
}
