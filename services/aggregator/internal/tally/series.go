package tally

import (
	"math"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/services/aggregator/internal/forecast"
)

// Period kinds, as array indexes. Minute quotas (TPM, RPM) are evaluated on
// the rate ring instead of a period total.
const (
	kindHour = iota
	kindDay
	kindMonth
	kindMinute
)

var periodNames = [...]schemas.Period{schemas.PeriodHour, schemas.PeriodDay, schemas.PeriodMonth, schemas.PeriodMinute}

func kindOf(period schemas.Period) int8 {
	for i, n := range periodNames {
		if n == period {
			return int8(i)
		}
	}
	return -1
}

// rateWindow is how many minutes the rate ring covers: the longest sliding
// window (60 minutes).
const rateWindow = 60

// rollupSlots is how many recent minutes keep full rollups in memory. An
// event for an older minute is repaired in ClickHouse from the raw events
// (see LateMinute) instead of holding an hour of rollups per series.
const rollupSlots = 4

type bound struct{ start, end int64 }

// tenant groups a tenant's series, its policy and its period boundaries,
// which all its series share: a tenant's periods roll over at its first
// event past the boundary, whichever model that event is for.
type tenant struct {
	id     string
	all    *Series
	models map[string]*Series
	order  []*Series // all first, then by first appearance: a deterministic order

	pol *policy.Policy
	tp  *policy.Tenant
	loc *time.Location
	// billingDay starts the tenant's months (policy.Tenant.BillingDay).
	billingDay int
	tiers      []int

	bounds  [3][2]bound // kind × (current, previous)
	wm      int64       // latest event time, unix seconds
	off     int64       // offset of the latest event, for signals of a re-evaluation
	started bool
	// capped: the tenant has folded a model into OtherModel since it was
	// created here, so the first fold is reported once (Options.OnFold).
	capped bool
}

func (t *tenant) eventTime(ts int64) time.Time { return time.Unix(ts, 0).UTC() }

// refresh installs the tenant's effective policy: pol's (or the built-in
// defaults) with the partition's active overrides laid over its quotas.
// It returns whether any series' quotas or the tiers changed.
func (t *tenant) refresh(pol *policy.Policy, p *Partition) (changed bool) {
	t.pol = pol
	if pol != nil {
		t.tp = pol.Tenant(t.id)
	} else {
		t.tp = policy.DefaultTenant(t.id)
	}
	loc := t.tp.Location
	if loc == nil {
		loc = time.UTC
	}
	moved := t.loc != nil && (t.loc.String() != loc.String() || t.billingDay != t.tp.BillingDay)
	t.loc, t.billingDay = loc, t.tp.BillingDay
	if moved && t.started {
		// A new time zone or billing day moves the boundaries; totals so
		// far stay with the period that contains the latest event.
		for k := range 3 {
			t.bounds[k][0] = t.boundsOf(k, t.wm)
		}
	}
	tiers := append([]int(nil), t.tp.AlertTiers...)
	sort.Ints(tiers)
	changed = !slices.Equal(tiers, t.tiers)
	t.tiers = tiers
	for _, s := range t.order {
		if s.setQuotas(p.quotas(t, s.model)) {
			changed = true
		}
	}
	return changed
}

// series returns the series that counts model: its own, or, when the
// tenant already counts max_models models on their own and its policy does
// not name this one, the tenant's OtherModel bucket (folded true). Models
// the policy names always get their own series, so that their quotas
// apply. The bucket does not count toward the cap.
func (t *tenant) series(model string, p *Partition) (s *Series, folded bool) {
	if s, ok := t.models[model]; ok {
		return s, false
	}
	own := len(t.models)
	if o, ok := t.models[policy.OtherModel]; ok && o.other {
		own--
	}
	if own >= t.maxModels() {
		if _, named := t.tp.Models[model]; !named {
			o, ok := t.models[policy.OtherModel]
			if !ok {
				o = p.newSeries(t, policy.OtherModel)
				o.other = true
				t.models[o.model] = o
			}
			return o, true
		}
	}
	s = p.newSeries(t, string([]byte(model)))
	t.models[s.model] = s
	return s, false
}

