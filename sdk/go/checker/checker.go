// Package checker is the gateway side of Sluice enforcement: it keeps every
// enforcement flag in memory, follows the enforcer's pub/sub announcements,
// resyncs from Redis on start, on reconnect and periodically, and answers
// "may this tenant call this model now?" with a lock-free hash-table lookup
// that makes no network call and allocates nothing.
//
// When the Checker's view is older than Config.MaxStaleness (Redis gone,
// enforcer dead), each tenant falls back to its fail mode: "open" keeps
// serving (honouring the flags still known), "closed" refuses. While the
// view is stale, manual breakers and blacklists stay in force past their
// Until, and are kept when a resync during staleness finds their hash
// expired (Redis reachable, enforcer dead): a gateway cut off from the
// enforcer must not let a leaked key through a minute into the outage. The
// first resync on a fresh view drops them if Redis no longer holds them.
// Breakers tied to traffic (quota, rate, error ratio, slow call) lapse at
// their Until, and while the view is stale also flag_ttl after the
// enforcer's last sign of life, so that a dead enforcer blocks no one
// longer than flag_ttl: the enforcer writes each flag's own end as its
// Until (a quota's period end, hours ahead) and never rewrites an
// unchanged flag, so Until alone would not end them (docs/flags.md,
// "Heartbeat and staleness"). flag_ttl is what the enforcer wrote under
// the layout's TTLKey, read at every resync; flags.DefaultFlagTTL before.
//
// Before the first full resync the Checker knows no flag and no tenant's
// fail mode. It then answers as a fresh view with no flags (every request
// allowed) for MaxStaleness after New, and after that as a stale view in
// which every tenant has Config.DefaultFailMode: a gateway that starts while
// Redis is down serves (default open) or refuses (default closed) everyone
// alike, until the first resync tells it the truth. Synced reports when it
// has.
package checker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/flags"
)

// FailMode is what a tenant's requests get while the Checker's view is stale.
type FailMode string

// The fail modes.
const (
	FailOpen   FailMode = "open"
	FailClosed FailMode = "closed"
)

// Config tunes a Checker.
type Config struct {
	// MaxStaleness is how old the view may grow (no enforcer heartbeat, no
	// Redis) before each tenant's fail mode applies.
	MaxStaleness time.Duration `yaml:"max_staleness" help:"view age after which each tenant's fail mode applies"`
	// ResyncInterval is how often the whole flag set is reread, to repair
	// anything a lost pub/sub message left behind. A Checker waits longer
	// when resyncs are slow: at least 20 times as long as the last one took,
	// so that with a million flagged tenants it does not spend a third of a
	// core on them.
	ResyncInterval time.Duration `yaml:"resync_interval" help:"period of full resyncs from Redis"`
	// DefaultFailMode applies to tenants the enforcer published no fail mode
	// for, and to every tenant before the first resync, when no fail mode
	// is known yet.
	DefaultFailMode FailMode `yaml:"default_fail_mode" help:"open or closed, for tenants without a published fail mode and for every tenant before the first resync from Redis"`
	// MaxPending bounds the set of tenants waiting to be refetched; beyond
	// it the Checker drops the set and resyncs everything instead.
	MaxPending int `yaml:"max_pending" help:"tenants queued for refetch before a full resync is cheaper"`
	// KeyPrefix is the flags layout's prefix; it must match the enforcer's.
	// It is not a YAML setting: a Sluice service derives it from its
	// redis.key_prefix, the one prefix the whole deployment agrees on.
	KeyPrefix string `yaml:"-"`
}

// DefaultConfig returns the defaults: stale after 10 s, resync every 30 s,
// fail open.
func DefaultConfig() Config {
	return Config{MaxStaleness: 10 * time.Second, ResyncInterval: 30 * time.Second, DefaultFailMode: FailOpen, MaxPending: 10000, KeyPrefix: flags.DefaultPrefix}
}

