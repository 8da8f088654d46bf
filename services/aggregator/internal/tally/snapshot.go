package tally

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/forecast"
)

// Snapshots.
//
// A snapshot is the state's counters in a self-checking binary form, so a
// restart can load it instead of replaying a month of events: every
// tenant's series (period and settled totals, rate ring, rollup slots,
// Holt forecasts, early-rate cells, every quota's tier, crossings,
// exhaustions and prediction, the breaker and spike detectors, the
// one-minute window), the evicted set, the held events and the overrides.
//
// The remembered ids (the dedup map and its FIFO order) are in it too,
// with the hash seed, so that a settlement arriving after a restart finds
// the estimate it replaces: ClickHouse no longer holds that estimate once
// the settlement's row replaced it, so the ids could not be rebuilt from
// the stored events alone. Quota definitions are not
// stored either: Load re-derives them from the policy and the overrides
// and refuses a snapshot whose quotas do not match, as it refuses one
// taken under another policy fingerprint or format version
// (ErrSnapshotMismatch) or a damaged one (ErrSnapshotCorrupt); the caller
// then falls back to the full rebuild.

// SnapshotVersion is the format version Snapshot writes and Load accepts.
// Change it with any change to what the state holds.
//
// 2: remembered ids and rollups hold cache-write and reasoning tokens,
// remembered ids and periods billed-equivalent tokens, periods the token
// types.
const SnapshotVersion = 2

// snapshotMagic starts every snapshot.
const snapshotMagic = "SLTSNAP"

var (
	// ErrSnapshotMismatch: the snapshot was taken under another format
	// version, policy fingerprint or partition; rebuild instead.
	ErrSnapshotMismatch = errors.New("tally: snapshot does not match this version, policy or partition")
	// ErrSnapshotCorrupt: the snapshot is damaged or truncated; rebuild
	// instead.
	ErrSnapshotCorrupt = errors.New("tally: snapshot is corrupt")
)

// Snapshot appends the state's snapshot to dst under the policy
// fingerprint fp (any string that changes whenever the policy does). Take
// it right after a Drain whose rows were written, with nothing pending
// and no restore in progress: it refuses otherwise, because rows not yet
// written would be lost to a restart that loads it. It is SnapshotCopy
// followed by the copy's Snapshot: one encoding, whoever calls it.
func (p *Partition) Snapshot(dst []byte, fp string) ([]byte, error) {
	c, err := p.SnapshotCopy(nil)
	if err != nil {
		return dst, err
	}
	return c.Snapshot(dst, fp)
}

// snapshotReady reports why the state cannot be snapshotted as it stands,
// or nil.
func (p *Partition) snapshotReady() error {
	if p.Pending() || len(p.minutes) > 0 || len(p.repairs) > 0 || len(p.quotaRepairs) > 0 || p.restoring {
		return errors.New("tally: snapshot with rows or signals pending; drain and write them first")
	}
	return nil
}

// errRemovedQuota: a snapshot is refused while a quota the policy dropped
// still waits for the re-evaluation that takes its tier down.
var errRemovedQuota = errors.New("tally: snapshot while a removed quota waits for its re-evaluation; take it after Reevaluate")

// StateCopy is a copy of everything a snapshot of a Partition holds, taken
// by SnapshotCopy, for Snapshot to encode while the partition moves on.
// It shares nothing the partition changes later.
type StateCopy struct {
	id                int32
	seed              uint64
	wm, lastScan, now int64
	overrides         map[string][]Override
	evicted           []evictedTenant
	held              []heldEvent
	tenants           []tenantCopy
	series            int // len(Partition.series): the range of idRec.series
	ids               []rememberedID
	counters          []seriesCounters // every series', in one block without pointers
	rates             []rateEntry      // their non-empty rate cells
	// The blocks the tenants' series, quotas and windows are cut from,
	// kept for reuse.
	seriesBlock []seriesCopy
	quotaBlock  []quotaState
	winBlock    []secWindow
	cellBlock   []secCell
}

type evictedTenant struct {
	key uint64
	at  int64
}

type rememberedID struct {
	key uint64
	rec idRec
}

