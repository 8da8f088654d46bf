package tally

import (
	"math"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/schemas"
)

// quotaSpec is one quota as it applies to a series: the policy's, or an
// operator override's limit laid over it (which may be 0: blocked).
type quotaSpec struct {
	q        policy.Quota
	override bool
}

// quotaState is one quota of a series in its current period.
type quotaState struct {
	q        policy.Quota
	kind     int8
	override bool // q.Limit is an operator override's

	tier        int
	crossings   int32 // tier crossings this period, part of signal ids
	fromTier    int   // the tier before the last crossing (AnnounceRestored)
	exhausted   bool
	exhaustions int32 // times exhausted this period (again after a raised limit), part of signal ids

	// predicted: an exhaustion_predicted was announced and not cleared
	// since; rung is the lead-time rung it announced (predictionRungs),
	// announced the predicted time it named.
	predicted bool
	rung      int8
	announced int64
	// changing is the event second from which a change that is not urgent
	// (a later prediction, a withdrawal) has held without a break; 0 when
	// none is pending. It is news only once it held predictionDwell.
	changing int64
	// predAt is when the quota is predicted to run out, unix seconds; 0 =
	// no prediction within the period. Once the quota is used up it is
	// exhaustedAt, never a time ahead: "runs out at" a future time for a
	// tenant already over its limit would tell the operator it has time.
	// predLo and predHi bound it (earliest and latest plausible; predHi 0:
	// not within the period); basis says what it rests on (BasisRates,
	// BasisForecast).
	predAt         int64
	predLo, predHi int64
	basis          string
	exhaustedAt    int64 // event time of the event that used the quota up; 0 = not exhausted
	rate           float64

	// rateUntil is the end of the throttle the last rate_exceeded asked
	// for (unix seconds of event time): no new signal before it.
	rateUntil int64
}

func (q *quotaState) resetPeriod() {
	q.tier, q.crossings, q.fromTier, q.exhausted, q.exhaustions = 0, 0, 0, false, 0
	q.predicted, q.predAt, q.predLo, q.predHi, q.basis, q.exhaustedAt = false, 0, 0, 0, "", 0
}

func (s *Series) used(q *quotaState, j int) float64 { return q.of(&s.per[q.kind][j]) }

// of is what pp counts in q's unit.
func (q *quotaState) of(pp *period) float64 {
	switch q.q.Unit {
	case schemas.UnitCurrency:
		return pp.cost
	case schemas.UnitRequests:
		return float64(pp.requests)
	}
	if q.q.Billed {
		return pp.billed
	}
	return float64(pp.tokens)
}

// tokenScale is what one token of the token rate counts in q: the
// settled period's billed-to-total ratio for a billed quota (the pace of
// billed-equivalent tokens at the period's mix so far), 1 otherwise.
func (s *Series) tokenScale(q *quotaState) float64 {
	st := &s.settled[q.kind]
	if !q.q.Billed || st.tokens <= 0 || st.billed <= 0 {
		return 1
	}
	return st.billed / float64(st.tokens)
}

// base fills what every quota signal of s carries.
func (s *Series) base(kind schemas.SignalKind, q *quotaState, b bound, ts, offset int64, used float64) schemas.Signal {
	return schemas.Signal{
		Kind:        kind,
		Time:        time.Unix(ts, 0).UTC(),
		Tenant:      s.t.id,
		Model:       s.model,
		Quota:       q.q.Name,
		Period:      q.q.Period,
		PeriodStart: time.Unix(b.start, 0).UTC(),
		PeriodEnd:   time.Unix(b.end, 0).UTC(),
		Tier:        q.tier,
		Used:        math.Max(used, 0),
		Limit:       q.q.Limit,
		Unit:        q.q.Unit,
		Rate:        q.rate,
		Mode:        schemas.Mode(q.q.Mode),
		Source:      schemas.SignalSource{FromOffset: offset, ToOffset: offset},
	}
}

