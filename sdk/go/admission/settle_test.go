package admission

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluicehq/sluice/platform/itest"
)

// TestLostReplyOfACorrectionIsAppliedOnce: Redis applies a batch of
// corrections (here the rest of a lease, returned on Close) but its reply
// comes after the bound; the retry must not apply it a second time, which
// would refund the rest twice and let the window forget usage it really
// had.
func TestLostReplyOfACorrectionIsAppliedOnce(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	faults := newScriptFaults(AdjustScript)
	c.AddHook(faults)
	// A day's window has granules of 24 minutes: the lease and the
	// admissions share one, so a second refund of the rest would show
	// rather than stop at an empty granule.
	busy := Rule{Name: "platform-tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: 24 * time.Hour}
	l, err := New(c, &Rules{Shared: []Rule{busy}}, WithPrefix(prefix), WithMaxWait(2*time.Second), WithLeaseTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var admitted int64
	for range 3000 {
		if !mustAdmit(t, l, Request{Tenant: "acme", Model: "m", PromptTokens: 8, CompletionTokens: 2}).Decision.Allowed {
			t.Fatal("refused")
		}
		admitted += 10
	}
	key := sharedKey(prefix, busy, Scope{})
	if got := windowUsed(t, c, key); got <= admitted {
		t.Fatalf("Redis holds %d for %d admitted: no lease outstanding to return", got, admitted)
	}
	t.Logf("before close: %d in Redis, %d admitted", windowUsed(t, c, key), admitted)
	faults.arm(loseReply, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("after close: %d in Redis; %d calls %d faults", windowUsed(t, c, key), faults.calls.Load(), faults.faults.Load())
	if faults.faults.Load() != 1 || faults.calls.Load() < 2 {
		t.Fatalf("adjust.lua ran %d times with %d replies lost, want a lost reply and a retry", faults.calls.Load(), faults.faults.Load())
	}
	if got := windowUsed(t, c, key); got != admitted {
		t.Fatalf("Redis holds %d after the lease rest came back, want the %d admitted (the rest refunded %s)", got, admitted,
			map[bool]string{true: "twice", false: "not at all"}[got < admitted])
	}
}

// TestSameRequestIDFromTwoTenantsSettlesBoth: request ids come from
// clients; two tenants (and one tenant reusing an id, and two gateways
// seeing one id) must each have their settlement applied on every rule,
// the shared rules first in the request included.
func TestSameRequestIDFromTwoTenantsSettlesBoth(t *testing.T) {
	prefix := testPrefix(t)
	c := testClient(t, "")
	platform := window("platform-tpm", TotalTokens, 10_000_000, time.Hour)
	tpm := window("tpm", TotalTokens, 1_000_000, time.Hour)
	rules := &Rules{Shared: []Rule{platform}, Default: TenantRules{Rules: []Rule{tpm}}}
	gw1 := newTestLimiter(t, c, rules, WithPrefix(prefix))
	gw2 := newTestLimiter(t, c, rules, WithPrefix(prefix))
	ctx := context.Background()
	settle := func(l *Limiter, tenant, id string) {
		t.Helper()
		tk := mustAdmit(t, l, Request{ID: id, Tenant: tenant, Model: "m", PromptTokens: 10})
		if !tk.Allowed() || tk.Decision.Path != PathRedis {
			t.Fatalf("%s %s: %+v", tenant, id, tk.Decision)
		}
		// Estimated 10, used 50,000: a charge of 49,990.
		if err := tk.Settle(ctx, Usage{PromptTokens: 40_000, CompletionTokens: 10_000}); err != nil {
			t.Fatal(err)
		}
	}
	settle(gw1, "acme", "req-1")
	settle(gw1, "beta", "req-1") // another tenant, the same id
	settle(gw1, "acme", "req-1") // the same tenant reusing it
	settle(gw2, "acme", "req-1") // another gateway
	for key, want := range map[string]int64{
		sharedKey(prefix, platform, Scope{}):    4 * 50_000,
		tenantKey(prefix, tpm, "acme", Scope{}): 3 * 50_000,
		tenantKey(prefix, tpm, "beta", Scope{}): 50_000,
	} {
		if got := windowUsed(t, c, key); got != want {
			t.Errorf("%s holds %d, want %d: a settlement was skipped as a duplicate of another request's", key, got, want)
		}
	}
}

// TestSettleRetryAfterBacklogFullAppliesNothingTwice: a ticket admitted
// partly from a lease and partly by Redis is settled while Redis is away
// and the backlog is full. Settle says so, and is counted and logged; its
// in-memory correction (the lease) is applied once however often it is
// retried, and the Redis part is applied once when a retry gets through.
func TestSettleRetryAfterBacklogFullAppliesNothingTwice(t *testing.T) {
	prefix := testPrefix(t)
	direct := testClient(t, "")
	proxy := itest.NewProxy(t, direct.Options().Addr)
	c := testClient(t, proxy.Addr())
	var logs syncBuffer
	busy := Rule{Name: "platform-tpm", Unit: TotalTokens, Algorithm: SlidingWindow, Limit: 10_000_000, Window: 10 * time.Minute}
	exact := window("tpm", TotalTokens, 1_000_000, time.Hour)
	reg := prometheus.NewRegistry()
	l := newTestLimiter(t, c, &Rules{Shared: []Rule{busy}, Default: TenantRules{Rules: []Rule{exact}}}, WithPrefix(prefix),
		WithLeaseTTL(time.Hour), WithMaxPending(1), WithRegisterer(reg), WithMaxWait(time.Second),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	req := Request{Tenant: "acme", Model: "m", PromptTokens: 8, CompletionTokens: 2}
	var tk Ticket
	var lease *instance
	for i := range 3000 {
		tk = mustAdmit(t, l, req)
		lease = l.gen.Load().insts[sharedKey(prefix, busy, Scope{})]
		// The shared rule from the lease, the exact one by Redis, and
		// enough left in the lease for the charge below (and other's 10).
		if tk.leased == 1 && tk.Decision.Path == PathRedis && lease.leaseLeft.Load() >= 100 {
			break
		}
		if i == 2999 {
			t.Fatal("no admission was served by a lease on the busy rule with 100 tokens left in it")
		}
	}
	other := mustAdmit(t, l, req)
	exactKey := tenantKey(prefix, exact, "acme", Scope{})
	before := windowUsed(t, direct, exactKey)

	proxy.Cut()
	ctx := context.Background()
	// The other ticket's settlement fills the backlog (one entry).
	if err := other.Settle(ctx, Usage{PromptTokens: 20}); err != nil {
		t.Fatalf("the first settlement with Redis away: %v, want it queued", err)
	}
	left := lease.leaseLeft.Load()
	u := Usage{PromptTokens: 40, CompletionTokens: 20} // 50 more than estimated
	for i := range 3 {
		if err := tk.Settle(ctx, u); !errors.Is(err, ErrBacklogFull) {
			t.Fatalf("settlement %d with the backlog full: %v, want ErrBacklogFull", i, err)
		}
		if got := lease.leaseLeft.Load(); got != left-50 {
			t.Fatalf("after settlement attempt %d the lease holds %d, want %d: its charge of 50 applied once", i, got, left-50)
		}
	}
	if got := testutil.ToFloat64(l.m.settles.WithLabelValues("failed")); got != 3 {
		t.Errorf("sluice_admission_settlements_total{result=\"failed\"} = %v, want 3", got)
	}
	if !strings.Contains(logs.String(), ErrBacklogFull.Error()) {
		t.Errorf("nothing logged about the failed settlement: %q", logs.String())
	}

	proxy.Restore()
	itest.Eventually(t, 10*time.Second, "the queued settlement applied", func() bool {
		s := l.Stats()
		return !s.Down && s.Pending == 0
	})
	for range 2 {
		if err := tk.Settle(ctx, u); err != nil {
			t.Fatalf("settlement with Redis back: %v", err)
		}
	}
	if got := lease.leaseLeft.Load(); got != left-50 {
		t.Fatalf("the lease holds %d, want %d", got, left-50)
	}
	if got, want := windowUsed(t, direct, exactKey), before+10+50; got != want {
		t.Fatalf("the exact rule holds %d, want %d (the other ticket's 10 more and this one's 50 more)", got, want)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
