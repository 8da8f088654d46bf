package pricetable

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/policy"
)

func TestSyncAddsOnlyWhatChangedAndCorrectionsWin(t *testing.T) {
	ctx := context.Background()
	_, conn := migrationtest.Open(t)
	jan := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prices := []policy.Price{{Model: "gpt-4o", Currency: "USD", EffectiveFrom: jan, Prompt: 2.5, Completion: 10, Cached: 1.25}}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	if n, err := Sync(ctx, conn, prices, t0); err != nil || n != 1 {
		t.Fatalf("first sync wrote %d, %v; want 1", n, err)
	}
	if n, err := Sync(ctx, conn, prices, t0.Add(time.Minute)); err != nil || n != 0 {
		t.Fatalf("unchanged sync wrote %d, %v; want 0", n, err)
	}
	// A typo fixed in the policy: same entry, new figure.
	prices[0].Completion = 12
	if n, err := Sync(ctx, conn, prices, t0.Add(2*time.Minute)); err != nil || n != 1 {
		t.Fatalf("corrected sync wrote %d, %v; want 1", n, err)
	}
	var completion float64
	var periods uint64
	if err := conn.QueryRow(ctx, "SELECT any(completion_per_million), count() FROM price_periods WHERE model = 'gpt-4o'").Scan(&completion, &periods); err != nil {
		t.Fatal(err)
	}
	if completion != 12 || periods != 1 {
		t.Errorf("price_periods has %d periods with completion %v, want one period at the corrected 12", periods, completion)
	}
}