// Validate names the field and the limit of each problem.
func (c Config) Validate() error {
	var errs []error
	if c.MaxStaleness < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("max_staleness: %v is below the minimum 100ms", c.MaxStaleness))
	}
	if c.ResyncInterval < time.Second {
		errs = append(errs, fmt.Errorf("resync_interval: %v is below the minimum 1s", c.ResyncInterval))
	}
	if c.DefaultFailMode != FailOpen && c.DefaultFailMode != FailClosed {
		errs = append(errs, fmt.Errorf("default_fail_mode: %q must be open or closed", c.DefaultFailMode))
	}
	if c.MaxPending < 1 || c.MaxPending > 1_000_000 {
		errs = append(errs, fmt.Errorf("max_pending: %d is outside 1..1000000", c.MaxPending))
	}
	if c.KeyPrefix == "" || len(c.KeyPrefix) > 200 {
		errs = append(errs, fmt.Errorf("key_prefix: %q must be 1..200 bytes", c.KeyPrefix))
	}
	return errors.Join(errs...)
}

// Outcome says why a request was allowed or refused.
type Outcome uint8

// The outcomes of a Check.
const (
	// Allowed: no flag applies.
	Allowed Outcome = iota
	// Probe: a half-open breaker let this request through as a probe.
	Probe
	// Refused: a flag applies; Decision.Flag says which.
	Refused
	// RefusedStale: the view is stale and the tenant fails closed.
	RefusedStale
)

// Decision is the answer to one Check. Flag, when set, names what was hit:
// the limit, its period, used and limit, and when it resets.
type Decision struct {
	Outcome Outcome
	// Flag is the flag that refused (or let a probe through); nil otherwise.
	Flag *flags.Flag
	// Scope is the field the flag sits on: a model, "*" or "@key:<id>".
	Scope string
	// Stale reports that the view was older than MaxStaleness.
	Stale bool
}

// Allowed reports whether the request may proceed.
func (d Decision) Allowed() bool { return d.Outcome == Allowed || d.Outcome == Probe }

// RetryAfter is how long a refused client should wait: until the quota's
// period resets, else until the flag ends, else the flag's hint.
func (d Decision) RetryAfter(now time.Time) time.Duration {
	f := d.Flag
	if f == nil {
		return 0
	}
	var at time.Time
	switch {
	case !f.ResetsAt.IsZero():
		at = f.ResetsAt
	case f.RetryAfter > 0:
		return f.RetryAfter
	case !f.Until.IsZero():
		at = f.Until
	}
	if w := at.Sub(now); w > 0 {
		return w
	}
	return 0
}

// entry is a flag plus the probes a half-open breaker has left here.
type entry struct {
	flag     *flags.Flag
	untilNS  int64 // flag.Until in unix ns; 0 = none
	halfOpen bool  // flag.State == StateHalfOpen, kept here to spare a memory access
	// sticky marks an operator's decision (manual breaker, blacklist): it
	// stays in force past untilNS while the view is stale.
	sticky bool
	// soft marks a flag that refuses nothing (flags.StateSoft): Check
	// passes over it, Over reports it.
	soft  bool
	scope string
	// probes is what a half-open breaker has left here; nil otherwise. A
	// pointer, so that the view rebuilt by the next resync or refetch
	// shares the counter with the one it replaces (see inheritProbes)
	// instead of granting a fresh set of probes every resync.
	probes *atomic.Int64
}

// maxScopes is how many scopes one request can match: its API key, its
// model and "*".
const maxScopes = 3