func (t *tenant) maxModels() int {
	if t.tp == nil || t.tp.MaxModels < 1 {
		return policy.DefaultMaxModels
	}
	return t.tp.MaxModels
}

// boundsOf is the period of kind that contains ts in the tenant's
// calendar (its zone and billing day).
func (t *tenant) boundsOf(kind int, ts int64) bound {
	cal := policy.Tenant{Location: t.loc, BillingDay: t.billingDay}
	s, e := cal.PeriodBounds(periodNames[kind], time.Unix(ts, 0))
	return bound{s.Unix(), e.Unix()}
}

// advance moves the tenant's periods forward to contain ts, resetting every
// series' totals and quota state for the periods that rolled over.
func (t *tenant) advance(ts, offset int64, p *Partition) {
	if !t.started {
		for k := range 3 {
			t.bounds[k][0] = t.boundsOf(k, ts)
		}
		t.started, t.wm = true, ts
		return
	}
	if ts <= t.wm {
		return
	}
	t.wm = ts
	for k := range 3 {
		if ts < t.bounds[k][0].end {
			continue
		}
		// The previous period leaves memory now. If it changed since the
		// last Drain (it closed, or a late event reached it, and no flush
		// came between — one flush may span hours of event time when the
		// aggregator catches up), its final rows are kept for the next
		// Drain: nothing will write that period from memory again.
		for _, s := range t.order {
			if s.prevDirty[k] && !p.restoring {
				for i := range s.quotas {
					if q := &s.quotas[i]; int(q.kind) == k {
						p.closed = append(p.closed, s.quotaRow(q, 1))
					}
				}
			}
		}
		t.bounds[k][1] = t.bounds[k][0]
		t.bounds[k][0] = t.boundsOf(k, ts)
		for _, s := range t.order {
			s.per[k][1], s.per[k][0] = s.per[k][0], period{}
			s.settled[k] = period{}
			// The closed period's final totals may not be written yet.
			s.prevDirty[k] = true
			for i := range s.quotas {
				q := &s.quotas[i]
				if q.kind != int8(k) {
					continue
				}
				p.emit(s.periodReset(q, ts, offset))
				q.resetPeriod()
			}
			p.markDirty(s)
		}
	}
}

// evaluate updates quota state after an event counted in s (and so in the
// tenant-wide series).
func (t *tenant) evaluate(s *Series, ts, offset int64, p *Partition) {
	for _, x := range [2]*Series{s, t.all} {
		if x.predictDue {
			x.predict(ts, offset, p)
			x.predictDue = false
		}
		for i := range x.quotas {
			x.evalQuota(&x.quotas[i], ts, offset, p)
		}
	}
}

type period struct {
	tokens, requests int64
	cost             float64
	// billed is tokens in billed-equivalent tokens (policy, "Billed-
	// equivalent tokens"), which quotas with count: billed read.
	billed float64
	// cached, cacheWrite and reasoning are the token types among tokens,
	// which quota_state rows carry.
	cached, cacheWrite, reasoning int64
}

type rateCell struct {
	min int32 // unix minute; int32 lasts until the year 6053
	req int32
	tok int64
}

type rollup struct {
	min                                         int64
	req, prompt, completion, cached, errs, slow int64
	cacheWrite, reasoning                       int64
	cost                                        float64
	dirty                                       bool
}

