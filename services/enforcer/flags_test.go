package enforcer

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/platform/redisconn"
	"github.com/sluicehq/sluice/sdk/go/checker"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// A signal becomes a flag that a Checker in another process sees, through
// Redis alone, within 100 ms (median of several tenants, so that one
// scheduling hiccup on a loaded machine does not decide it).
func TestSignalVisibleToCheckerInAnotherProcess(t *testing.T) {
	rc := itest.Redis(t)
	cfg := testConfig(t)
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	c, _ := startCore(t, cfg, rdb)

	bin := filepath.Join(t.TempDir(), "checkerprobe")
	build := exec.Command("go", "build", "-o", bin, "./internal/checkerprobe")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build checkerprobe: %v\n%s", err, out)
	}
	const trials = 5
	var lat []time.Duration
	for i := range trials {
		tenant := fmt.Sprintf("probe-%d", i)
		cmd := exec.Command(bin, "-addr", rc.Addr, "-prefix", cfg.KeyPrefix, "-tenant", tenant, "-model", "gpt-4o")
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 8)
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		next := func() string {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatal("checkerprobe exited")
				}
				return l
			case <-time.After(30 * time.Second):
				t.Fatal("checkerprobe said nothing for 30s")
			}
			return ""
		}
		if l := next(); l != "ready" {
			t.Fatalf("checkerprobe: %q", l)
		}
		sent := time.Now()
		c.handle(exhausted(tenant, "gpt-4o"), sent)
		l := next()
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "refused" || f[2] != "quota" || f[3] != "daily_tokens" {
			t.Fatalf("checkerprobe saw %q, want a daily_tokens quota refusal", l)
		}
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		lat = append(lat, time.Unix(0, ns).Sub(sent))
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	slices.Sort(lat)
	t.Logf("signal to flag visible in another process: %v", lat)
	if med := lat[trials/2]; med > 100*time.Millisecond {
		t.Errorf("median signal-to-visible latency %v exceeds 100ms", med)
	}
}