// tenantView is one tenant's flags; immutable once published, except for
// the probe counters. Model flags sit in a short slice scanned linearly: a
// tenant has few, and a slice costs one memory access where a map costs
// several, which matters when 100,000 tenants do not fit in the CPU caches.
// For the usual one or two model flags the slice's array is allocated
// together with the view (see newView), and a name of up to inlineNameMax
// bytes is copied into the view, so a lookup that finds its tenant reads
// one allocation instead of chasing pointers. Fields Check reads come first.
type tenantView struct {
	hash    uint64  // tenantHash(name, Checker.seed)
	models  []entry // one per model, "*" included
	nameLen uint8   // len(name) when it fits inlineName, else 0
	inline  [inlineNameMax]byte
	keys    map[string]*entry // API key id -> flag; usually nil
	version int64
	name    string
}

// inlineNameMax fits the usual tenant slugs; a longer name (a UUID) costs
// one more cache line per hit, through name. It is small because view size
// matters more: with 100,000 flagged tenants, a 47-byte buffer made the views
// outgrow the CPU cache and every hit slower (measured). A view with one
// model entry is a 144-byte allocation.
const inlineNameMax = 23

// setName records the tenant's name (and its hash).
func (tv *tenantView) setName(name string, hash uint64) {
	tv.name, tv.hash = name, hash
	if len(name) > 0 && len(name) <= inlineNameMax {
		tv.nameLen = uint8(copy(tv.inline[:], name))
	}
}

// is reports whether tv belongs to the tenant called name, whose hash is h.
func (tv *tenantView) is(h uint64, name string) bool {
	if tv.hash != h {
		return false
	}
	if tv.nameLen != 0 {
		// The conversion does not allocate: the compiler compares in place.
		return string(tv.inline[:tv.nameLen]) == name
	}
	return tv.name == name
}

// viewWith1 and viewWith2 put a view and its model entries in one
// allocation.
type viewWith1 struct {
	tenantView
	inline [1]entry
}

type viewWith2 struct {
	tenantView
	inline [2]entry
}

// newView returns an empty view with room for models model entries.
func newView(models int) *tenantView {
	switch models {
	case 0:
		return &tenantView{}
	case 1:
		v := &viewWith1{}
		v.models = v.inline[:0]
		return &v.tenantView
	case 2:
		v := &viewWith2{}
		v.models = v.inline[:0]
		return &v.tenantView
	}
	return &tenantView{models: make([]entry, 0, models)}
}

// Checker answers Check from memory and keeps that memory in step with
// Redis while Run runs.
type Checker struct {
	rdb  redis.UniversalClient
	cfg  Config
	keys flags.Layout
	log  *slog.Logger

	// seed keys tenantHash; fixed at New.
	seed      uint64
	shards    [shardCount]atomic.Pointer[table]
	failModes atomic.Pointer[map[string]FailMode]
	stale     atomic.Bool
	// clock is a coarse wall clock (unix ns) that Run advances every few
	// milliseconds: reading the time on every Check would cost more than
	// the whole lookup on some hosts.
	clock     atomic.Int64
	lastFresh atomic.Int64 // unix ns of the last sign of a live enforcer
	// flagTTL is the enforcer's flag_ttl in ns (see the package
	// documentation): a stale view drops traffic-tied flags at
	// lastFresh + flagTTL.
	flagTTL atomic.Int64
	synced  atomic.Bool

	mu sync.Mutex // serialises writers of the shards

	internMu sync.Mutex
	interned map[string]string

	// resyncs counts full resyncs, for tests and metrics.
	resyncs atomic.Int64
	// lastResyncNS is how long the last resync took (see resyncEvery).
	lastResyncNS atomic.Int64
}

// New returns a Checker reading from rdb: a *redis.Client, or a
// *redis.ClusterClient when the enforcer writes to a Redis Cluster (the
// Checker then lists tenants on every master). It knows nothing until Run has
// done its first resync (see Synced); until then it answers as if stale
// would only after MaxStaleness, so a gateway starting with Redis down
// follows fail modes rather than blocking.
func New(rdb redis.UniversalClient, cfg Config, log *slog.Logger) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Checker{rdb: rdb, cfg: cfg, log: log, keys: flags.Layout{Prefix: cfg.KeyPrefix}, interned: map[string]string{}, seed: rand.Uint64()}
	for i := range c.shards {
		c.shards[i].Store(emptyTable)
	}
	fm := map[string]FailMode{}
	c.failModes.Store(&fm)
	c.lastFresh.Store(time.Now().UnixNano())
	c.clock.Store(time.Now().UnixNano())
	c.flagTTL.Store(int64(flags.DefaultFlagTTL))
	return c, nil
}

