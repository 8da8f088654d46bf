package controlplane

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/adminlog"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/signalauth"
	"github.com/sluicehq/sluice/schemas"
)

const topic = "t"

func testKey(id, tenant string, version uint64) *Key {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stamp := adminapi.MadeBy("ops", now)
	stamp.Version = version
	return &Key{SHA256: HashSecret("s-" + id), KeyTerms: adminapi.KeyTerms{ID: id, Tenant: tenant, Models: []string{"*"}, Stamp: stamp}}
}

// write returns the records a writer holding log l produces for k, as the
// enforcer does.
func write(t *testing.T, l *Log, k *Key, request string) []*kgo.Record {
	t.Helper()
	recs, err := l.Records(topic, &Record{Kind: KindKey, Key: k, Request: request})
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestLogKeepsTheFirstRecordOfEachVersionAndRefusesReplays(t *testing.T) {
	auth := itest.Signer(t, itest.SignalAuth(t))
	writer, reader := NewLog(auth), NewLog(auth)
	apply := func(recs ...*kgo.Record) []Outcome {
		var out []Outcome
		for _, r := range recs {
			writer.Apply(r)
			out = append(out, reader.Apply(r).Outcome)
		}
		return out
	}
	v1 := write(t, writer, testKey("k1", "acme", 1), "r1")
	if got := apply(v1...); got[0] != Applied {
		t.Fatalf("version 1: %v", got)
	}
	revoked := testKey("k1", "acme", 2)
	revoked.Revoked = true
	v2 := write(t, writer, revoked, "r2")
	// A second writer that read version 1 too writes its own version 2.
	other := testKey("k1", "acme", 2)
	other.Name = "renamed"
	v2b := write(t, writer, other, "r3")
	if got := apply(v2...); got[0] != Applied || got[1] != Ignored {
		t.Fatalf("version 2 and its tombstone of version 1: %v", got)
	}
	if got := apply(v2b[0]); got[0] != Stale {
		t.Fatalf("a second version 2 was %v; the first in topic order must stand", got)
	}
	if !reader.Key("k1").Revoked || !writer.InForce("key/k1", v2[0].Key) || writer.InForce("key/k1", v2b[0].Key) {
		t.Fatalf("the revocation is not the record in force: %+v", reader.Key("k1"))
	}
	// A replay of the issued version must not bring the key back.
	if got := apply(v1[0]); got[0] != Stale {
		t.Fatalf("replayed version 1 was %v", got)
	}
	if !reader.Key("k1").Revoked {
		t.Fatal("a replay un-revoked the key")
	}
}

func TestLogRefusesForgedRecordsAndLeavesOperatorActionsAlone(t *testing.T) {
	cfg := itest.SignalAuth(t)
	auth := itest.Signer(t, cfg)
	l := NewLog(auth)
	forger := NewLog(itest.Signer(t, itest.SignalAuth(t))) // another key ring
	if res := l.Apply(write(t, forger, testKey("k1", "acme", 1), "r")[0]); res.Outcome != Unauthenticated {
		t.Fatalf("a record signed with another key was %v", res.Outcome)
	}
	// Signed with the ring but in the operator actions' domain: not a key.
	good := write(t, l, testKey("k1", "acme", 1), "r")[0]
	cross := auth.For(signalauth.AdminActions).Record(topic, good.Key, good.Value)
	cross.Headers[0].Value = []byte(schemas.SchemaControlPlaneV1)
	auth.For(signalauth.AdminActions).Sign(cross)
	if res := l.Apply(cross); res.Outcome != Unauthenticated {
		t.Fatalf("a key record signed as an operator action was %v", res.Outcome)
	}
	// A genuine record moved to another record key.
	moved := auth.For(signalauth.ControlPlane).Record(topic, []byte("k1"), good.Value)
	if res := l.Apply(moved); res.Outcome != Invalid {
		t.Fatalf("a record under a key not derived from it was %v", res.Outcome)
	}
	// The operator actions' reader skips key records, and the reverse.
	if res := adminlog.New(auth.For(signalauth.AdminActions)).Apply(good); res.Outcome != adminlog.Ignored {
		t.Fatalf("adminlog: a key record was %v (%v); it must be ignored, not counted as invalid", res.Outcome, res.Err)
	}
	st := &schemas.AdminState{Kind: schemas.AdminTrip, Tenant: "acme", Model: "*", Until: time.Now().Add(time.Hour)}
	action, err := adminlog.New(auth.For(signalauth.AdminActions)).Records(topic, st)
	if err != nil {
		t.Fatal(err)
	}
	if res := l.Apply(action[0]); res.Outcome != Ignored {
		t.Fatalf("an operator action was %v", res.Outcome)
	}
	if got := l.Keys(""); len(got) != 0 {
		t.Fatalf("keys after refusals: %+v", got)
	}
}

func TestKeyValidateNamesFieldsAndLimits(t *testing.T) {
	k := &Key{SHA256: "zz", KeyTerms: adminapi.KeyTerms{ID: "bad id", Tenant: "", Models: []string{"*", "gpt-4o"},
		Name: strings.Repeat("n", MaxNameLen+1), Endpoints: []string{"v1/chat"}}}
	err := k.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"id:", "1..64", "tenant:", "name:", "128", "sha256:", "models:", `"*"`, "endpoints[0]:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestValidAtHonoursRevocationExpiryAndOverlap(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	k := testKey("k", "acme", 3)
	old := k.SHA256
	k.SHA256, k.PreviousSHA256, k.PreviousUntil = HashSecret("new"), old, now.Add(time.Minute)
	for _, c := range []struct {
		sha  string
		at   time.Time
		want bool
	}{
		{k.SHA256, now, true}, {old, now, true}, {old, now.Add(time.Minute), false}, {HashSecret("other"), now, false},
	} {
		if got := k.ValidAt(c.sha, c.at); got != c.want {
			t.Errorf("ValidAt(%s, %s) = %v, want %v", Fingerprint(c.sha), c.at, got, c.want)
		}
	}
	k.ExpiresAt = now
	if k.ValidAt(k.SHA256, now) {
		t.Error("valid at its expiry")
	}
	k.ExpiresAt, k.Revoked = time.Time{}, true
	if k.ValidAt(k.SHA256, now) {
		t.Error("valid once revoked")
	}
}

func TestDiffNamesChangedFieldsAndHidesHashes(t *testing.T) {
	before := testKey("k", "acme", 1)
	after := *before
	after.Revoked, after.SHA256, after.Version = true, HashSecret("new"), 2
	got := Diff(before, &after)
	if len(got) != 2 || got[0].Field != "revoked" || got[0].To != "true" || got[1].Field != "sha256" ||
		!strings.HasPrefix(got[1].From, "sha256:") || len(got[1].From) != len("sha256:")+12 {
		t.Fatalf("diff %+v", got)
	}
	if issued := Diff(nil, before); len(issued) < 5 {
		t.Fatalf("an issue's diff lists %d fields: %+v", len(issued), issued)
	}
}
