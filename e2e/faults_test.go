package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/platform/itest"
	"github.com/sluicehq/sluice/sdk/go/flags"
)

// Recovery bounds the fault suite states (and README.md repeats): after a
// fault ends, counters equal the ground truth and flags are right again
// within these times.
const (
	// flagRecovery: a quota flag that should exist is back in Redis.
	flagRecovery = 30 * time.Second
	// enforcerCrashRecovery: after a kill -9 the restarted enforcer joins
	// its consumer group only once the dead member's session expired
	// (services.enforcer.consumer.session_timeout, 10 s by default), so a quota
	// crossed while it was dead is flagged within this.
	enforcerCrashRecovery = 45 * time.Second
	// clickHouseOutage is how long ClickHouse is unreachable.
	clickHouseOutage = 30 * time.Second
)

// faultTenants returns the load tenants (unlimited, metered with the
// defaults) and a tenant with a 1000-token hourly quota.
func faultTenants(prefix string) (load []string, limited string) {
	sfx := randomKey()[7:15]
	return []string{prefix + "-a-" + sfx, prefix + "-b-" + sfx, prefix + "-c-" + sfx}, prefix + "-limited-" + sfx
}

// pushOver sends one event that takes limited past its 1000-token hourly
// quota and returns its tokens.
func pushOver(t testing.TB, s *stack, limited string) uint64 {
	t.Helper()
	id := "over-" + randomKey()
	var code int
	var body []byte
	itest.EventuallyNoError(t, waitTimeout, "ingest acknowledges the over-quota event", func() error {
		var err error
		code, body, _, err = s.postEvents(context.Background(), s.ingestKey, "application/json", []byte(eventJSON(id, limited, time.Now(), 1199, 1)))
		if err != nil || code != 202 {
			return fmt.Errorf("%d %v %s", code, err, body)
		}
		return nil
	})
	return 1200
}

// waitQuotaFlag waits within bound until limited's hourly quota flag is in
// Redis.
func (s *stack) waitQuotaFlag(t testing.TB, limited string, bound time.Duration) {
	t.Helper()
	itest.EventuallyNoError(t, bound, "quota flag of "+limited+" in Redis", func() error {
		f, err := s.flag(context.Background(), limited, flags.AllModels)
		if err != nil {
			return err
		}
		if f == nil || f.Kind != flags.KindQuota || f.State != flags.StateOpen || f.Quota != "hourly_tokens" {
			return fmt.Errorf("flag %+v", f)
		}
		return nil
	})
}

// TestFaultServiceCrashes kills -9 the aggregator and then the enforcer
// under load, restarts them, and checks that no acknowledged event is lost
// or counted twice and that a quota crossed while the enforcer was dead is
// flagged within enforcerCrashRecovery of its restart.
func TestFaultServiceCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	load, limited := faultTenants("e2e-crash")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000})})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 2000)

	s.kill9("aggregator")
	l.waitProgress(t, 1000) // events pile up in Kafka meanwhile
	s.start("aggregator")
	l.waitProgress(t, 1000)

	s.kill9("enforcer")
	overTokens := pushOver(t, s, limited)
	l.waitProgress(t, 500)
	s.start("enforcer")
	s.waitQuotaFlag(t, limited, enforcerCrashRecovery)

	l.stop()
	s.countersMatchTruth(t, l.snapshot())
	s.countersMatchTruthTokens(t, limited, overTokens)
	s.requireAlive()
	t.Logf("%d events acknowledged, %d refused and retried", l.ackedCount(), l.refused)
}

// TestFaultRedisRestart restarts a private Redis (no persistence, so every
// flag is lost) and checks the enforcer writes the flags back within
// flagRecovery, and that the gateway's Checker refuses again.
func TestFaultRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	rd := startPrivateRedis(t)
	load, limited := faultTenants("e2e-redis")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000}), RedisAddr: rd.addr})
	s.startAll("ingest", "aggregator", "enforcer")
	g := newGateway(t, s, limited)
	l := startLoader(t, s, 20, 20*time.Millisecond, load...)
	pushOver(t, s, limited)
	s.waitQuotaFlag(t, limited, waitTimeout)

	rd.restart(t)
	restarted := time.Now()
	s.waitQuotaFlag(t, limited, flagRecovery)
	itest.EventuallyNoError(t, flagRecovery-time.Since(restarted)+time.Second, "gateway Checker refuses again after the Redis restart", func() error {
		if d := g.checker.Check(limited, "gpt-4o-mini", "key-"+limited); d.Allowed() {
			return fmt.Errorf("allowed")
		}
		return nil
	})
	if a := g.chat(t, limited, "gpt-4o-mini", 10); a.status != 429 {
		t.Fatalf("after the Redis restart the gateway answered %d, want 429: %s", a.status, a.body)
	}
	l.stop()
	s.countersMatchTruth(t, l.snapshot())
	s.requireAlive()
}