type tenantCopy struct {
	id              string
	bounds          [3][2]bound
	wm, off         int64
	started, capped bool
	series          []seriesCopy
}

// seriesCopy is a Series as a snapshot holds it: its counters (by index in
// StateCopy.counters), model, quotas and one-minute window.
type seriesCopy struct {
	idx    int32 // in Partition.series
	model  string
	quotas []quotaState
	win    *secWindow
}

// seriesCounters is every counter of a Series that a snapshot holds, by
// value and without a pointer, so that the copy of a million series is a
// memory copy into one block the garbage collector does not scan — but
// for the rate ring, mostly empty, whose non-empty cells go to a block of
// their own (StateCopy.rates). A field
// added to Series that a snapshot must hold goes here (or into
// seriesCopy), into copySeries, encodeSeries and Series.decode, with
// SnapshotVersion raised.
type seriesCounters struct {
	per               [3][2]period
	settled           [3]period
	rate              [2]int32 // the series' non-empty rate cells: StateCopy.rates[rate[0]:rate[1]]
	roll              [rollupSlots]rollup
	holtTok, holtCost forecast.Holt
	lastMin, minTok   int64
	minCost           float64
	early             earlyRate
	health            [2]healthWindow
	probes            [2]probeTally
	spike             spikeState
	lateHour          int64
	prevDirty         [3]bool
	predictDue, other bool
}

// copySeries copies s's counters into c field by field: a composite
// literal would be built on the stack and copied again.
func (c *seriesCounters) copySeries(s *Series, rates []rateEntry) []rateEntry {
	c.rate[0] = int32(len(rates))
	for i := range s.rate {
		if s.rate[i] != (rateCell{}) {
			rates = append(rates, rateEntry{int32(i), s.rate[i]})
		}
	}
	c.rate[1] = int32(len(rates))
	c.per, c.settled, c.roll = s.per, s.settled, s.roll
	c.holtTok, c.holtCost, c.lastMin, c.minTok, c.minCost = s.holtTok, s.holtCost, s.lastMin, s.minTok, s.minCost
	c.early, c.health, c.probes, c.spike = s.early, s.health, s.probes, s.spike
	c.lateHour, c.prevDirty, c.predictDue, c.other = s.lateHour, s.prevDirty, s.predictDue, s.other
	return rates
}

// rateEntry is a non-empty cell of a series' rate ring, by index.
type rateEntry struct {
	i    int32
	cell rateCell
}