// hash is the tenant hash that places tenant in c's tables.
func (c *Checker) hash(tenant string) uint64 { return tenantHash(tenant, c.seed) }

// Check decides whether tenant may call model now with the API key
// apiKeyID ("" when unknown). It is safe for concurrent use, takes no lock,
// makes no network call and does not allocate.
//
// Check itself is only the common path (fresh view, tenant without flags);
// the rest sits in functions kept out of line, so the common path carries
// no stack frame for them.
func (c *Checker) Check(tenant, model, apiKeyID string) Decision {
	stale := c.stale.Load()
	if stale {
		if d, refused := c.refuseStale(tenant); refused {
			return d
		}
	}
	h := c.hash(tenant)
	tv := c.shards[shardIndex(h)].Load().get(h, tenant)
	if tv == nil {
		return Decision{Stale: stale}
	}
	return c.checkView(tv, model, apiKeyID, stale)
}

// refuseStale applies tenant's fail mode to a stale view.
//
//go:noinline
func (c *Checker) refuseStale(tenant string) (Decision, bool) {
	if c.failMode(tenant) == FailClosed {
		return Decision{Outcome: RefusedStale, Stale: true}, true
	}
	return Decision{}, false
}

// checkView decides for a tenant that has flags. Every scope the request
// matches (its API key, its model, "*") is evaluated and any refusal wins:
// a half-open breaker on the model must not let a probe through a
// tenant-wide blacklist or quota. A probe goes through only when every
// matching flag is half-open and each has a probe left; it spends one probe
// of each.
//
//go:noinline
func (c *Checker) checkView(tv *tenantView, model, apiKeyID string, stale bool) Decision {
	var live [maxScopes]*entry
	n := 0
	now, lapse := c.clock.Load(), c.lapse(stale)
	if apiKeyID != "" && tv.keys != nil {
		if e := tv.keys[apiKeyID]; e != nil && !e.soft && e.live(now, lapse, stale) {
			live[n] = e
			n++
		}
	}
	for i := range tv.models {
		e := &tv.models[i]
		if (e.scope == model || e.scope == flags.AllModels) && !e.soft && e.live(now, lapse, stale) && n < maxScopes {
			live[n] = e
			n++
		}
	}
	if n == 0 {
		return Decision{Stale: stale}
	}
	// A refusal: the most specific scope, except that a blacklist is named
	// first, since it says most about why and for how long.
	var refuse *entry
	for _, e := range live[:n] {
		if !e.halfOpen && (refuse == nil || e.flag.State == flags.StateBlacklist && refuse.flag.State != flags.StateBlacklist) {
			refuse = e
		}
	}
	if refuse != nil {
		return Decision{Outcome: Refused, Flag: refuse.flag, Scope: refuse.scope, Stale: stale}
	}
	// Every matching flag is half-open: take a probe from each, or give
	// back what was taken and refuse with the one that had none left.
	for i, e := range live[:n] {
		if e.probes.Add(-1) < 0 {
			e.probes.Add(1)
			for _, t := range live[:i] {
				t.probes.Add(1)
			}
			return Decision{Outcome: Refused, Flag: e.flag, Scope: e.scope, Stale: stale}
		}
	}
	return Decision{Outcome: Probe, Flag: live[0].flag, Scope: live[0].scope, Stale: stale}
}