// startPrivateRedis runs a redis-server of our own (no persistence) on
// port, so that the test may kill and restart it.
func startPrivateRedis(t *testing.T, port int) func() {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server is not installed")
	}
	cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	itest.Eventually(t, within, "private redis up", func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	return stop
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// While Redis is down the enforcer keeps its state; a restarted (empty)
// Redis gets every flag back, and fail modes with them.
func TestRedisRestartRestoresAllFlags(t *testing.T) {
	port := freePort(t)
	stop := startPrivateRedis(t, port)
	rc := redisconn.Defaults()
	rc.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	rdb := redisconn.NewClient(rc)
	t.Cleanup(func() { rdb.Close() }) // after the core stops (startCore)
	cfg := testConfig(t)
	cfg.HeartbeatEvery = 100 * time.Millisecond
	c, _ := startCore(t, cfg, rdb)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	ctx := context.Background()

	tenants := []string{"a", "b", "c"}
	for _, tn := range tenants {
		c.handle(exhausted(tn, "*"), time.Now())
	}
	allThere := func() bool {
		for _, tn := range tenants {
			if v, _ := rdb.HGet(ctx, keys.TenantKey(tn), "*").Result(); v == "" {
				return false
			}
		}
		m, _ := rdb.HGet(ctx, keys.FailModeKey(), "strict").Result()
		return m == "closed"
	}
	itest.Eventually(t, within, "flags written", allThere)

	stop()
	// A change while Redis is down is kept and written later.
	c.handle(exhausted("d", "*"), time.Now())
	tenants = append(tenants, "d")
	startPrivateRedis(t, port)
	itest.Eventually(t, within, "flags restored after the restart", allThere)
	for _, tn := range tenants {
		if ttl := rdb.PTTL(ctx, keys.TenantKey(tn)).Val(); ttl <= 0 || ttl > cfg.FlagTTL {
			t.Errorf("tenant %s key TTL %v, want within (0, %v]", tn, ttl, cfg.FlagTTL)
		}
	}
}

// With the enforcer stopped, flags lapse by their TTL and Checkers follow
// each tenant's fail mode: the fail-closed tenant is refused, the
// fail-open one served.
func TestEnforcerStoppedFlagsExpireAndFailModesApply(t *testing.T) {
	rc := itest.Redis(t)
	cfg := testConfig(t)
	cfg.FlagTTL = 3 * time.Second
	cfg.HeartbeatEvery = 100 * time.Millisecond
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	c, stop := startCore(t, cfg, rdb)
	ch := startChecker(t, rc, cfg.KeyPrefix, 500*time.Millisecond)
	keys := flags.Layout{Prefix: cfg.KeyPrefix}

	c.handle(exhausted("loose", "*"), time.Now())
	itest.Eventually(t, within, "flag visible", func() bool { return ch.Check("loose", "m", "").Outcome == checker.Refused })
	itest.Eventually(t, within, "fresh view", func() bool { return !ch.Stale() })
	if d := ch.Check("strict", "m", ""); !d.Allowed() {
		t.Fatalf("fail-closed tenant refused while the enforcer lives: %+v", d)
	}

	stop()
	itest.Eventually(t, within, "stale view once the heartbeat stops", ch.Stale)
	if d := ch.Check("strict", "m", ""); d.Outcome != checker.RefusedStale {
		t.Fatalf("fail-closed tenant with a dead enforcer: %+v", d)
	}
	itest.Eventually(t, within, "flag key expired in redis", func() bool { return rdb.Exists(context.Background(), keys.TenantKey("loose")).Val() == 0 })
	itest.Eventually(t, within, "flag lapsed in the checker", func() bool { return ch.Check("loose", "m", "").Allowed() })
	if d := ch.Check("loose", "m", ""); !d.Stale {
		t.Fatalf("decision does not report the stale view: %+v", d)
	}
}

// A burst of 10,000 signals over 500 tenants is written in a few pipelined
// round trips, not 10,000.
func TestBurstOfSignalsIsCoalesced(t *testing.T) {
	rc := itest.Redis(t)
	cfg := testConfig(t)
	// A short heartbeat lets writerSettled tell when the counts are final.
	cfg.HeartbeatEvery = 50 * time.Millisecond
	cfg.FlagTTL = 5 * time.Minute
	rdb := testRedis(t, rc, cfg.KeyPrefix)
	hook := &roundTrips{}
	rdb.AddHook(hook)
	c, _ := startCore(t, cfg, rdb)
	ctx := context.Background()
	keys := flags.Layout{Prefix: cfg.KeyPrefix}
	itest.Eventually(t, within, "initial write", func() bool { return rdb.Exists(ctx, cfg.KeyPrefix+"epoch").Val() == 1 })
	writerSettled(t, rdb, keys)

	before := hook.n.Load()
	flushesBefore, _, _ := c.writer.Stats()
	const signals, tenants = 10_000, 500
	now := time.Now()
	for i := range signals {
		c.handle(exhausted(fmt.Sprintf("t%03d", i%tenants), fmt.Sprintf("m%d", i/tenants)), now)
	}
	// The last signal handled completes the last tenant's hash; flushes
	// still in flight then are waited for by writerSettled.
	last := keys.TenantKey(fmt.Sprintf("t%03d", tenants-1))
	itest.Eventually(t, within, "burst written", func() bool {
		n, _ := rdb.HLen(ctx, last).Result()
		return n == 1+signals/tenants
	})
	writerSettled(t, rdb, keys)
	// The waiting above went through the hooked client too; count only the
	// writer's pipelines.
	flushes, errs, _ := c.writer.Stats()
	flushes -= flushesBefore
	used := hook.n.Load() - before
	t.Logf("10,000 signals: %d flushes (%d failed); %d client round trips including the test's own polls", flushes, errs, used)
	if flushes > 50 {
		t.Errorf("10,000 signals cost %d write round trips; coalescing should keep it to a handful", flushes)
	}
}
