package admission

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/platform/itest"
)

// The tests in this file run against the real 3-master Redis Cluster: the
// package's promise that a request whose rules live on different masters is
// still all or nothing (one pipelined round trip, refunds on a partial
// refusal) and settled exactly once in every slot is only worth something
// if it holds where slots really are on different servers.

// clusterClient returns a Cluster client of the real Redis Cluster with
// context timeouts on, as New requires.
func clusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rc := itest.RedisCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Seeds(), ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.Ping(ctx).Err()
	}); err != nil {
		t.Fatalf("Redis Cluster: %v", err)
	}
	return c
}

// clusterPrefix is a key prefix of the test's own; its keys are deleted on
// every master at the end.
func clusterPrefix(t testing.TB, c *redis.ClusterClient) string {
	t.Helper()
	p := itest.Unique(t, "sluice:adm:") + ":"
	t.Cleanup(func() {
		_ = c.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
			iter := m.Scan(ctx, 0, p+"*", 1000).Iterator()
			for iter.Next(ctx) {
				m.Del(ctx, iter.Val())
			}
			return iter.Err()
		})
	})
	return p
}

// masterOf returns the address of the master serving key, asking the
// server for the slot (CLUSTER KEYSLOT) and checking it against the slot
// Admit groups by.
func masterOf(t testing.TB, c *redis.ClusterClient, key string) string {
	t.Helper()
	ctx := context.Background()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if uint16(slot) != keySlot(key) {
		t.Fatalf("CLUSTER KEYSLOT %s = %d, admission groups it in slot %d", key, slot, keySlot(key))
	}
	m, err := c.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return m.Options().Addr
}

// onDistinctMasters returns, for each rule template, a copy whose name puts
// its key (by key(r)) on a master none of the others uses. Names are
// searched rather than fixed, so the test does not depend on how the
// cluster split its slots.
func onDistinctMasters(t testing.TB, c *redis.ClusterClient, key func(Rule) string, rules ...Rule) []Rule {
	t.Helper()
	used := map[string]bool{}
	out := make([]Rule, len(rules))
	for i, r := range rules {
		found := false
		for n := range 1000 {
			cand := r
			cand.Name = fmt.Sprintf("%s-%d", r.Name, n)
			if m := masterOf(t, c, key(cand)); !used[m] {
				used[m], out[i], found = true, cand, true
				break
			}
		}
		if !found {
			t.Fatalf("no name puts rule %s on a master of its own (masters in use: %v)", r.Name, used)
		}
	}
	return out
}

// bucketTokens reads a token bucket's tokens left, refilled to now the way
// admit.lua does (an absent key is a full bucket).
func bucketTokens(t testing.TB, c redis.UniversalClient, key string, r Rule) float64 {
	t.Helper()
	ctx := context.Background()
	v, err := c.HMGet(ctx, key, "t", "ts").Result()
	if err != nil {
		t.Fatal(err)
	}
	if v[0] == nil || v[1] == nil {
		return float64(r.Limit)
	}
	tokens, _ := strconv.ParseFloat(v[0].(string), 64)
	ts, _ := strconv.ParseFloat(v[1].(string), 64)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ms := float64(now.UnixMicro()) / 1000; ms > ts {
		tokens = min(float64(r.Limit), tokens+(ms-ts)*r.Rate/1000)
	}
	return tokens
}