func (s *Series) id(kind schemas.SignalKind, q *quotaState, start int64, extra ...string) string {
	parts := append([]string{string(kind), s.t.id, s.model, string(q.q.Name), time.Unix(start, 0).UTC().Format(time.RFC3339)}, extra...)
	return schemas.SignalID(parts...)
}

// exhaustion is the signal of q's latest exhaustion in b. Its id counts
// the exhaustions of the period (the first keeps the id without the
// count), so that one after a raised limit is not a replay of the first.
func (s *Series) exhaustion(q *quotaState, b bound, ts, offset int64, used float64) schemas.Signal {
	sig := s.base(schemas.SignalQuotaExhausted, q, b, ts, offset, used)
	sig.ID = s.id(sig.Kind, q, b.start)
	if q.exhaustions > 1 {
		sig.ID = s.id(sig.Kind, q, b.start, strconv.Itoa(int(q.exhaustions)))
	}
	sig.Reason = string(q.q.Name) + " exhausted (" + string(q.q.Mode) + ")"
	return sig
}

func (s *Series) periodReset(q *quotaState, ts, offset int64) schemas.Signal {
	b := s.t.bounds[q.kind][0]
	sig := s.base(schemas.SignalPeriodReset, q, b, ts, offset, 0)
	sig.Tier, sig.PreviousTier, sig.Rate = 0, q.tier, 0
	sig.ID = s.id(sig.Kind, q, b.start)
	sig.Reason = string(q.q.Name) + " period began; usage restarts from zero"
	return sig
}

func (s *Series) evalQuota(q *quotaState, ts, offset int64, p *Partition) {
	if q.kind == kindMinute {
		s.evalRate(q, ts, offset, p)
		return
	}
	b := s.t.bounds[q.kind][0]
	used := s.used(q, 0)
	pct := policy.Percent(used, q.q.Limit)
	if q.q.Limit <= 0 {
		pct = math.Inf(1) // an override of 0: blocked at once
	}
	nt := policy.NextTier(s.t.tiers, pct, q.tier, p.opt.Hysteresis)
	if nt != q.tier {
		prev := q.tier
		q.tier, q.fromTier = nt, prev
		q.crossings++
		sig := s.base(schemas.SignalTierCrossed, q, b, ts, offset, used)
		sig.PreviousTier = prev
		sig.Direction = schemas.DirectionUp
		if nt < prev {
			sig.Direction = schemas.DirectionDown
		}
		sig.ID = s.id(sig.Kind, q, b.start, strconv.Itoa(prev), strconv.Itoa(nt), strconv.Itoa(int(q.crossings)))
		sig.Reason = string(q.q.Name) + " at " + strconv.FormatFloat(pct, 'f', 1, 64) + "% of its limit"
		if q.override {
			sig.Reason += " (an operator override's limit of " + strconv.FormatFloat(q.q.Limit, 'f', -1, 64) + ")"
			if q.q.Limit <= 0 {
				sig.Reason = string(q.q.Name) + " blocked: an operator override set its limit to 0"
			}
		}
		p.emit(sig)
	}
	if used >= q.q.Limit {
		if q.exhaustedAt == 0 {
			q.exhaustedAt = ts
		}
		q.predAt, q.predLo, q.predHi, q.predicted = q.exhaustedAt, q.exhaustedAt, q.exhaustedAt, false
	} else if q.exhaustedAt != 0 {
		// Back under the limit (an estimate settled lower, a limit raised):
		// the next prediction starts afresh.
		if q.predAt == q.exhaustedAt {
			q.predAt, q.predLo, q.predHi = 0, 0, 0
		}
		q.exhaustedAt = 0
	}
	if used < q.q.Limit && q.exhausted && q.tier < 100 {
		// Back under a raised limit: a later exhaustion is news again.
		q.exhausted = false
	}
	if used >= q.q.Limit && !q.exhausted {
		q.exhausted = true
		q.exhaustions++
		p.emit(s.exhaustion(q, b, ts, offset, used))
	}
}

