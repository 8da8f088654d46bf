// Package chstore is the aggregator's ClickHouse side: it writes a
// partition batch (raw events, minute rollups, quota state, signals log) as
// column batches, and reads back the distinct events a restarted instance
// replays to rebuild its state.
//
// Every table written is a ReplacingMergeTree and every row is absolute
// (totals, not deltas), versioned by the Kafka offset it covers, so writing
// the same batch twice — a retry after a timeout, a replay after a crash —
// changes nothing a FINAL or argMax read sees.
//
// A retried Write sends the same bytes as the attempt before it (the
// batches' Stamp, attributes in key order): on a replicated cluster
// (clickhouse.cluster) ClickHouse deduplicates an insert by its blocks'
// hashes, so a batch retried on another replica after the first died
// mid-insert is stored once, not only read once. ClickHouse 18.16 has no
// insert_deduplication_token; identical bytes are what it recognises.
package chstore

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/policy"
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
// batch covers: the aggregator uses the topic's partition count shifted by
// VersionShift plus the highest offset plus one.
type Batch struct {
	tally.Rows
	Version uint64
	Events  []Event
	Signals []schemas.Signal
	// Payloads, when it has one entry per signal, holds the signals
	// encoded already (the aggregator encodes them once for Kafka and for
	// signals_log).
	Payloads [][]byte
	// Traces, when it has one entry per signal, holds the trace context
	// each signal's record carries (the aggregator's span for the event
	// that raised it; zero for none). Empty when tracing is off.
	Traces []trace.SpanContext
	// Stamp is the ingested_at / updated_at of the rows, set by the first
	// Write of the batch and kept by its retries (see the package doc).
	Stamp time.Time
}

// Reset empties b, keeping its buffers.
func (b *Batch) Reset() {
	for i := range b.Events {
		b.Events[i] = Event{} // drop references to decoded records
	}
	b.Rows.Reset()
	b.Events, b.Signals, b.Payloads, b.Traces = b.Events[:0], b.Signals[:0], b.Payloads[:0], b.Traces[:0]
	b.Version = 0
	b.Stamp = time.Time{}
}