// Series is the state of one tenant × model, or of a tenant × "*" (all its
// models together).
type Series struct {
	t     *tenant
	model string
	idx   int32 // in Partition.series

	per [3][2]period // kind × (current, previous), aligned with t.bounds
	// settled is per[k][0] without unsettled estimates: what predictions
	// measure the remaining quota against, so that a state rebuilt from
	// ClickHouse (which holds settlements, not the estimates they
	// replaced) predicts, and announces, exactly what the original did.
	settled [3]period
	rate    [rateWindow]rateCell
	roll    [rollupSlots]rollup

	// Exhaustion prediction runs on completed minutes: minTok and minCost
	// accumulate lastMin until an event of a later minute completes it.
	holtTok, holtCost forecast.Holt
	lastMin           int64
	minTok            int64
	minCost           float64
	// early holds the recent minutes for the first prediction (early.go).
	early earlyRate

	quotas []quotaState

	health [2]healthWindow // by detErr, detSlow
	probes [2]probeTally   // by detErr, detSlow
	spike  spikeState

	priceFor            *policy.Policy
	priceFrom, priceEnd int64
	price               policy.Price
	priceOK             bool

	// removed holds quotas the policy dropped while they had a tier, until
	// a re-evaluation takes that tier down.
	removed []quotaState

	// win is the sliding one-minute window (window.go), kept only while
	// the series has a one-minute quota.
	win *secWindow

	lateHour   int64
	prevDirty  [3]bool
	dirty      bool
	predictDue bool
	// other: this is the tenant's bucket for models beyond its max_models
	// (policy "Model cardinality"), not one model's series.
	other bool
}

func (p *Partition) newSeries(t *tenant, model string) *Series {
	s := &Series{t: t, model: model}
	if n := len(p.free); n > 0 {
		s.idx, p.free = p.free[n-1], p.free[:n-1]
		p.series[s.idx] = s
	} else {
		s.idx = int32(len(p.series))
		p.series = append(p.series, s)
	}
	t.order = append(t.order, s)
	if t.tp != nil {
		s.setQuotas(p.quotas(t, model))
	}
	return s
}

// setQuotas installs the policy's quotas, keeping the state of those that
// are still there so a policy reload does not re-announce crossed tiers.
// Quotas that went away are kept in removed, so that a re-evaluation can
// take their tiers down. It reports whether anything changed.
func (s *Series) setQuotas(qs []quotaSpec) (changed bool) {
	old := s.quotas
	s.quotas = make([]quotaState, 0, len(qs))
	kept := 0
	for _, spec := range qs {
		q := spec.q
		k := kindOf(q.Period)
		if k < 0 || (q.Limit <= 0 && !spec.override) {
			continue
		}
		st := quotaState{q: q, kind: k, override: spec.override}
		found := false
		for _, o := range old {
			if o.q.Name == q.Name {
				st = o
				st.q, st.override = q, spec.override
				found = true
				if o.q != q || o.override != spec.override {
					changed = true
				}
			}
		}
		if found {
			kept++
		} else {
			changed = true
		}
		s.quotas = append(s.quotas, st)
	}
	if kept < len(old) {
		changed = true
		for _, o := range old {
			if !slices.ContainsFunc(s.quotas, func(n quotaState) bool { return n.q.Name == o.q.Name }) && o.tier > 0 {
				s.removed = append(s.removed, o)
			}
		}
	}
	// The sliding window exists while a one-minute quota does; one added
	// by a reload starts empty (it sees the events from then on).
	perMinute := slices.ContainsFunc(s.quotas, func(q quotaState) bool { return q.kind == kindMinute })
	switch {
	case perMinute && s.win == nil:
		s.win = &secWindow{}
	case !perMinute:
		s.win = nil
	}
	return changed
}

func (s *Series) addPeriods(r *idRec, sign int64, p *Partition) {
	tok := (int64(r.prompt) + int64(r.completion)) * sign
	cost, billed := r.cost*float64(sign), r.billed*float64(sign)
	for k := range 3 {
		b := &s.t.bounds[k]
		var pp *period
		switch {
		case r.ts >= b[0].start:
			pp = &s.per[k][0]
		case b[1].end != 0 && r.ts >= b[1].start && r.ts < b[1].end:
			pp = &s.per[k][1]
			s.prevDirty[k] = true
		default:
			// Older than the state keeps: have the writer recompute the
			// period's quota rows from the raw events.
			s.repairPeriod(k, r.ts, p)
			continue
		}
		pp.tokens += tok
		pp.requests += sign
		pp.cost += cost
		pp.billed += billed
		pp.cached += int64(r.cached) * sign
		pp.cacheWrite += int64(r.cacheWrite) * sign
		pp.reasoning += int64(r.reasoning) * sign
		if pp == &s.per[k][0] && r.flags&flagEstimated == 0 {
			st := &s.settled[k]
			st.tokens += tok
			st.requests += sign
			st.cost += cost
			st.billed += billed
		}
	}
}

