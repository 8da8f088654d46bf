// Package forecast predicts when a quota runs out from its per-minute
// consumption, for the aggregator's exhaustion_predicted signals and the
// predicted_exhaustion column of quota_state.
//
// # Model
//
// Holt's linear trend method (double exponential smoothing) over completed
// event-time minutes:
//
//	level_t = α·x_t + (1−α)·(level_{t−1} + trend_{t−1})
//	trend_t = β·(level_t − level_{t−1}) + (1−β)·trend_{t−1}
//
// with α = 0.5 and β = 0.1, where x_t is what one minute consumed (idle
// minutes count as zero). The forecast for k minutes ahead is
// level + k·trend, so the cumulative consumption over h minutes is
// level·h + trend·h(h+1)/2, and the time to exhaustion is the smallest h
// at which that reaches the remaining quota (a quadratic, solved in closed
// form).
//
// Why this model: a plain EWMA lags a ramp forever (it predicts a rate the
// tenant has already left behind), which makes exhaustion warnings late
// exactly when traffic grows; Holt's trend term removes that lag and tracks a
// linear ramp with no steady-state error. α = 0.5 weights the last two
// minutes at 75 %, so a 10× step shows within two minutes, while a steady
// rate with moderate noise still gives a stable level. β is small so that a
// step is not mistaken for a ramp: with β = 0.3 a 10× step made the model
// extrapolate the jump and predict exhaustion twice too early. A falling
// trend is
// not extrapolated to zero: a dip would then predict "never", so with a
// negative trend the prediction uses the level alone, which errs early
// rather than late. Nothing is predicted before MinSamples minutes were
// observed, nor when the level is not positive.
//
// # Uncertainty
//
// Besides the level and trend the predictor keeps dev, an exponentially
// weighted mean of its absolute one-minute-ahead error (weight Gamma):
// how far a minute typically lands from what the model expected. The
// earliest and latest plausible exhaustion (Range) are the times at which
// the forecast with its level raised and lowered by dev reaches the
// remaining quota: a steady tenant gets a narrow range, a bursty one a
// wide one, in the same units the operator reads.
//
// State is four numbers and a counter, so every tenant × model can afford
// one predictor per unit it is metered in.
package forecast

import "math"

// Smoothing factors and the warm-up length; see the package documentation.
const (
	Alpha      = 0.5
	Beta       = 0.1
	Gamma      = 0.3
	MinSamples = 3
)

// Holt is one Holt's-linear-trend predictor. The zero value is ready and
// has seen no data.
type Holt struct {
	level, trend float64
	dev          float64 // mean absolute one-minute-ahead error
	n            int32
}

// Observe adds the consumption of one completed minute.
func (h *Holt) Observe(x float64) {
	if h.n == 0 {
		h.level, h.trend, h.n = x, 0, 1
		return
	}
	prev := h.level
	miss := math.Abs(x - (h.level + h.trend))
	if h.n == 1 {
		h.dev = miss
	} else {
		h.dev = Gamma*miss + (1-Gamma)*h.dev
	}
	h.level = Alpha*x + (1-Alpha)*(h.level+h.trend)
	h.trend = Beta*(h.level-prev) + (1-Beta)*h.trend
	if h.n < math.MaxInt32 {
		h.n++
	}
}

// Reset forgets everything observed, for a predictor whose series went idle
// for so long that its history says nothing about what comes next.
func (h *Holt) Reset() { *h = Holt{} }

// Samples returns how many minutes were observed.
func (h *Holt) Samples() int { return int(h.n) }

// Rate returns the smoothed consumption per minute, and whether enough
// minutes were observed for it to mean anything.
func (h *Holt) Rate() (float64, bool) {
	if h.n < MinSamples {
		return 0, false
	}
	return math.Max(h.level, 0), true
}

// MinutesToExhaustion returns in how many minutes consumption reaches
// remaining at the forecast rate, and false when there is no prediction:
// too little data, or a rate that is not positive.
func (h *Holt) MinutesToExhaustion(remaining float64) (float64, bool) {
	if h.n < MinSamples || h.level <= 0 {
		return 0, false
	}
	if remaining <= 0 {
		return 0, true
	}
	return minutes(h.level, h.trend, remaining), true
}

// Range returns the earliest and latest plausible minutes to exhaustion:
// the forecast with its level raised and lowered by its typical
// one-minute error (see the package documentation). latest is +Inf when
// the lowered forecast never reaches remaining. ok is false when
// MinutesToExhaustion has no prediction.
func (h *Holt) Range(remaining float64) (earliest, latest float64, ok bool) {
	if h.n < MinSamples || h.level <= 0 {
		return 0, 0, false
	}
	if remaining <= 0 {
		return 0, 0, true
	}
	earliest = minutes(h.level+h.dev, h.trend, remaining)
	latest = math.Inf(1)
	if l := h.level - h.dev; l > 0 {
		latest = minutes(l, h.trend, remaining)
	}
	return earliest, latest, true
}

// minutes solves level·h + trend·h(h+1)/2 = remaining for h, with a
// falling trend not extrapolated (level > 0).
func minutes(l, t, remaining float64) float64 {
	if t <= 0 {
		return remaining / l
	}
	// t/2·h² + (l + t/2)·h − remaining = 0
	b := l + t/2
	return (-b + math.Sqrt(b*b+2*t*remaining)) / t
}

// State returns the smoother's whole state, for a snapshot of the
// aggregator's state (tally's snapshot codec); HoltFromState rebuilds it.
func (h Holt) State() (level, trend, dev float64, n int32) { return h.level, h.trend, h.dev, h.n }

// HoltFromState returns the smoother whose State is (level, trend, dev, n).
func HoltFromState(level, trend, dev float64, n int32) Holt {
	return Holt{level: level, trend: trend, dev: dev, n: n}
}