// SnapshotCopy returns a copy of everything Snapshot encodes, taken under
// the same conditions, for the copy's Snapshot to encode while p moves on:
// the aggregator takes it on its poll loop and encodes it on a goroutine
// of its own while the partition keeps consuming. The copy is a memory
// copy of the counters (no encoding, no sorting: the copy's Snapshot does
// those); the copy's Snapshot is byte for byte p's at the time of the
// copy.
//
// reuse, if not nil, is an earlier copy whose Snapshot has returned and
// which nothing uses any more: its memory is reused where it is large
// enough. Allocating the copy afresh every interval costs more than the
// copy itself (zeroed memory, page faults, and the garbage collector's
// assists the allocation triggers), so a caller that snapshots
// periodically keeps its last copy — at the price of holding it, about
// 2.8 KB per key (1.9 KB of counters per series, and the quotas), between
// snapshots.
func (p *Partition) SnapshotCopy(reuse *StateCopy) (*StateCopy, error) {
	if err := p.snapshotReady(); err != nil {
		return nil, err
	}
	c := reuse
	if c == nil {
		c = &StateCopy{}
	}
	c.id, c.seed, c.wm, c.lastScan, c.now, c.series = p.id, p.seed, p.wm, p.lastScan, p.now, len(p.series)
	c.overrides = nil
	if len(p.overrides) > 0 {
		c.overrides = make(map[string][]Override, len(p.overrides))
		for tn, ovs := range p.overrides {
			c.overrides[tn] = slices.Clone(ovs)
		}
	}
	c.evicted = c.evicted[:0]
	for k, at := range p.evicted {
		c.evicted = append(c.evicted, evictedTenant{k, at})
	}
	c.held = slices.Clone(p.held) // held events own their attribute maps, which nothing changes
	c.ids = c.ids[:0]
	for k := range p.idOrder.All() {
		c.ids = append(c.ids, rememberedID{k, p.dedup[k]})
	}

	// The series, their quotas and windows each in one block (a handful of
	// allocations instead of millions), in one pass over the state: the
	// blocks of the copy reused are as large as the state was then, and
	// grow when it has grown.
	if reuse == nil {
		// A first copy: size the blocks in a pass of its own rather than
		// grow them, copying, as the state is walked.
		nSeries, nQuotas, nCells, nWins := 0, 0, 0, 0
		for _, t := range p.tenants {
			for _, s := range t.order {
				nSeries++
				nQuotas += len(s.quotas)
				if s.win != nil {
					nWins++
					nCells += len(s.win.cells)
				}
			}
		}
		c.counters, c.seriesBlock = make([]seriesCounters, 0, nSeries), make([]seriesCopy, 0, nSeries)
		c.quotaBlock, c.winBlock, c.cellBlock = make([]quotaState, 0, nQuotas), make([]secWindow, 0, nWins), make([]secCell, 0, nCells)
		c.tenants = make([]tenantCopy, 0, len(p.tenants))
	}
	c.counters, c.rates = c.counters[:0], c.rates[:0]
	series, quotas, wins, cells := c.seriesBlock[:0], c.quotaBlock[:0], c.winBlock[:0], c.cellBlock[:0]
	c.tenants = c.tenants[:0]
	for _, t := range p.tenants {
		c.tenants = append(c.tenants, tenantCopy{id: t.id, bounds: t.bounds, wm: t.wm, off: t.off, started: t.started, capped: t.capped})
		ct := &c.tenants[len(c.tenants)-1]
		from := len(series)
		for _, s := range t.order {
			if len(s.removed) > 0 {
				return nil, errRemovedQuota
			}
			if len(c.counters) == cap(c.counters) {
				c.counters = slices.Grow(c.counters, max(1024, len(c.counters)/2))
			}
			c.counters = c.counters[:len(c.counters)+1]
			c.rates = c.counters[len(c.counters)-1].copySeries(s, c.rates)
			q := len(quotas)
			quotas = append(quotas, s.quotas...)
			cs := seriesCopy{idx: s.idx, model: s.model, quotas: quotas[q:len(quotas):len(quotas)]}
			if s.win != nil {
				k := len(cells)
				cells = append(cells, s.win.cells...)
				wins = append(wins, secWindow{cells: cells[k:len(cells):len(cells)], tok: s.win.tok, req: s.win.req})
				cs.win = &wins[len(wins)-1]
			}
			series = append(series, cs)
		}
		ct.series = series[from:len(series):len(series)]
	}
	c.seriesBlock, c.quotaBlock, c.winBlock, c.cellBlock = series, quotas, wins, cells
	return c, nil
}

