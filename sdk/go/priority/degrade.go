package priority

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/schemas"
)

// Level is a degradation level: which classes an upstream still admits.
type Level uint8

// The levels, from serving everyone to serving critical calls only.
const (
	// Normal operation: every class is admitted.
	LevelNone Level = iota
	// Level1 admits high and critical.
	Level1
	// Level2 admits critical only.
	Level2
	// Level3 admits nothing.
	Level3
)

// Admits reports whether level l admits class c.
func (l Level) Admits(c schemas.Priority) bool {
	switch l {
	case LevelNone:
		return true
	case Level1:
		return c.Rank() >= schemas.PriorityHigh.Rank()
	case Level2:
		return c == schemas.PriorityCritical
	}
	return false
}

func (l Level) admits() string {
	switch l {
	case LevelNone:
		return "all priorities admitted"
	case Level1:
		return "only high and critical admitted"
	case Level2:
		return "only critical admitted"
	}
	return "nothing admitted"
}

// Degrader turns a load figure into a degradation level, with hysteresis
// so that a load hovering at a threshold does not flap the level. Load is
// a number from 0 (idle) to 1 (full); package upstream computes it from
// the requests in the gateway and the upstream's breaker. Safe for
// concurrent use.
type Degrader struct {
	above      [3]float64 // load above which levels 1, 2, 3 apply
	hysteresis float64
	retryAfter time.Duration

	mu    sync.Mutex
	level Level
	load  float64
}

// DegraderOpt configures a Degrader.
type DegraderOpt interface{ applyDegrader(*Degrader) }

type degraderOpt func(*Degrader)

func (o degraderOpt) applyDegrader(d *Degrader) { o(d) }

// Thresholds are the loads above which levels 1, 2 and 3 apply (default
// 0.5, 0.7, 0.9).
func Thresholds(l1, l2, l3 float64) DegraderOpt {
	return degraderOpt(func(d *Degrader) { d.above = [3]float64{l1, l2, l3} })
}

// Hysteresis is how far below a level's threshold the load must fall
// before the level is left (default 0.05).
func Hysteresis(h float64) DegraderOpt {
	return degraderOpt(func(d *Degrader) { d.hysteresis = h })
}

// DegradedRetryAfter is the Retry-After of a degraded refusal (default
// 30 s: long enough for a surge to pass, short enough for a batch job to
// resume the same minute).
func DegradedRetryAfter(r time.Duration) DegraderOpt {
	return degraderOpt(func(d *Degrader) { d.retryAfter = r })
}

// NewDegrader returns a Degrader at LevelNone.
func NewDegrader(opts ...DegraderOpt) (*Degrader, error) {
	d := &Degrader{above: [3]float64{0.5, 0.7, 0.9}, hysteresis: 0.05, retryAfter: 30 * time.Second}
	for _, o := range opts {
		o.applyDegrader(d)
	}
	var errs []error
	a := d.above
	if !(a[0] > 0 && a[0] < a[1] && a[1] < a[2] && a[2] <= 1) {
		errs = append(errs, fmt.Errorf("Thresholds: %v, %v, %v must increase strictly within (0, 1]", a[0], a[1], a[2]))
	}
	if !(d.hysteresis >= 0 && d.hysteresis < a[0]) {
		errs = append(errs, fmt.Errorf("Hysteresis: %v is outside 0..the first threshold (%v)", d.hysteresis, a[0]))
	}
	if d.retryAfter < time.Second || d.retryAfter > time.Hour {
		errs = append(errs, fmt.Errorf("DegradedRetryAfter: %v is outside 1s..1h", d.retryAfter))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("priority.NewDegrader: %w", err)
	}
	return d, nil
}

// Update sets the load and returns the level it leads to. The level rises
// as soon as the load exceeds a threshold, and falls only once the load
// is below the lower level's threshold by the hysteresis.
func (d *Degrader) Update(load float64) Level {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.load = load
	up := LevelNone
	for i, a := range d.above {
		if load > a {
			up = Level(i + 1)
		}
	}
	switch {
	case up >= d.level:
		d.level = up
	default:
		// Fall one level at a time while below each threshold by the
		// margin; the epsilon keeps 0.7 − 0.05 from missing 0.65 by a
		// rounding error.
		for d.level > up && load <= d.above[d.level-1]-d.hysteresis+1e-9 {
			d.level--
		}
	}
	return d.level
}

// Level is the current level.
func (d *Degrader) Level() Level {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.level
}

// Load is the last load given to Update.
func (d *Degrader) Load() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.load
}

// Check refuses class c when the current level does not admit it: the
// Decision says Degraded, names the level and carries the Retry-After.
// ok is true when c is admitted.
func (d *Degrader) Check(c schemas.Priority) (dec Decision, ok bool) {
	l := d.Level()
	if l.Admits(c) {
		return Decision{Reason: Admitted, Priority: c}, true
	}
	return Decision{Reason: Degraded, Priority: c, Level: l, RetryAfter: d.retryAfter}, false
}
