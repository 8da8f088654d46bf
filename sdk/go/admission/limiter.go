package admission

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter decides admissions. It is safe for concurrent use; make one per
// gateway process and Close it on shutdown.
type Limiter struct {
	client  redis.UniversalClient
	cluster bool
	o       options
	m       *metrics
	base    time.Time
	gen     atomic.Pointer[generation]
	// rulesMu serialises rule changes (SetRules, expiries); rules is the
	// last set, expired rules and all, which an expiry filters again.
	rulesMu sync.Mutex
	rules   *Rules

	// coarse is l.now() as of the last background tick or Redis-path
	// admission, for the lease path.
	coarse   atomic.Int64
	down     atomic.Bool
	downErr  atomic.Pointer[error]
	pend     pending
	leasedMu sync.Mutex
	leased   map[*instance]struct{}

	renewQ    chan *instance
	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	renewDone chan struct{}
	closed    atomic.Bool
	closeOne  sync.Once

	// nonce and seq make the ids of marker keys (newID): random per
	// Limiter, so that no two gateways' ids meet.
	nonce string
	seq   atomic.Uint64

	// Failed settlements so far, as of the last log, and when it was.
	settleFails, settleLogged, settleLogAt atomic.Int64

	// wq holds the requests Acquire keeps waiting.
	wq waitQueue
}

// ErrBacklogFull is returned by Settle when Redis is unreachable and the
// queue of corrections waiting for it is full (WithMaxPending): the
// ticket's Redis corrections are not applied (the Limiter counts and logs
// that), and calling Settle again applies them once.
var ErrBacklogFull = errors.New("admission: Redis is unreachable and the pending corrections are full")

// New returns a Limiter enforcing rules through client, which may be a
// *redis.Client (standalone, Sentinel) or a *redis.ClusterClient. The client
// must have ContextTimeoutEnabled set: that is what bounds each call by
// WithMaxWait.
func New(client redis.UniversalClient, rules *Rules, opts ...Option) (*Limiter, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	l := &Limiter{client: client, o: o, base: time.Now(), leased: map[*instance]struct{}{},
		renewQ: make(chan *instance, renewQueue), kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		renewDone: make(chan struct{}), nonce: randomNonce()}
	switch c := client.(type) {
	case *redis.Client:
		if !c.Options().ContextTimeoutEnabled {
			return nil, errors.New("admission: the Redis client must set Options.ContextTimeoutEnabled, or a slow Redis blocks Admit past WithMaxWait")
		}
	case *redis.ClusterClient:
		l.cluster = true
		if !c.Options().ContextTimeoutEnabled {
			return nil, errors.New("admission: the Redis client must set ClusterOptions.ContextTimeoutEnabled, or a slow Redis blocks Admit past WithMaxWait")
		}
	case *redis.Ring:
		return nil, errors.New("admission: a redis.Ring cannot run one script over several keys; use a standalone or a Cluster client")
	}
	m, err := newMetrics(o.reg)
	if err != nil {
		return nil, err
	}
	l.m = m
	l.wq.keys = map[string]*waitKey{}
	l.pend.init(o.maxPending)
	l.coarse.Store(l.now())
	if err := l.SetRules(rules); err != nil {
		return nil, err
	}
	go l.run()
	go l.renewer()
	return l, nil
}

