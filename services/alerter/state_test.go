package alerter

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/kafkaconn"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/services/alerter/alert"
	"github.com/sluicehq/sluice/services/alerter/engine"
)

// TestStateStoreRoundTrip writes alert states and held notifications to a
// real compacted topic and reads them back per partition: the last record
// of a key wins, a deletion removes it, a flushed group's record is
// deleted, and a state for a partition the state topic lacks is skipped
// without failing the others.
func TestStateStoreRoundTrip(t *testing.T) {
	kcfg, cl, signals := signalsTopic(t, 2)
	ctx := context.Background()
	n, err := ensureStateTopic(ctx, cl, kcfg, signals, signals+".state")
	if err != nil || n != 2 {
		t.Fatalf("ensureStateTopic = %d, %v; want 2 partitions", n, err)
	}
	if n, err := ensureStateTopic(ctx, cl, kcfg, signals, signals+".state"); err != nil || n != 2 {
		t.Fatalf("second ensureStateTopic = %d, %v", n, err)
	}
	s := testStore(kcfg, cl, signals+".state", n, testSigner)
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

// testStore is the state store of topic as Run builds it, with auth's key
// ring (the pipelines' testSignalAuth, or another).
func testStore(kcfg kafkaconn.Config, cl *kgo.Client, topic string, partitions int32, auth *signalauth.Auth) *stateStore {
	return &stateStore{topic: topic, kcfg: kcfg, cl: cl, log: slog.New(slog.NewTextHandler(io.Discard, nil)), partitions: partitions,
		auth: auth.For(signalauth.AlerterState), refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "refused"}),
		unsigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "unsigned"})}
}

