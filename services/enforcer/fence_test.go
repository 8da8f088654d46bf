package enforcer

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// startReplica runs a core as Run does — the flag writer once the floor
// is read, the leader lease, the clock — with its own Redis clients for
// the writer and the lease, so that a test can cut one apart from the
// other: a paused process whose renewals stop while its flush is on the
// wire.
func startReplica(t *testing.T, cfg Config, id string, writer, lease redis.UniversalClient) *core {
	t.Helper()
	c := newCore(cfg, writer, testWatcher(t), quietLog())
	c.writer.SetLeading(false) // as Run: silent until the lease says otherwise
	ctx, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(ctx)
	caughtUp := make(chan struct{})
	close(caughtUp)
	floored, writerDone := make(chan struct{}), make(chan struct{})
	g.Go(func() error { defer close(writerDone); return c.runWriterAfterFloor(ctx, floored) })
	g.Go(func() error { return c.runLease(ctx, lease, id, caughtUp, writerDone) })
	g.Go(func() error { return c.runClock(ctx) })
	t.Cleanup(func() {
		cancel()
		if err := g.Wait(); err != nil {
			t.Errorf("replica %s: %v", id, err)
		}
	})
	return c
}

// redisVia is a client of rc that reaches Redis through addr.
func redisVia(t *testing.T, rc redisconn.Config, addr string) redis.UniversalClient {
	t.Helper()
	rc.Addr = addr
	rc.DialTimeout = time.Second
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// Issue 31's "done when" for one writer at a time: two enforcers, the
// leader paused in the middle of a flush past its lease, never leave a
// blocked tenant's flag empty. Replica A leads and is about to lift the
// tenant's breaker (its batch is on the wire, held by the network) when it
// stalls: its renewals stop, its lease lapses, B takes the lead and writes
// the tenant blocked (B's state says so: a new quota_exhausted reached
// it). Then A's late batch reaches Redis. Redis must refuse it.
func TestPausedLeaderCannotEmptyABlockedTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rc := itest.Redis(t)
	cfg := testConfig(t)
	cfg.LeaderLease, cfg.HeartbeatEvery = time.Second, 200*time.Millisecond
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	ctx := context.Background()
	const tenant = "blocked"

	wire := newHoldingProxy(t, rc.Addr)
	leaseLine := itest.NewProxy(t, rc.Addr)
	sent := &pipelineWatch{key: keys.TenantKey(tenant)}
	writerA := redisVia(t, rc, wire.Addr())
	writerA.AddHook(sent)
	a := startReplica(t, cfg, "a", writerA, redisVia(t, rc, leaseLine.Addr()))
	itest.Eventually(t, within, "a leads", a.writer.Leading)
	a.handle(exhausted(tenant, "gpt-4o"), time.Now())
	hasFlag := func() bool {
		v, _ := rdb.HGet(ctx, keys.TenantKey(tenant), "gpt-4o").Result()
		return strings.Contains(v, "daily_tokens")
	}
	itest.Eventually(t, within, "a writes the block", hasFlag)
	b := startReplica(t, cfg, "b", rdb, rdb)
	ch := startChecker(t, rc, cfg.KeyPrefix, 10*time.Second)
	itest.Eventually(t, within, "the Checker refuses the tenant", func() bool { return ch.Check(tenant, "gpt-4o", "").Outcome == checker.Refused })

	// A lifts the breaker; its batch leaves A and is held on the way.
	wire.Hold()
	sent.arm()
	if !a.table.Reset(tenant, "gpt-4o", flags.KindQuota) {
		t.Fatal("a had no quota breaker to lift")
	}
	a.writer.MarkDirty(tenant)
	itest.Eventually(t, within, "a's lifting batch sent", sent.seen)
	// A stalls: no renewal reaches Redis, and its lease lapses.
	leaseLine.Cut()
	itest.Eventually(t, within, "b leads", b.writer.Leading)
	b.handle(exhausted(tenant, "gpt-4o"), time.Now())
	itest.Eventually(t, within, "b's write of the tenant", func() bool {
		v, _ := rdb.HGet(ctx, keys.TenantKey(tenant), flags.VersionField).Int64()
		return v > sent.version() && hasFlag()
	})
	// A's batch arrives late.
	wire.Release()
	itest.Eventually(t, within, "a's late batch processed by Redis", func() bool { return wire.Forwarded() > 0 && wire.Idle() })
	writerSettled(t, rdb, keys)
	if !hasFlag() {
		h, _ := rdb.HGetAll(ctx, keys.TenantKey(tenant)).Result()
		t.Fatalf("the paused leader's late write emptied the blocked tenant's flags: %v", h)
	}
	if d := ch.Check(tenant, "gpt-4o", ""); d.Outcome != checker.Refused {
		t.Fatalf("the Checker lets the blocked tenant through: %+v", d)
	}
}