// TestFaultClickHouseOutage makes ClickHouse unreachable for 30 s under
// load (a proxy that refuses connections, so the shared server keeps
// serving other tests), and checks that once it is back every acknowledged
// event is stored once, counters equal the ground truth, and a quota
// crossed during the outage is flagged within flagRecovery.
func TestFaultClickHouseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("fault suite: needs the real services")
	}
	t.Parallel()
	proxy := itest.NewProxy(t, itest.ClickHouse(t).Addr)
	load, limited := faultTenants("e2e-ch")
	s := newStack(t, stackOptions{Policy: policyYAML(map[string]int{limited: 1000}), ClickHouseAddr: proxy.Addr()})
	s.startAll("ingest", "aggregator", "enforcer")
	l := startLoader(t, s, 50, 20*time.Millisecond, load...)
	l.waitProgress(t, 1000)

	proxy.Cut()
	cut := time.Now()
	overTokens := pushOver(t, s, limited)
	// The outage lasts clickHouseOutage whatever the load does meanwhile;
	// ingest must keep acknowledging (it does not need ClickHouse).
	itest.EventuallyNoError(t, clickHouseOutage+waitTimeout, "load continues during the ClickHouse outage", func() error {
		if time.Since(cut) < clickHouseOutage {
			return fmt.Errorf("outage still running")
		}
		return nil
	})
	before := l.ackedCount()
	proxy.Restore()
	s.waitQuotaFlag(t, limited, flagRecovery+waitTimeout) // the aggregator's back-off may reach 30 s
	l.waitProgress(t, 500)
	l.stop()
	acked := l.snapshot()
	// The outage left its events to store (2,500 a second for 30 s, more
	// than a minute's work on two busy cores with -race): a bound on the
	// backlog draining, not on enforcement, which the flag wait above
	// bounds.
	s.countersMatchTruthWithin(t, acked, 3*waitTimeout)
	s.countersMatchTruthTokens(t, limited, overTokens)
	s.requireAlive()
	t.Logf("%d events acknowledged before ClickHouse came back, %d in all", before, l.ackedCount())
}

// privateRedis is a redis-server of this test alone, so restarting it
// disturbs nobody else.
type privateRedis struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrivateRedis(t testing.TB) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not installed (scripts/services.sh install redis)")
		}
		t.Skip("redis-server not installed (scripts/services.sh install redis)")
	}
	r := &privateRedis{addr: freeAddr(t), dir: t.TempDir()}
	r.spawn(t, bin)
	t.Cleanup(func() {
		if r.cmd != nil && r.cmd.Process != nil {
			_ = r.cmd.Process.Signal(syscall.SIGKILL)
			<-r.done
		}
	})
	return r
}

func (r *privateRedis) spawn(t testing.TB, bin string) {
	t.Helper()
	_, port, _ := net.SplitHostPort(r.addr)
	r.cmd = exec.Command(bin, "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no",
		"--dir", r.dir, "--logfile", filepath.Join(r.dir, "redis.log"))
	r.done = make(chan struct{})
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(r.cmd, r.done)
	itest.EventuallyNoError(t, waitTimeout, "private redis-server accepts connections", func() error {
		c, err := net.DialTimeout("tcp", r.addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_, _ = c.Write([]byte("PING\r\n"))
		buf := make([]byte, 16)
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, _ := c.Read(buf)
		if !strings.HasPrefix(string(buf[:n]), "+PONG") {
			return fmt.Errorf("answered %q", buf[:n])
		}
		return nil
	})
}

// restart kills the server (kill -9: no goodbye to clients) and starts a
// fresh, empty one on the same port.
func (r *privateRedis) restart(t testing.TB) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	r.spawn(t, r.cmd.Path)
}
