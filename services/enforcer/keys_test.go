package enforcer

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/internal/controlplane"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Two replicas that read the same version of a key and change it at the
// same time: the topic keeps one change, every replica agrees on which,
// and the other writer is told its change was refused as stale — no lost
// update, whichever replica each operator reached.
func TestConcurrentKeyChangesOnTwoReplicasEndWithOneRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	ctx := context.Background()
	a, b := twoReplicas(t, testWatcher)
	key := func(name string) *controlplane.Key {
		k := acmeKey("k1")
		k.Name = name
		return k
	}
	if err := a.PutKey(ctx, key("issued"), 0, "r0"); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "replica b reading the issued key", func() bool { return b.Key("k1") != nil })

	for round := range 5 {
		read := a.Key("k1").Version
		errs := make([]error, 2)
		var race sync.WaitGroup
		for i, r := range []*adminState{a, b} {
			race.Add(1)
			go func() {
				defer race.Done()
				errs[i] = r.PutKey(ctx, key([]string{"by-a", "by-b"}[i]), read, []string{"ra", "rb"}[i]+string(rune('0'+round)))
			}()
		}
		race.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, controlplane.ErrStale):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d changes of version %d accepted (%v); want exactly one", round, won, read+1, errs)
		}
		winner := "by-a"
		if errs[0] != nil {
			winner = "by-b"
		}
		itest.Eventually(t, within, "both replicas holding the accepted change", func() bool {
			ka, kb := a.Key("k1"), b.Key("k1")
			return ka.Version == read+1 && kb.Version == read+1 && ka.Name == winner && kb.Name == winner
		})
	}
}