// A new leader whose clock is behind its predecessor's is still heard:
// the previous leader (clock an hour ahead) left a tenant blocked on one
// model; the new leader adds a block on another, and Checkers must see it
// (they drop a read whose version is older than their view, so versions
// from the writers' own clocks made them ignore the new leader for the
// length of the skew).
func TestNewLeaderBehindThePreviousClockIsHeard(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rc := itest.Redis(t)
	cfg, rdb, _, _ := leaseTest(t, rc)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	ctx := context.Background()
	const tenant = "skewed"

	// What a leader an hour ahead wrote, in the layout of docs/flags.md.
	ahead := time.Now().Add(time.Hour)
	v := ahead.UnixMicro()
	f := &flags.Flag{State: flags.StateOpen, Kind: flags.KindQuota, Quota: string(schemas.QuotaDailyTokens), Period: "day",
		Until: time.Now().Add(time.Minute), Limit: 1000, Used: 1000}
	if _, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, keys.TenantKey(tenant), flags.VersionField, v, "gpt-4o", flags.Encode(f))
		p.PExpire(ctx, keys.TenantKey(tenant), time.Minute)
		p.Set(ctx, keys.VersionKey(), v, 0)
		p.Set(ctx, keys.HeartbeatKey(), time.Now().UnixMilli(), time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ch := startChecker(t, rc, cfg.KeyPrefix, time.Minute)
	itest.Eventually(t, within, "the Checker holds the earlier leader's view", func() bool { return ch.Check(tenant, "gpt-4o", "").Outcome == checker.Refused })

	c := startReplica(t, cfg, "behind", rdb, rdb)
	itest.Eventually(t, within, "the new replica leads", c.writer.Leading)
	c.handle(exhausted(tenant, "claude"), time.Now())
	itest.Eventually(t, within, "the new leader's block reaches the Checker", func() bool {
		return ch.Check(tenant, "claude", "").Outcome == checker.Refused && ch.Check(tenant, "gpt-4o", "").Outcome == checker.Refused
	})
	if got, _ := rdb.HGet(ctx, keys.TenantKey(tenant), flags.VersionField).Int64(); got <= v {
		t.Errorf("the new leader wrote version %d, not above its predecessor's %d", got, v)
	}
}

// Two processes with one replica_id (a rolling update with surge, host
// networking): the second takes the lease over from the first once, as a
// restarted replica does, and from then on the first never renews it
// again — they never both lead.
func TestSameReplicaIDNeverLeadsTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis")
	}
	rc := itest.Redis(t)
	cfg, rdb, lease, fence := leaseTest(t, rc)
	ctx := context.Background()

	first := startReplica(t, cfg, "same", rdb, rdb)
	itest.Eventually(t, within, "the first process leads", first.writer.Leading)
	held, _ := rdb.Get(ctx, lease).Result()
	second := startReplica(t, cfg, "same", rdb, rdb)
	itest.Eventually(t, within, "the second takes over and the first stops", func() bool {
		v, _ := rdb.Get(ctx, lease).Result()
		return v != held && second.writer.Leading() && !first.writer.Leading()
	})
	// Three renewals of the second later (each moves the granted
	// ceiling on), the first still does not lead and holds nothing.
	owner, _ := rdb.Get(ctx, lease).Result()
	last, _ := rdb.Get(ctx, fence).Result()
	for range 3 {
		itest.Eventually(t, within, "a renewal", func() bool {
			g, _ := rdb.Get(ctx, fence).Result()
			if g != last {
				last = g
				return true
			}
			return false
		})
		if first.writer.Leading() {
			t.Fatal("both processes of one replica_id lead")
		}
		if v, _ := rdb.Get(ctx, lease).Result(); v != owner {
			t.Fatalf("the lease went from %q to %q", owner, v)
		}
	}
}

// leaseTest is the set-up of a test of the leader lease on rc: a
// configuration whose lease changes hands within a second, a client whose
// keys go with the test, and the lease's key and its fence's.
func leaseTest(t *testing.T, rc redisconn.Config) (cfg Config, rdb redis.UniversalClient, lease, fence string) {
	t.Helper()
	cfg = testConfig(t)
	cfg.LeaderLease = time.Second
	rdb = testRedis(t, rc, cfg.KeyPrefix)
	lease = leaseKey(cfg.KeyPrefix)
	fence, err := fenceKey(lease)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, rdb, lease, fence
}

// pipelineWatch is a go-redis hook that records, once armed, when a
// pipeline writing key is sent, and the highest version field it carries.
type pipelineWatch struct {
	key   string
	armed atomic.Bool
	hit   atomic.Bool
	ver   atomic.Int64
}

func (w *pipelineWatch) arm()                                        { w.armed.Store(true) }
func (w *pipelineWatch) seen() bool                                  { return w.hit.Load() }
func (w *pipelineWatch) version() int64                              { return w.ver.Load() }
func (w *pipelineWatch) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *pipelineWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}

func (w *pipelineWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if w.armed.Load() {
			for _, c := range cmds {
				args := c.Args()
				for i, a := range args {
					if s, ok := a.(string); ok && s == w.key {
						w.ver.Store(max(w.ver.Load(), versionArg(args[i+1:])))
						w.hit.Store(true)
					}
				}
			}
		}
		return next(ctx, cmds)
	}
}

