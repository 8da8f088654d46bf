package admission

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
)

// failoverBound is how long after its master is killed -9 a rule's
// decisions come from Redis again: the services script's Redis Cluster
// promotes the replica after cluster-node-timeout (2 s), the client
// learns the new slot map on its next redirect or refused dial, and the
// limiter's probe then finds Redis answering. docs/admission.md states
// the bound.
const failoverBound = 20 * time.Second

// TestRedisMasterKillUnderLoad admits a fail-open tenant under steady
// load on the Redis Cluster with a replica per master and kills -9 the
// master holding its rule. Meanwhile the local limiter admits it at this
// gateway's share; within failoverBound decisions come from Redis (the
// promoted replica) again; and over the whole run the tenant gets its
// limit — the debits the replica took over are not charged twice — and
// no more than the limit plus the share the fail mode allows and the few
// writes the old master acknowledged and lost, after which Redis refuses
// it: the failover does not leave it unblocked.
func TestRedisMasterKillUnderLoad(t *testing.T) {
	itest.LockEngine(t, itest.EngineRedisHA, true)
	rc := itest.RedisHA(t)
	// The client the services build (redisconn), which re-reads the slot
	// map when a node cannot be dialled.
	c := redisconn.NewClient(rc, redisconn.ContextTimeouts()).(*redis.ClusterClient)
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("Redis Cluster with replicas: %v", err)
	}
	prefix := clusterPrefix(t, c)
	const limit, gateways = 400, 4
	rpm := window("rpm", Requests, limit, time.Hour)
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{rpm}, FailMode: FailOpen}},
		WithPrefix(prefix), WithGatewayCount(gateways), WithMaxWait(300*time.Millisecond), WithProbeInterval(100*time.Millisecond))
	req := Request{Tenant: "acme", Model: "m"}
	master := masterOf(t, c, tenantKey(prefix, rpm, "acme", Scope{}))

	admitted := 0
	for range 100 {
		tk := mustAdmit(t, l, req)
		if !tk.Allowed() || tk.Decision.Path != PathRedis {
			t.Fatalf("before the kill: %+v", tk.Decision)
		}
		admitted++
	}
	_, port, _ := net.SplitHostPort(master)
	p, _ := strconv.Atoi(port)
	itest.KillEngineNode(t, itest.EngineRedisHA, p)
	killed := time.Now()

	// Steady load (one request every 20 ms) until Redis decides again.
	local, redisAgain := 0, time.Duration(0)
	for redisAgain == 0 {
		if time.Since(killed) > failoverBound {
			t.Fatalf("decisions did not come from Redis within %v of the master's kill (%d local admissions meanwhile)", failoverBound, local)
		}
		tk := mustAdmit(t, l, req)
		switch {
		case tk.Decision.Path == PathRedis:
			redisAgain = time.Since(killed)
		case tk.Decision.Path == PathUnavailable:
			t.Fatalf("a fail-open tenant was refused as unavailable: %+v", tk.Decision)
		case tk.Decision.Path == PathLocal && tk.Allowed():
			local++
		}
		if tk.Allowed() {
			admitted++
		}
		time.Sleep(20 * time.Millisecond) // the load's pace, not an assertion
	}
	// Then until Redis refuses: the whole limit, not much more.
	most := limit + limit/gateways + 10
	for {
		tk := mustAdmit(t, l, req)
		if !tk.Allowed() {
			if tk.Decision.Path != PathRedis {
				t.Fatalf("refused by %v, want Redis's refusal after the failover", tk.Decision.Path)
			}
			break
		}
		if admitted++; admitted > most {
			t.Fatalf("admitted %d of a %d-request limit and still admitting: the failover left the tenant unblocked", admitted, limit)
		}
	}
	if admitted < limit {
		t.Fatalf("admitted %d before Redis refused, want the whole limit of %d: debits charged twice in the failover", admitted, limit)
	}
	t.Logf("master %s killed: %d local admissions meanwhile, Redis decided again after %v; %d admitted of a %d limit (bound %d)",
		master, local, redisAgain.Round(time.Millisecond), admitted, limit, most)
}