// CostFunc prices one event, as the aggregator's state does, and weighs
// it into billed-equivalent tokens with the same price.
type CostFunc func(model string, at time.Time, tok policy.Tokens) (cost, billed float64)

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
 cache_write_tokens, reasoning_tokens, user, api_key_id, provider, endpoint, status, outcome, latency_ms, priority, session_id, estimated, gateway, requested_model,
 attribute_keys, attribute_values, kafka_partition, kafka_offset, ingested_at)`

const insertMinutes = `INSERT INTO usage_minute (tenant, model, minute, requests, prompt_tokens, completion_tokens,
 cached_tokens, cache_write_tokens, reasoning_tokens, errors, slow_calls, cost, version, updated_at)`

const insertQuotas = `INSERT INTO quota_state (tenant, model, quota, period, period_start, period_end, used,
 cached_tokens, cache_write_tokens, reasoning_tokens, quota_limit,
 unit, mode, tier, rate_per_minute, predicted_exhaustion, predicted_earliest, predicted_latest, prediction_basis,
 version, updated_at)`

const insertSignals = `INSERT INTO signals_log (id, kind, time, tenant, model, quota, period, period_start, tier,
 previous_tier, used, quota_limit, rate_per_minute, predicted_exhaustion, reason, payload)`

// Write stores batches, flushed in this order (a partition's, or several
// partitions'): raw events first (late minutes are recomputed from them),
// then rollups, quota state and the signals log, each table in one insert
// whatever the number of batches. Each batch's rows keep its version, so
// one write of several batches leaves what writing them one by one would.
// It is idempotent.
func (s *Store) Write(ctx context.Context, batches ...*Batch) error {
	if len(batches) == 0 {
		return nil
	}
	// One stamp for every row, the first batch's: a retry of the same
	// batches writes the same bytes.
	now := batches[0].Stamp
	if now.IsZero() {
		now = time.Now().UTC().Truncate(time.Second)
	}
	for _, b := range batches {
		if b.Stamp.IsZero() {
			b.Stamp = now
		}
	}
	var nEvents, nSignals int
	for _, b := range batches {
		nEvents, nSignals = nEvents+len(b.Events), nSignals+len(b.Signals)
	}
	if nEvents > 0 {
		if err := s.send(ctx, insertEvents, eventColumns(batches, nEvents, now)); err != nil {
			return fmt.Errorf("usage_events: %d rows: %w", nEvents, err)
		}
	}
	var minutes, quotas versioned
	for _, b := range batches {
		minutes.add(len(b.Minutes), b.Version)
		minutes.minutes = append(minutes.minutes, b.Minutes...)
		if len(b.MinuteRepairs) > 0 {
			fixed, err := s.recompute(ctx, b.MinuteRepairs)
			if err != nil {
				return err
			}
			minutes.add(len(fixed), b.Version)
			minutes.minutes = append(minutes.minutes, fixed...)
		}
		quotas.add(len(b.Quotas), b.Version)
		quotas.quotas = append(quotas.quotas, b.Quotas...)
		if len(b.QuotaRepairs) > 0 {
			fixed, err := s.recomputeQuotas(ctx, b.QuotaRepairs)
			if err != nil {
				return err
			}
			quotas.add(len(fixed), b.Version)
			quotas.quotas = append(quotas.quotas, fixed...)
		}
	}
	if len(minutes.minutes) > 0 {
		if err := s.send(ctx, insertMinutes, minuteColumns(minutes.minutes, minutes.versions, now)); err != nil {
			return fmt.Errorf("usage_minute: %d rows: %w", len(minutes.minutes), err)
		}
	}
	if len(quotas.quotas) > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertQuotas)
		if err != nil {
			return fmt.Errorf("quota_state: prepare: %w", err)
		}
		for i, q := range quotas.quotas {
			if err := batch.Append(q.Tenant, q.Model, q.Quota, q.Period, q.PeriodStart, q.PeriodEnd, q.Used,
				q.CachedTokens, q.CacheWriteTokens, q.ReasoningTokens, q.Limit,
				q.Unit, q.Mode, q.Tier, q.Rate, orEpoch(q.PredictedExhaustion), orEpoch(q.PredictedEarliest), orEpoch(q.PredictedLatest),
				q.PredictionBasis, quotas.versions[i], now); err != nil {
				batch.Abort()
				return fmt.Errorf("quota_state: append: %w", err)
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("quota_state: send %d rows: %w", len(quotas.quotas), err)
		}
	}
	if nSignals > 0 {
		batch, err := s.conn.PrepareBatch(ctx, insertSignals)
		if err != nil {
			return fmt.Errorf("signals_log: prepare: %w", err)
		}
		for _, b := range batches {
			if err := appendSignals(batch, b); err != nil {
				batch.Abort()
				return err
			}
		}
		if err := batch.Send(); err != nil {
			return fmt.Errorf("signals_log: send %d rows: %w", nSignals, err)
		}
	}
	return nil
}

// versioned collects the rollup or quota rows of several batches with
// each row's version (its batch's).
type versioned struct {
	minutes  []tally.MinuteRow
	quotas   []tally.QuotaRow
	versions []uint64
}

func (v *versioned) add(n int, version uint64) {
	for range n {
		v.versions = append(v.versions, version)
	}
}

// appendSignals appends b's signals to a signals_log insert.
func appendSignals(batch driver.Batch, b *Batch) error {
	for i := range b.Signals {
		sg := &b.Signals[i]
		var payload []byte
		if len(b.Payloads) == len(b.Signals) {
			payload = b.Payloads[i]
		} else {
			var err error
			if payload, err = schemas.EncodeSignal(sg); err != nil {
				return fmt.Errorf("signals_log: signal %s: %w", sg.ID, err)
			}
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
			return fmt.Errorf("signals_log: append: %w", err)
		}
	}
	return nil
}

// orEpoch is t, or the epoch (ClickHouse's "none" for a DateTime) when t
// is zero.
func orEpoch(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t
}

// send inserts whole columns, in the order the query names them: one
// append per column instead of one boxed value per cell, which on large
// batches saves most of the client's CPU and garbage.
func (s *Store) send(ctx context.Context, query string, cols []any) error {
	batch, err := s.conn.PrepareBatch(ctx, query)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	for i, c := range cols {
		if err := batch.Column(i).Append(c); err != nil {
			batch.Abort()
			return fmt.Errorf("append column %d: %w", i, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// eventColumns lays events out as the columns of insertEvents.
func eventColumns(batches []*Batch, n int, now time.Time) []any {
	var (
		ids, tenants, models, users, keys, providers, endpoints = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		outcomes, priorities, sessions, gateways, requested     = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		times, ingested                                         = make([]time.Time, n), make([]time.Time, n)
		ms, status                                              = make([]uint16, n), make([]uint16, n)
		prompt, completion, cached                              = make([]uint64, n), make([]uint64, n), make([]uint64, n)
		cacheWrite, reasoning                                   = make([]uint64, n), make([]uint64, n)
		latency                                                 = make([]uint32, n)
		est                                                     = make([]uint8, n)
		attrKeys, attrVals                                      = make([][]string, n), make([][]string, n)
		parts                                                   = make([]int32, n)
		offs                                                    = make([]int64, n)
	)
	i := 0
	for _, b := range batches {
		for k := range b.Events {
			e := &b.Events[k]
			ids[i], times[i], ms[i], tenants[i], models[i] = e.ID, e.Time.UTC(), uint16(e.Time.Nanosecond()/1e6), e.Tenant, e.Model
			prompt[i], completion[i], cached[i] = uint64(e.PromptTokens), uint64(e.CompletionTokens), uint64(e.CachedTokens)
			cacheWrite[i], reasoning[i] = uint64(e.CacheWriteTokens), uint64(e.ReasoningTokens)
			users[i], keys[i], providers[i], endpoints[i] = e.User, e.APIKeyID, e.Provider, e.Endpoint
			status[i], outcomes[i], latency[i], priorities[i], sessions[i] = uint16(e.Status), string(e.Outcome), uint32(e.LatencyMS), string(e.Priority), e.SessionID
			if e.Estimated {
				est[i] = 1
			}
			gateways[i], requested[i] = e.Gateway, e.RequestedModel
			attrKeys[i], attrVals[i] = attrs(e.Attributes)
			parts[i], offs[i], ingested[i] = e.Partition, e.Offset, now
			i++
		}
	}
	return []any{ids, times, ms, tenants, models, prompt, completion, cached, cacheWrite, reasoning, users, keys, providers, endpoints,
		status, outcomes, latency, priorities, sessions, est, gateways, requested, attrKeys, attrVals, parts, offs, ingested}
}

// minuteColumns lays rollups out as the columns of insertMinutes.
func minuteColumns(rows []tally.MinuteRow, version []uint64, now time.Time) []any {
	n := len(rows)
	tenants, models := make([]string, n), make([]string, n)
	minutes, updated := make([]time.Time, n), make([]time.Time, n)
	req, prompt, completion, cached, errs, slow, versions := make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n), make([]uint64, n)
	cacheWrite, reasoning := make([]uint64, n), make([]uint64, n)
	cost := make([]float64, n)
	for i := range rows {
		m := &rows[i]
		tenants[i], models[i], minutes[i] = m.Tenant, m.Model, m.Minute
		req[i], prompt[i], completion[i], cached[i], errs[i], slow[i] = m.Requests, m.PromptTokens, m.CompletionTokens, m.CachedTokens, m.Errors, m.SlowCalls
		cacheWrite[i], reasoning[i] = m.CacheWriteTokens, m.ReasoningTokens
		cost[i], versions[i], updated[i] = m.Cost, version[i], now
	}
	return []any{tenants, models, minutes, req, prompt, completion, cached, cacheWrite, reasoning, errs, slow, cost, versions, updated}
}

// noStrings is the attribute columns' value for an event without
// attributes, shared so that most events allocate nothing for them.
var noStrings = []string{}

func attrs(m map[string]string) (keys, vals []string) {
	if len(m) == 0 {
		return noStrings, noStrings
	}
	// In key order, not the map's: a retried insert must be the same bytes.
	keys = make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals = make([]string, len(keys))
	for i, k := range keys {
		vals[i] = m[k]
	}
	return keys, vals
}

// distinctEvents selects each id's latest version (highest offset) among
// the stored events of one partition below an offset: exactly what a clean
// run had counted when it reached that offset.
const distinctEvents = `SELECT id, tenant,
 argMax(model, kafka_offset), argMax(time, kafka_offset), argMax(time_ms, kafka_offset),
 argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset), argMax(cached_tokens, kafka_offset),
 argMax(cache_write_tokens, kafka_offset), argMax(reasoning_tokens, kafka_offset),
 argMax(status, kafka_offset), argMax(outcome, kafka_offset), argMax(latency_ms, kafka_offset),
 argMax(estimated, kafka_offset), max(kafka_offset) AS off
