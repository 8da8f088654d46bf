package enforcer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adminapi"
	"github.com/sluicehq/sluice/platform"
	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Two replicas share one key prefix: A holds the leader lease and writes
// the flags; an admin action served by B (the follower) is enforced by A
// through the admin topic, and neither replica's periodic refresh
// deletes the other's flags. When A stops, B takes the lead with A's
// actions in its state, and keeps enforcing them.
func TestTwoReplicasShareAdminStateAndOneWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Kafka, ClickHouse and Redis")
	}
	kc := itest.Kafka(t)
	chc := itest.ClickHouse(t)
	rc := itest.Redis(t)
	ctx := context.Background()
	testClickHouse(t, chc)
	base := testConfig(t)
	topics := itest.Topics(t)
	base.Group = itest.Unique(t, "enforcer_")
	// Short TTL: a refresh of every flag (every flag_ttl/3) each second.
	base.FlagTTL, base.HeartbeatEvery, base.LeaderLease = 3*time.Second, 500*time.Millisecond, time.Second
	base.Admin.Tokens = []adminapi.Token{{Name: "ops", SHA256: adminapi.HashToken("tok")}}
	rdb := testRedis(t, rc, base.KeyPrefix)
	keys := flags.Layout{Prefix: base.KeyPrefix}
	ch := startChecker(t, rc, base.KeyPrefix, 10*time.Second)
	// One key ring, as in a deployment: each replica verifies the admin
	// records the others sign.
	sigAuth := itest.SignalAuth(t)

	start := func(id string) (*adminapi.Client, func()) {
		cfg := base
		cfg.ReplicaID = id
		cfg.Admin.Listen = closedAddr(t)
		env := platform.Env{Topics: topics, Logger: quietLog(), Kafka: kc, ClickHouse: chc, Redis: rc, SignalAuth: sigAuth}.Named("test-" + id)
		svc, err := New(cfg, env)
		stop := itest.RunService(t, svc, err)
		cl, err := adminapi.NewClient("http://"+cfg.Admin.Listen, "tok", nil)
		if err != nil {
			t.Fatal(err)
		}
		itest.EventuallyNoError(t, within, "admin API of "+id+" up", func() error { _, err := cl.Breakers(ctx, ""); return err })
		return cl, stop
	}
	leader := func() string {
		v, _ := rdb.Get(ctx, leaseKey(base.KeyPrefix)).Result()
		id, _, _ := strings.Cut(v, "/")
		return id
	}
	clA, stopA := start("a")
	itest.Eventually(t, within, "replica a leads", func() bool { return leader() == "a" })
	clB, _ := start("b")

	// An action served by the follower answers with it in force there…
	res, err := clB.Blacklist(ctx, adminapi.Request{Tenant: "shared", Reason: "fraud", ExpiresIn: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(res.Breakers, func(b adminapi.Breaker) bool { return b.Kind == flags.KindBlacklist }) {
		t.Fatalf("follower's answer lists %+v, want the blacklist", res.Breakers)
	}
	// …and the leader writes it.
	itest.Eventually(t, within, "blacklist from the follower enforced", func() bool {
		d := ch.Check("shared", "m", "")
		return d.Outcome == checker.Refused && d.Flag.Kind == flags.KindBlacklist
	})
	if _, err := clA.Trip(ctx, adminapi.Request{Tenant: "tripped", Model: "gpt-4o", Reason: "incident", ExpiresIn: "1h"}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "trip on the leader enforced", func() bool {
		return ch.Check("tripped", "gpt-4o", "").Outcome == checker.Refused
	})
	present := func() bool {
		a, _ := rdb.HGet(ctx, keys.TenantKey("shared"), "*").Result()
		b, _ := rdb.HGet(ctx, keys.TenantKey("tripped"), "gpt-4o").Result()
		return strings.Contains(a, "blacklist") && strings.Contains(b, "manual")
	}
	// Two periodic refreshes later both flags are still there: each
	// refresh renews the keys' expiry (3 s) without rewriting them, as
	// their flags did not change (the versions stay).
	version := func() [2]int64 {
		a, _ := rdb.HGet(ctx, keys.TenantKey("shared"), flags.VersionField).Int64()
		b, _ := rdb.HGet(ctx, keys.TenantKey("tripped"), flags.VersionField).Int64()
		return [2]int64{a, b}
	}
	v0 := version()
	for range 2 {
		expiry := time.Now().Add(max(rdb.PTTL(ctx, keys.TenantKey("shared")).Val(), rdb.PTTL(ctx, keys.TenantKey("tripped")).Val()))
		itest.Eventually(t, within, "both keys renewed past their expiry", func() bool {
			return time.Now().After(expiry) && present()
		})
	}
	if v := version(); v != v0 {
		t.Fatalf("versions went from %v to %v: a refresh rewrote unchanged flags", v0, v)
	}

	// A stops; B takes the lead with both actions and keeps enforcing them.
	// Refreshes do not touch the epoch: only a full rewrite (B's, on
	// taking the lead) sets it after this, and B may make it before the
	// test sees B lead.
	since := time.Now().UnixMilli()
	stopA()
	itest.Eventually(t, within, "replica b leads", func() bool { return leader() == "b" })
	itest.Eventually(t, within, "b's first full rewrite", func() bool {
		e, _ := rdb.Get(ctx, base.KeyPrefix+"epoch").Int64()
		return e > since
	})
	writerSettled(t, rdb, keys)
	if !present() {
		t.Fatal("the new leader's rewrite deleted the old leader's admin flags")
	}
	if ch.Check("tripped", "gpt-4o", "").Outcome != checker.Refused || ch.Check("shared", "m", "").Outcome != checker.Refused {
		t.Fatal("checker lets tenants through after the failover")
	}
	// A lift served by the new leader reaches the gateways.
	if _, err := clB.Unblacklist(ctx, adminapi.Request{Tenant: "shared", Reason: "cleared"}); err != nil {
		t.Fatal(err)
	}
	itest.Eventually(t, within, "unblacklist enforced", func() bool { return ch.Check("shared", "m", "").Allowed() })
}