func (s *Series) evalRate(q *quotaState, ts, offset int64, p *Partition) {
	if s.win == nil {
		return
	}
	requests := q.q.Unit == schemas.UnitRequests
	used := float64(s.win.used(requests))
	if used <= q.q.Limit || ts < q.rateUntil {
		return // under, or over with its signal's throttle still running
	}
	// Throttled until the window is back under the limit with nothing
	// more counted; a tenant still over then is signalled again.
	q.rateUntil = max(s.win.under(q.q.Limit, requests), ts+1)
	b := bound{ts - windowSeconds + 1, q.rateUntil}
	sig := s.base(schemas.SignalRateExceeded, q, b, ts, offset, used)
	sig.Tier = 0
	sig.Rate = used
	sig.ID = s.id(sig.Kind, q, ts)
	t5, r5 := s.windowRate(5)
	t60, r60 := s.windowRate(60)
	sig.Attributes = map[string]string{
		"tokens_per_minute_5m":    strconv.FormatFloat(t5, 'f', 1, 64),
		"tokens_per_minute_60m":   strconv.FormatFloat(t60, 'f', 1, 64),
		"requests_per_minute_5m":  strconv.FormatFloat(r5, 'f', 2, 64),
		"requests_per_minute_60m": strconv.FormatFloat(r60, 'f', 2, 64),
	}
	sig.Reason = string(q.q.Name) + " over its limit in the last 60 s"
	p.emit(sig)
}

// predict runs when a minute completed and every earlyEvery seconds of
// event time between: for each period quota, when does it run out at the
// current pace (early.go), and should the alerter hear about it?
func (s *Series) predict(ts, offset int64, p *Partition) {
	now := s.early.last // the latest settled event: what the rates and forecast have seen
	if now == 0 {
		now = s.lastMin * 60
	}
	for i := range s.quotas {
		q := &s.quotas[i]
		if q.kind == kindMinute || q.q.Unit == schemas.UnitRequests {
			continue
		}
		used := s.used(q, 0)
		b := s.t.bounds[q.kind][0]
		// The prediction counts settled use only (see Series.settled);
		// the signals carry the use with estimates, like the others.
		settled := q.of(&s.settled[q.kind])
		if settled >= q.q.Limit {
			// Already out: the prediction is the time it ran out, and the
			// quota_exhausted signal clears the alerter's prediction.
			q.predAt, q.predLo, q.predHi, q.predicted = q.exhaustedAt, q.exhaustedAt, q.exhaustedAt, false
			continue
		}
		scale := s.tokenScale(q)
		est, ok := s.forecastExhaustion(q.q.Unit == schemas.UnitCurrency, (q.q.Limit-settled)/scale)
		est.rate *= scale
		q.rate = est.rate
		q.predAt, q.predLo, q.predHi, q.basis = 0, 0, 0, ""
		left := float64(b.end-now) / 60
		if ok && est.mins <= left {
			q.predAt = now + int64(est.mins*60)
			q.predLo = now + int64(est.earliest*60)
			if est.latest <= left {
				q.predHi = now + int64(math.Ceil(est.latest*60))
			}
			q.basis = est.basis
		}
		switch s.predictionNews(q, est, ok, now, math.Min(p.opt.Horizon.Minutes(), left)) {
		case newsOn:
			q.rung, q.announced = rungOf(time.Duration(est.mins*float64(time.Minute))), q.predAt
			s.announcePrediction(q, b, ts, offset, used, p, true)
		case newsOff:
			s.announcePrediction(q, b, ts, offset, used, p, false)
		}
	}
}

// News a prediction may be.
const (
	newsNone = iota
	newsOn   // announce the prediction in q
	newsOff  // withdraw the prediction announced
)

// predictionDwell is how many seconds of event time a change that is not
// urgent must hold before it is announced: a forecast that swings with
// each minute of a tenant that was just blocked must not page on every
// swing (issue 31: four signals in 30 s for one monthly quota).
const predictionDwell = 60