// Snapshot appends the snapshot of the copied state to dst under the
// policy fingerprint fp; see Partition.Snapshot. It may be called more
// than once, from any one goroutine at a time.
func (c *StateCopy) Snapshot(dst []byte, fp string) ([]byte, error) {
	slices.SortFunc(c.evicted, func(a, b evictedTenant) int { return cmp.Compare(a.key, b.key) })
	// The counters follow the tenants' series in the order they were
	// copied: sort an index of the tenants, not the tenants.
	order := make([]int, len(c.tenants))
	first := make([]int, len(c.tenants)) // index in counters of each tenant's first series
	n := 0
	for i := range c.tenants {
		order[i], first[i] = i, n
		n += len(c.tenants[i].series)
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(c.tenants[a].id, c.tenants[b].id) })

	e := enc{b: dst}
	start := len(dst)
	e.b = append(e.b, snapshotMagic...)
	e.u(SnapshotVersion)
	e.str(fp)
	e.i(int64(c.id))
	e.b = binary.LittleEndian.AppendUint64(e.b, c.seed)
	e.i(c.wm)
	e.i(c.lastScan)
	e.i(c.now)

	ovs := sortedKeys(c.overrides)
	e.u(uint64(len(ovs)))
	for _, id := range ovs {
		e.str(id)
		e.u(uint64(len(c.overrides[id])))
		for _, o := range c.overrides[id] {
			e.str(o.Model)
			e.str(string(o.Quota))
			e.f(o.Limit)
			e.i(o.Until.UnixNano())
		}
	}

	e.u(uint64(len(c.evicted)))
	for _, ev := range c.evicted {
		e.u(ev.key)
		e.i(ev.at)
	}

	e.u(uint64(len(c.held)))
	for i := range c.held {
		js, err := json.Marshal(&c.held[i].ev)
		if err != nil {
			return dst, fmt.Errorf("tally: snapshot of a held event: %w", err)
		}
		e.bytes(js)
		e.i(c.held[i].offset)
	}

	// ord numbers the series in the order they are written, for the
	// remembered ids' references; -1: a freed slot (evicted tenant).
	ord := make([]int32, c.series)
	for i := range ord {
		ord[i] = -1
	}
	next := int32(0)
	e.u(uint64(len(c.tenants)))
	for _, ti := range order {
		t := &c.tenants[ti]
		e.str(t.id)
		for k := range 3 {
			for j := range 2 {
				e.i(t.bounds[k][j].start)
				e.i(t.bounds[k][j].end)
			}
		}
		e.i(t.wm)
		e.i(t.off)
		e.bool(t.started)
		e.bool(t.capped)
		e.u(uint64(len(t.series)))
		for k := range t.series {
			s := &t.series[k]
			ord[s.idx] = next
			next++
			encodeSeries(&e, s, &c.counters[first[ti]+k], c.rates)
		}
	}

	// The remembered ids, oldest first, so Load rebuilds the FIFO.
	e.u(uint64(len(c.ids)))
	for _, id := range c.ids {
		r := &id.rec
		e.b = binary.LittleEndian.AppendUint64(e.b, id.key)
		e.i(int64(ord[r.series]))
		e.i(r.ts)
		e.i(int64(r.prompt))
		e.i(int64(r.completion))
		e.i(int64(r.cached))
		e.i(int64(r.cacheWrite))
		e.i(int64(r.reasoning))
		e.u(uint64(r.flags))
		e.f(r.cost)
		e.f(r.billed)
	}
	e.b = binary.LittleEndian.AppendUint32(e.b, crc32.ChecksumIEEE(e.b[start:]))
	return e.b, nil
}

func encodeSeries(e *enc, s *seriesCopy, c *seriesCounters, rates []rateEntry) {
	e.str(s.model)
	e.bool(c.other)
	for k := range 3 {
		for j := range 2 {
			e.period(c.per[k][j])
		}
		e.period(c.settled[k])
	}
	// The rate ring is sparse (a cell per minute with events in the last
	// hour): only its non-empty cells, by index.
	own := rates[c.rate[0]:c.rate[1]]
	e.u(uint64(len(own)))
	for _, r := range own {
		e.u(uint64(r.i))
		e.i(int64(r.cell.min))
		e.i(int64(r.cell.req))
		e.i(r.cell.tok)
	}
	for i := range c.roll {
		r := &c.roll[i]
		e.i(r.min)
		for _, v := range [...]int64{r.req, r.prompt, r.completion, r.cached, r.cacheWrite, r.reasoning, r.errs, r.slow} {
			e.i(v)
		}
		e.f(r.cost)
		e.bool(r.dirty)
	}
	for _, h := range [2]*forecast.Holt{&c.holtTok, &c.holtCost} {
		level, trend, dev, n := h.State()
		e.f(level)
		e.f(trend)
		e.f(dev)
		e.i(int64(n))
	}
	e.i(c.lastMin)
	e.i(c.minTok)
	e.f(c.minCost)
	e.i(c.early.first)
	e.i(c.early.last)
	e.i(c.early.next)
	e.i(int64(c.early.req))
	for _, d := range c.early.done {
		e.i(d.tok)
		e.f(d.cost)
		e.i(int64(d.req))
	}
	e.u(uint64(len(s.quotas)))
	for i := range s.quotas {
		q := &s.quotas[i]
		e.str(string(q.q.Name))
		e.bool(q.override)
		e.i(int64(q.tier))
		e.i(int64(q.crossings))
		e.bool(q.exhausted)
		e.i(int64(q.exhaustions))
		e.bool(q.predicted)
		e.i(int64(q.rung))
		e.i(q.announced)
		e.i(q.predAt)
		e.i(q.predLo)
		e.i(q.predHi)
		e.str(q.basis)
		e.i(q.exhaustedAt)
		e.f(q.rate)
		e.i(q.rateUntil)
	}
	for _, h := range c.health {
		e.i(h.start)
		e.i(h.end)
		e.i(int64(h.req))
		e.i(int64(h.bad))
		e.bool(h.fired)
		e.bool(h.firing)
	}
	for _, pr := range c.probes {
		e.i(pr.last)
		e.i(pr.failedAt)
		e.i(int64(pr.passed))
	}
	sp := &c.spike
	e.i(sp.min)
	e.i(sp.tok)
	e.i(int64(sp.req))
	e.i(int64(sp.minutes))
	e.f(sp.baseline)
	e.bool(sp.fired)
	e.bool(sp.firing)
	if s.win == nil {
		e.bool(false)
	} else {
		e.bool(true)
		e.u(uint64(len(s.win.cells)))
		for _, cell := range s.win.cells {
			e.i(cell.sec)
			e.i(cell.tok)
			e.i(cell.req)
		}
		e.i(s.win.tok)
		e.i(s.win.req)
	}
	e.i(c.lateHour)
	for _, d := range c.prevDirty {
		e.bool(d)
	}
	e.bool(c.predictDue)
}

