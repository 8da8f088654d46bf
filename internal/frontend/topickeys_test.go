package frontend

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/internal/keyfile"
	"github.com/sluicehq/sluice/platform/itest"
)

// topicLog returns a control-plane log holding keys, as a gateway's
// follower would after reading them from the admin topic.
func topicLog(t *testing.T, keys ...*controlplane.Key) *controlplane.Log {
	t.Helper()
	auth := itest.Signer(t, itest.SignalAuth(t))
	l := controlplane.NewLog(auth)
	for _, k := range keys {
		recs, err := l.Records("t", &controlplane.Record{Kind: controlplane.KindKey, Key: k, Request: "r"})
		if err != nil {
			t.Fatal(err)
		}
		if res := l.Apply(recs[0]); res.Outcome != controlplane.Applied {
			t.Fatalf("%s: %v %v", k.ID, res.Outcome, res.Err)
		}
	}
	return l
}

// A control-plane key is accepted while it is valid: not after its
// expiry, its old secret not after the rotation's overlap, not at all once
// revoked; its endpoint scope holds; and a key id the keys file also has
// is a conflict, reported and not accepted, whatever its secret.
func TestTopicKeysAcceptOnlyValidKeysAndReportConflicts(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	key := func(id string) *controlplane.Key {
		stamp := adminapi.MadeBy("ops", now)
		stamp.Version = 1
		return &controlplane.Key{SHA256: controlplane.HashSecret("sk-" + id),
			KeyTerms: adminapi.KeyTerms{ID: id, Tenant: "acme", Models: []string{"gpt-4o"}, Stamp: stamp}}
	}
	expiring := key("expiring")
	expiring.ExpiresAt = now.Add(time.Hour)
	rotated := key("rotated")
	rotated.SHA256, rotated.PreviousSHA256, rotated.PreviousUntil = controlplane.HashSecret("sk-rotated-new"), rotated.SHA256, now.Add(time.Minute)
	revoked := key("revoked")
	revoked.Revoked = true
	scoped := key("scoped")
	scoped.Endpoints = []string{"/v1/embeddings"}
	clash := key("file-key")
	file, err := ParseKeys([]byte("keys:\n" + KeyLine("file-key", "sk-from-file", "acme", nil)))
	if err != nil {
		t.Fatal(err)
	}
	tk := NewTopicKeys(topicLog(t, expiring, rotated, revoked, scoped, clash), func() *keyfile.Set[Caller] { return file },
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	tk.Refresh()

	for _, c := range []struct {
		secret string
		at     time.Time
		want   string // key id, "" for refused
	}{
		{"sk-expiring", now, "expiring"},
		{"sk-expiring", now.Add(time.Hour), ""},
		{"sk-rotated-new", now.Add(time.Hour), "rotated"},
		{"sk-rotated", now, "rotated"},
		{"sk-rotated", now.Add(time.Minute), ""},
		{"sk-revoked", now, ""},
		{"sk-file-key", now, ""},
		{"sk-unknown", now, ""},
	} {
		got := ""
		if c := tk.Authenticate(c.secret, c.at); c != nil {
			got = c.KeyID
		}
		if got != c.want {
			t.Errorf("%s at %s: %q, want %q", c.secret, c.at.Format(time.TimeOnly), got, c.want)
		}
	}
	if got := tk.Conflicts(); len(got) != 1 || got[0] != "file-key" {
		t.Errorf("conflicts %v; want [file-key]", got)
	}
	c := tk.Authenticate("sk-scoped", now)
	if c == nil || !c.MayCall("/v1/embeddings") || c.MayCall("/v1/chat/completions") || !c.MayUse("gpt-4o") || c.MayUse("gpt-4o-mini") {
		t.Errorf("scoped key: %+v; want embeddings only, gpt-4o only", c)
	}
	if tk.ByID("acme", "revoked", now) != nil || tk.ByID("acme", "expiring", now) == nil || tk.ByID("other", "expiring", now) != nil {
		t.Error("ByID must find a valid key of its tenant only")
	}
}