// versionArg finds the largest number among a script call's arguments
// after its key: the batch's version (it is microseconds, the largest).
func versionArg(args []any) int64 {
	var v int64
	for _, a := range args {
		switch x := a.(type) {
		case int64:
			v = max(v, x)
		case string:
			if n, err := strconv.ParseInt(x, 10, 64); err == nil {
				v = max(v, n)
			}
		}
	}
	return v
}

// holdingProxy forwards TCP to a target, and can hold what clients send:
// bytes already sent are kept and delivered on Release, as a congested
// network delivers a request long after it left — after the sender gave up
// waiting, even.
type holdingProxy struct {
	target string
	ln     net.Listener

	mu        sync.Mutex
	cond      *sync.Cond
	held      bool
	pending   int // bytes read from clients, not yet written upstream
	forwarded int // bytes written upstream since the last Hold
	wg        sync.WaitGroup
}

func newHoldingProxy(t *testing.T, target string) *holdingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{target: target, ln: ln}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.Release(); p.wg.Wait() })
	return p
}

func (p *holdingProxy) Addr() string { return p.ln.Addr().String() }

// Hold keeps everything clients send from now on until Release.
func (p *holdingProxy) Hold() {
	p.mu.Lock()
	p.held, p.forwarded = true, 0
	p.mu.Unlock()
}

// Release delivers what was held and forwards again.
func (p *holdingProxy) Release() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Forwarded is how many bytes went upstream since the last Hold.
func (p *holdingProxy) Forwarded() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.forwarded
}

// Idle reports whether nothing read from a client waits to go upstream.
func (p *holdingProxy) Idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending == 0
}

func (p *holdingProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.wg.Add(2)
		go func() { defer p.wg.Done(); p.upstream(c, up) }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
	}
}

// upstream copies what the client sends to up, waiting while held; what
// the client sent before closing is still delivered.
func (p *holdingProxy) upstream(c, up net.Conn) {
	defer up.Close()
	chunks := make(chan []byte, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := c.Read(buf)
			if n > 0 {
				p.mu.Lock()
				p.pending += n
				p.mu.Unlock()
				chunks <- buf[:n]
			}
			if err != nil {
				return
			}
		}
	}()
	for b := range chunks {
		p.mu.Lock()
		for p.held {
			p.cond.Wait()
		}
		p.mu.Unlock()
		_, err := up.Write(b)
		p.mu.Lock()
		p.pending -= len(b)
		p.forwarded += len(b)
		p.mu.Unlock()
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// The lease and its fence key share a slot, so that one script takes the
// lease and grants versions on a Redis Cluster too; a leader elected there
// writes fenced flags.
func TestLeaseAndFenceOnRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Redis Cluster")
	}
	rc := itest.RedisCluster(t)
	cfg, rdb, lease, fence := leaseTest(t, rc)
	ctx := context.Background()
	cl, ok := rdb.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("client %T is not a cluster client", rdb)
	}
	a, _ := cl.ClusterKeySlot(ctx, lease).Result()
	b, _ := cl.ClusterKeySlot(ctx, fence).Result()
	if a != b {
		t.Fatalf("lease %s on slot %d, fence %s on slot %d", lease, a, fence, b)
	}
	c := startReplica(t, cfg, "clustered", rdb, rdb)
	itest.Eventually(t, within, "the replica leads on the cluster", c.writer.Leading)
	c.handle(exhausted("spread", "gpt-4o"), time.Now())
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	itest.Eventually(t, within, "its flag written", func() bool {
		v, _ := rdb.HGet(ctx, keys.TenantKey("spread"), "gpt-4o").Result()
		return strings.Contains(v, "daily_tokens")
	})
	g, _ := rdb.Get(ctx, fence).Int64()
	if v, _ := rdb.HGet(ctx, keys.TenantKey("spread"), flags.VersionField).Int64(); v <= 0 || v > g {
		t.Fatalf("flag version %d, want within the granted ceiling %d", v, g)
	}
}

// fenceKey follows the Redis Cluster hash-tag rules for every prefix, and
// refuses one whose braces form no tag, naming the setting.
func TestFenceKeySharesTheLeaseSlot(t *testing.T) {
	for prefix, want := range map[string]string{
		"acme:flags:": "acme:flags:leader:fence{acme:flags:leader}",
		"{sluice}:f:": "{sluice}:f:leader:fence",
	} {
		if got, err := fenceKey(leaseKey(prefix)); err != nil || got != want {
			t.Errorf("prefix %q: %q %v, want %q", prefix, got, err, want)
		}
	}
	for _, prefix := range []string{"a{b:", "a}b:", "a{}b:"} {
		if _, err := fenceKey(leaseKey(prefix)); err == nil || !strings.Contains(err.Error(), "redis.key_prefix") {
			t.Errorf("prefix %q: %v, want an error naming redis.key_prefix", prefix, err)
		}
	}
}