// Load returns the state of partition id stored in data by Snapshot, under
// policy pol whose fingerprint is fp. It answers ErrSnapshotMismatch for a
// snapshot of another format version, fingerprint or partition, or whose
// quotas pol does not give, and ErrSnapshotCorrupt for a damaged one.
// A restart then replays, in replay mode, the distinct stored events at
// and above the offset the snapshot covers, as a rebuild does.
func Load(id int32, opt Options, pol *policy.Policy, fp string, data []byte) (*Partition, error) {
	if len(data) < len(snapshotMagic)+4 || string(data[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: no snapshot header", ErrSnapshotCorrupt)
	}
	body := data[:len(data)-4]
	if crc32.ChecksumIEEE(body) != binary.LittleEndian.Uint32(data[len(data)-4:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrSnapshotCorrupt)
	}
	d := dec{b: body[len(snapshotMagic):]}
	if v := d.u(); v != SnapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrSnapshotMismatch, v, SnapshotVersion)
	}
	if got := d.str(); got != fp {
		return nil, fmt.Errorf("%w: policy fingerprint %q, the policy in force is %q", ErrSnapshotMismatch, got, fp)
	}
	if got := d.i(); got != int64(id) {
		return nil, fmt.Errorf("%w: snapshot of partition %d loaded for %d", ErrSnapshotMismatch, got, id)
	}
	p := New(id, opt)
	p.SetPolicy(pol)
	p.seed = d.u64()
	p.wm, p.lastScan, p.now = d.i(), d.i(), d.i()

	for n := d.count(); n > 0 && d.err == nil; n-- {
		tenant := d.str()
		var ovs []Override
		for m := d.count(); m > 0 && d.err == nil; m-- {
			ovs = append(ovs, Override{Model: d.str(), Quota: schemas.QuotaKind(d.str()), Limit: d.f(), Until: time.Unix(0, d.i())})
		}
		if p.overrides == nil {
			p.overrides = map[string][]Override{}
		}
		p.overrides[tenant] = ovs
	}
	p.nextExpiry()

	for n := d.count(); n > 0 && d.err == nil; n-- {
		k := d.u()
		p.evicted[k] = d.i()
	}

	for n := d.count(); n > 0 && d.err == nil; n-- {
		var h heldEvent
		if js := d.bytes(); d.err == nil {
			if err := json.Unmarshal(js, &h.ev); err != nil {
				return nil, fmt.Errorf("%w: held event: %v", ErrSnapshotCorrupt, err)
			}
		}
		h.offset = d.i()
		if len(p.held) == 0 {
			p.heldMin = math.MaxInt64
		}
		p.held = append(p.held, h)
		p.heldMin = min(p.heldMin, h.ev.Time.Unix())
	}

	for n := d.count(); n > 0 && d.err == nil; n-- {
		t := p.tenant(d.str())
		for k := range 3 {
			for j := range 2 {
				t.bounds[k][j] = bound{d.i(), d.i()}
			}
		}
		t.wm, t.off = d.i(), d.i()
		t.started, t.capped = d.bool(), d.bool()
		for m, i := d.count(), 0; i < m && d.err == nil; i++ {
			model := d.str()
			s := t.all
			switch {
			case i > 0:
				s = p.newSeries(t, model)
				t.models[s.model] = s
			case model != policy.AllModels:
				return nil, fmt.Errorf("%w: tenant %q: first series is %q, not %q", ErrSnapshotCorrupt, t.id, model, policy.AllModels)
			}
			if err := s.decode(&d); err != nil {
				return nil, err
			}
		}
	}

	gone := int32(-1) // a slot that stays empty, for ids of evicted tenants
	for n := d.count(); n > 0 && d.err == nil; n-- {
		k := d.u64()
		o := d.i()
		r := idRec{ts: d.i(), prompt: int32(d.i()), completion: int32(d.i()), cached: int32(d.i()), cacheWrite: int32(d.i()),
			reasoning: int32(d.i()), flags: uint8(d.u()), cost: d.f(), billed: d.f()}
		switch {
		case o >= 0 && o < int64(len(p.series)):
			r.series = int32(o) // Load created the series in the order Snapshot wrote them
		case o == -1:
			if gone < 0 {
				gone = int32(len(p.series))
				p.series = append(p.series, nil)
			}
			r.series = gone
		default:
			return nil, fmt.Errorf("%w: remembered id refers to series %d of %d", ErrSnapshotCorrupt, o, len(p.series))
		}
		p.remember(k, r)
	}
	if d.err != nil {
		return nil, d.err
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes left over", ErrSnapshotCorrupt, len(d.b))
	}
	return p, nil
}

