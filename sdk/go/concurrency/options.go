package concurrency

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// config holds every algorithm's settings; each constructor reads its own.
type config struct {
	initial, min, max int

	// Threshold.
	window, every        time.Duration
	slowAbove, fastBelow time.Duration
	errorsAbove          float64
	errorsBelow          float64
	down, up             float64

	// Gradient.
	sampleEvery time.Duration
	minSamples  int
	tolerance   float64
	bestOf      time.Duration
	smoothing   float64
	headroom    func(limit float64) float64
	probeEvery  time.Duration
}

// Opt is an option of both algorithms.
type Opt interface {
	ThresholdOpt
	GradientOpt
}

// ThresholdOpt configures NewThreshold.
type ThresholdOpt interface{ applyThreshold(*config) }

// GradientOpt configures NewGradient.
type GradientOpt interface{ applyGradient(*config) }

type bothOpt func(*config)

func (o bothOpt) applyThreshold(c *config) { o(c) }
func (o bothOpt) applyGradient(c *config)  { o(c) }

type thresholdOpt func(*config)

func (o thresholdOpt) applyThreshold(c *config) { o(c) }

type gradientOpt func(*config)

func (o gradientOpt) applyGradient(c *config) { o(c) }

// InitialLimit is the limit before the first adjustment (default 20).
func InitialLimit(n int) Opt { return bothOpt(func(c *config) { c.initial = n }) }

// MinLimit is the floor of the limit (default 1).
func MinLimit(n int) Opt { return bothOpt(func(c *config) { c.min = n }) }

// MaxLimit is the ceiling of the limit (default 1000).
func MaxLimit(n int) Opt { return bothOpt(func(c *config) { c.max = n }) }

// ErrorsAbove is the error ratio over which the limit is decreased
// (default 0.10), in both algorithms.
func ErrorsAbove(r float64) Opt { return bothOpt(func(c *config) { c.errorsAbove = r }) }

// Window is the span of calls the threshold rule averages over (default
// 60 s). It must be a whole multiple of AdjustEvery.
func Window(d time.Duration) ThresholdOpt { return thresholdOpt(func(c *config) { c.window = d }) }

// AdjustEvery is how often the threshold rule re-evaluates the window
// (default 10 s).
func AdjustEvery(d time.Duration) ThresholdOpt {
	return thresholdOpt(func(c *config) { c.every = d })
}

// SlowAbove is the average latency over which the threshold rule
// decreases the limit (default 2 s).
func SlowAbove(d time.Duration) ThresholdOpt {
	return thresholdOpt(func(c *config) { c.slowAbove = d })
}

// FastBelow is the average latency under which (with errors under
// ErrorsBelow) the threshold rule increases the limit (default 500 ms).
func FastBelow(d time.Duration) ThresholdOpt {
	return thresholdOpt(func(c *config) { c.fastBelow = d })
}

// ErrorsBelow is the error ratio under which (with latency under
// FastBelow) the threshold rule increases the limit (default 0.01).
func ErrorsBelow(r float64) ThresholdOpt {
	return thresholdOpt(func(c *config) { c.errorsBelow = r })
}

// Factors are the threshold rule's multipliers: down when slow or failing
// (default 0.8), up when fast and clean (default 1.2).
func Factors(down, up float64) ThresholdOpt {
	return thresholdOpt(func(c *config) { c.down, c.up = down, up })
}

// SampleEvery is the gradient's measurement window: a window closes, and
// the limit is recomputed, once it is at least this old (default 1 s)
// and holds at least minSamples calls (default 20).
func SampleEvery(d time.Duration, minSamples int) GradientOpt {
	return gradientOpt(func(c *config) { c.sampleEvery, c.minSamples = d, minSamples })
}

// Tolerance is how much slower than the best recent latency the current
// one may be before the gradient shrinks the limit (default 1.0: any
// slowdown counts). Raise it when window averages are noisy — few calls
// per window, or prompts and answers of very different sizes — or noise
// alone holds the limit down.
func Tolerance(x float64) GradientOpt { return gradientOpt(func(c *config) { c.tolerance = x }) }

// BestOf is how far back the gradient looks for the best latency
// (default 5 min). Longer resists drift under sustained saturation;
// shorter follows an upstream that became slower for good.
func BestOf(d time.Duration) GradientOpt { return gradientOpt(func(c *config) { c.bestOf = d }) }

// ProbeEvery is how often, under uninterrupted saturation, the gradient
// runs one window at 80% of its limit to re-measure the upstream's
// unqueued latency (default 1 min). It must be shorter than BestOf.
func ProbeEvery(d time.Duration) GradientOpt {
	return gradientOpt(func(c *config) { c.probeEvery = d })
}

// Smoothing is the share of a computed decrease the gradient applies at
// once (default 0.2), so that one slow window does not halve the limit.
// Increases apply at once.
func Smoothing(s float64) GradientOpt { return gradientOpt(func(c *config) { c.smoothing = s }) }

