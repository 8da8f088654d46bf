package flagwriter

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gateway/flags"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

type noFlags struct{}

func (noFlags) Flags(string, time.Time, time.Duration) map[string]*flags.Flag { return nil }
func (noFlags) Tenants() []string                                             { return nil }

// The dirty set is bounded: past MaxDirty it turns into one full rewrite
// instead of growing.
func TestDirtySetIsBounded(t *testing.T) {
	w := New(nil, noFlags{}, Config{MaxDirty: 3}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	w.full = false // as after the first successful flush
	w.MarkDirty("a", "b", "c")
	if len(w.dirty) != 3 || w.full {
		t.Fatalf("dirty %v full %v", w.dirty, w.full)
	}
	w.MarkDirty("d")
	if len(w.dirty) != 0 || !w.full {
		t.Fatalf("overflow: dirty %v full %v", w.dirty, w.full)
	}
}

// A restarted enforcer's first (full) flush deletes flag hashes an earlier
// incarnation left behind, instead of letting them refuse a tenant until
// their TTL runs out.
func TestFullRewriteClearsLeftoverFlags(t *testing.T) {
	rdb := redisconn.NewClient(itest.Redis(t))
	defer rdb.Close()
	prefix := itest.Unique(t, "sluice_test_") + ":"
	keys := flags.Layout{Prefix: prefix}
	ctx := context.Background()
	stale := flags.Encode(&flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: "hourly_tokens"})
	if err := rdb.HSet(ctx, keys.TenantKey("ghost"), "*", stale).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.Expire(ctx, keys.TenantKey("ghost"), time.Minute)
	w := New(rdb, noFlags{}, Config{KeyPrefix: prefix, FlagTTL: time.Minute, BatchTenants: 100, MaxDirty: 10},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if !w.Flush(ctx) {
		t.Fatal("flush failed")
	}
	if n, err := rdb.Exists(ctx, keys.TenantKey("ghost")).Result(); err != nil || n != 0 {
		t.Fatalf("leftover flag hash still there (exists=%d, err=%v)", n, err)
	}
}
