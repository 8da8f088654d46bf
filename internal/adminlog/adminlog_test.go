package adminlog

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

func ring(t *testing.T, secret string) *signalauth.Auth {
	t.Helper()
	a, err := signalauth.Open(signalauth.Config{Keys: []string{"k1:" + strings.Repeat(secret, 64)}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a.For(signalauth.AdminActions)
}

func blacklist(tenant string) *schemas.AdminState {
	return &schemas.AdminState{Kind: schemas.AdminBlacklist, Tenant: tenant, Model: "*", Until: time.Now().Add(time.Hour), Time: time.Now()}
}

// write makes st the next version of its scope as the admin API does and
// applies the records to every reader, as the topic would.
func write(t *testing.T, w *Log, st *schemas.AdminState, readers ...*Log) []*kgo.Record {
	t.Helper()
	recs, err := w.Records("admin", st)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		for _, l := range append([]*Log{w}, readers...) {
			if res := l.Apply(r); res.Outcome != Applied && res.Outcome != Ignored {
				t.Fatalf("the writer's own record: %+v", res)
			}
		}
	}
	return recs
}

func copyOf(r *kgo.Record) *kgo.Record {
	return &kgo.Record{Key: r.Key, Value: r.Value, Headers: r.Headers}
}

// TestReplayOfASupersededVersionIsRefused: a genuine record copied back
// after its scope moved on (a lifted blacklist re-sent) is refused as a
// replay, by a reader that saw the lift and by one that reads the whole
// log afterwards; the scope stays lifted.
func TestReplayOfASupersededVersionIsRefused(t *testing.T) {
	auth := ring(t, "a")
	w, live := New(auth), New(auth)
	var log []*kgo.Record
	bl := blacklist("acme")
	log = append(log, write(t, w, bl, live)...)
	lift := *bl
	lift.Lifted, lift.Until = true, time.Now()
	log = append(log, write(t, w, &lift, live)...)
	if len(log) != 3 || log[2].Value != nil || !bytes.Equal(log[2].Key, log[0].Key) {
		t.Fatalf("the lift does not delete the version it supersedes: %d records", len(log))
	}
	replay := copyOf(log[0])
	for name, l := range map[string]*Log{"live": live, "fresh": New(auth)} {
		if name == "fresh" {
			for _, r := range log {
				l.Apply(r)
			}
		}
		if res := l.Apply(replay); res.Outcome != Replayed {
			t.Errorf("%s reader: replay %s, want %s", name, res.Outcome, Replayed)
		}
		if st := l.State(bl.Key()); st == nil || st.Active(time.Now()) || st.Version != 2 {
			t.Errorf("%s reader: scope %+v after the replay, want lifted version 2", name, st)
		}
	}
}

// TestForgedTombstonesCannotReachAnAction: record keys are derived under
// the signing key, so the keys a forger can name (the scope, the scope and
// a version, or a derivation under a guessed secret) never equal the key
// of a signed action — which compaction would otherwise drop for the
// forger's tombstone — and a tombstone never lifts a versioned action.
func TestForgedTombstonesCannotReachAnAction(t *testing.T) {
	auth := ring(t, "a")
	w := New(auth)
	bl := blacklist("acme")
	key := write(t, w, bl)[0].Key
	guesses := [][]byte{[]byte(bl.Key()), []byte(bl.VersionKey()), ring(t, "f").RecordKey([]byte(bl.VersionKey()))}
	for _, g := range guesses {
		if bytes.Equal(g, key) {
			t.Fatalf("a forger computes the record key %q", g)
		}
		if res := w.Apply(&kgo.Record{Key: g}); res.Outcome != Unauthenticated {
			t.Errorf("forged tombstone %q: %s", g, res.Outcome)
		}
	}
	// Even a signed tombstone of the action's own key (only the writer can
	// make one) does not lift it: only a lifted version does.
	if res := w.Apply(auth.Record("admin", key, nil)); res.Outcome != Ignored || !w.State(bl.Key()).Active(time.Now()) {
		t.Fatalf("a tombstone of a versioned action: %s", res.Outcome)
	}
}

// TestRecordsWithoutVersionsStillApply: the topic of a release without
// versions (keys are scopes, a tombstone lifts) is read as it was, and a
// new version of such a scope deletes the old record.
func TestRecordsWithoutVersionsStillApply(t *testing.T) {
	auth := ring(t, "a")
	l := New(auth)
	bl := blacklist("acme")
	v, _ := schemas.EncodeAdminState(bl)
	if res := l.Apply(auth.Record("admin", []byte(bl.Key()), v)); res.Outcome != Applied || !l.State(bl.Key()).Active(time.Now()) {
		t.Fatalf("version-0 record: %+v", res)
	}
	if res := l.Apply(auth.Record("admin", []byte(bl.Key()), nil)); res.Outcome != Applied || l.State(bl.Key()) != nil {
		t.Fatalf("version-0 tombstone: %+v", res)
	}
	l.Apply(auth.Record("admin", []byte(bl.Key()), v))
	recs := write(t, l, blacklist("acme"))
	if len(recs) != 2 || string(recs[1].Key) != bl.Key() || recs[1].Value != nil {
		t.Fatalf("a new version does not delete the version-0 record: %d records", len(recs))
	}
	if res := l.Apply(auth.Record("admin", []byte(bl.Key()), v)); res.Outcome != Replayed {
		t.Fatalf("version-0 record after version 1: %s", res.Outcome)
	}
}

// TestRecordKeyMustMatchItsVersion: a signed record whose key is not the
// derivation of its own scope and version is skipped, so two versions
// never share a key by mistake.
func TestRecordKeyMustMatchItsVersion(t *testing.T) {
	auth := ring(t, "a")
	l := New(auth)
	bl := blacklist("acme")
	bl.Version = 3
	v, _ := schemas.EncodeAdminState(bl)
	other := *bl
	other.Version = 4
	if res := l.Apply(auth.Record("admin", auth.RecordKey([]byte(other.VersionKey())), v)); res.Outcome != Invalid {
		t.Fatalf("mismatched key: %s", res.Outcome)
	}
	if res := l.Apply(auth.Record("admin", auth.RecordKey([]byte(bl.VersionKey())), v)); res.Outcome != Applied {
		t.Fatalf("matching key: %s", res.Outcome)
	}
}
