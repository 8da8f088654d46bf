package enforcer

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/sluicehq/sluice/migrations/migrationtest"
	"github.com/sluicehq/sluice/platform/chconn"
)

// A key's last use is its latest usage event among the tenants asked for,
// since the time given; events without a key, of other tenants or older
// do not count.
func TestLastUseIsTheLatestEventOfEachKey(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse")
	}
	ctx := context.Background()
	chc, conn := migrationtest.Open(t)
	now := time.Now().UTC().Truncate(time.Second)
	b, err := conn.PrepareBatch(ctx, "INSERT INTO usage_events (id, time, tenant, model, api_key_id)")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct {
		id, tenant, key string
		at              time.Time
	}{
		{"e1", "acme", "k1", now.Add(-2 * time.Hour)},
		{"e2", "acme", "k1", now.Add(-time.Hour)},
		{"e3", "acme", "k2", now.Add(-100 * 24 * time.Hour)}, // before since
		{"e4", "acme", "", now},                              // no key
		{"e5", "other", "k3", now},                           // another tenant
	} {
		if err := b.Append(e.id, e.at, e.tenant, "m", e.key); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	l := &lazyClickHouse{chconn.NewLazy(chc)}
	defer l.Close()
	used, err := l.LastUse(ctx, []string{"acme"}, now.Add(-90*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]time.Time{"k1": now.Add(-time.Hour)}; !maps.EqualFunc(used, want, time.Time.Equal) {
		t.Errorf("last use %v; want %v", used, want)
	}
}