// TestClusterPartialRefusalLeavesNoDebitOnOtherMasters: three rules on
// three different masters; whichever of them refuses, the other two hold
// exactly what they held before (the debits made on their masters in the
// same round trip were refunded before Admit returned).
func TestClusterPartialRefusalLeavesNoDebitOnOtherMasters(t *testing.T) {
	c := clusterClient(t)
	prefix := clusterPrefix(t, c)
	bucket := Rule{Name: "upstream-tpm", Scope: Scope{Upstream: "openai-main"}, Unit: TotalTokens, Algorithm: TokenBucket, Limit: 10_000, Rate: 0.001, Exact: true}
	perUser := window("per-user", PromptTokens, 1000, time.Hour)
	perUser.Scope = Scope{User: Each}
	perKey := window("per-key-rpm", Requests, 2, time.Hour)
	perKey.Scope = Scope{Key: Each}
	rs := onDistinctMasters(t, c, func(r Rule) string {
		switch r.Unit {
		case TotalTokens:
			return sharedKey(prefix, r, Scope{Upstream: "openai-main"})
		case PromptTokens:
			return tenantKey(prefix, r, "acme", Scope{User: "bob"})
		}
		return tenantKey(prefix, r, "acme", Scope{Key: "k1"})
	}, bucket, perUser, perKey)
	bucket, perUser, perKey = rs[0], rs[1], rs[2]
	l := newTestLimiter(t, c, &Rules{
		Shared:  []Rule{bucket},
		Tenants: map[string]TenantRules{"acme": {Rules: []Rule{perUser, perKey}}},
	}, WithPrefix(prefix))

	base := Request{Tenant: "acme", Model: "gpt-4o", Upstream: "openai-main", User: "bob", Key: "k1", PromptTokens: 300, CompletionTokens: 100}
	bk := sharedKey(prefix, bucket, Scope{Upstream: "openai-main"})
	uk := tenantKey(prefix, perUser, "acme", Scope{User: "bob"})
	kk := func(key string) string { return tenantKey(prefix, perKey, "acme", Scope{Key: key}) }
	masters := map[string]bool{masterOf(t, c, bk): true, masterOf(t, c, uk): true, masterOf(t, c, kk("k1")): true}
	if len(masters) != 3 {
		t.Fatalf("the rules' keys are on %d masters, want 3", len(masters))
	}

	type state struct {
		bucket       float64
		user, perKey map[string]string
	}
	read := func(key string) state {
		u, err := c.HGetAll(context.Background(), uk).Result()
		if err != nil {
			t.Fatal(err)
		}
		k, err := c.HGetAll(context.Background(), kk(key)).Result()
		if err != nil {
			t.Fatal(err)
		}
		return state{bucket: bucketTokens(t, c, bk, bucket), user: u, perKey: k}
	}
	for range 2 {
		if d := mustAdmit(t, l, base).Decision; !d.Allowed {
			t.Fatalf("refused: %+v", d)
		}
	}
	if s := read("k1"); s.bucket > 10_000-800+1 || windowUsed(t, c, uk) != 600 || windowUsed(t, c, kk("k1")) != 2 {
		t.Fatalf("after two admissions: %+v", s)
	}
	cases := []struct {
		name string
		req  Request
		rule string
	}{
		{"the per-key rule refuses, the other two masters had debited", base, perKey.Name},
		{"the per-user rule refuses", func() Request { r := base; r.Key = "k2"; r.PromptTokens = 500; return r }(), perUser.Name},
		{"the upstream bucket refuses", func() Request {
			r := base
			r.Key = "k3"
			r.User = "bob"
			r.PromptTokens = 1
			r.CompletionTokens = 9_500
			return r
		}(), bucket.Name},
	}
	for _, tc := range cases {
		before := read(tc.req.Key)
		d := mustAdmit(t, l, tc.req).Decision
		if d.Allowed || d.Rule != tc.rule || d.Path != PathRedis {
			t.Fatalf("%s: %+v", tc.name, d)
		}
		after := read(tc.req.Key)
		// The bucket refills at 0.001 tokens a second meanwhile, and the
		// scripts store tokens to 6 decimals: the debit and the refund may
		// each round it down by up to 5e-7, more than the refill adds in
		// the milliseconds between the reads (about half the runs).
		if after.bucket < before.bucket-1e-5 || after.bucket > before.bucket+2 {
			t.Errorf("%s: the bucket on %s went from %.7f to %.7f tokens", tc.name, masterOf(t, c, bk), before.bucket, after.bucket)
		}
		if !maps.Equal(before.user, after.user) {
			t.Errorf("%s: the per-user window on %s went from %v to %v", tc.name, masterOf(t, c, uk), before.user, after.user)
		}
		if !maps.Equal(before.perKey, after.perKey) {
			t.Errorf("%s: the per-key window on %s went from %v to %v", tc.name, masterOf(t, c, kk(tc.req.Key)), before.perKey, after.perKey)
		}
	}
	if got := l.Stats().Pending; got != 0 {
		t.Fatalf("%d refunds are still pending: Redis did not take them", got)
	}
}