func (s *Series) decode(d *dec) error {
	s.other = d.bool()
	for k := range 3 {
		for j := range 2 {
			s.per[k][j] = d.period()
		}
		s.settled[k] = d.period()
	}
	for n := d.count(); n > 0 && d.err == nil; n-- {
		i := d.u()
		if i >= rateWindow {
			return fmt.Errorf("%w: rate cell %d of %d", ErrSnapshotCorrupt, i, rateWindow)
		}
		s.rate[i] = rateCell{min: int32(d.i()), req: int32(d.i()), tok: d.i()}
	}
	for i := range s.roll {
		r := &s.roll[i]
		r.min = d.i()
		r.req, r.prompt, r.completion, r.cached, r.cacheWrite, r.reasoning, r.errs, r.slow = d.i(), d.i(), d.i(), d.i(), d.i(), d.i(), d.i(), d.i()
		r.cost = d.f()
		r.dirty = d.bool()
	}
	for _, h := range [2]*forecast.Holt{&s.holtTok, &s.holtCost} {
		*h = forecast.HoltFromState(d.f(), d.f(), d.f(), int32(d.i()))
	}
	s.lastMin, s.minTok, s.minCost = d.i(), d.i(), d.f()
	s.early.first, s.early.last, s.early.next, s.early.req = d.i(), d.i(), d.i(), int32(d.i())
	for i := range s.early.done {
		s.early.done[i] = earlyCell{tok: d.i(), cost: d.f(), req: int32(d.i())}
	}
	if n := d.count(); d.err == nil && n != len(s.quotas) {
		return fmt.Errorf("%w: tenant %q model %q has %d quotas in the snapshot, %d under the policy in force", ErrSnapshotMismatch, s.t.id, s.model, n, len(s.quotas))
	}
	for i := range s.quotas {
		q := &s.quotas[i]
		if name, ov := d.str(), d.bool(); d.err == nil && (name != string(q.q.Name) || ov != q.override) {
			return fmt.Errorf("%w: tenant %q model %q: quota %q in the snapshot, %q under the policy in force", ErrSnapshotMismatch, s.t.id, s.model, name, q.q.Name)
		}
		q.tier, q.crossings, q.exhausted, q.exhaustions = int(d.i()), int32(d.i()), d.bool(), int32(d.i())
		q.predicted, q.rung, q.announced = d.bool(), int8(d.i()), d.i()
		q.predAt, q.predLo, q.predHi, q.basis = d.i(), d.i(), d.i(), d.str()
		q.exhaustedAt, q.rate, q.rateUntil = d.i(), d.f(), d.i()
	}
	for i := range s.health {
		s.health[i] = healthWindow{start: d.i(), end: d.i(), req: int32(d.i()), bad: int32(d.i()), fired: d.bool(), firing: d.bool()}
	}
	for i := range s.probes {
		s.probes[i] = probeTally{last: d.i(), failedAt: d.i(), passed: int32(d.i())}
	}
	s.spike = spikeState{min: d.i(), tok: d.i(), req: int32(d.i()), minutes: int32(d.i()), baseline: d.f(), fired: d.bool(), firing: d.bool()}
	if hasWin := d.bool(); hasWin != (s.win != nil) && d.err == nil {
		return fmt.Errorf("%w: tenant %q model %q: one-minute window present %v in the snapshot, %v under the policy in force", ErrSnapshotMismatch, s.t.id, s.model, hasWin, s.win != nil)
	} else if hasWin {
		w := s.win
		w.cells = w.cells[:0]
		for n := d.count(); n > 0 && d.err == nil; n-- {
			w.cells = append(w.cells, secCell{sec: d.i(), tok: d.i(), req: d.i()})
		}
		w.tok, w.req = d.i(), d.i()
	}
	s.lateHour = d.i()
	for i := range s.prevDirty {
		s.prevDirty[i] = d.bool()
	}
	s.predictDue = d.bool()
	return d.err
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// enc appends a snapshot's fields: integers as varints, floats as their
// 8 bits-exact bytes (a snapshot must reproduce the state exactly).
type enc struct{ b []byte }

func (e *enc) i(v int64)    { e.b = binary.AppendVarint(e.b, v) }
func (e *enc) u(v uint64)   { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) f(v float64)  { e.b = binary.LittleEndian.AppendUint64(e.b, math.Float64bits(v)) }
func (e *enc) str(v string) { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *enc) bytes(v []byte) {
	e.u(uint64(len(v)))
	e.b = append(e.b, v...)
}
func (e *enc) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *enc) period(v period) {
	e.i(v.tokens)
	e.i(v.requests)
	e.f(v.cost)
	e.f(v.billed)
	e.i(v.cached)
	e.i(v.cacheWrite)
	e.i(v.reasoning)
}