// predictionNews decides whether the estimate est (ok false: none) is news
// against what was announced for q, with hysteresis on range and time:
//
//   - A first prediction within the horizon (window, in minutes) is news
//     at once: a runaway must be predicted within seconds.
//   - A prediction that moved sooner is news at once when it is at least a
//     rung sooner and the announced time is later than its latest
//     plausible time (the alerter may raise its severity); so is one whose
//     announced time passed without the quota running out.
//   - A prediction that moved later is news when it is at least two rungs
//     later and the announced time is earlier than its earliest plausible
//     time — the announcement is no longer within the uncertainty — and
//     that held for predictionDwell.
//   - The prediction is withdrawn when there is no estimate, or even its
//     earliest plausible time lies beyond a quarter past the horizon, and
//     that held for predictionDwell.
//
// A change within the announced prediction's uncertainty is no news.
func (s *Series) predictionNews(q *quotaState, est estimate, ok bool, now int64, window float64) int {
	if !q.predicted {
		q.changing = 0
		if ok && est.mins <= window {
			return newsOn
		}
		return newsNone
	}
	r := rungOf(time.Duration(est.mins * float64(time.Minute)))
	var urgent, change bool
	switch {
	case !ok || est.earliest > window*1.25:
		change = true
	case est.mins > window:
		// Between the horizon and a quarter past it: neither news nor a
		// withdrawal, so that a prediction at the horizon's edge holds.
	case now >= q.announced:
		urgent = true
	case r < q.rung && q.predHi != 0 && q.predHi < q.announced:
		urgent = true
	case r > q.rung+1 && q.predLo > q.announced:
		change = true
	}
	if urgent {
		q.changing = 0
		return newsOn
	}
	if !change {
		q.changing = 0
		return newsNone
	}
	if q.changing == 0 {
		q.changing = now
	}
	if now-q.changing < predictionDwell {
		return newsNone
	}
	q.changing = 0
	if !ok || est.mins > window {
		return newsOff
	}
	return newsOn
}

// predictionRungs are the lead times, in minutes, at which a prediction
// is announced again when it moves between them. They include the
// alerter's default warning and critical horizons (30 and 10 minutes) so
// that its severity follows the prediction.
var predictionRungs = [...]int64{1, 2, 5, 10, 15, 30, 60, 120, 240, 360, 720, 1440, 4320, 10080, 20160, 44640}

// rungOf is the index of the smallest rung at least lead.
func rungOf(lead time.Duration) int8 {
	for i, m := range predictionRungs {
		if lead <= time.Duration(m)*time.Minute {
			return int8(i)
		}
	}
	return int8(len(predictionRungs))
}

// announcePrediction emits an exhaustion_predicted signal: the prediction
// in q (on), or that the one announced before no longer holds (off: the
// quota is no longer predicted to run out within the horizon), which
// carries the attribute state=clear. Both carry the uncertainty as
// attributes (schemas.AttrPredicted*).
func (s *Series) announcePrediction(q *quotaState, b bound, ts, offset int64, used float64, p *Partition, on bool) {
	q.predicted, q.changing = on, 0
	sig := s.base(schemas.SignalExhaustionPredicted, q, b, ts, offset, used)
	at := q.predAt
	if at == 0 {
		at = b.end // not before the period ends
	}
	t := time.Unix(at, 0).UTC()
	sig.PredictedExhaustion = &t
	sig.Attributes = map[string]string{schemas.AttrPredictionBasis: q.basis}
	if q.predLo != 0 {
		sig.Attributes[schemas.AttrPredictedEarliest] = time.Unix(q.predLo, 0).UTC().Format(time.RFC3339)
	}
	if q.predHi != 0 {
		sig.Attributes[schemas.AttrPredictedLatest] = time.Unix(q.predHi, 0).UTC().Format(time.RFC3339)
	}
	// The id names the change and the event second it was computed at, so
	// that a replay of the same events yields the same id; a rebuilt state
	// that predicts differently (it never saw estimates settled meanwhile)
	// yields a new one, which the alerter applies like any other.
	if on {
		sig.ID = s.id(sig.Kind, q, b.start, strconv.Itoa(int(q.rung)), strconv.FormatInt(ts, 10))
		sig.Reason = string(q.q.Name) + " predicted to run out at " + t.Format(time.RFC3339) + " (" + q.basis + ")"
	} else {
		sig.Attributes[schemas.AttrState] = schemas.StateClear
		if q.basis == "" {
			delete(sig.Attributes, schemas.AttrPredictionBasis)
		}
		sig.ID = s.id(sig.Kind, q, b.start, schemas.StateClear, strconv.FormatInt(ts, 10))
		sig.Reason = string(q.q.Name) + " no longer predicted to run out within " + p.opt.Horizon.String()
	}
	p.emit(sig)
}