// TestClusterSettleExactlyOnceOnEveryMaster: a ticket whose rules are on
// three masters is settled by several holders at once and again later; each
// master applies the correction once.
func TestClusterSettleExactlyOnceOnEveryMaster(t *testing.T) {
	c := clusterClient(t)
	prefix := clusterPrefix(t, c)
	rs := onDistinctMasters(t, c, func(r Rule) string { return tenantKey(prefix, r, "acme", Scope{}) },
		window("tpm", TotalTokens, 1_000_000, time.Hour),
		Rule{Name: "completion-bucket", Unit: CompletionTokens, Algorithm: TokenBucket, Limit: 1_000_000, Rate: 0.001, Exact: true},
		window("prompt-window", PromptTokens, 1_000_000, time.Hour))
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: rs}}, WithPrefix(prefix))
	tpmKey, bucketKey, promptKey := tenantKey(prefix, rs[0], "acme", Scope{}), tenantKey(prefix, rs[1], "acme", Scope{}), tenantKey(prefix, rs[2], "acme", Scope{})
	ctx := context.Background()

	check := func(when string, tpm, completion, prompt int64) {
		t.Helper()
		if got := windowUsed(t, c, tpmKey); got != tpm {
			t.Errorf("%s: total tokens window = %d, want %d", when, got, tpm)
		}
		if got := bucketTokens(t, c, bucketKey, rs[1]); got < float64(1_000_000-completion) || got > float64(1_000_000-completion)+2 {
			t.Errorf("%s: completion bucket = %.3f, want about %d", when, got, 1_000_000-completion)
		}
		if got := windowUsed(t, c, promptKey); got != prompt {
			t.Errorf("%s: prompt window = %d, want %d", when, got, prompt)
		}
	}

	// A refund: estimated 100 + 400, used 60 + 40.
	tk := mustAdmit(t, l, Request{ID: itest.Unique(t, "refund"), Tenant: "acme", Model: "m", PromptTokens: 100, CompletionTokens: 400})
	if !tk.Allowed() {
		t.Fatalf("refused: %+v", tk.Decision)
	}
	check("after admission", 500, 400, 100)
	settleFromCopies(t, tk, Usage{PromptTokens: 60, CompletionTokens: 40})
	check("after the refund, settled by 8 holders at once", 100, 40, 60)
	if err := tk.Settle(ctx, Usage{PromptTokens: 60, CompletionTokens: 40}); err != nil {
		t.Fatal(err)
	}
	check("after settling once more", 100, 40, 60)

	// A charge: estimated 10 + 10, used 200 + 300.
	tk2 := mustAdmit(t, l, Request{ID: itest.Unique(t, "charge"), Tenant: "acme", Model: "m", PromptTokens: 10, CompletionTokens: 10})
	settleFromCopies(t, tk2, Usage{PromptTokens: 200, CompletionTokens: 300})
	check("after the charge, settled by 8 holders at once", 600, 340, 260)

	// The markers that make it exactly once: one per slot group, in the
	// group's own slot, so on each of the three masters.
	markerMasters := map[string]bool{}
	for _, k := range []string{tpmKey, bucketKey, promptKey} {
		n, err := c.Exists(ctx, k+":settled:"+tk.settleID()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			markerMasters[masterOf(t, c, k)] = true
		}
	}
	if len(markerMasters) != 3 {
		t.Fatalf("settle markers on %d masters, want 3 (one per slot group)", len(markerMasters))
	}
}