// dec reads what enc wrote. The first error sticks (later reads return
// zeros), so a decoder checks err once per record.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated %s", ErrSnapshotCorrupt, what)
	}
	d.b = nil
}

func (d *dec) i() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length, refusing one larger than the bytes left (each
// element takes at least one byte), so a damaged length cannot make the
// decoder allocate without bound.
func (d *dec) count() int {
	n := d.u()
	if n > uint64(len(d.b)) {
		d.fail("length")
		return 0
	}
	return int(n)
}

// fixed64 reads the 8 little-endian bytes that enc writes for a hash or a
// float's bits; what names them when they are missing.
func (d *dec) fixed64(what string) uint64 {
	if len(d.b) < 8 {
		d.fail(what)
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *dec) u64() uint64 { return d.fixed64("hash") }

func (d *dec) f() float64 { return math.Float64frombits(d.fixed64("float")) }

func (d *dec) bytes() []byte {
	n := d.count()
	if d.err != nil {
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string { return string(d.bytes()) }

func (d *dec) bool() bool {
	if len(d.b) < 1 {
		d.fail("bool")
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v != 0
}

func (d *dec) period() period {
	return period{tokens: d.i(), requests: d.i(), cost: d.f(), billed: d.f(), cached: d.i(), cacheWrite: d.i(), reasoning: d.i()}
}

// Policy returns the policy the state applies (SetPolicy's latest).
func (p *Partition) Policy() *policy.Policy { return p.pol }

// OverriddenTenants returns the tenants with overrides in force in the
// state, sorted: after Load, the caller lifts those no longer in force.
func (p *Partition) OverriddenTenants() []string { return sortedKeys(p.overrides) }