// TestForgedStateRecordsAreRefused: anyone who can produce to the state
// topic could make a restarted alerter page again (a forged deletion of a
// notified alert), stay silent (a forged state saying an alert was
// notified) or post any text (a forged held notification is sent as it
// is). Load refuses and counts records that are unsigned, signed with a
// guessed secret, carry another record's genuine signature or a genuine
// signal's; each key keeps its last authentic state. During a migration
// (signal_auth.accept_unsigned_state) the unsigned ones — what a release
// that did not sign wrote — are used and counted, the badly signed ones
// still refused.
func TestForgedStateRecordsAreRefused(t *testing.T) {
	kcfg, cl, signals := signalsTopic(t, 1)
	ctx := context.Background()
	topic := signals + ".state"
	n, err := ensureStateTopic(ctx, cl, kcfg, signals, topic)
	if err != nil {
		t.Fatal(err)
	}
	s := testStore(kcfg, cl, topic, n, testSigner)
	partOf := func(string) (int32, bool) { return 0, true }
	key := func(tenant string) alert.Key { return alert.Key{Tenant: tenant, Model: "*", Rule: alert.RuleQuotaTier} }
	rec := func(tenant string, level int) *engine.Record {
		return &engine.Record{V: engine.RecordVersion, Key: key(tenant), Level: level, Firing: true, Delivered: true}
	}
	if _, err := s.save(ctx, []engine.Change{{Key: key("a"), Record: rec("a", 90)}, {Key: key("b"), Record: rec("b", 70)}}, nil, false, partOf); err != nil {
		t.Fatal(err)
	}
	encode := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	genuine := s.records(0, key("b").String(), encode(rec("b", 70)))[0]
	forger := itest.Signer(t, signalauth.Config{Keys: []string{"test:" + strings.Repeat("f", 64)}}).For(signalauth.AlerterState)
	phishing := engine.Held{V: engine.RecordVersion, Channel: "slack:ops", First: time.Now().UTC(),
		Alerts: []alert.Alert{{Key: key("a"), Reason: "<https://evil.example|re-enter your password>"}}}
	unsigned := []*kgo.Record{
		{Key: []byte(key("a").String())},                                 // a deletion: a's alert would page again
		{Key: []byte(heldPrefix + "slack:ops"), Value: encode(phishing)}, // a held notification: sent as it is
	}
	badlySigned := []*kgo.Record{
		forger.Record(topic, []byte(key("b").String()), encode(rec("b", 0))),                     // a guessed secret
		{Key: []byte(key("c").String()), Value: encode(rec("c", 100)), Headers: genuine.Headers}, // another record's signature
		testSigner.Record(topic, []byte(key("c").String()), encode(rec("c", 100))),               // a genuine signal's
	}
	for _, r := range append(slices.Clone(unsigned), badlySigned...) {
		r.Topic, r.Partition = topic, 0
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	load := func(s *stateStore) (map[string]int, int) {
		t.Helper()
		got, err := s.load(ctx, []int32{0})
		if err != nil {
			t.Fatal(err)
		}
		states, held := map[string]int{}, 0
		for _, r := range got {
			if r.held != nil {
				held++
				continue
			}
			states[r.rec.Key.Tenant] = r.rec.Level
		}
		return states, held
	}
	states, held := load(s)
	if len(states) != 2 || states["a"] != 90 || states["b"] != 70 || held != 0 {
		t.Fatalf("restored %v and %d held notifications; want a at 90 and b at 70, nothing forged", states, held)
	}
	if got := testutil.ToFloat64(s.refused); got != float64(len(unsigned)+len(badlySigned)) {
		t.Errorf("refused %v records, want %d", got, len(unsigned)+len(badlySigned))
	}

	migrating := testStore(kcfg, cl, topic, n, itest.Signer(t, signalauth.Config{Keys: testSignalAuth.Keys, AcceptUnsignedState: true}))
	states, held = load(migrating)
	// The unsigned deletion is used but names the alert key, not the key
	// a's state is stored under (derived under the signing key): a keeps
	// its state.
	if len(states) != 2 || states["a"] != 90 || states["b"] != 70 || held != 1 {
		t.Fatalf("migrating: restored %v and %d held notifications; want the unsigned held record used, a at 90, b at 70", states, held)
	}
	if u, r := testutil.ToFloat64(migrating.unsigned), testutil.ToFloat64(migrating.refused); u != float64(len(unsigned)) || r != float64(len(badlySigned)) {
		t.Errorf("migrating: %v unsigned used, %v refused; want %d and %d", u, r, len(unsigned), len(badlySigned))
	}
}

// signalsTopic creates a signals topic of its own with partitions
// partitions, and returns its Kafka settings and a client that produces
// to the partition a record names, as the alerter's does.
func signalsTopic(t *testing.T, partitions int32) (kafkaconn.Config, *kgo.Client, string) {
	t.Helper()
	kcfg := itest.Kafka(t)
	kcfg.Partitions = partitions
	signals := itest.Unique(t, "signals_")
	cl, err := kafkaconn.NewClient(kcfg, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := kafkaconn.EnsureTopics(context.Background(), cl, kcfg, signals); err != nil {
		t.Fatal(err)
	}
	return kcfg, cl, signals
}

// TestForgedTombstoneAndCompactionKeepAlertState: load refuses an
// unsigned deletion, but the broker's compaction keeps the last record of
// each key whoever wrote it. A forger's tombstone of an alert's key
// followed by a real compaction must leave its state on the topic: a
// restarted alerter then still knows the alert was notified, and does not
// page again.
func TestForgedTombstoneAndCompactionKeepAlertState(t *testing.T) {
	kcfg, cl, signals := signalsTopic(t, 1)
	ctx := context.Background()
	topic := signals + ".state"
	itest.CompactingTopic(t, kcfg, topic)
	n, err := ensureStateTopic(ctx, cl, kcfg, signals, topic)
	if err != nil {
		t.Fatal(err)
	}
	s := testStore(kcfg, cl, topic, n, testSigner)
	produce := func(key string, value []byte) {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	canary := itest.Unique(t, "canary-")
	produce(canary, []byte("1"))
	k := alert.Key{Tenant: itest.Unique(t, "acme-"), Model: "*", Rule: alert.RuleQuotaTier}
	if _, err := s.save(ctx, []engine.Change{{Key: k, Record: &engine.Record{V: engine.RecordVersion, Key: k, Level: 100, Firing: true, Delivered: true}}},
		nil, false, func(string) (int32, bool) { return 0, true }); err != nil {
		t.Fatal(err)
	}
	produce(k.String(), nil) // the forger's tombstone
	produce(canary, []byte("2"))
	itest.WaitCompacted(t, kcfg, cl, topic, canary)
	got, err := s.load(ctx, []int32{0})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got {
		if r.rec != nil && r.rec.Key == k && r.rec.Level == 100 && r.rec.Delivered {
			return
		}
	}
	t.Fatalf("the notified alert's state is gone after a forged tombstone and compaction: %+v", got)
}