func floorDiv60(ts int64) int64 {
	if ts >= 0 {
		return ts / 60
	}
	return (ts - 59) / 60
}

func (s *Series) addMinute(r *idRec, sign int64, p *Partition) {
	m := floorDiv60(r.ts)
	tok := (int64(r.prompt) + int64(r.completion)) * sign
	if s.win != nil {
		wreq := sign
		if r.flags&flagRejected != 0 {
			wreq = 0
		}
		s.win.add(r.ts, tok, wreq)
	}
	// Requests the gateway refused are not requests served: they stay out
	// of requests_per_minute (the rollup below still counts them, as the
	// raw events do).
	req := int32(sign)
	if r.flags&flagRejected != 0 {
		req = 0
	}

	if c := &s.rate[m%rateWindow]; int64(c.min) == m {
		c.req += req
		c.tok += tok
	} else if m > int64(c.min) {
		*c = rateCell{min: int32(m), req: req, tok: tok}
	}

	// The predictor sees settled consumption only: an estimate is replaced
	// by its settlement, and a rebuild from ClickHouse sees only the
	// settlement, so predictions must not depend on estimates to replay
	// identically.
	if r.flags&flagEstimated == 0 {
		if s.lastMin == 0 {
			s.lastMin = m
		}
		if m > s.lastMin {
			s.completeMinutes(m)
		}
		if m == s.lastMin {
			s.early.see(r.ts)
			s.minTok += tok
			s.minCost += r.cost * float64(sign)
			if tok != 0 {
				s.early.req += int32(sign)
			}
			if r.ts >= s.early.next {
				// Between minute boundaries the rates re-predict every
				// earlyEvery seconds of event time.
				s.early.next = r.ts + earlyEvery
				s.predictDue = true
			}
		}
	}

	rl := &s.roll[m%rollupSlots]
	if rl.min != m {
		if m < rl.min {
			// The bucket of folded models cannot be recomputed from the raw
			// events (they keep the real model names): its late minute is
			// not repaired. The tenant's "*" minute is.
			if !p.restoring && !s.other {
				p.repairs = append(p.repairs, LateMinute{Tenant: s.t.id, Model: s.model, Minute: time.Unix(m*60, 0).UTC()})
			}
			return
		}
		if rl.dirty && !p.restoring {
			p.minutes = append(p.minutes, rl.row(s))
		}
		*rl = rollup{min: m}
	}
	rl.req += sign
	rl.prompt += int64(r.prompt) * sign
	rl.completion += int64(r.completion) * sign
	rl.cached += int64(r.cached) * sign
	rl.cacheWrite += int64(r.cacheWrite) * sign
	rl.reasoning += int64(r.reasoning) * sign
	if r.flags&flagError != 0 {
		rl.errs += sign
	}
	if r.flags&flagSlow != 0 {
		rl.slow += sign
	}
	rl.cost += r.cost * float64(sign)
	rl.dirty = true
}

// completeMinutes feeds the predictors the minutes from lastMin up to m,
// idle ones as zero; after an idle hour they start over.
func (s *Series) completeMinutes(m int64) {
	gap := m - s.lastMin
	s.early.complete(s.lastMin, m, s.minTok, s.minCost)
	s.holtTok.Observe(float64(s.minTok))
	s.holtCost.Observe(s.minCost)
	if gap > rateWindow {
		s.holtTok.Reset()
		s.holtCost.Reset()
	} else {
		for i := int64(1); i < gap; i++ {
			s.holtTok.Observe(0)
			s.holtCost.Observe(0)
		}
	}
	s.lastMin, s.minTok, s.minCost = m, 0, 0
	s.predictDue = true
}

