package admission

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestUnreachableRedisFailsOpenLocallyThenReconciles: with Redis cut, a
// fail-open tenant is admitted by the local limiter at the limit divided by
// the gateway count (starting from what Redis last said), a fail-closed
// tenant is refused with 503; once Redis is back the local debits, settled,
// are in Redis.
func TestUnreachableRedisFailsOpenLocallyThenReconciles(t *testing.T) {
	prefix := testPrefix(t)
	direct := testClient(t, "")
	proxy := itest.NewProxy(t, direct.Options().Addr)
	c := testClient(t, proxy.Addr())
	tpm := window("tpm", TotalTokens, 10_000, time.Hour)
	l := newTestLimiter(t, c, &Rules{
		Tenants: map[string]TenantRules{"vip": {Rules: []Rule{tpm}, FailMode: FailClosed}},
		Default: TenantRules{Rules: []Rule{tpm}, FailMode: FailOpen},
	}, WithPrefix(prefix), WithGatewayCount(2), WithMaxWait(time.Second))
	key := tenantKey(prefix, tpm, "acme", Scope{})
	req := Request{Tenant: "acme", Model: "m", PromptTokens: 800, CompletionTokens: 200}
	if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathRedis {
		t.Fatalf("before the cut: %+v", d)
	}
	if d := mustAdmit(t, l, Request{Tenant: "vip", Model: "m", PromptTokens: 10}).Decision; !d.Allowed {
		t.Fatalf("vip before the cut: %+v", d)
	}

	proxy.Cut()
	// Redis said 9,000 were left; this gateway's share is 4,500 of a local
	// limit of 5,000, i.e. 4 more requests of 1,000.
	var tickets []Ticket
	for i := range 4 {
		tk := mustAdmit(t, l, req)
		if !tk.Allowed() || tk.Decision.Path != PathLocal || tk.Decision.Cause == nil {
			t.Fatalf("local admission %d: %+v", i, tk.Decision)
		}
		tickets = append(tickets, tk)
	}
	d := mustAdmit(t, l, req).Decision
	if d.Allowed || d.Path != PathLocal || d.Rule != "tpm" || d.Scope.Tenant != "acme" {
		t.Fatalf("5th local admission: %+v, want the local limiter's refusal by tpm", d)
	}
	closed := mustAdmit(t, l, Request{Tenant: "vip", Model: "m", PromptTokens: 10}).Decision
	if closed.Allowed || closed.Path != PathUnavailable || Status(closed) != http.StatusServiceUnavailable || closed.Cause == nil {
		t.Fatalf("fail-closed tenant while Redis is cut: %+v", closed)
	}
	rec := httptest.NewRecorder()
	WriteRefusal(rec, closed)
	var body refusalBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != 503 || body.Error.Code != "admission_unavailable" || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("503 answer: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	// One local call spent less than estimated.
	if err := tickets[0].Settle(context.Background(), Usage{PromptTokens: 300, CompletionTokens: 100}); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); !s.Down || s.FailOpen != 5 || s.FailClosed != 1 {
		t.Fatalf("stats while cut: %+v", s)
	}

	proxy.Restore()
	want := int64(1000 + 4*1000 - 600)
	itest.Eventually(t, 10*time.Second, "the local debits reconciled into Redis", func() bool {
		return windowUsed(t, direct, key) == want && !l.Stats().Down
	})
	if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathRedis {
		t.Fatalf("after Redis came back: %+v", d)
	}
}

// blackHole accepts connections and never answers: a Redis that hangs.
func blackHole(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return ln.Addr().String()
}

// TestHungRedisDecidesWithinTheBound: a Redis that accepts and never
// answers costs Admit the wait bound, not the client's 30 s read timeout,
// and then the tenant's fail mode decides.
func TestHungRedisDecidesWithinTheBound(t *testing.T) {
	c := testClient(t, blackHole(t))
	rule := window("rpm", Requests, 100, time.Minute)
	l := newTestLimiter(t, c, &Rules{
		Tenants: map[string]TenantRules{"strict": {Rules: []Rule{rule}, FailMode: FailClosed}},
		Default: TenantRules{Rules: []Rule{rule}},
	}, WithMaxWait(50*time.Millisecond), WithPrefix("sluice:adm:test:hung:"))
	start := time.Now()
	open := mustAdmit(t, l, Request{Tenant: "acme", Model: "m"}).Decision
	took := time.Since(start)
	if !open.Allowed || open.Path != PathLocal {
		t.Fatalf("fail-open tenant with Redis hung: %+v", open)
	}
	// 30 s is what an unbounded call would take: anything far below it
	// shows the bound applied, without asserting a speed.
	if took > 10*time.Second {
		t.Fatalf("Admit took %s with Redis hung", took)
	}
	closed := mustAdmit(t, l, Request{Tenant: "strict", Model: "m"}).Decision
	if closed.Allowed || closed.Path != PathUnavailable || !errors.Is(closed.Cause, context.DeadlineExceeded) {
		t.Fatalf("fail-closed tenant with Redis hung: %+v (cause %v)", closed, closed.Cause)
	}
}

