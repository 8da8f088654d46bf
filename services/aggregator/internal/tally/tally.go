// Package tally is the aggregator's in-memory state for one Kafka partition
// of sluice.usage.v1: per tenant × model and per tenant × all models ("*"),
// it deduplicates events by id, keeps sliding per-minute rates, hour, day and
// month totals in the tenant's time zone, cost from the price table, usage
// against every quota of the policy, alert tiers with hysteresis and
// exhaustion predictions, and emits signals when they change. A tenant
// counts at most its policy's max_models models on their own; the usage of
// further models goes to its "other" series while its "*" series stays
// exact (policy package doc, "Model cardinality").
//
// Everything is a function of the events in partition order, the policy
// and the reference clock the consumer passes to SetClock (each record's
// Kafka time), which only decides when an event stamped far ahead is
// counted: the wall clock is never read here. That is what makes the aggregator
// exactly-once in effect: after a crash the state is rebuilt by replaying
// the events stored in ClickHouse (with signals suppressed), consumption
// resumes at the committed offset, and the events after it produce the same
// signals, with the same ids, as the first time.
//
// A Partition is not safe for concurrent use; the consumer owns one per
// assigned partition.
//
// Apply is the aggregator's hot path and is hand-written for it: a
// pointer-free id map (hashes and series indexes, so the garbage collector
// does not scan it), package fifo's ring for the id bound, a price cached
// per series. BenchmarkApply, BenchmarkAllocsPerEvent and
// BenchmarkBytesPerSeries (bench_test.go; aggregator_inmemory_* and
// aggregator_bytes_per_tenant_model in bench/README.md) guard it.
package tally