FROM usage_events
WHERE %s
GROUP BY tenant, id
ORDER BY off`

// tenantEvents is distinctEvents for a replay by tenant: a tenant's events
// may be stored under several partitions when the topic gained partitions
// and moved the tenant's home (the aggregator counts every tenant on its
// home partition, see the aggregator's route.go). Offsets of different
// partitions do not compare, so each id's latest version is taken per
// partition, and the events of the other partitions — counted before the
// move — come first, in the order they were stored, then those of the
// partition being rebuilt, in offset order. An id stored under two
// partitions is passed twice; the state counts it once (a settlement in
// the second replaces an estimate in the first).
const tenantEvents = `SELECT id, tenant,
 argMax(model, kafka_offset), argMax(time, kafka_offset), argMax(time_ms, kafka_offset),
 argMax(prompt_tokens, kafka_offset), argMax(completion_tokens, kafka_offset), argMax(cached_tokens, kafka_offset),
 argMax(cache_write_tokens, kafka_offset), argMax(reasoning_tokens, kafka_offset),
 argMax(status, kafka_offset), argMax(outcome, kafka_offset), argMax(latency_ms, kafka_offset),
 argMax(estimated, kafka_offset), max(kafka_offset) AS off
FROM usage_events
WHERE %s
GROUP BY tenant, id, kafka_partition
ORDER BY kafka_partition = %d, toUInt32(max(ingested_at)) * (kafka_partition != %d), off`

// Replay calls fn with every distinct event counted by the tenants of
// partition — those with events stored for it below offset before — in
// the order they were counted: their events stored under other partitions
// (before the topic gained partitions and moved them here) first, then the
// partition's own below before, in offset order. It reaches back to the
// start of the previous calendar month (in any time zone) of the latest
// stored event: enough to rebuild every open period and the one before it.
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
	own := fmt.Sprintf("kafka_partition = %d AND kafka_offset < %d", partition, before)
	where := fmt.Sprintf("time >= toDateTime(%d) AND (%s OR (kafka_partition != %d AND tenant IN (SELECT tenant FROM usage_events WHERE %s AND time >= toDateTime(%d))))",
		since.Unix(), own, partition, own, since.Unix())
	n, err := s.scan(ctx, fmt.Sprintf(tenantEvents, where, partition, partition), fn)
	if err != nil {
		return n, fmt.Errorf("replay partition %d: %w", partition, err)
	}
	return n, nil
}

// ReplayTenant is Replay for one tenant: it calls fn, in the order they
// were counted, with every distinct event of tenant stored under other
// partitions and under partition below offset before, from the start of
// the previous calendar month of the tenant's latest stored event. It
// rebuilds a tenant evicted from memory as idle, or one new to partition
// because the topic gained partitions and moved its home here.
func (s *Store) ReplayTenant(ctx context.Context, partition int32, tenant string, before int64, fn func(ev *schemas.UsageEvent, offset int64)) (int, error) {
	scope := fmt.Sprintf("tenant = '%s' AND (kafka_partition != %d OR kafka_offset < %d)", quote(tenant), partition, before)
	var latest time.Time
	if err := s.conn.QueryRow(ctx, "SELECT max(time) FROM usage_events WHERE "+scope).Scan(&latest); err != nil {
		return 0, fmt.Errorf("replay tenant %s: latest event: %w", tenant, err)
	}
	if latest.Unix() <= 0 {
		return 0, nil
	}
	l := latest.UTC()
	since := time.Date(l.Year(), l.Month()-1, 1, 0, 0, 0, 0, time.UTC).Add(-15 * time.Hour)
	where := fmt.Sprintf("%s AND time >= toDateTime(%d)", scope, since.Unix())
	n, err := s.scan(ctx, fmt.Sprintf(tenantEvents, where, partition, partition), fn)
	if err != nil {
		return n, fmt.Errorf("replay tenant %s: %w", tenant, err)
	}
	return n, nil
}

// VersionShift places the usage topic's partition count above the offset
// in the version of quota_state and usage_minute rows: version =
// partitions<<VersionShift | offset after the batch. Kafka partition
// counts only grow, so when partitions are added and a tenant's home moves
// to a partition with lower offsets, its new rows still beat the old
// home's under FINAL; for one count, versions grow with the offset as
// before. 2^48 offsets is 89 years of 100,000 events/s on one partition.
const VersionShift = 48

// PartitionCounts returns the usage topic partition counts under which
// the stored quota_state rows were written (0: rows from before versions
// carried it).
func (s *Store) PartitionCounts(ctx context.Context) ([]int, error) {
	rows, err := s.conn.Query(ctx, fmt.Sprintf("SELECT DISTINCT toUInt32(intDiv(version, %d)) FROM quota_state", uint64(1)<<VersionShift))
	if err != nil {
		return nil, fmt.Errorf("quota_state: partition counts: %w", err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var n uint32
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("quota_state: partition counts: %w", err)
		}
		out = append(out, int(n))
	}
	return out, rows.Err()
}

// announcedQuery reads, from quota_state as last written (argMax by
// version, like FINAL), the open quota periods that were announced above
// tier 0 or exhausted; every other period was announced at tier 0.
const announcedQuery = `SELECT tenant, model, quota, toUInt32(period_start) AS ps,
	argMax(tier, version) AS t, argMax(used, version) >= argMax(quota_limit, version) AS x, argMax(quota_limit, version) AS l