// A tenant written through one replica reaches both replicas' policy: its
// fail mode is what each enforces, laid over the file (policy.Overlay).
func TestTenantRecordsReachEveryReplicasPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka")
	}
	ctx := context.Background()
	a, b := twoReplicas(t, func(t testing.TB) *policy.Watcher {
		pw, err := policy.FromData([]byte(testPolicyYAML), "test.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return pw
	})
	now := time.Now().UTC()
	s := &controlplane.Section{Section: adminapi.Section{Name: "newco", Body: json.RawMessage(`{"fail_mode":"closed"}`), Stamp: adminapi.MadeBy("ops", now)}}
	if err := a.CheckOverlay(policy.Overlay{Tenants: map[string]json.RawMessage{"newco": json.RawMessage(`{"fail_mode":"shut"}`)}}); err == nil {
		t.Fatal("CheckOverlay accepted fail_mode shut")
	}
	if err := a.PutSection(ctx, controlplane.KindTenant, s, 0, "r1"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []*adminState{a, b} {
		itest.Eventually(t, within, "newco's fail mode in the replica's policy", func() bool {
			return r.c.policy.Current().Tenant("newco").FailMode == policy.FailClosed
		})
	}
}

// twoReplicas returns two enforcer replicas' admin states on one admin
// topic of the test's own, each with a policy of its own from watcher,
// running until the test ends.
func twoReplicas(t *testing.T, watcher func(testing.TB) *policy.Watcher) (a, b *adminState) {
	kc := itest.Kafka(t)
	cfg := testConfig(t)
	topics := itest.Topics(t)
	env := platform.Env{Topics: topics, Logger: quietLog(), Kafka: kc, SignalAuth: itest.SignalAuth(t)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	replica := func() *adminState {
		c := newCore(cfg, nil, watcher(t), quietLog())
		c.auth = itest.Signer(t, env.SignalAuth)
		as, err := openAdminState(ctx, cfg, env, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(as.close)
		wg.Add(1)
		go func() { defer wg.Done(); _ = as.run(ctx) }()
		return as
	}
	return replica(), replica()
}

// A key revoked through one replica is blacklisted in every replica's
// flags (field @key:<id>, no end), so that the SDKs' Checkers and the
// LiteLLM hook, which read flags and not key records, refuse it too.
func TestARevokedKeyIsBlacklistedInTheFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	ctx := context.Background()
	a, b := twoReplicas(t, testWatcher)
	k := acmeKey("k-leaked")
	if err := a.PutKey(ctx, k, 0, "issue"); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "replica b reading the issued key", func() bool { return b.Key(k.ID) != nil })
	for _, r := range []*adminState{a, b} {
		if f := r.c.table.Flags("acme")[flags.KeyField(k.ID)]; f != nil {
			t.Fatalf("a key in use is flagged: %+v", f)
		}
	}
	revoked := *a.Key(k.ID)
	revoked.Revoked, revoked.RevokedAt, revoked.UpdatedBy = true, time.Now().UTC(), "security"
	if err := a.PutKey(ctx, &revoked, revoked.Version, "revoke"); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*adminState{"a": a, "b": b} {
		itest.Eventually(t, within, "replica "+name+" blacklisting the revoked key", func() bool {
			f := r.c.table.Flags("acme")[flags.KeyField(k.ID)]
			return f != nil && f.Kind == flags.KindBlacklist && f.State == flags.StateBlacklist && f.Until.IsZero()
		})
	}
	if f := a.c.table.Flags("acme")[flags.AllModels]; f != nil {
		t.Errorf("revoking a key flagged the whole tenant: %+v", f)
	}
}

// A key's expiry blacklists it in the flags, as a revocation does, so that
// the readers of flags (the SDKs' Checkers, the LiteLLM hook,
// forward-auth) refuse it too: at once for a key read after its expiry
// (a replica starting later), at its expiry for a key in force.
func TestAnExpiredKeyIsBlacklistedInTheFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka and Redis")
	}
	ctx := context.Background()
	a, _ := twoReplicas(t, testWatcher)
	now := time.Now().UTC()
	key := func(id string, expires time.Time) *controlplane.Key {
		k := acmeKey(id)
		k.ExpiresAt = expires
		return k
	}
	blacklisted := func(id string) bool {
		f := a.c.table.Flags("acme")[flags.KeyField(id)]
		return f != nil && f.Kind == flags.KindBlacklist && f.Until.IsZero()
	}
	past, soon := key("k-past", now.Add(-time.Minute)), key("k-soon", now.Add(time.Second))
	for _, k := range []*controlplane.Key{past, soon, key("k-open", time.Time{})} {
		if err := a.PutKey(ctx, k, 0, "issue "+k.ID); err != nil {
			t.Fatal(err)
		}
	}
	if !blacklisted("k-past") {
		t.Fatal("a key applied after its expiry is not blacklisted")
	}
	a.expireDue(time.Now())
	if blacklisted("k-soon") || blacklisted("k-open") {
		t.Fatal("a key before its expiry, or without one, is blacklisted")
	}
	// The enforcer's clock ticks expireDue (core.tick); the test ticks it.
	itest.Eventually(t, 10*time.Second, "k-soon blacklisted at its expiry", func() bool {
		a.expireDue(time.Now())
		return blacklisted("k-soon")
	})
	if time.Now().Before(soon.ExpiresAt) {
		t.Errorf("k-soon blacklisted before its expiry %v", soon.ExpiresAt)
	}
	if r := a.c.table.Flags("acme")[flags.KeyField("k-soon")].Reason; !strings.Contains(r, "expired") {
		t.Errorf("k-soon's flag says %q; want it to say the key expired", r)
	}
	if blacklisted("k-open") {
		t.Error("a key without expiry is blacklisted")
	}
}

// acmeKey is a new key id of tenant acme for every model, issued now by
// ops, its secret the id.
func acmeKey(id string) *controlplane.Key {
	return &controlplane.Key{SHA256: controlplane.HashSecret(id),
		KeyTerms: adminapi.KeyTerms{ID: id, Tenant: "acme", Models: []string{"*"}, Stamp: adminapi.MadeBy("ops", time.Now().UTC())}}
}
