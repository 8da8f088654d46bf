package chstate

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/schemas"
)

// TestReadsFoldVersionsAndReplays writes usage minutes in two versions and
// a signal twice, as a replay does, and reads them back: the console's
// figures are the latest version's, each signal is listed once, and the
// throughput adds every tenant's "*" rows.
func TestReadsFoldVersionsAndReplays(t *testing.T) {
	_, conn := migrationtest.Open(t)
	ctx := context.Background()
	m0 := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	b, err := conn.PrepareBatch(ctx, `INSERT INTO usage_minute (tenant, model, minute, requests, prompt_tokens, completion_tokens, cost, version, updated_at)`)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		tenant, model string
		requests      uint64
		version       uint64
	}{{"acme", "gpt-4o", 1, 1}, {"acme", "gpt-4o", 3, 2}, {"acme", "*", 3, 2}, {"other", "*", 4, 1}} {
		if err := b.Append(r.tenant, r.model, m0, r.requests, r.requests*100, r.requests*10, float64(r.requests)/2, r.version, m0); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	// A replay writes the same signal again.
	sb, err := conn.PrepareBatch(ctx, `INSERT INTO signals_log (id, kind, time, tenant, model, quota, tier, used, quota_limit, reason)`)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := sb.Append("s1", string(schemas.SignalTierCrossed), m0, "acme", "gpt-4o", "hourly_tokens", uint16(90), 450.0, 500.0, "at 90%"); err != nil {
			t.Fatal(err)
		}
	}
	if err := sb.Send(); err != nil {
		t.Fatal(err)
	}
	s := New(conn)

	ms, err := s.Minutes(ctx, "acme", m0, m0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Model != "*" || ms[1].Model != "gpt-4o" || ms[1].Requests != 3 || ms[1].Tokens != 330 ||
		ms[1].Cost != 1.5 || !ms[1].Minute.Equal(m0) || ms[1].Minute.Location() != time.UTC {
		t.Fatalf("Minutes = %+v", ms)
	}
	tp, err := s.Throughput(ctx, m0, m0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if len(tp) != 1 || tp[0].Model != "*" || tp[0].Requests != 7 || tp[0].Tokens != 770 || !tp[0].Minute.Equal(m0) {
		t.Fatalf("Throughput = %+v", tp)
	}
	sg, err := s.Signals(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(sg) != 1 || sg[0].Kind != schemas.SignalTierCrossed || sg[0].Tier != 90 || sg[0].Used != 450 || sg[0].Reason != "at 90%" {
		t.Fatalf("Signals = %+v", sg)
	}
	if q, err := s.Quotas(ctx, "acme", m0); err != nil || len(q) != 0 {
		t.Fatalf("Quotas without quota state = %+v, %v", q, err)
	}
	if _, err := s.Minutes(ctx, "acme", m0, m0.Add(-time.Minute)); err != nil {
		t.Fatalf("an empty range: %v", err)
	}
}