FROM quota_state
WHERE period_end > ?%s
GROUP BY tenant, model, quota, period_start
HAVING t > 0 OR x`

// Announced returns what the quota_state rows say was announced for the
// quota periods still open at now (of tenant only, when not empty): the
// baseline tally.Partition.AnnounceRestored compares a restored state
// with. The aggregator writes a flush's rows after producing its signals,
// so a row never claims more than was announced.
func (s *Store) Announced(ctx context.Context, tenant string, now time.Time) (map[tally.AnnouncedKey]tally.Announced, error) {
	query, args := fmt.Sprintf(announcedQuery, ""), []any{now.UTC()}
	if tenant != "" {
		query, args = fmt.Sprintf(announcedQuery, " AND tenant = ?"), append(args, tenant)
	}
	rows, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("quota_state: announced tiers: %w", err)
	}
	defer rows.Close()
	out := map[tally.AnnouncedKey]tally.Announced{}
	for rows.Next() {
		var (
			k         tally.AnnouncedKey
			ps        uint32
			tier      uint16
			exhausted uint8
			limit     float64
		)
		if err := rows.Scan(&k.Tenant, &k.Model, &k.Quota, &ps, &tier, &exhausted, &limit); err != nil {
			return nil, fmt.Errorf("quota_state: announced tiers: %w", err)
		}
		k.PeriodStart = int64(ps)
		out[k] = tally.Announced{Tier: int(tier), Exhausted: exhausted != 0, Limit: limit}
	}
	return out, rows.Err()
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
			cacheWrite, reasoning      uint64
			latency                    uint32
			outcome                    string
			est                        uint8
			off                        int64
		)
		if err := rows.Scan(&ev.ID, &ev.Tenant, &ev.Model, &ev.Time, &tms, &prompt, &completion, &cached, &cacheWrite, &reasoning,
			&status, &outcome, &latency, &est, &off); err != nil {
			return n, fmt.Errorf("read events: scan: %w", err)
		}
		ev.Time = ev.Time.UTC().Add(time.Duration(tms) * time.Millisecond)
		ev.PromptTokens, ev.CompletionTokens, ev.CachedTokens = int64(prompt), int64(completion), int64(cached)
		ev.CacheWriteTokens, ev.ReasoningTokens = int64(cacheWrite), int64(reasoning)
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
			row.CacheWriteTokens += uint64(ev.CacheWriteTokens)
			row.ReasoningTokens += uint64(ev.ReasoningTokens)
			if ev.Outcome == schemas.OutcomeError || ev.Outcome == schemas.OutcomeTimeout || ev.Status >= 500 {
				row.Errors++
			}
			if s.slowCallMS > 0 && ev.LatencyMS >= s.slowCallMS {
				row.SlowCalls++
			}
			if cost != nil {
				c, _ := cost(ev.Model, ev.Time, policy.TokensOf(ev))
				row.Cost += c
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
		r.Used, r.CachedTokens, r.CacheWriteTokens, r.ReasoningTokens = 0, 0, 0, 0
		_, err := s.scan(ctx, fmt.Sprintf(distinctEvents, cond), func(ev *schemas.UsageEvent, _ int64) {
			if r.Model != "*" && ev.Model != r.Model {
				return
			}
			r.CachedTokens += uint64(ev.CachedTokens)
			r.CacheWriteTokens += uint64(ev.CacheWriteTokens)
			r.ReasoningTokens += uint64(ev.ReasoningTokens)
			switch r.Unit {
			case "requests":
				r.Used++
			case "currency":
				if cost != nil {
					c, _ := cost(ev.Model, ev.Time, policy.TokensOf(ev))
					r.Used += c
				}
			default:
				if r.Billed && cost != nil {
					_, b := cost(ev.Model, ev.Time, policy.TokensOf(ev))
					r.Used += b
				} else {
					r.Used += float64(ev.PromptTokens + ev.CompletionTokens)
				}
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