// aclUser creates a Redis user of the test's own with every permission and
// returns its name and password; it is deleted when the test ends.
func aclUser(t *testing.T, admin *redis.Client) (string, string) {
	t.Helper()
	name, pass := itest.Unique(t, "sluice_adm_"), itest.Unique(t, "pw_")
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", name, "on", ">"+pass, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", name) })
	return name, pass
}

// tickWaiter counts the background loop's iterations (withTickHook).
type tickWaiter struct{ ch chan struct{} }

func newTickWaiter() *tickWaiter { return &tickWaiter{ch: make(chan struct{}, 1)} }

func (w *tickWaiter) hook() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// wait returns once n iterations have started and ended after the call
// (the first one seen may have begun before it, hence one more).
func (w *tickWaiter) wait(t *testing.T, n int) {
	t.Helper()
	select {
	case <-w.ch:
	default:
	}
	for range n + 1 {
		select {
		case <-w.ch:
		case <-time.After(30 * time.Second):
			t.Fatal("the background loop did not run")
		}
	}
}

// TestFailOpenShareHoldsWhileRedisRefusesScripts: Redis answers PING but
// refuses every script (here an ACL that lost EVAL and EVALSHA; a Cluster
// master down, OOM under noeviction and a READONLY replica look the same
// to admission). Every background iteration then finds Redis "back" by its
// probe and fails to flush; through all of them the fail-open tenant keeps
// the share it had (Redis's last word divided by the gateways), and once
// Redis takes scripts again exactly what was admitted locally is
// reconciled.
func TestFailOpenShareHoldsWhileRedisRefusesScripts(t *testing.T) {
	prefix := testPrefix(t)
	admin := testClient(t, "")
	user, pass := aclUser(t, admin)
	c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: user, Password: pass, ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second})
	t.Cleanup(func() { c.Close() })
	ticks := newTickWaiter()
	rpm := window("rpm", Requests, 20, time.Minute)
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: []Rule{rpm}, FailMode: FailOpen}},
		WithPrefix(prefix), WithGatewayCount(2), WithProbeInterval(5*time.Millisecond), withTickHook(ticks.hook))
	req := Request{Tenant: "acme", Model: "m"}
	for i := range 2 {
		if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathRedis {
			t.Fatalf("admission %d before the ACL change: %+v", i, d)
		}
	}

	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING as %s after the ACL change: %v (the test needs a Redis that still answers it)", user, err)
	}
	if err := c.Eval(ctx, "return 1", nil).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("EVAL as %s after the ACL change: %v, want NOPERM", user, err)
	}

	// Redis said 18 were left: this gateway's share is 9 (of a local limit
	// of 10), however many background iterations run meanwhile.
	var admitted int
	for round := range 20 {
		for range 5 {
			d := mustAdmit(t, l, req).Decision
			if d.Path != PathLocal {
				t.Fatalf("round %d: decided by %s (%v), want the local limiter", round, d.Path, d.Cause)
			}
			if d.Allowed {
				admitted++
			}
		}
		ticks.wait(t, 2) // each probes (PING answers) and fails to flush
	}
	if admitted != 9 {
		t.Fatalf("admitted %d requests locally under a 20/min rule shared by 2 gateways, 18 left: want 9", admitted)
	}
	if !l.Stats().Down {
		t.Fatal("the Limiter trusts a Redis that refuses its scripts")
	}

	if err := admin.Do(ctx, "ACL", "SETUSER", user, "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	key := tenantKey(prefix, rpm, "acme", Scope{})
	itest.Eventually(t, 10*time.Second, "the local debits reconciled once scripts run again", func() bool {
		return !l.Stats().Down && l.Stats().Pending == 0
	})
	if got := windowUsed(t, admin, key); got != 2+9 {
		t.Fatalf("Redis holds %d requests, want the 2 it admitted and the 9 admitted locally", got)
	}
}
