package chstore

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations"
	"github.com/sluicehq/sluice/platform/chconn"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/tally"
)

// TestRetriedWriteOnAnotherReplicaIsStoredOnce: on the replicated cluster
// (clickhouse.cluster), a Write retried on the other replica — what the
// aggregator does when the replica it wrote to dies before answering —
// sends the same bytes (stamp, attributes in key order), and ClickHouse's
// deduplication by block hash stores every table's rows once, not only
// FINAL reads them once.
func TestRetriedWriteOnAnotherReplicaIsStoredOnce(t *testing.T) {
	itest.LockEngine(t, itest.EngineClickHouse, false)
	cfg := itest.ClickHouseCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := migrations.ApplyConfig(ctx, cfg, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	var stores []*Store
	for _, a := range cfg.Addrs {
		one := cfg
		one.Addrs, one.Addr = nil, a
		conn, err := chconn.Open(ctx, one)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		stores = append(stores, New(conn, func() CostFunc { return nil }, 1000))
	}
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	b := &Batch{Version: 99}
	for i := range 300 {
		b.Events = append(b.Events, Event{UsageEvent: schemas.UsageEvent{ID: fmt.Sprintf("e%d", i), Time: at, Tenant: fmt.Sprintf("t%d", i%3), Model: "m",
			PromptTokens: int64(i), Attributes: map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}}, Offset: int64(i)})
	}
	b.Minutes = []tally.MinuteRow{{Tenant: "t0", Model: "m", Minute: at.Truncate(time.Minute), Requests: 100}}
	b.Quotas = []tally.QuotaRow{{Tenant: "t0", Model: "*", Quota: "hourly_tokens", Period: "hour", PeriodStart: at.Truncate(time.Hour),
		PeriodEnd: at.Truncate(time.Hour).Add(time.Hour), Used: 5, Limit: 1000, Unit: "tokens", Mode: "hard"}}
	if err := stores[0].Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	// The retry comes in a later second than the first attempt: the
	// stamp must not move with it.
	itest.Eventually(t, 5*time.Second, "a second later than the first attempt", func() bool {
		return time.Now().UTC().Truncate(time.Second).After(b.Stamp)
	})
	if err := stores[1].Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	for i, s := range stores {
		for table, want := range map[string]uint64{"usage_events": 300, "usage_minute": 1, "quota_state": 1} {
			itest.EventuallyNoError(t, time.Minute, fmt.Sprintf("%s on replica %d", table, i+1), func() error {
				// Every part, active or merged away: a duplicate insert
				// is a second part, whatever a merge makes of it.
				var parts, rows uint64
				if err := s.conn.QueryRow(ctx, "SELECT count(), sum(rows) FROM system.parts WHERE database = currentDatabase() AND table = ?", table).Scan(&parts, &rows); err != nil {
					return err
				}
				if parts != 1 || rows != want {
					return fmt.Errorf("%d parts of %d rows stored, want one part of %d", parts, rows, want)
				}
				return nil
			})
		}
	}
}