// cost prices tokens of the series' model at ts, at the policy's
// unpriced_price when no price is in force (policy.CostSpan), and weighs
// them into billed-equivalent tokens with the same price; priced says
// whether a price was in force.
func (s *Series) cost(p *Partition, ts int64, tok policy.Tokens) (cost, billed float64, priced bool) {
	if s.priceFor != p.pol || ts < s.priceFrom || ts >= s.priceEnd {
		s.priceFor = p.pol
		s.price, s.priceOK, s.priceFrom, s.priceEnd = p.pol.CostSpan(s.model, ts)
	}
	return s.price.Cost(tok), s.price.BilledTokens(tok), s.priceOK
}

// costOf is cost without a series' cache: for events folded into the
// OtherModel bucket, which must cost what their real model costs so the
// tenant's budget stays exact.
func (p *Partition) costOf(model string, ts int64, tok policy.Tokens) (cost, billed float64, priced bool) {
	pr, ok, _, _ := p.pol.CostSpan(model, ts)
	return pr.Cost(tok), pr.BilledTokens(tok), ok
}

// windowRate returns tokens and requests per minute over the last minutes
// minutes ending with the series' latest minute.
func (s *Series) windowRate(minutes int) (tok, req float64) {
	if minutes < 1 || minutes > rateWindow {
		return 0, 0
	}
	latest := s.lastMin
	for _, c := range s.rate {
		if int64(c.min) > latest-int64(minutes) && int64(c.min) <= latest {
			tok += float64(c.tok)
			req += float64(c.req)
		}
	}
	return tok / float64(minutes), req / float64(minutes)
}

// observedTokenRate is the tokens of the last complete minute, or of the
// minute in progress when none completed yet (a lower bound).
func (s *Series) observedTokenRate() float64 {
	var cur, prev float64
	for _, c := range s.rate {
		switch int64(c.min) {
		case s.lastMin:
			cur = float64(c.tok)
		case s.lastMin - 1:
			prev = float64(c.tok)
		}
	}
	if prev > 0 {
		return prev
	}
	return cur
}

func (rl *rollup) row(s *Series) MinuteRow {
	return MinuteRow{
		Tenant: s.t.id, Model: s.model, Minute: time.Unix(rl.min*60, 0).UTC(),
		Requests: clampU(rl.req), PromptTokens: clampU(rl.prompt), CompletionTokens: clampU(rl.completion),
		CachedTokens: clampU(rl.cached), Errors: clampU(rl.errs), SlowCalls: clampU(rl.slow), Cost: math.Max(rl.cost, 0),
		CacheWriteTokens: clampU(rl.cacheWrite), ReasoningTokens: clampU(rl.reasoning),
	}
}

func clampU(v int64) uint64 {
	if v < 0 {
		return 0
	}
	return uint64(v)
}

func (s *Series) repairPeriod(k int, ts int64, p *Partition) {
	if p.restoring {
		return // ClickHouse holds the restored tenant's rows already
	}
	var b bound
	for i := range s.quotas {
		q := &s.quotas[i]
		if int(q.kind) != k {
			continue
		}
		if b.end == 0 {
			b = s.t.boundsOf(k, ts)
		}
		p.quotaRepairs = append(p.quotaRepairs, QuotaRow{
			Tenant: s.t.id, Model: s.model, Quota: string(q.q.Name), Period: string(q.q.Period),
			PeriodStart: time.Unix(b.start, 0).UTC(), PeriodEnd: time.Unix(b.end, 0).UTC(),
			Limit: q.q.Limit, Unit: string(q.q.Unit), Mode: string(q.q.Mode), Billed: q.q.Billed,
		})
	}
}