// Over returns the soft-quota flag (flags.StateSoft) that applies to a
// request of tenant for model with API key apiKeyID — its key's, its
// model's or the tenant-wide one —, nil when the tenant is over no soft
// quota there. It refuses nothing: a gateway that has cheaper models for
// the one asked (the policy's fallbacks) serves the request with one of
// them. Like Check it reads memory only.
func (c *Checker) Over(tenant, model, apiKeyID string) *flags.Flag {
	h := c.hash(tenant)
	tv := c.shards[shardIndex(h)].Load().get(h, tenant)
	if tv == nil {
		return nil
	}
	now, stale := c.clock.Load(), c.stale.Load()
	lapse := c.lapse(stale)
	if e := tv.keys[apiKeyID]; apiKeyID != "" && e != nil && e.soft && e.live(now, lapse, stale) {
		return e.flag
	}
	for i := range tv.models {
		e := &tv.models[i]
		if (e.scope == model || e.scope == flags.AllModels) && e.soft && e.live(now, lapse, stale) {
			return e.flag
		}
	}
	return nil
}

// live reports whether e applies at now (unix ns): until its Until, and
// while the view is stale until lapseNS too; an operator's decision is kept
// anyway while the view is stale, because then the enforcer's silence says
// nothing about it.
//
// lapseNS is when a stale view drops traffic-tied flags (see lapse).
func (e *entry) live(now, lapseNS int64, stale bool) bool {
	if stale && e.sticky {
		return true
	}
	return (e.untilNS == 0 || now < e.untilNS) && now < lapseNS
}

// lapse is the instant (unix ns) after which a view stale or not drops its
// traffic-tied flags: flag_ttl after the enforcer's last sign of life when
// stale, never when fresh.
func (c *Checker) lapse(stale bool) int64 {
	if !stale {
		return math.MaxInt64
	}
	return c.lastFresh.Load() + c.flagTTL.Load()
}

func (c *Checker) failMode(tenant string) FailMode {
	m := *c.failModes.Load()
	if fm, ok := m[tenant]; ok {
		return fm
	}
	if fm, ok := m[flags.AllModels]; ok {
		return fm
	}
	return c.cfg.DefaultFailMode
}

// Synced reports whether a full resync has completed.
func (c *Checker) Synced() bool { return c.synced.Load() }

// Stale reports whether the view is older than MaxStaleness.
func (c *Checker) Stale() bool { return c.stale.Load() }

// Age returns how long ago the view last showed a live enforcer (a
// heartbeat, a flag change or a resync): what a gateway's flag-staleness
// metric reports, so an operator sees a view going stale before
// MaxStaleness makes tenants' fail modes apply.
func (c *Checker) Age() time.Duration {
	return time.Duration(time.Now().UnixNano() - c.lastFresh.Load())
}

// Ready is a readiness check for ops.Health: ready once synced.
func (c *Checker) Ready(context.Context) error {
	if !c.Synced() {
		return errors.New("checker: no full resync from Redis yet")
	}
	return nil
}

// Tenants returns how many tenants have flags in memory.
func (c *Checker) Tenants() int {
	n := 0
	for i := range c.shards {
		n += c.shards[i].Load().n
	}
	return n
}

// buildView decodes one tenant hash; undecodable fields are logged and
// skipped, so one bad value never hides the tenant's other flags.
func (c *Checker) buildView(tenant string, fields map[string]string) *tenantView {
	models := 0
	for k := range fields {
		if _, isKey := cutKey(k); !isKey && k != flags.VersionField {
			models++
		}
	}
	tv := newView(models)
	tv.setName(tenant, c.hash(tenant))
	for k, v := range fields {
		if k == flags.VersionField {
			tv.version, _ = strconv.ParseInt(v, 10, 64)
			continue
		}
		f, err := flags.Decode(v)
		if err != nil {
			c.log.Warn("checker: skipping undecodable flag", "tenant", tenant, "field", k, "err", err)
			continue
		}
		var untilNS int64
		if !f.Until.IsZero() {
			untilNS = f.Until.UnixNano()
		}
		e := entry{flag: f, untilNS: untilNS, halfOpen: f.State == flags.StateHalfOpen,
			sticky: f.Kind == flags.KindManual || f.Kind == flags.KindBlacklist || f.State == flags.StateBlacklist,
			soft:   f.State == flags.StateSoft}
		if e.halfOpen {
			e.probes = new(atomic.Int64)
			e.probes.Store(int64(f.Probes))
		}
		if id, ok := cutKey(k); ok {
			if tv.keys == nil {
				tv.keys = map[string]*entry{}
			}
			e.scope = k
			tv.keys[id] = &e
		} else {
			e.scope = c.internScope(k)
			tv.models = append(tv.models, e)
		}
	}
	return tv
}