// MinuteRow is the absolute totals of one tenant × model × minute, for
// usage_minute.
type MinuteRow struct {
	Tenant, Model                            string
	Minute                                   time.Time
	Requests, PromptTokens, CompletionTokens uint64
	CachedTokens, Errors, SlowCalls          uint64
	// CacheWriteTokens and ReasoningTokens are parts of PromptTokens and
	// CompletionTokens, as CachedTokens is.
	CacheWriteTokens, ReasoningTokens uint64
	Cost                              float64
}

// QuotaRow is usage against one quota in one period, for quota_state.
type QuotaRow struct {
	Tenant, Model, Quota, Period string
	PeriodStart, PeriodEnd       time.Time
	Used, Limit                  float64
	Unit, Mode                   string
	Tier                         uint16
	Rate                         float64
	PredictedExhaustion          time.Time // zero: none
	// PredictedEarliest and PredictedLatest bound PredictedExhaustion
	// (zero: none; a zero latest with a prediction: not within the
	// period); PredictionBasis is BasisRates or BasisForecast.
	PredictedEarliest, PredictedLatest time.Time
	PredictionBasis                    string
	// Billed: Used counts billed-equivalent tokens (policy.Quota.Billed),
	// so a recompute from raw events must weigh them the same way.
	Billed bool
	// CachedTokens, CacheWriteTokens and ReasoningTokens are the token
	// types of the period's usage of the model key, whatever the unit.
	CachedTokens, CacheWriteTokens, ReasoningTokens uint64
}

// LateMinute names a minute an event arrived for after its rollup left
// memory; the writer recomputes that minute from the raw events.
type LateMinute struct {
	Tenant, Model string
	Minute        time.Time
}

// Rows are what a Partition changed since the last Drain: absolute rows
// to write, and closed periods to recompute from the raw events because
// their totals had left memory when a late event arrived for them.
type Rows struct {
	Minutes       []MinuteRow
	Quotas        []QuotaRow
	MinuteRepairs []LateMinute
	// QuotaRepairs carry everything but Used, which the writer computes.
	QuotaRepairs []QuotaRow
}

// Reset empties r, keeping its buffers.
func (r *Rows) Reset() {
	r.Minutes, r.Quotas, r.MinuteRepairs, r.QuotaRepairs = r.Minutes[:0], r.Quotas[:0], r.MinuteRepairs[:0], r.QuotaRepairs[:0]
}

// Drain appends the rows changed since the last drain to r and forgets
// that they changed.
func (p *Partition) Drain(r *Rows) {
	r.Minutes = append(r.Minutes, p.minutes...)
	r.Quotas = append(r.Quotas, p.closed...)
	r.MinuteRepairs = append(r.MinuteRepairs, p.repairs...)
	r.QuotaRepairs = append(r.QuotaRepairs, p.quotaRepairs...)
	p.minutes, p.closed, p.repairs, p.quotaRepairs = p.minutes[:0], p.closed[:0], p.repairs[:0], p.quotaRepairs[:0]
	for _, s := range p.dirty {
		for i := range s.roll {
			if rl := &s.roll[i]; rl.dirty {
				r.Minutes = append(r.Minutes, rl.row(s))
				rl.dirty = false
			}
		}
		for i := range s.quotas {
			q := &s.quotas[i]
			if q.kind == kindMinute {
				continue
			}
			r.Quotas = append(r.Quotas, s.quotaRow(q, 0))
			if s.prevDirty[q.kind] {
				r.Quotas = append(r.Quotas, s.quotaRow(q, 1))
			}
		}
		s.prevDirty = [3]bool{}
		s.dirty = false
	}
	p.dirty = p.dirty[:0]
}