// randomNonce returns 96 random bits in hex.
func randomNonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (o *options) validate() error {
	var errs []error
	if o.maxWait <= 0 {
		errs = append(errs, fmt.Errorf("admission: max wait %s must be positive", o.maxWait))
	}
	if o.gateways < 1 {
		errs = append(errs, fmt.Errorf("admission: gateway count %d must be at least 1", o.gateways))
	}
	if !(o.leaseFraction >= 0 && o.leaseFraction <= 0.5) {
		errs = append(errs, fmt.Errorf("admission: lease fraction %v is outside 0..0.5", o.leaseFraction))
	}
	if o.leaseHorizon <= 0 || o.leaseTTL <= 0 || o.probe <= 0 || o.idle <= 0 || o.settleTTL < time.Second || o.refusalCache < 0 {
		errs = append(errs, errors.New("admission: lease horizon, lease TTL, probe interval and idle TTL must be positive, settle TTL at least 1s, refusal cache not negative"))
	}
	if o.maxInstances < 1 || o.maxPending < 1 {
		errs = append(errs, errors.New("admission: max instances and max pending must be at least 1"))
	}
	if o.maxWaiters < 0 {
		errs = append(errs, fmt.Errorf("admission: max waiters %d must not be negative", o.maxWaiters))
	}
	if o.prefix == "" || strings.ContainsAny(o.prefix, "{}") {
		errs = append(errs, fmt.Errorf("admission: prefix %q must be non-empty and hold no braces (they would change the hash tag)", o.prefix))
	}
	return errors.Join(errs...)
}

// SetRules replaces the rules, for a policy reload. Leases and local debits
// of the previous rules go back to Redis; counters in Redis carry over for
// rules whose name, scope, algorithm and unit did not change.
//
// Rules that have expired (Rule.Expires) by the Limiter's clock are left
// out; the first Admit at or after the next expiry sets the rules again
// without the rule that expired.
func (l *Limiter) SetRules(rules *Rules) error {
	if rules == nil {
		rules = &Rules{}
	}
	if err := rules.Validate(); err != nil {
		return err
	}
	l.rulesMu.Lock()
	defer l.rulesMu.Unlock()
	l.rules = rules
	l.install(rules)
	return nil
}

// expire sets the rules again once g, the current generation, holds a
// rule that has expired.
func (l *Limiter) expire(g *generation) {
	l.rulesMu.Lock()
	defer l.rulesMu.Unlock()
	if l.gen.Load() == g {
		l.install(l.rules)
	}
}

// install makes a generation of the rules of rules active now and swaps
// it in; rulesMu is held.
func (l *Limiter) install(all *Rules) {
	rules, next := all.activeAt(l.o.clock())
	g := &generation{seed: maphash.MakeSeed(), insts: map[string]*instance{}, tenants: map[string]*tenantRules{}, expires: next}
	for i := range g.sets {
		g.sets[i].m = map[uint64]*matchSet{}
	}
	for _, r := range rules.Shared {
		g.shared = append(g.shared, compileRule(r, true, l.o.leaseFraction, l.m))
	}
	compileTenant := func(tr TenantRules) *tenantRules {
		out := &tenantRules{failMode: tr.FailMode}
		if out.failMode == "" {
			out.failMode = FailOpen
		}
		for _, r := range tr.Rules {
			r.Scope.Tenant = ""
			out.rules = append(out.rules, compileRule(r, false, l.o.leaseFraction, l.m))
		}
		return out
	}
	for id, tr := range rules.Tenants {
		g.tenants[id] = compileTenant(tr)
	}
	g.def = compileTenant(rules.Default)
	mark := func(list []*rule) {
		for _, r := range list {
			for i, d := range r.Scope.dims() {
				if *d.v != "" {
					g.used |= 1 << uint(i)
				}
			}
		}
	}
	mark(g.shared)
	for _, tr := range g.tenants {
		mark(tr.rules)
	}
	mark(g.def.rules)
	if old := l.gen.Swap(g); old != nil {
		l.retireAll(old)
	}
}