// inheritProbes makes the half-open entries of next, which replaces prev,
// share prev's probe counters where the breaker is the same one: same scope
// and the same flag apart from Until and RetryAfter, which the enforcer
// moves on every rewrite. Without it every resync (or any change of the
// tenant) would grant each Checker a fresh set of probes. A breaker that
// went open and half-open again arrives as a different flag in between and
// gets fresh probes.
func inheritProbes(prev, next *tenantView) {
	for i := range next.models {
		e := &next.models[i]
		if !e.halfOpen {
			continue
		}
		for j := range prev.models {
			if p := &prev.models[j]; p.scope == e.scope && sameBreaker(p, e) {
				e.probes = p.probes
				break
			}
		}
	}
	for id, e := range next.keys {
		if p := prev.keys[id]; e.halfOpen && p != nil && sameBreaker(p, e) {
			e.probes = p.probes
		}
	}
}

// keepSticky returns next (nil or empty: the tenant has no flags in Redis)
// with the operator flags of prev that next lacks added back, or nil when
// there is nothing to keep. It is used while the view is stale, when the
// hashes have expired because no enforcer refreshes them: a blacklist must
// not lapse because its refresher died.
func (c *Checker) keepSticky(prev, next *tenantView) *tenantView {
	var models []entry
	var keys map[string]*entry
	for i := range prev.models {
		if e := &prev.models[i]; e.sticky && (next == nil || !next.hasModel(e.scope)) {
			models = append(models, *e)
		}
	}
	for id, e := range prev.keys {
		if e.sticky && (next == nil || next.keys[id] == nil) {
			if keys == nil {
				keys = map[string]*entry{}
			}
			keys[id] = e
		}
	}
	if len(models) == 0 && len(keys) == 0 {
		return next
	}
	n := len(models)
	if next != nil {
		n += len(next.models)
	}
	tv := newView(n)
	tv.setName(prev.name, prev.hash)
	tv.version = prev.version
	if next != nil {
		tv.version = max(tv.version, next.version)
		tv.models = append(tv.models, next.models...)
		for id, e := range next.keys {
			if keys == nil {
				keys = map[string]*entry{}
			}
			keys[id] = e
		}
	}
	tv.models = append(tv.models, models...)
	tv.keys = keys
	return tv
}

// hasModel reports whether tv has a flag on scope.
func (tv *tenantView) hasModel(scope string) bool {
	for i := range tv.models {
		if tv.models[i].scope == scope {
			return true
		}
	}
	return false
}

// sameBreaker reports whether two half-open entries are one breaker state.
func sameBreaker(a, b *entry) bool {
	if !a.halfOpen || !b.halfOpen || a.probes == nil {
		return false
	}
	x, y := *a.flag, *b.flag
	x.Until, y.Until, x.RetryAfter, y.RetryAfter = time.Time{}, time.Time{}, 0, 0
	return flags.Encode(&x) == flags.Encode(&y)
}

// maxInterned bounds the intern table; past it scopes are simply not shared.
const maxInterned = 10_000

// internScope shares one copy of each model name among all tenants, so the
// string comparison in Check reads memory that is already in cache.
func (c *Checker) internScope(s string) string {
	c.internMu.Lock()
	defer c.internMu.Unlock()
	if v, ok := c.interned[s]; ok {
		return v
	}
	if len(c.interned) < maxInterned {
		c.interned[s] = s
	}
	return s
}

