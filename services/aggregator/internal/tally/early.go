package tally

import (
	"math"

	"github.com/sluicehq/sluice/services/aggregator/internal/forecast"
)

// Early prediction.
//
// The forecast (package forecast) needs forecast.MinSamples completed
// minutes before it predicts anything, which is too late for a tenant
// that burns its hour in a minute and a half. So each series also keeps
// its settled consumption of the minute in progress and of the last
// earlyMinutes completed minutes, and from about earlyMinSpan seconds of
// traffic on predicts from two rates over that history:
//
//   - the one-minute rate, over the last 60 s of the series' traffic, and
//   - the five-minute rate, over the last 300 s,
//
// each over the seconds the series has actually been sending when it
// started less than a window ago (so 10 s of traffic give a rate at
// once). A minute's consumption is taken as spread evenly over the part
// of it the window covers. The prediction is the one-minute rate's: the
// current pace. Its uncertainty is the spread between the two rates (a
// tenant speeding up or slowing down) widened by the sampling error of
// the calls seen in the last minute (1/√n, as for a count of independent
// arrivals): the earliest exhaustion assumes the faster rate plus that
// error, the latest the slower minus it.
//
// Once the forecast has its minutes it refines the prediction: its time
// is the one reported, and the range is the union of its own (its typical
// one-minute error, forecast.Holt.Range) and the rates' range, so a burst
// the forecast has not absorbed yet still shows as an earlier earliest.
//
// Like the forecast, this sees settled consumption only (an estimate is
// replaced by its settlement, and a rebuild from ClickHouse sees only the
// settlement), so that a rebuilt state predicts what the original did.

const (
	// earlyMinutes is how many completed minutes the rates look back.
	earlyMinutes = 5
	// earlyMinSpan is how many seconds of traffic the first prediction
	// waits for. Ten, not fifteen: the prediction must be on screen within
	// 15 s of a runaway's first call, and the pipeline after the
	// aggregator (flush, store, a reader's poll) takes two to three more;
	// at a runaway's pace ten seconds are already a hundred calls or so.
	earlyMinSpan = 10
	// earlyMinCalls is the fewest settled calls the first prediction
	// rests on: one call says nothing about a pace.
	earlyMinCalls = 3
	// earlyEvery is how often, in seconds of event time, a series
	// re-predicts between minute boundaries.
	earlyEvery = 5
	// maxUncertainty caps the sampling error, so that the latest bound
	// still moves with the rates when few calls were seen.
	maxUncertainty = 0.9
)

// Prediction bases, for the quota_state column prediction_basis and the
// signal attribute of the same name.
const (
	// BasisRates: the first estimate, from the one- and five-minute rates.
	BasisRates = "rates"
	// BasisForecast: the forecast over completed minutes.
	BasisForecast = "forecast"
)

// earlyCell is one completed minute's settled consumption.
type earlyCell struct {
	tok  int64
	cost float64
	req  int32
}

// earlyRate is a series' recent settled consumption for the rates (the
// minute in progress is Series.minTok, minCost and req here).
type earlyRate struct {
	// first is the first second of the series' current run of traffic
	// (reset after earlyMinutes of silence), last its latest settled
	// second, next the second from which it predicts again.
	first, last, next int64
	req               int32                   // settled calls carrying tokens in the minute in progress
	done              [earlyMinutes]earlyCell // completed minutes by minute mod earlyMinutes
}

// see notes a settled event at second ts.
func (e *earlyRate) see(ts int64) {
	if e.first == 0 || ts-e.last > earlyMinutes*60 {
		e.first = ts // earlier cells end before first and are ignored
		// The first estimate is due as soon as the span allows it.
		e.next = ts + earlyMinSpan - 1
	}
	e.last = max(e.last, ts)
}

// complete stores minute m's consumption and empties the minutes of a gap
// up to next (exclusive).
func (e *earlyRate) complete(m, next int64, tok int64, cost float64) {
	e.done[mod(m, earlyMinutes)] = earlyCell{tok: tok, cost: cost, req: e.req}
	for k := m + 1; k < next && k <= m+earlyMinutes; k++ {
		e.done[mod(k, earlyMinutes)] = earlyCell{}
	}
	e.req = 0
}