// generation is the state built from one set of rules.
type generation struct {
	shared  []*rule
	tenants map[string]*tenantRules
	def     *tenantRules
	seed    maphash.Seed
	// used has a bit per dimension some rule looks at (dims order); the
	// others are left out of request shapes.
	used uint8
	// expires is the earliest Rule.Expires among the rules (zero if none
	// expires): from then on a new generation leaves that rule out.
	expires time.Time

	sets  [setShards]setShard
	nsets atomic.Int64
	// recent remembers the match set last looked up in each of its slots
	// (by shape hash), so that a lease hit finds its set with atomic loads
	// alone: the shard's read lock costs two atomic additions, a third of
	// a lease hit. A set found there is checked like one found in the
	// shard (same hash, same shape) and must not be gone.
	recent [recentSlots]atomic.Pointer[matchSet]

	imu   sync.Mutex
	insts map[string]*instance
}

type tenantRules struct {
	rules    []*rule
	failMode FailMode
}

const setShards = 64

// recentSlots is the size of generation.recent: shapes beyond it that
// collide take the shard's read lock.
const recentSlots = 4096

// setShard maps a shape's hash to its match sets (chained on the rare
// collision): one string hash per lookup, not the six a struct key costs.
type setShard struct {
	mu sync.RWMutex
	m  map[uint64]*matchSet
}

// reqKey is a request's shape: everything that decides which rule
// instances count it.
type reqKey struct{ tenant, model, user, key, endpoint, upstream, session, organization string }

// matchSet is the rule instances that count requests of one shape, shared
// rules first, in rule order.
type matchSet struct {
	key      reqKey
	hash     uint64
	next     *matchSet   // same hash
	gone     atomic.Bool // removed from its shard (unref): recent must not hand it out
	insts    []*instance
	failMode FailMode
	lastUsed atomic.Int64
}

// The bits of generation.used, in the order of Scope.dims.
const (
	dimUpstream = 1 << iota
	dimTenant
	dimModel
	dimUser
	dimKey
	dimEndpoint
	dimSession
	dimOrganization
)

// shape sets k to req's shape: the tenant (whose rules apply) and the
// dimensions some rule looks at. It fills k in place: returned by value,
// the key was stored 8 bytes at a time and copied 16 at a time, a stalled
// store forward that cost a tenth of a lease hit.
func (g *generation) shape(req *Request, k *reqKey) {
	*k = reqKey{tenant: req.Tenant}
	if g.used&dimUpstream != 0 {
		k.upstream = req.upstream()
	}
	if g.used&dimModel != 0 {
		k.model = req.Model
	}
	if g.used&dimUser != 0 {
		k.user = req.User
	}
	if g.used&dimKey != 0 {
		k.key = req.Key
	}
	if g.used&dimEndpoint != 0 {
		k.endpoint = req.Endpoint
	}
	if g.used&dimSession != 0 {
		k.session = req.Session
	}
	if g.used&dimOrganization != 0 {
		k.organization = req.Organization
	}
}

// hash hashes the fields of a shape that rules look at.
func (g *generation) hash(k *reqKey) uint64 {
	h := maphash.String(g.seed, k.tenant)
	if g.used&^dimTenant != 0 {
		for _, f := range [...]string{k.upstream, k.model, k.user, k.key, k.endpoint, k.session, k.organization} {
			h = h*0x9E3779B97F4A7C15 ^ maphash.String(g.seed, f)
		}
	}
	return h
}

func (l *Limiter) lookup(g *generation, req *Request, now int64) (*matchSet, error) {
	var k reqKey
	g.shape(req, &k)
	h := g.hash(&k)
	slot := &g.recent[(h>>32)&(recentSlots-1)]
	s := slot.Load()
	if s == nil || s.hash != h || s.key != k || s.gone.Load() {
		sh := &g.sets[h&(setShards-1)]
		sh.mu.RLock()
		s = sh.m[h]
		for s != nil && s.key != k {
			s = s.next
		}
		sh.mu.RUnlock()
		if s == nil {
			return l.build(g, req, k, h, sh, now)
		}
		slot.Store(s)
	}
	if now-s.lastUsed.Load() > touchEvery {
		s.lastUsed.Store(now)
	}
	return s, nil
}