// settleFromCopies settles copies of tk from 8 goroutines at once, as
// retries by different holders of one request would.
func settleFromCopies(t *testing.T, tk Ticket, u Usage) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		cp := tk
		wg.Go(func() {
			if err := cp.Settle(context.Background(), u); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestClusterExactRuleNeverOverAdmits: 200 goroutines race for an exact
// requests rule on one master while every request also debits a tokens
// rule on another master. Every fourth request is larger than the tokens
// rule's limit, so that rule refuses it after the requests rule's master
// may have debited it; once the requests rule is full it refuses the rest,
// after the tokens rule's master debited them: refunds run both ways,
// concurrently with admissions. Nothing is admitted beyond the limit, and
// what Redis holds is exactly what was admitted.
func TestClusterExactRuleNeverOverAdmits(t *testing.T) {
	c := clusterClient(t)
	prefix := clusterPrefix(t, c)
	const rpm, small, huge = 300, 10, 2_000_000
	rs := onDistinctMasters(t, c, func(r Rule) string { return sharedKey(prefix, r, Scope{}) },
		window("exact-rpm", Requests, rpm, time.Hour),
		window("exact-tpm", TotalTokens, 1_000_000, time.Hour))
	// Exactness is the promise while Redis answers; a request that waits
	// out max_wait is decided by the fail mode (local shares) instead. 800
	// requests on a busy 2-core machine can wait seconds, so the wait is
	// long enough that only a Redis that is really down ends it.
	l := newTestLimiter(t, c, &Rules{Shared: rs}, WithPrefix(prefix), WithMaxWait(30*time.Second))
	rpmKey, tpmKey := sharedKey(prefix, rs[0], Scope{}), sharedKey(prefix, rs[1], Scope{})
	if masterOf(t, c, rpmKey) == masterOf(t, c, tpmKey) {
		t.Fatal("the two rules share a master")
	}

	var admitted, refusedRPM, refusedTPM atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for g := range 200 {
		wg.Go(func() {
			for i := range 4 {
				tokens := int64(small)
				if i == g%4 {
					tokens = huge
				}
				tk, err := l.Admit(context.Background(), Request{ID: fmt.Sprintf("g%d-%d", g, i), Tenant: "acme", Model: "m", PromptTokens: tokens})
				if err != nil {
					errs <- err
					return
				}
				switch {
				case tk.Allowed() && tokens == huge:
					errs <- fmt.Errorf("a request of %d tokens was admitted by a 1,000,000 tokens rule", tokens)
					return
				case tk.Allowed():
					admitted.Add(1)
				case tk.Decision.Rule == rs[0].Name:
					refusedRPM.Add(1)
				case tk.Decision.Rule == rs[1].Name:
					refusedTPM.Add(1)
				default:
					errs <- fmt.Errorf("refused by %q (%v)", tk.Decision.Rule, tk.Decision.Cause)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := admitted.Load()
	t.Logf("800 requests: %d admitted, %d refused by %s, %d by %s", n, refusedRPM.Load(), rs[0].Name, refusedTPM.Load(), rs[1].Name)
	if st := l.Stats(); st.FailOpen+st.FailClosed > 0 {
		t.Fatalf("%d decisions were made by the fail mode: Redis did not answer within max_wait", st.FailOpen+st.FailClosed)
	}
	if n > rpm {
		t.Fatalf("%d requests admitted by an exact rule of %d", n, rpm)
	}
	// A huge request meeting a full requests rule is refused by both; the
	// decision names the first rule, so the tokens rule is named for some.
	if refusedRPM.Load() == 0 || refusedTPM.Load() == 0 {
		t.Fatalf("refusals: %d by the requests rule, %d by the tokens rule, want both", refusedRPM.Load(), refusedTPM.Load())
	}
	if got := windowUsed(t, c, rpmKey); got != n {
		t.Errorf("the requests rule holds %d, want the %d admitted (refunds lost or doubled)", got, n)
	}
	if got := windowUsed(t, c, tpmKey); got != n*small {
		t.Errorf("the tokens rule holds %d, want %d for %d admitted", got, n*small, n)
	}
	if p := l.Stats().Pending; p != 0 {
		t.Errorf("%d refunds are still pending", p)
	}
	// A refund in flight may have refused a request that would have fit,
	// never the other way round; what is left now is exactly the rest, as
	// another gateway (without this one's memory of recent refusals) sees.
	other := newTestLimiter(t, c, &Rules{Shared: rs}, WithPrefix(prefix))
	var more int64
	for {
		if !mustAdmit(t, other, Request{Tenant: "acme", Model: "m", PromptTokens: small}).Decision.Allowed {
			break
		}
		more++
	}
	if n+more != rpm {
		t.Fatalf("%d admitted in the race and %d after it, want %d in all", n, more, rpm)
	}
}

// faultyClusterClient is clusterClient with a hook on every node's client,
// built by hook from the node's address.
func faultyClusterClient(t testing.TB, hook func(addr string) redis.Hook) *redis.ClusterClient {
	t.Helper()
	rc := itest.RedisCluster(t)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Seeds(), ContextTimeoutEnabled: true,
		DialTimeout: time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, PoolSize: 64})
	c.OnNewNode(func(n *redis.Client) {
		if h := hook(n.Options().Addr); h != nil {
			n.AddHook(h)
		}
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClusterFlushRetriesOnlyTheSlotsThatFailed: the local debits of a
// fail-open tenant whose rules live on three masters are sent back in one
// flush; on one master the call is applied but its reply lost, on another
// it never arrives, on the third it succeeds. The retry must apply the
// second master's debits and nothing else again.
func TestClusterFlushRetriesOnlyTheSlotsThatFailed(t *testing.T) {
	plain := clusterClient(t)
	prefix := clusterPrefix(t, plain)
	rs := onDistinctMasters(t, plain, func(r Rule) string { return tenantKey(prefix, r, "acme", Scope{}) },
		window("lost-reply", TotalTokens, 1_000_000, time.Hour),
		window("not-sent", TotalTokens, 1_000_000, time.Hour),
		window("fine", TotalTokens, 1_000_000, time.Hour))
	keys := make([]string, len(rs))
	faults := map[string]*scriptFaults{}
	admits := map[string]*scriptFaults{}
	for i, r := range rs {
		keys[i] = tenantKey(prefix, r, "acme", Scope{})
		m := masterOf(t, plain, keys[i])
		faults[m], admits[m] = newScriptFaults(AdjustScript), newScriptFaults(AdmitScript)
	}
	c := faultyClusterClient(t, func(addr string) redis.Hook {
		if faults[addr] == nil {
			return nil
		}
		return hooks{admits[addr], faults[addr]}
	})
	ticks := newTickWaiter()
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: rs}}, WithPrefix(prefix), WithMaxWait(time.Second),
		WithProbeInterval(5*time.Millisecond), withTickHook(ticks.hook))
	req := Request{Tenant: "acme", Model: "m", PromptTokens: 100}
	if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathRedis {
		t.Fatalf("before the faults: %+v", d)
	}

	// Every script fails without reaching Redis: the tenant is admitted
	// locally and its debits wait.
	for _, f := range faults {
		f.arm(refuse, -1)
	}
	for _, f := range admits {
		f.arm(refuse, -1)
	}
	for i := range 5 {
		if d := mustAdmit(t, l, req).Decision; !d.Allowed || d.Path != PathLocal {
			t.Fatalf("local admission %d: %+v", i, d)
		}
	}
	ticks.wait(t, 2)

	// Scripts run again, but the next flush meets one fault per master.
	for _, f := range admits {
		f.arm(passThrough, 0)
	}
	faults[masterOf(t, plain, keys[0])].arm(loseReply, 1)
	faults[masterOf(t, plain, keys[1])].arm(refuse, 1)
	faults[masterOf(t, plain, keys[2])].arm(passThrough, 0)
	itest.Eventually(t, 10*time.Second, "the local debits flushed", func() bool {
		s := l.Stats()
		return !s.Down && s.Pending == 0
	})
	for i, k := range keys {
		if got := windowUsed(t, plain, k); got != 600 {
			t.Errorf("%s (%s) holds %d, want 600: 100 through Redis and 500 admitted locally", rs[i].Name, masterOf(t, plain, k), got)
		}
	}
}

// hooks chains go-redis hooks.
type hooks []redis.Hook

func (h hooks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hooks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	for i := len(h) - 1; i >= 0; i-- {
		next = h[i].ProcessHook(next)
	}
	return next
}

func (h hooks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	for i := len(h) - 1; i >= 0; i-- {
		next = h[i].ProcessPipelineHook(next)
	}
	return next
}

// clockAhead is a hook that reports admit.lua's Redis time (now_ms) as
// ahead by ms: a master whose clock is ahead of the others'.
type clockAhead struct {
	sha string
	ms  int64
}

func (h clockAhead) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h clockAhead) shift(cmd redis.Cmder) {
	c, ok := cmd.(*redis.Cmd)
	if !ok || c.Err() != nil || len(c.Args()) < 2 || (c.Args()[1] != h.sha && c.Args()[1] != AdmitScript) {
		return
	}
	if v, ok := c.Val().([]any); ok && len(v) > 1 {
		if now, ok := v[1].(int64); ok {
			v[1] = now + h.ms
		}
	}
}

func (h clockAhead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.shift(cmd)
		return err
	}
}

func (h clockAhead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			h.shift(c)
		}
		return err
	}
}

// TestClusterSettleRefundsEachGroupAtItsOwnTime: a request's rules live on
// two masters, and the first one's clock is an hour ahead of the second's
// (each script reads its own server's TIME). The refund of each rule's
// window must go to the granule that rule was debited in, by its own
// master's clock; the first master's time is nothing to the second's
// window.
func TestClusterSettleRefundsEachGroupAtItsOwnTime(t *testing.T) {
	plain := clusterClient(t)
	prefix := clusterPrefix(t, plain)
	rs := onDistinctMasters(t, plain, func(r Rule) string { return tenantKey(prefix, r, "acme", Scope{}) },
		window("ahead", TotalTokens, 1_000_000, 10*time.Minute),
		window("behind", TotalTokens, 1_000_000, 10*time.Minute))
	ahead, behind := tenantKey(prefix, rs[0], "acme", Scope{}), tenantKey(prefix, rs[1], "acme", Scope{})
	aheadMaster := masterOf(t, plain, ahead)
	c := faultyClusterClient(t, func(addr string) redis.Hook {
		if addr == aheadMaster {
			return clockAhead{sha: redis.NewScript(AdmitScript).Hash(), ms: time.Hour.Milliseconds()}
		}
		return nil
	})
	l := newTestLimiter(t, c, &Rules{Default: TenantRules{Rules: rs}}, WithPrefix(prefix))
	tk := mustAdmit(t, l, Request{ID: "r1", Tenant: "acme", Model: "m", PromptTokens: 400})
	if !tk.Allowed() || tk.Decision.Path != PathRedis {
		t.Fatalf("refused: %+v", tk.Decision)
	}
	if err := tk.Settle(context.Background(), Usage{PromptTokens: 100}); err != nil {
		t.Fatal(err)
	}
	// The first master's refund went by the time it reported (the hook's
	// lie stands for its clock, not for where it stored the debit): only
	// the second master's window tells.
	if got := windowUsed(t, plain, behind); got != 100 {
		t.Fatalf("the window on the second master holds %d after a refund of 300 of 400, want 100", got)
	}
}
