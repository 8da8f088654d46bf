package alerter

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/engine"
)

// TestStateStoreRoundTrip writes alert states and held notifications to a
// real compacted topic and reads them back per partition: the last record
// of a key wins, a deletion removes it, a flushed group's record is
// deleted, and a state for a partition the state topic lacks is skipped
// without failing the others.
func TestStateStoreRoundTrip(t *testing.T) {
	kcfg := itest.Kafka(t)
	signals := itest.Unique(t, "signals_")
	kcfg.Partitions = 2
	cl, err := kafkaconn.NewClient(kcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := kafkaconn.EnsureTopics(ctx, cl, kcfg, signals); err != nil {
		t.Fatal(err)
	}
	n, err := ensureStateTopic(ctx, cl, kcfg, signals, signals+".state")
	if err != nil || n != 2 {
		t.Fatalf("ensureStateTopic = %d, %v; want 2 partitions", n, err)
	}
	if n, err := ensureStateTopic(ctx, cl, kcfg, signals, signals+".state"); err != nil || n != 2 {
		t.Fatalf("second ensureStateTopic = %d, %v", n, err)
	}
	s := &stateStore{topic: signals + ".state", kcfg: kcfg, cl: cl, log: slog.New(slog.NewTextHandler(io.Discard, nil)), partitions: n}
	parts := map[string]int32{"a": 0, "b": 1, "c": 1, "far": 7}
	partOf := func(tenant string) (int32, bool) { p, ok := parts[tenant]; return p, ok }
	key := func(tenant string) alert.Key { return alert.Key{Tenant: tenant, Model: "*", Rule: alert.RuleQuotaTier} }
	rec := func(tenant string, level int) *engine.Record {
		return &engine.Record{V: engine.RecordVersion, Key: key(tenant), Level: level, Firing: true, Delivered: true}
	}
	held := []engine.Held{{V: engine.RecordVersion, Channel: "slack:noc", First: time.Unix(1700000000, 0).UTC(),
		Alerts: []alert.Alert{{Key: key("a")}, {Key: key("b")}}}}

	w, err := s.save(ctx, []engine.Change{{Key: key("a"), Record: rec("a", 70)}, {Key: key("b"), Record: rec("b", 90)},
		{Key: key("c"), Record: rec("c", 70)}, {Key: key("far"), Record: rec("far", 70)}}, held, true, partOf)
	if err != nil || w != 5 {
		t.Fatalf("save = %d, %v; want 3 states and 2 held records (far skipped)", w, err)
	}
	// Later: a escalates, c resolves, the group was sent.
	if _, err := s.save(ctx, []engine.Change{{Key: key("a"), Record: rec("a", 90)}, {Key: key("c")}}, nil, true, partOf); err != nil {
		t.Fatal(err)
	}

	got, err := s.load(ctx, []int32{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]int{}
	for _, r := range got {
		if r.held != nil {
			t.Errorf("held record of partition %d survived its group's flush: %+v", r.part, r.held)
			continue
		}
		if r.part != parts[r.rec.Key.Tenant] {
			t.Errorf("%s restored from partition %d, want %d", r.rec.Key.Tenant, r.part, parts[r.rec.Key.Tenant])
		}
		states[r.rec.Key.Tenant] = r.rec.Level
	}
	if len(states) != 2 || states["a"] != 90 || states["b"] != 90 {
		t.Fatalf("restored %v, want a at 90 and b at 90 (c resolved, far never stored)", states)
	}

	// Only the partitions asked for are read.
	got, err = s.load(ctx, []int32{0})
	if err != nil || len(got) != 1 || got[0].rec == nil || got[0].rec.Key.Tenant != "a" {
		t.Fatalf("load(partition 0) = %+v, %v; want a alone", got, err)
	}
}