// build makes the match set of a request shape seen for the first time.
func (l *Limiter) build(g *generation, req *Request, k reqKey, h uint64, sh *setShard, now int64) (*matchSet, error) {
	tr := g.tenants[req.Tenant]
	if tr == nil {
		tr = g.def
	}
	var rules []*rule
	for _, r := range g.shared {
		if r.appliesTo(req) {
			rules = append(rules, r)
		}
	}
	for _, r := range tr.rules {
		if r.appliesTo(req) {
			rules = append(rules, r)
		}
	}
	if len(rules) > MaxRulesPerRequest {
		return nil, fmt.Errorf("admission: %d rules apply to this request, at most %d may", len(rules), MaxRulesPerRequest)
	}
	s := &matchSet{failMode: tr.failMode, hash: h}
	s.lastUsed.Store(now)
	cache := g.nsets.Load() < int64(l.o.maxInstances)
	for _, r := range rules {
		scope := r.instanceScope(req, req.Tenant)
		s.insts = append(s.insts, l.instance(g, r, scope, cache, now))
	}
	if !cache {
		return s, nil
	}
	s.key = reqKey{strings.Clone(k.tenant), strings.Clone(k.model), strings.Clone(k.user), strings.Clone(k.key), strings.Clone(k.endpoint), strings.Clone(k.upstream),
		strings.Clone(k.session), strings.Clone(k.organization)}
	sh.mu.Lock()
	for old := sh.m[h]; old != nil; old = old.next {
		if old.key == k {
			sh.mu.Unlock()
			l.unref(g, s)
			return old, nil
		}
	}
	s.next = sh.m[h]
	sh.m[h] = s
	sh.mu.Unlock()
	g.nsets.Add(1)
	return s, nil
}

// instance returns the live instance of r for scope, creating it; ref
// counts the match set that will hold it. When the table is full the
// instance is transient: it holds no lease and no local state.
func (l *Limiter) instance(g *generation, r *rule, scope Scope, ref bool, now int64) *instance {
	key := instanceKey(l.o.prefix, r, scope)
	g.imu.Lock()
	defer g.imu.Unlock()
	if in := g.insts[key]; in != nil {
		if ref {
			in.refs++
		}
		return in
	}
	in := newInstance(r, key, cloneScope(scope), now)
	if len(g.insts) >= l.o.maxInstances {
		in.transient, in.dead = true, true
		return in
	}
	if ref {
		in.refs++
	}
	g.insts[key] = in
	return in
}

func (l *Limiter) unref(g *generation, s *matchSet) {
	s.gone.Store(true)
	g.imu.Lock()
	for _, in := range s.insts {
		in.refs--
	}
	g.imu.Unlock()
}

func cloneScope(s Scope) Scope {
	return Scope{strings.Clone(s.Upstream), strings.Clone(s.Tenant), strings.Clone(s.Model), strings.Clone(s.User), strings.Clone(s.Key), strings.Clone(s.Endpoint),
		strings.Clone(s.Session), strings.Clone(s.Organization)}
}

// instanceKey is the Redis key of one rule instance; see Layout.
func instanceKey(prefix string, r *rule, s Scope) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteByte('{')
	if r.shared {
		b.WriteString("s:")
	} else {
		b.WriteString("t:")
		escape(&b, s.Tenant)
		b.WriteByte(':')
	}
	escape(&b, r.Name)
	for i, d := range r.Scope.dims() {
		if *d.v == "" || (!r.shared && i == 1) {
			continue
		}
		b.WriteByte('|')
		b.WriteString(d.name)
		b.WriteByte('=')
		escape(&b, *s.dims()[i].v)
	}
	b.WriteString("}:")
	b.WriteString(r.Algorithm.String())
	b.WriteByte(':')
	b.WriteString(r.Unit.String())
	return b.String()
}