// ClearDirty forgets pending changes without returning them: after a
// rebuild, whose rows ClickHouse already holds.
func (p *Partition) ClearDirty() {
	p.minutes, p.closed, p.repairs, p.quotaRepairs = p.minutes[:0], p.closed[:0], p.repairs[:0], p.quotaRepairs[:0]
	for _, s := range p.dirty {
		for i := range s.roll {
			s.roll[i].dirty = false
		}
		s.prevDirty = [3]bool{}
		s.dirty = false
	}
	p.dirty = p.dirty[:0]
}

func (s *Series) quotaRow(q *quotaState, j int) QuotaRow {
	b := s.t.bounds[q.kind][j]
	used := math.Max(s.used(q, j), 0)
	pp := &s.per[q.kind][j]
	r := QuotaRow{
		CachedTokens: clampU(pp.cached), CacheWriteTokens: clampU(pp.cacheWrite), ReasoningTokens: clampU(pp.reasoning),
		Tenant: s.t.id, Model: s.model, Quota: string(q.q.Name), Period: string(q.q.Period),
		PeriodStart: time.Unix(b.start, 0).UTC(), PeriodEnd: time.Unix(b.end, 0).UTC(),
		Used: used, Limit: q.q.Limit, Unit: string(q.q.Unit), Mode: string(q.q.Mode),
	}
	if j == 0 {
		r.Tier, r.Rate = uint16(q.tier), q.rate
		if r.Rate == 0 && q.q.Unit == schemas.UnitTokens {
			// The forecast needs a few minutes of history; until then show
			// the observed pace so a fresh burst is visible at once.
			r.Rate = s.observedTokenRate() * s.tokenScale(q)
		}
		if q.predAt != 0 {
			r.PredictedExhaustion = time.Unix(q.predAt, 0).UTC()
			r.PredictionBasis = q.basis
			if q.predLo != 0 {
				r.PredictedEarliest = time.Unix(q.predLo, 0).UTC()
			}
			if q.predHi != 0 {
				r.PredictedLatest = time.Unix(q.predHi, 0).UTC()
			}
		}
	} else {
		r.Tier = uint16(policy.TierReached(s.t.tiers, policy.Percent(used, q.q.Limit)))
	}
	return r
}

// Totals returns the current hour, day or month totals of tenant × model
// (model "*" for all models) and the period's start, or ok false when the
// state has none.
func (p *Partition) Totals(tenant, model, period string) (tokens, requests int64, cost float64, start time.Time, ok bool) {
	t, found := p.tenants[tenant]
	k := kindOf(schemas.Period(period))
	if !found || k < 0 || k == kindMinute {
		return 0, 0, 0, time.Time{}, false
	}
	s := t.all
	if model != policy.AllModels {
		if s, found = t.models[model]; !found {
			return 0, 0, 0, time.Time{}, false
		}
	}
	pp := s.per[k][0]
	return pp.tokens, pp.requests, pp.cost, time.Unix(t.bounds[k][0].start, 0).UTC(), true
}

// Rate returns tokens and requests per minute of tenant × model over the
// sliding window of the last minutes minutes (1 to 60) of event time.
func (p *Partition) Rate(tenant, model string, minutes int) (tokensPerMinute, requestsPerMinute float64) {
	t, found := p.tenants[tenant]
	if !found {
		return 0, 0
	}
	s := t.all
	if model != policy.AllModels {
		if s, found = t.models[model]; !found {
			return 0, 0
		}
	}
	return s.windowRate(minutes)
}
