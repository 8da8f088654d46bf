package enforcer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluicehq/sluice/schemas"
)

// Recovery rebuilds the core's memory on start: the flags in Redis first
// (the floor, core.restoreFloor), then the admin topic (manual breakers,
// blacklists, overrides: adminstate.go, applied after the floor so that
// its lifts apply to it), and open quota breakers from ClickHouse's
// quota_state (here). admin_audit is the audit trail only: an action whose
// publication failed is in it as attempted, so replaying it would enforce
// what was refused. The enforcer has no database of its own, so this
// is what makes a restart invisible to tenants. Its orderings, and what
// goes wrong without each:
//
//   - Signals wait for recovery, at most recoveryWait (awaitRecovery).
//     Recovery applies the state ClickHouse held when it queried; a signal
//     handled before that (a period reset, a raised limit) would be undone
//     by it. Waiting also makes the first flags a signal causes include the
//     recovered state.
//   - The wait is bounded because a ClickHouse outage must not stop
//     enforcement: after recoveryWait signals flow and recovery keeps
//     retrying, and a late recovery may then reapply older state — the
//     lesser failure than enforcing nothing.
//   - The process is not ready (readiness check "enforcer-recovered") from
//     before anything runs until recovery succeeded, so a deployment does
//     not retire the previous enforcer while this one's memory is empty.
//   - The flag writer waits for the floor, not for ClickHouse. Before it
//     writes anything (not even the heartbeat) it reads the flags already
//     in Redis back into the table (core.restoreFloor,
//     breaker.Table.Restore): they are the enforcement in force, including
//     rate and health breakers that ClickHouse knows nothing of. Its first
//     full rewrite therefore rewrites what was there plus what this
//     enforcer added, and deletes nothing still in force, so a restart
//     never lowers enforcement, with or without ClickHouse. Waiting for
//     ClickHouse instead would let the flags lapse by TTL and the heartbeat
//     go stale through a ClickHouse outage.
//   - ClickHouse recovery then adds to the floor quota breakers whose
//     flags had already expired from Redis, and the use of open periods.
//   - ClickHouse may be unreachable at start: the enforcer starts anyway
//     (lazyClickHouse) and recovery retries.
//   - The done channel is closed however recovery ends, so nothing waits
//     on it past shutdown.

// recoveryWait bounds how long signal consumption waits for recovery.
const recoveryWait = 30 * time.Second

// recoveredCheck is the readiness check that holds until recovery succeeded.
const recoveredCheck = "enforcer-recovered"

// recoverUntilDone runs recoverState until it succeeds or ctx ends, backing
// off from 1 s to 30 s between attempts, each bounded to a minute. It calls
// recovered after a success and closes done however it returns.
func (c *core) recoverUntilDone(ctx context.Context, ch *lazyClickHouse, recovered func(), done chan<- struct{}) error {
	defer close(done)
	for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		conn, err := ch.Get(rctx)
		if err == nil {
			err = c.recoverState(rctx, conn, time.Now())
		}
		cancel()
		if err == nil {
			recovered()
			return nil
		}
		c.log.Warn("enforcer: recovery from ClickHouse failed; retrying", "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// awaitRecovery blocks until done is closed, wait has passed, or ctx ends;
// it reports whether to go on (false: ctx ended).
func awaitRecovery(ctx context.Context, done <-chan struct{}, wait time.Duration, log *slog.Logger) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn("enforcer: consuming signals before recovery finished", "waited", wait)
	case <-ctx.Done():
		return false
	}
	return true
}

// recoverState rebuilds open quota breakers from quota_state (and the use
// of every open period, so that an override set below it blocks at once).
func (c *core) recoverState(ctx context.Context, conn driver.Conn, now time.Time) error {
	// Aliases differ from column names: ClickHouse 18.16 resolves a WHERE
	// column to a same-named aggregate alias.
	rows, err := conn.Query(ctx, `SELECT tenant, model, quota, period, pe, u, l, md FROM (
  SELECT tenant, model, quota, period, period_start, any(period_end) AS pe,
         argMax(used, version) AS u, argMax(quota_limit, version) AS l, argMax(mode, version) AS md
  FROM quota_state WHERE period_end > toDateTime(?) GROUP BY tenant, model, quota, period, period_start
) WHERE l > 0`, now.Unix())
	if err != nil {
		return fmt.Errorf("recover quota_state: %w", err)
	}
	p := c.policy.Current()
	n := 0
	for rows.Next() {
		var s schemas.Signal
		var quota, period, mode string
		if err := rows.Scan(&s.Tenant, &s.Model, &quota, &period, &s.PeriodEnd, &s.Used, &s.Limit, &mode); err != nil {
			rows.Close()
			return fmt.Errorf("recover quota_state: %w", err)
		}
		s.Kind, s.Quota, s.Period, s.Mode = schemas.SignalTierCrossed, schemas.QuotaKind(quota), schemas.Period(period), schemas.Mode(mode)
		if s.Used < s.Limit {
			// Not exhausted: only its use is kept, for overrides.
			c.table.NoteUsage(&s, now)
			continue
		}
		s.Kind = schemas.SignalQuotaExhausted
		if res := c.table.Apply(&s, p.Tenant(s.Tenant), now); len(res.Changed) > 0 {
			c.writer.MarkDirty(res.Changed...)
			n++
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("recover quota_state: %w", err)
	}
	c.log.Info("enforcer: state recovered from ClickHouse", "quota_breakers", n)
	return nil
}