// escape writes v with the characters that structure a key (% | = : { })
// percent-encoded, so that no two scopes share a key and the hash tag ends
// where the layout says.
func escape(b *strings.Builder, v string) {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch c {
		case '%', '|', '=', ':', '{', '}':
			fmt.Fprintf(b, "%%%02X", c)
		default:
			b.WriteByte(c)
		}
	}
}

// now is the Limiter's monotonic clock in ns; it starts at 1 so that 0
// means "never".
func (l *Limiter) now() int64 { return int64(time.Since(l.base)) + 1 }

// Admit decides whether req may be sent upstream. It checks every rule that
// applies in one Redis round trip (or from local leases with none), all or
// nothing, and never waits for Redis longer than WithMaxWait. The error is
// for a request it cannot judge (negative estimates, too many rules); a
// refusal is a Decision with Allowed false. Settle the ticket of an allowed
// request once the call is over.
func (l *Limiter) Admit(ctx context.Context, req Request) (t Ticket, err error) {
	// A clock read costs as much as the rest of a lease hit, which needs
	// time only coarsely (lease expiry, idleness, header resets): it reads
	// the clock the background loop and the Redis path keep, and the
	// clock itself one admission in 64, to sample its latency.
	start := l.coarse.Load()
	sampled := l.m.c.leaseHits.Load()&63 == 0
	if sampled {
		start = l.now()
	}
	if req.PromptTokens < 0 || req.CompletionTokens < 0 || req.Cost < 0 {
		return t, fmt.Errorf("admission: estimated tokens and cost must not be negative (prompt %d, completion %d, cost %d)", req.PromptTokens, req.CompletionTokens, req.Cost)
	}
	g := l.gen.Load()
	if !g.expires.IsZero() && !l.o.clock().Before(g.expires) {
		l.expire(g)
		g = l.gen.Load()
	}
	set, err := l.lookup(g, &req, start)
	if err != nil {
		return t, err
	}
	t.l, t.set, t.id, t.est = l, set, req.ID, req.estimate()
	n := len(set.insts)
	if n == 0 {
		t.Decision.Allowed = true
		l.m.c.allowed.Add(1)
		if sampled {
			l.m.durOther.Observe(float64(l.now()-start) / 1e9)
		}
		return t, nil
	}
	all := uint64(1)<<uint(n) - 1
	var leased uint64
	for i, in := range set.insts {
		if in.r.maxLease == 0 {
			continue
		}
		ok, left := in.tryLease(need(in.r.Unit, req.estimate()), start)
		if !ok {
			continue
		}
		leased |= 1 << uint(i)
		if ms := in.leaseAtMs.Load(); t.leaseMs == 0 || ms < t.leaseMs {
			t.leaseMs = ms
		}
		if left < in.lowWater.Load() && !in.renewing.Load() { // a load, not renewSoon's failing CAS, while one is asked for
			l.renewSoon(in)
		}
	}
	t.leased = leased
	if leased == all {
		t.Decision.Allowed, t.Decision.Path = true, PathLease
		l.allowed(&t, start, true)
		l.m.c.leaseHits.Add(1)
		if sampled {
			l.m.durLease.Observe(float64(l.now()-start) / 1e9)
		}
		return t, nil
	}
	now := l.now()
	l.coarse.Store(now)
	l.admitSlow(ctx, &t, &req, leased, now)
	if t.Decision.Path == PathRedis {
		l.m.durRedis.Observe(float64(l.now()-now) / 1e9)
	} else {
		l.m.durOther.Observe(float64(l.now()-now) / 1e9)
	}
	return t, nil
}

// allowed completes an allowed decision: rate samples, headroom, metrics.
// A lease hit's units need no sample: the lease's own accounting has them.
func (l *Limiter) allowed(t *Ticket, now int64, leaseHit bool) {
	var rq, tk Headroom
	for _, in := range t.set.insts {
		if !leaseHit {
			in.units.Add(need(in.r.Unit, t.est))
		}
		in.touch(now)
		in.r.m.allowed.Inc()
		h := in.headroom(now)
		if in.r.Unit == Requests {
			tighter(&rq, h)
		} else {
			tighter(&tk, h)
		}
	}
	t.Decision.Requests, t.Decision.Tokens = rq, tk
	if !leaseHit {
		l.m.c.allowed.Add(1)
	}
}