// Headroom is what the gradient adds to the limit each window while the
// upstream answers at its best latency (default √limit / 2, at least 1):
// how fast the limit probes upward, and how far above the upstream's
// true capacity it settles.
func Headroom(f func(limit float64) float64) GradientOpt {
	return gradientOpt(func(c *config) { c.headroom = f })
}

func defaults() config {
	return config{
		initial: 20, min: 1, max: 1000,
		window: 60 * time.Second, every: 10 * time.Second,
		slowAbove: 2 * time.Second, fastBelow: 500 * time.Millisecond,
		errorsAbove: 0.10, errorsBelow: 0.01,
		down: 0.8, up: 1.2,
		sampleEvery: time.Second, minSamples: 20,
		tolerance: 1.0, bestOf: 5 * time.Minute, smoothing: 0.2, probeEvery: time.Minute,
		headroom: func(l float64) float64 { return max(1, math.Sqrt(l)/2) },
	}
}

// validateLimits checks the settings both algorithms share.
func (c *config) validateLimits() []error {
	var errs []error
	if c.min < 1 {
		errs = append(errs, fmt.Errorf("MinLimit: %d is below 1", c.min))
	}
	if c.max > 1_000_000 {
		errs = append(errs, fmt.Errorf("MaxLimit: %d is above 1000000", c.max))
	}
	if c.max < c.min {
		errs = append(errs, fmt.Errorf("MaxLimit: %d is below MinLimit %d", c.max, c.min))
	}
	if c.initial < c.min || c.initial > c.max {
		errs = append(errs, fmt.Errorf("InitialLimit: %d is outside MinLimit..MaxLimit (%d..%d)", c.initial, c.min, c.max))
	}
	if !(c.errorsAbove > 0 && c.errorsAbove < 1) {
		errs = append(errs, fmt.Errorf("ErrorsAbove: %v is outside (0, 1)", c.errorsAbove))
	}
	return errs
}

func (c *config) validateThreshold() error {
	errs := c.validateLimits()
	if c.every < time.Millisecond {
		errs = append(errs, fmt.Errorf("AdjustEvery: %v is below 1ms", c.every))
	} else if c.window < c.every || c.window%c.every != 0 || c.window/c.every > maxBuckets {
		errs = append(errs, fmt.Errorf("Window: %v must be a whole multiple of AdjustEvery (%v), at most %d times it", c.window, c.every, maxBuckets))
	}
	if c.fastBelow <= 0 || c.slowAbove < c.fastBelow {
		errs = append(errs, fmt.Errorf("FastBelow, SlowAbove: %v, %v must be positive and FastBelow at most SlowAbove", c.fastBelow, c.slowAbove))
	}
	if !(c.errorsBelow >= 0 && c.errorsBelow <= c.errorsAbove) {
		errs = append(errs, fmt.Errorf("ErrorsBelow: %v is outside 0..ErrorsAbove (%v)", c.errorsBelow, c.errorsAbove))
	}
	if !(c.down > 0 && c.down < 1) {
		errs = append(errs, fmt.Errorf("Factors: down %v is outside (0, 1)", c.down))
	}
	if !(c.up > 1 && c.up <= 10) {
		errs = append(errs, fmt.Errorf("Factors: up %v is outside (1, 10]", c.up))
	}
	return errors.Join(errs...)
}

func (c *config) validateGradient() error {
	errs := c.validateLimits()
	if c.sampleEvery < time.Millisecond {
		errs = append(errs, fmt.Errorf("SampleEvery: %v is below 1ms", c.sampleEvery))
	}
	if c.minSamples < 1 || c.minSamples > 100_000 {
		errs = append(errs, fmt.Errorf("SampleEvery: minSamples %d is outside 1..100000", c.minSamples))
	}
	if !(c.tolerance >= 1 && c.tolerance <= 10) {
		errs = append(errs, fmt.Errorf("Tolerance: %v is outside 1..10", c.tolerance))
	}
	if c.bestOf < c.sampleEvery {
		errs = append(errs, fmt.Errorf("BestOf: %v is below SampleEvery (%v)", c.bestOf, c.sampleEvery))
	}
	if c.probeEvery < c.sampleEvery || c.probeEvery >= c.bestOf {
		errs = append(errs, fmt.Errorf("ProbeEvery: %v is outside SampleEvery (%v) .. BestOf (%v)", c.probeEvery, c.sampleEvery, c.bestOf))
	}
	if !(c.smoothing > 0 && c.smoothing <= 1) {
		errs = append(errs, fmt.Errorf("Smoothing: %v is outside (0, 1]", c.smoothing))
	}
	if c.headroom == nil {
		errs = append(errs, errors.New("Headroom: must not be nil"))
	}
	return errors.Join(errs...)
}