func cutKey(field string) (string, bool) {
	if len(field) > len(flags.KeyFieldPrefix) && field[:len(flags.KeyFieldPrefix)] == flags.KeyFieldPrefix {
		return field[len(flags.KeyFieldPrefix):], true
	}
	return "", false
}

// apply installs updated tenant views (nil or empty = the tenant has no
// flags). A full resync also drops tenants it did not see, unless their
// version is newer than keepNewerThan, the version counter read before the
// resync started (a change announced while it ran). Each touched shard is
// copied once.
func (c *Checker) apply(updates map[string]*tenantView, keepNewerThan int64, full bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// While the view is stale but Redis answers, the enforcer is gone and
	// its keys expire after flag_ttl; operator flags are kept anyway (see
	// the package documentation).
	stale := c.stale.Load()
	byShard := map[uint64][]string{}
	for t := range updates {
		s := shardIndex(c.hash(t))
		byShard[s] = append(byShard[s], t)
	}
	for i := range c.shards {
		names, touched := byShard[uint64(i)]
		if !touched && !full {
			continue
		}
		old := c.shards[i].Load()
		if !full && !rebuildShards && c.replaceInPlace(old, names, updates, stale) {
			continue
		}
		next := make(map[string]*tenantView, old.n+len(names))
		old.each(func(tv *tenantView) {
			if full {
				if _, seen := updates[tv.name]; !seen && tv.version <= keepNewerThan {
					if stale {
						if kept := c.keepSticky(tv, nil); kept != nil {
							next[tv.name] = kept
						}
					}
					return // gone from Redis: expired or cleared
				}
			}
			next[tv.name] = tv
		})
		for _, t := range names {
			tv := updates[t]
			cur := next[t]
			if stale && cur != nil {
				tv = c.keepSticky(cur, tv)
			}
			if tv == nil || (len(tv.models) == 0 && len(tv.keys) == 0) {
				delete(next, t)
				continue
			}
			if cur != nil && cur.version > tv.version {
				continue // a newer read already landed
			}
			if cur != nil {
				inheritProbes(cur, tv)
			}
			next[t] = tv
		}
		views := make([]*tenantView, 0, len(next))
		for _, tv := range next {
			views = append(views, tv)
		}
		c.shards[i].Store(newTable(views))
	}
}

// rebuildShards makes apply copy every shard it touches even when each
// update only replaces a tenant's view, as it did before replaceInPlace:
// BenchmarkScaleCheckerSync sets it (SLUICE_CHECKER_REBUILD=1) to measure
// both ways with the same binary.
var rebuildShards bool

// replaceInPlace installs the updates of names, all in shard table old,
// without copying the shard, when each of them replaces the view of a
// tenant old already holds with a view that still has flags — what a
// burst of changes to flagged tenants brings (and what older enforcers'
// periodic refresh announced for every flagged tenant). It
// reports false, having changed nothing, when a tenant is new or loses
// its flags: the caller then rebuilds the shard. The caller holds c.mu.
func (c *Checker) replaceInPlace(old *table, names []string, updates map[string]*tenantView, stale bool) bool {
	slots := make([]int, len(names))
	for i, t := range names {
		if tv := updates[t]; tv == nil || len(tv.models) == 0 && len(tv.keys) == 0 {
			return false
		}
		if slots[i] = old.slot(c.hash(t), t); slots[i] < 0 {
			return false
		}
	}
	for i, t := range names {
		cur, tv := old.views[slots[i]].Load(), updates[t]
		if stale {
			tv = c.keepSticky(cur, tv)
		}
		if cur.version > tv.version {
			continue // a newer read already landed
		}
		inheritProbes(cur, tv)
		old.set(slots[i], tv)
	}
	return true
}