// tighter replaces cur with h when h has the smaller share of its limit left.
func tighter(cur *Headroom, h Headroom) {
	if cur.Limit == 0 || float64(h.Remaining)*float64(cur.Limit) < float64(cur.Remaining)*float64(h.Limit) {
		*cur = h
	}
}

func (l *Limiter) admitSlow(ctx context.Context, t *Ticket, req *Request, leased uint64, now int64) {
	set := t.set
	// A fresh Redis refusal of an instance refuses without a round trip.
	if l.o.refusalCache > 0 {
		for i, in := range set.insts {
			if leased&(1<<uint(i)) != 0 {
				continue
			}
			nd := need(in.r.Unit, req.estimate())
			if until := in.blockUntil.Load(); until > now && nd >= in.blockNeed.Load() && in.r.floor(req.Priority) >= in.blockFloor.Load() {
				l.undoLeases(t, leased)
				l.refuse(t, PathCached, in, nd, in.blockAvail.Load(), time.Duration(max(in.blockRetryAt.Load()-now, until-now)), in.blockNever.Load())
				return
			}
		}
	}
	if l.down.Load() {
		l.failMode(t, req, leased, now, l.cause())
		return
	}
	res, err := l.admitRedis(ctx, t, req, leased, now)
	if err != nil {
		if ctx.Err() == nil { // not the caller giving up
			l.markDown(err)
		}
		l.failMode(t, req, leased, now, err)
		return
	}
	if res.refused >= 0 {
		l.undoLeases(t, leased)
		in := set.insts[res.refused]
		nd := need(in.r.Unit, req.estimate())
		retry := time.Duration(res.retryMs) * time.Millisecond
		never := res.retryMs < 0
		if l.o.refusalCache > 0 {
			block := l.o.refusalCache
			if !never && retry < block {
				block = retry
			}
			in.blockNeed.Store(nd)
			in.blockFloor.Store(in.r.floor(req.Priority))
			in.blockNever.Store(never)
			in.blockAvail.Store(res.avail)
			in.blockRetryAt.Store(now + int64(retry))
			in.blockUntil.Store(now + int64(block))
		}
		l.refuse(t, PathRedis, in, nd, res.avail, retry, never)
		return
	}
	t.leased = leased
	t.atMs, t.atMsBy, t.periods = res.nowMs, res.byInst, res.periods
	t.seq = l.seq.Add(1)
	t.Decision.Allowed, t.Decision.Path = true, PathRedis
	l.allowed(t, now, false)
}

// undoLeases gives back the lease units a refused request took.
func (l *Limiter) undoLeases(t *Ticket, leased uint64) {
	for i, in := range t.set.insts {
		if leased&(1<<uint(i)) != 0 {
			in.giveBack(l, need(in.r.Unit, t.est))
		}
	}
}

func (l *Limiter) refuse(t *Ticket, path Path, in *instance, nd, avail int64, retry time.Duration, never bool) {
	r := in.r
	t.refusedBy = in
	t.Decision = Decision{Path: path, Rule: r.Name, Scope: in.scope, Unit: r.Unit, Algorithm: r.Algorithm,
		Limit: r.Limit, Window: r.Window, Rate: r.Rate, Requested: nd, Available: avail, RetryAfter: retry, Never: never}
	h := Headroom{Limit: r.Limit, Remaining: avail, Reset: retry}
	if r.Unit == Requests {
		t.Decision.Requests = h
	} else {
		t.Decision.Tokens = h
	}
	r.m.refused.Inc()
	l.m.c.refused.Add(1)
}