func mod(a, n int64) int64 { return ((a % n) + n) % n }

// earlyWindow is the settled tokens, cost and calls of the last w seconds
// of s's traffic, with the seconds they were spread over.
func (s *Series) earlyWindow(w int64) (tok, cost, req, span float64) {
	e := &s.early
	from := max(e.last-w+1, e.first)
	for k := s.lastMin; k >= s.lastMin-earlyMinutes; k-- {
		lo, hi := max(k*60, e.first), k*60+59
		c := e.done[mod(k, earlyMinutes)]
		if k == s.lastMin {
			hi = e.last
			c = earlyCell{tok: s.minTok, cost: s.minCost, req: e.req}
		}
		if hi < lo || hi < from {
			continue
		}
		f := float64(hi-max(lo, from)+1) / float64(hi-lo+1)
		tok += f * float64(c.tok)
		cost += f * float64(c.cost)
		req += f * float64(c.req)
	}
	if from > e.first {
		return tok, cost, req, float64(e.last - from + 1)
	}
	// The window reaches back to the first call: n calls over d seconds
	// are n−1 intervals, so the pace is n calls per d·n/(n−1) seconds
	// (the first call's second is not a whole interval of traffic).
	d := float64(e.last - e.first)
	if req > 1 {
		return tok, cost, req, d * req / (req - 1)
	}
	return tok, cost, req, d + 1
}

// estimate is one prediction of a quota's exhaustion, in minutes from the
// series' latest settled event.
type estimate struct {
	mins, earliest, latest float64 // latest +Inf: not bounded
	rate                   float64 // per minute, in the quota's unit
	basis                  string
}

// earlyRates returns the one- and five-minute rates (per minute, in
// tokens or currency) and the sampling error, or ok false before
// earlyMinSpan seconds and earlyMinCalls calls.
func (s *Series) earlyRates(currency bool) (r1, r5, u float64, ok bool) {
	e := &s.early
	if e.first == 0 || e.last-e.first+1 < earlyMinSpan {
		return 0, 0, 0, false
	}
	tok1, cost1, n1, span1 := s.earlyWindow(60)
	tok5, cost5, _, span5 := s.earlyWindow(earlyMinutes * 60)
	if n1 < earlyMinCalls || span1 <= 0 || span5 <= 0 {
		return 0, 0, 0, false
	}
	if currency {
		tok1, tok5 = cost1, cost5
	}
	return tok1 * 60 / span1, tok5 * 60 / span5, math.Min(1/math.Sqrt(n1), maxUncertainty), true
}

// forecastExhaustion predicts when remaining (in the quota's unit) runs
// out; ok is false when neither the rates nor the forecast can tell.
func (s *Series) forecastExhaustion(currency bool, remaining float64) (est estimate, ok bool) {
	h := s.holt(currency)
	r1, r5, u, early := s.earlyRates(currency)
	if early && r1 > 0 {
		est = estimate{mins: remaining / r1, rate: r1, basis: BasisRates, latest: math.Inf(1)}
		est.earliest = remaining / (math.Max(r1, r5) * (1 + u))
		if slow := math.Min(r1, r5) * (1 - u); slow > 0 {
			est.latest = remaining / slow
		}
		ok = true
	}
	if mins, fok := h.MinutesToExhaustion(remaining); fok {
		lo, hi, _ := h.Range(remaining)
		if !ok {
			est.earliest, est.latest = lo, hi
		}
		est.mins, est.basis = mins, BasisForecast
		est.rate, _ = h.Rate()
		est.earliest, est.latest = math.Min(est.earliest, lo), math.Max(est.latest, hi)
		ok = true
	}
	return est, ok
}

// holt returns the series' forecast for a quota's unit.
func (s *Series) holt(currency bool) *forecast.Holt {
	if currency {
		return &s.holtCost
	}
	return &s.holtTok
}