import (
	"maps"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/sluicehq/sluice/internal/fifo"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// Options tune a Partition.
type Options struct {
	// Hysteresis is how many percentage points usage must fall below a tier
	// before the tier is left, so usage wobbling around a threshold (an
	// estimate settled lower, a limit edited back and forth) does not flap.
	Hysteresis float64
	// Horizon: an exhaustion_predicted signal is emitted when a quota is
	// predicted to run out sooner than this (and before its period ends).
	Horizon time.Duration
	// DedupCapacity bounds the ids remembered for deduplication and
	// settlement. When full the oldest id is forgotten (FIFO): a retry of an
	// event older than the last DedupCapacity events would be counted again
	// by the in-memory totals (ClickHouse still keeps it once).
	DedupCapacity int
	// SlowCallMS is the latency from which a request counts as a slow call
	// in the minute rollups. (The slow_call anomaly detector uses the
	// tenant's policy, breakers.slow_call.slow_call_ms.)
	SlowCallMS int64
	// SpikeMultiplier: a minute whose settled tokens exceed this multiple
	// of the series' 60-minute baseline is a rate_spike anomaly. 0 turns
	// the detector off.
	SpikeMultiplier float64
	// SpikeMinTokens is the least a minute must carry to be called a
	// spike, so that a quiet tenant's 10 tokens after 1 are not an alert.
	SpikeMinTokens int64
	// IdleEvict is how long of event time (behind the partition's latest
	// event) a tenant may stay silent before EvictIdle forgets it; 0 keeps
	// every tenant.
	IdleEvict time.Duration
	// MaxFuture is how far ahead of the reference clock (SetClock) an
	// event may be stamped and still be applied at once. An event further
	// ahead is held, uncounted, until the clock comes within MaxFuture of
	// it, so that one event from a gateway with a wrong clock (or a direct
	// producer) cannot roll a tenant's hour, day or month early or move
	// the partition's clock and have every tenant evicted as idle. A
	// period therefore rolls at most MaxFuture early.
	MaxFuture time.Duration
	// HoldCapacity bounds the events held for being ahead; when it is full
	// a further future event is refused (Result TooFarAhead): not counted
	// and not stored.
	HoldCapacity int
	// OnFold, if set, is called for every event counted under the
	// OtherModel bucket because its tenant reached the policy's max_models
	// (first is true the first time for that tenant in this state), for the
	// aggregator's metric and its one log line per tenant. Not called while
	// replaying or restoring.
	OnFold func(tenant, model string, maxModels int, first bool)
}

// DefaultOptions are the settings the aggregator ships with.
func DefaultOptions() Options {
	return Options{Hysteresis: 5, Horizon: 6 * time.Hour, DedupCapacity: 200_000, SlowCallMS: 10_000,
		SpikeMultiplier: 10, SpikeMinTokens: 10_000, IdleEvict: 2 * time.Hour, MaxFuture: 2 * time.Minute, HoldCapacity: 10_000}
}

// Result says what Apply did with an event.
type Result uint8

const (
	// Accepted: the event was counted (new id, or a settlement replacing an
	// estimate); its raw row must be stored.
	Accepted Result = iota
	// Duplicate: the id was already counted; the event changes nothing and
	// its raw row must not be stored (it would replace the counted version).
	Duplicate
	// Rejected: the event cannot be counted (model "*" is reserved).
	Rejected
	// Evicted: the event's tenant was evicted as idle; nothing was done.
	// Restore the tenant, then apply the event again.
	Evicted
	// Held: the event is stamped more than Options.MaxFuture ahead of the
	// reference clock. It is not counted yet; it is applied when the clock
	// comes within MaxFuture of it (see SetClock). Its raw row must be
	// stored, like an accepted one: a rebuild replays it and holds it again
	// (or applies it, if its time has come by then).
	Held
	// TooFarAhead: the event is ahead like a held one but the hold is full
	// (Options.HoldCapacity). It is refused: not counted, and its raw row
	// must not be stored, so ClickHouse and the counters still agree.
	TooFarAhead
)

// Stats counts what a Partition did, for metrics.
type Stats struct {
	Accepted, Duplicates, Settled, Late, Rejected int64
	// Held counts events held for being stamped ahead of the clock,
	// Released those applied since, Refused those refused for a full hold.
	Held, Released, Refused int64
	// Folded counts events counted under OtherModel for a tenant beyond
	// its max_models.
	Folded int64
	// Unpriced counts events of a model without a price at their time
	// (counted at the policy's unpriced_price).
	Unpriced int64
	// EvictedSeries and RestoredTenants count EvictIdle's and Restore's
	// work.
	EvictedSeries, RestoredTenants int64
}

// Partition is the state of one partition.
type Partition struct {
	id  int32
	opt Options
	pol *policy.Policy

	tenants map[string]*tenant

	// dedup holds no pointers (keys are hashes, series are indexes), so
	// the garbage collector does not scan it: at hundreds of thousands of
	// ids that scan cost more than the aggregation itself.
	dedup   map[uint64]idRec
	idOrder *fifo.Ring[uint64] // the keys of dedup, oldest first
	seed    uint64             // of key and tenantKey
	series  []*Series          // by index, for idRec.series; nil: a free slot
	free    []int32            // free slots of series, reused before it grows

	// wm is the latest event time applied, unix seconds: the partition's
	// event-time clock for idle eviction.
	wm       int64
	lastScan int64
	// evicted maps the hash of each evicted tenant to its latest event
	// time. Apply answers Evicted for them until Restore rebuilds them.
	// Entries older than evictedMemory are dropped (a tenant silent that
	// long comes back as new, as it would after a rebuild from ClickHouse,
	// whose replay does not reach that far back either).
	evicted   map[uint64]int64
	restoring bool

	// now is the reference clock for Options.MaxFuture, unix seconds; 0
	// (never set) applies every event at once. held are the events ahead
	// of it, in arrival order; heldMin is the earliest time among them.
	now     int64
	held    []heldEvent
	heldMin int64

	// overrides are the operators' active quota overrides by tenant
	// (override.go); ovNext is the earliest Until among them, unix seconds.
	overrides map[string][]Override
	ovNext    int64

	// unpriced holds the models an unpriced-model alert was raised for
	// (unpriced.go), at most maxUnpricedModels.
	unpriced map[string]struct{}

	replay       bool
	signals      []schemas.Signal
	dirty        []*Series
	minutes      []MinuteRow      // rollups pushed out of a series' ring before a drain
	closed       []QuotaRow       // final rows of periods that left memory before a drain
	restored     map[uint64]idRec // ids a Restore in progress applied
	restoreNew   bool             // the tenant being restored was not evicted here: it is new
	repairs      []LateMinute
	quotaRepairs []QuotaRow

	// Stats is updated by Apply.
	Stats Stats
}

// heldEvent is an event held for being ahead of the clock, with its offset.
type heldEvent struct {
	ev     schemas.UsageEvent
	offset int64
}

// idRec is what one counted event contributed, so a settlement can take it
// back. Token counts fit in int32 after the schema's per-event limit (1e9).
type idRec struct {
	series int32
	// cacheWrite sits here, in what would be padding before ts.
	cacheWrite                            int32
	ts                                    int64
	prompt, completion, cached, reasoning int32
	flags                                 uint8
	cost                                  float64
	billed                                float64 // billed-equivalent tokens
}

const (
	flagEstimated = 1 << iota
	flagError
	flagSlow
	// flagRejected: the gateway refused the request (outcome rejected). It
	// carries no tokens; it is kept out of requests_per_minute, because a
	// throttled client retrying would otherwise keep its own throttle shut.
	flagRejected
)

// New returns the empty state of partition id.
func New(id int32, opt Options) *Partition {
	if opt.DedupCapacity < 1 {
		opt.DedupCapacity = 1
	}
	return &Partition{
		id:      id,
		opt:     opt,
		tenants: map[string]*tenant{},
		dedup:   make(map[uint64]idRec, min(opt.DedupCapacity, 1<<16)),
		idOrder: fifo.New[uint64](opt.DedupCapacity),
		seed:    rand.Uint64(),
		evicted: map[uint64]int64{},
	}
}

// ID returns the partition number.
func (p *Partition) ID() int32 { return p.id }

// SetPolicy makes pol the policy for the events applied from now on.
// Tenants pick it up at their next event, keeping tier state for quotas
// that still exist; Reevaluate applies it to every tenant at once.
func (p *Partition) SetPolicy(pol *policy.Policy) {
	if pol == p.pol {
		return
	}
	p.pol = pol
}

// Reevaluate makes pol the policy in force and re-evaluates at once every
// tenant in memory whose quotas or tiers it changes, instead of waiting
// for that tenant's next event: a tenant blocked at 100% sends no events,
// so a raised limit must take its tier down (closing the enforcer's quota
// breaker and resolving its alerts) by itself. The signals carry the
// tenant's latest event time and offset; its quota rows are marked for
// the next Drain.
func (p *Partition) Reevaluate(pol *policy.Policy) {
	p.SetPolicy(pol)
	ids := make([]string, 0, len(p.tenants))
	for id, t := range p.tenants {
		if t.pol != pol {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // signals in a deterministic order
	for _, id := range ids {
		p.reevaluate(p.tenants[id])
	}
}

// reevaluate refreshes t's effective policy and, if that changed any of
// its quotas or tiers, evaluates every quota of every series now.
func (p *Partition) reevaluate(t *tenant) {
	if !t.refresh(p.pol, p) || !t.started {
		return
	}
	ts, offset := t.wm, t.off
	for _, x := range t.order {
		for _, q := range x.removed {
			// The quota no longer exists: take its tier down to 0.
			b := t.bounds[q.kind][0]
			sig := x.base(schemas.SignalTierCrossed, &q, b, ts, offset, x.used(&q, 0))
			sig.Tier, sig.PreviousTier, sig.Direction = 0, q.tier, schemas.DirectionDown
			sig.ID = x.id(sig.Kind, &q, b.start, strconv.Itoa(q.tier), "0", strconv.Itoa(int(q.crossings+1)), "removed")
			sig.Reason = string(q.q.Name) + " no longer applies"
			p.emit(sig)
		}
		x.removed = x.removed[:0]
		for i := range x.quotas {
			q := &x.quotas[i]
			if q.kind == kindMinute {
				continue
			}
			x.evalQuota(q, ts, offset, p)
		}
		// Predict against the new limits now: a prediction the change
		// makes sooner is news, one it pushes out is cleared.
		x.predict(ts, offset, p)
		p.markDirty(x)
	}
}

// PendingSignals returns the signals emitted since the last TakeSignals
// without taking them, for counting.
func (p *Partition) PendingSignals() []schemas.Signal { return p.signals }

// Pending reports whether signals or rows wait for TakeSignals or Drain
// without a new event: after Reevaluate, SetOverrides or a release.
func (p *Partition) Pending() bool {
	return len(p.signals) > 0 || len(p.dirty) > 0 || len(p.closed) > 0
}

// SetReplay switches replay mode: while on, Apply rebuilds state but emits
// no signals, because the events replayed were already signalled.
func (p *Partition) SetReplay(on bool) { p.replay = on }

// Entries returns how many tenant × model series and remembered ids the
// state holds, for the state-size metric.
func (p *Partition) Entries() (series, ids int) {
	for _, t := range p.tenants {
		series += 1 + len(t.models)
	}
	return series, len(p.dedup)
}

// TakeSignals returns the signals emitted since the last call, in emission
// order. The slice is reused by later calls to Apply.
func (p *Partition) TakeSignals() []schemas.Signal {
	s := p.signals
	p.signals = p.signals[:0]
	return s
}

// SetClock sets the reference clock the MaxFuture bound is measured
// from, and applies the held events it brings within reach (their
// signals and rows come out as if they had just arrived). The consumer
// passes each record's Kafka timestamp capped by its own wall clock, and
// its wall clock before a rebuild; this is the only way the wall clock
// reaches the state. Without a call every event is applied at once.
func (p *Partition) SetClock(now time.Time) {
	p.now = now.Unix()
	p.expireOverrides()
	if len(p.held) == 0 || p.heldMin > p.now+p.maxFuture() {
		return
	}
	due := p.held
	var keep []heldEvent
	p.held, p.heldMin = nil, math.MaxInt64
	for i := range due {
		h := &due[i]
		if h.ev.Time.Unix() > p.now+p.maxFuture() {
			keep = append(keep, *h)
			p.heldMin = min(p.heldMin, h.ev.Time.Unix())
			continue
		}
		p.Stats.Released++
		p.Apply(&h.ev, h.offset)
	}
	p.held = keep
}

// Held returns how many events are held for being ahead of the clock.
func (p *Partition) Held() int { return len(p.held) }

func (p *Partition) maxFuture() int64 { return int64(p.opt.MaxFuture / time.Second) }

// holding returns the tenants with held events.
func (p *Partition) holding() map[string]bool {
	out := make(map[string]bool, len(p.held))
	for i := range p.held {
		out[p.held[i].ev.Tenant] = true
	}
	return out
}

// Apply counts one event read at offset. The caller has validated it
// (eventjson.DecodeUsageEvent does).
func (p *Partition) Apply(ev *schemas.UsageEvent, offset int64) Result {
	if ev.Model == policy.AllModels || ev.Model == "" || ev.Tenant == "" {
		p.Stats.Rejected++
		return Rejected
	}
	if len(p.evicted) > 0 && !p.restoring {
		if _, known := p.tenants[ev.Tenant]; !known {
			if _, gone := p.evicted[p.tenantKey(ev.Tenant)]; gone {
				return Evicted
			}
		}
	}
	if p.now != 0 && !p.restoring && ev.Time.Unix() > p.now+p.maxFuture() {
		return p.hold(ev, offset)
	}
	t := p.tenant(ev.Tenant)
	s, folded := t.series(ev.Model, p)

	key := p.key(t.id, ev.ID)
	old, seen := p.dedup[key]
	if p.restoring {
		// A restore replays each stored id in its latest version per
		// partition: count it the first time, and re-attach a remembered
		// id to the new series while keeping its place in the FIFO (an id
		// the FIFO already forgot stays forgotten, as it would have
		// without the eviction). An id stored under two partitions (sent
		// again across a partition count change) comes twice: the second
		// is a duplicate, or the settlement of the first.
		old, seen = p.restored[key]
	}
	if seen && (old.flags&flagEstimated == 0 || ev.Estimated) {
		p.Stats.Duplicates++
		return Duplicate
	}

	ts := ev.Time.Unix()
	t.advance(ts, offset, p)
	p.wm = max(p.wm, ts)
	t.off = max(t.off, offset)

	if seen {
		// A settlement: take the estimate back where it was counted, unless
		// that series was evicted and the estimate is older than a restore
		// replays (its period is gone from memory either way).
		if x := p.series[old.series]; x != nil && x.t == t {
			p.add(x, &old, -1, offset)
		}
		p.Stats.Settled++
	}
	rec := idRec{
		series:     s.idx,
		ts:         ts,
		prompt:     int32(ev.PromptTokens),
		completion: int32(ev.CompletionTokens),
		cached:     int32(ev.CachedTokens),
		cacheWrite: int32(ev.CacheWriteTokens),
		reasoning:  int32(ev.ReasoningTokens),
	}
	if ev.Estimated {
		rec.flags |= flagEstimated
	}
	if ev.Outcome == schemas.OutcomeError || ev.Outcome == schemas.OutcomeTimeout || ev.Status >= 500 {
		rec.flags |= flagError
	}
	if ev.Outcome == schemas.OutcomeRejected {
		rec.flags |= flagRejected
	}
	if p.opt.SlowCallMS > 0 && ev.LatencyMS >= p.opt.SlowCallMS {
		rec.flags |= flagSlow
	}
	var priced bool
	if folded {
		rec.cost, rec.billed, priced = p.costOf(ev.Model, ts, policy.TokensOf(ev))
	} else {
		rec.cost, rec.billed, priced = s.cost(p, ts, policy.TokensOf(ev))
	}
	if !priced {
		p.unpricedEvent(t, ev, offset)
	}
	late := p.add(s, &rec, 1, offset)
	if late && !seen {
		p.Stats.Late++
		p.lateSignal(s, ts, offset, ev)
	}

	switch _, remembered := p.dedup[key]; {
	case p.restoring:
		switch {
		case remembered:
			p.dedup[key] = rec
		case p.restoreNew:
			// A tenant new here (moved by added partitions) has no ids in
			// this partition's memory yet: a retry of one sent before the
			// move must be a duplicate here too.
			p.remember(key, rec)
		}
		p.restored[key] = rec
	case seen:
		p.dedup[key] = rec
	default:
		p.remember(key, rec)
	}
	p.Stats.Accepted++
	if folded {
		p.Stats.Folded++
		if p.opt.OnFold != nil && !p.replay && !p.restoring {
			p.opt.OnFold(t.id, ev.Model, t.maxModels(), !t.capped)
			t.capped = true
		}
	}
	t.evaluate(s, ts, offset, p)
	if !ev.Estimated {
		t.detect(s, ev, ts, offset, p)
	}
	return Accepted
}

// hold keeps an event stamped beyond the MaxFuture bound aside, or
// refuses it when the hold is full. A retry of an id already counted is a
// duplicate as usual.
func (p *Partition) hold(ev *schemas.UsageEvent, offset int64) Result {
	if old, seen := p.dedup[p.key(ev.Tenant, ev.ID)]; seen && (old.flags&flagEstimated == 0 || ev.Estimated) {
		p.Stats.Duplicates++
		return Duplicate
	}
	if len(p.held) >= p.opt.HoldCapacity {
		p.Stats.Refused++
		return TooFarAhead
	}
	h := heldEvent{ev: *ev, offset: offset}
	// The caller reuses ev; copy what it shares.
	h.ev.Attributes = maps.Clone(ev.Attributes)
	if len(p.held) == 0 {
		p.heldMin = math.MaxInt64
	}
	p.held = append(p.held, h)
	p.heldMin = min(p.heldMin, ev.Time.Unix())
	p.Stats.Held++
	return Held
}

// tenantKey hashes a tenant name for the evicted set.
func (p *Partition) tenantKey(tenant string) uint64 {
	var h xxhash.Digest
	h.ResetWithSeed(p.seed)
	h.WriteString(tenant)
	return h.Sum64()
}

// key hashes tenant and id to 64 bits. With the dedup capacity's ids in
// memory the chance that two distinct ids collide (and the second is taken
// for a duplicate) is about capacity²/2⁶⁵, 1e-9 at 200,000 ids; ClickHouse
// still stores both, and the reconciler would see the drift. The hash is
// seeded xxHash64 rather than hash/maphash because its seed can be kept:
// a snapshot stores the seed with the hashes (snapshot.go). The seed is
// random per state, so ids cannot be crafted to collide in advance.
func (p *Partition) key(tenant, id string) uint64 {
	var h xxhash.Digest
	h.ResetWithSeed(p.seed)
	h.WriteString(tenant)
	h.WriteString("\x00")
	h.WriteString(id)
	return h.Sum64()
}

// remember keeps r for id hash k, forgetting the oldest id when
// DedupCapacity ids are held.
func (p *Partition) remember(k uint64, r idRec) {
	if old, evicted := p.idOrder.Push(k); evicted {
		delete(p.dedup, old)
	}
	p.dedup[k] = r
}

func (p *Partition) tenant(id string) *tenant {
	t, ok := p.tenants[id]
	if !ok {
		t = &tenant{id: string([]byte(id)), models: map[string]*Series{}}
		t.all = p.newSeries(t, policy.AllModels)
		p.tenants[t.id] = t
	}
	if t.pol != p.pol || t.tp == nil {
		if t.started {
			p.reevaluate(t) // every series, not only the one this event is for
		} else {
			t.refresh(p.pol, p)
		}
	}
	return t
}

// add adds (sign 1) or takes back (sign -1) one event's contribution to s
// and to the tenant-wide series. It reports whether the event is late: its
// hour has closed.
func (p *Partition) add(s *Series, r *idRec, sign int64, offset int64) (late bool) {
	t := s.t
	late = r.ts < t.bounds[kindHour][0].start
	for _, x := range [2]*Series{s, t.all} {
		x.addPeriods(r, sign, p)
		x.addMinute(r, sign, p)
		p.markDirty(x)
	}
	return late
}

func (p *Partition) markDirty(s *Series) {
	if !s.dirty && !p.restoring {
		s.dirty = true
		p.dirty = append(p.dirty, s)
	}
}

func (p *Partition) emit(sig schemas.Signal) {
	if p.replay {
		return
	}
	sig.Source.Partition = p.id
	p.signals = append(p.signals, sig)
}

func (p *Partition) lateSignal(s *Series, ts, offset int64, ev *schemas.UsageEvent) {
	start, end := policy.PeriodBounds(schemas.PeriodHour, ev.Time, s.t.loc)
	if s.lateHour == start.Unix() {
		return // one signal per closed hour and series: on change only
	}
	s.lateHour = start.Unix()
	at := s.t.eventTime(s.t.wm)
	p.emit(schemas.Signal{
		ID:          schemas.SignalID(string(schemas.SignalLateEvent), s.t.id, s.model, start.UTC().Format(time.RFC3339), ev.ID),
		Kind:        schemas.SignalLateEvent,
		Time:        at,
		Tenant:      s.t.id,
		Model:       s.model,
		Period:      schemas.PeriodHour,
		PeriodStart: start.UTC(),
		PeriodEnd:   end.UTC(),
		Reason:      "event " + ev.ID + " at " + ev.Time.UTC().Format(time.RFC3339) + " arrived after its hour closed; counted in its own period",
		Source:      schemas.SignalSource{FromOffset: offset, ToOffset: offset},
	})
}