// failMode decides while Redis is unreachable.
func (l *Limiter) failMode(t *Ticket, req *Request, leased uint64, now int64, cause error) {
	set := t.set
	if set.failMode == FailClosed {
		l.undoLeases(t, leased)
		t.Decision = Decision{Path: PathUnavailable, Cause: cause}
		l.m.failMode.WithLabelValues("closed", "refused").Inc()
		l.m.c.unavailable.Add(1)
		return
	}
	var local uint64
	for i, in := range set.insts {
		if leased&(1<<uint(i)) != 0 {
			continue
		}
		nd := need(in.r.Unit, req.estimate())
		ok, avail, retry := in.localTake(l, nd, now)
		if ok {
			local |= 1 << uint(i)
			continue
		}
		for j, other := range set.insts {
			if local&(1<<uint(j)) != 0 {
				other.localUndo(l, need(other.r.Unit, req.estimate()), now)
			}
		}
		l.undoLeases(t, leased)
		l.refuse(t, PathLocal, in, nd, avail, retry, false)
		t.Decision.Cause = cause
		l.m.failMode.WithLabelValues("open", "refused").Inc()
		l.m.c.failOpen.Add(1)
		return
	}
	t.leased, t.local = leased, local
	t.Decision.Allowed, t.Decision.Path, t.Decision.Cause = true, PathLocal, cause
	l.allowed(t, now, false)
	l.m.failMode.WithLabelValues("open", "allowed").Inc()
	l.m.c.failOpen.Add(1)
}

func (l *Limiter) cause() error {
	if p := l.downErr.Load(); p != nil {
		return *p
	}
	return errors.New("redis unreachable")
}

// markDown switches to the fail modes until a probe finds Redis again.
func (l *Limiter) markDown(err error) {
	l.m.redisErrors.Inc()
	err = fmt.Errorf("admission: redis: %w", err)
	l.downErr.Store(&err)
	if l.down.CompareAndSwap(false, true) {
		l.o.log.Warn("admission: Redis unreachable; tenants' fail modes apply", "err", err)
		l.wake()
	}
}

func (l *Limiter) wake() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// Stats are a Limiter's counts since it was made.
type Stats struct {
	// Admissions counts Admit calls that reached a decision; LeaseHits
	// those decided from leases alone; Refused those refused by a rule.
	Admissions, LeaseHits, Refused int64
	// RedisRoundTrips counts every Redis call, background ones included.
	RedisRoundTrips int64
	// FailOpen and FailClosed count decisions made while Redis was
	// unreachable.
	FailOpen, FailClosed int64
	// Pending is the number of corrections waiting for Redis.
	Pending int
	// Down is set while Redis is considered unreachable.
	Down bool
}

// Stats returns the counts so far.
func (l *Limiter) Stats() Stats {
	c := &l.m.c
	return Stats{
		Admissions: c.leaseHits.Load() + c.allowed.Load() + c.refused.Load() + c.unavailable.Load(),
		LeaseHits:  c.leaseHits.Load(), Refused: c.refused.Load(), RedisRoundTrips: c.roundTrips.Load(),
		FailOpen: c.failOpen.Load(), FailClosed: c.unavailable.Load(),
		Pending: l.pend.len(), Down: l.down.Load(),
	}
}

// Close returns every lease and flushes pending corrections (waiting at
// most a few seconds for Redis), then stops the background work. Admit
// keeps working after Close, without leases, but what it would have to
// send to Redis later (settlements while Redis is away, local debits) is
// no longer sent.
func (l *Limiter) Close() error {
	l.closeOne.Do(func() {
		l.closed.Store(true)
		close(l.stop)
		l.refuseWaiters()
	})
	<-l.done
	if n := l.pend.len(); n > 0 {
		return fmt.Errorf("admission: closed with %d corrections Redis did not take", n)
	}
	return nil
}
