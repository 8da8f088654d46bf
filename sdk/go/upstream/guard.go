package upstream

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/priority"
)

// Request is what a Guard needs to know of a request.
type Request struct {
	// Tenant is the caller's tenant, for its own concurrency limit.
	Tenant string
	// Class is the request's effective class (priority.Effective); the
	// zero Class is schemas.PriorityNormal.
	Priority schemas.Priority
	// Deadline is the latest time the upstream call may start; zero
	// means the queue's MaxWait from now.
	Deadline time.Time
	// Tokens is the request's estimated tokens, for reserved shares
	// counted in tokens (Reserved with ReserveTokens).
	Tokens int64
}

// Load is what the degradation level is computed from.
type Load struct {
	// InFlight and Limit are the upstream's calls in flight and its
	// concurrency limit; Waiting and MaxWaiting its queue's length and
	// bound.
	InFlight, Limit, Waiting, MaxWaiting int
	// Breaker is the upstream breaker's state.
	Breaker State
}

// DefaultLoad is the share of the gateway's room for this upstream that
// is taken — (in flight + waiting) / (limit + queue bound) — or 1 while
// the breaker is open and at least 0.75 (level 2 by default: critical
// only) while it is half-open. So with a limit of 50 and a queue of 1,000
// the gateway stops admitting normal and low requests once 525 requests
// are in it, long before the queue must shed.
func DefaultLoad(l Load) float64 {
	room := l.Limit + l.MaxWaiting
	v := 1.0
	if room > 0 {
		v = float64(l.InFlight+l.Waiting) / float64(room)
	}
	switch l.Breaker {
	case Open:
		v = 1
	case HalfOpen:
		v = math.Max(v, 0.75)
	}
	return v
}

// Guard is the admission path of one upstream. Safe for concurrent use.
type Guard struct {
	name        string
	gate        priority.Gate
	queue       *priority.Queue
	breaker     *Breaker
	degrader    *priority.Degrader
	tenants     *concurrency.Keyed // nil without a tenant limit
	tenantLimit func(tenant string, upstreamLimit int) int
	load        func(Load) float64
	clock       priority.Clock
	reserve     *Reserve // nil: no reserved shares
	// shortenAt marks the degradation levels (1..3, at index level-1)
	// that admit the classes they refuse with a shortened output.
	shortenAt [3]bool
}

type guardConfig struct {
	alg          concurrency.Algorithm
	gate         priority.Gate
	queueOpts    []priority.QueueOpt
	breakerOpts  []BreakerOpt
	degraderOpts []priority.DegraderOpt
	tenantLimit  func(tenant string, upstreamLimit int) int
	load         func(Load) float64
	clock        priority.Clock
	onLimit      func(old, new int)
	reserve      *Reserve
	shortenAt    [3]bool
	errs         []error
}

// Opt configures a Guard.
type Opt interface{ apply(*guardConfig) }

type opt func(*guardConfig)

func (o opt) apply(c *guardConfig) { o(c) }

// Limit sets the algorithm of the upstream's concurrency limit (default
// concurrency.Fixed(100)), counted in this process.
func Limit(alg concurrency.Algorithm) Opt { return opt(func(c *guardConfig) { c.alg = alg }) }

// OnLimitChange is called after each change of the in-process limit.
func OnLimitChange(f func(old, new int)) Opt { return opt(func(c *guardConfig) { c.onLimit = f }) }

// SharedGate replaces the in-process limit with g, for an upstream whose
// concurrency is counted across gateway processes (concurrency.Shared;
// Guard.Run runs its lease renewal). The queue then polls g every
// 20 ms while requests wait, since other processes free its slots.
func SharedGate(g priority.Gate) Opt { return opt(func(c *guardConfig) { c.gate = g }) }

// QueueOptions configure the priority queue (priority.MaxWaiting,
// priority.MaxWait, priority.MinShare).
func QueueOptions(o ...priority.QueueOpt) Opt {
	return opt(func(c *guardConfig) { c.queueOpts = append(c.queueOpts, o...) })
}

// BreakerOptions configure the upstream breaker.
func BreakerOptions(o ...BreakerOpt) Opt {
	return opt(func(c *guardConfig) { c.breakerOpts = append(c.breakerOpts, o...) })
}

// DegraderOptions configure the degradation levels.
func DegraderOptions(o ...priority.DegraderOpt) Opt {
	return opt(func(c *guardConfig) { c.degraderOpts = append(c.degraderOpts, o...) })
}

// TenantShare limits each tenant to share of the upstream's current
// limit (rounded up, at least 1), counting its requests in flight and
// waiting. Without it or TenantLimit tenants are not limited apart.
func TenantShare(share float64) Opt {
	return opt(func(c *guardConfig) {
		if !(share > 0 && share <= 1) {
			c.errs = append(c.errs, fmt.Errorf("TenantShare: %v is outside (0, 1]", share))
			return
		}
		c.tenantLimit = func(_ string, l int) int { return max(1, int(math.Ceil(share*float64(l)))) }
	})
}

// TenantLimit gives each tenant's limit on this upstream (its requests in
// flight and waiting) from the tenant and the upstream's current limit;
// the policy's per-tenant concurrency goes here.
func TenantLimit(f func(tenant string, upstreamLimit int) int) Opt {
	return opt(func(c *guardConfig) { c.tenantLimit = f })
}

// Reserved holds each class to its reserved share of the upstream once it
// is saturated, across the fleet (see Reserve); checked after the tenant
// limit and before the queue, refusing with priority.ClassShare. A
// concurrency Reserve counts a request from then until its Permit is
// released (its queue wait included).
func Reserved(r *Reserve) Opt { return opt(func(c *guardConfig) { c.reserve = r }) }

// ShortenAt makes degradation levels (1..3) admit the classes they
// refuse, to be served with a shorter output instead (seed 003's "shorten
// max_tokens" degradation): the Permit says so (Permit.Shortened) and the
// caller must cap the call's output before it sends it. Such a call still
// waits in the queue and counts against the concurrency limit.
func ShortenAt(levels ...priority.Level) Opt {
	return opt(func(c *guardConfig) {
		for _, l := range levels {
			if l < 1 || l > 3 {
				c.errs = append(c.errs, fmt.Errorf("ShortenAt: level %d is outside 1..3", l))
				continue
			}
			c.shortenAt[l-1] = true
		}
	})
}

// LoadFunc replaces DefaultLoad, for gateways that weigh other signals.
func LoadFunc(f func(Load) float64) Opt { return opt(func(c *guardConfig) { c.load = f }) }

// Clock replaces the real clock everywhere in the Guard, for tests.
func Clock(c priority.Clock) Opt { return opt(func(g *guardConfig) { g.clock = c }) }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	return time.AfterFunc(d, f)
}

// New returns the Guard of the upstream called name.
func New(name string, opts ...Opt) (*Guard, error) {
	c := guardConfig{alg: concurrency.Fixed(100), load: DefaultLoad, clock: realClock{}}
	for _, o := range opts {
		o.apply(&c)
	}
	errs := c.errs
	if name == "" {
		errs = append(errs, errors.New("name: must not be empty"))
	}
	if c.clock == nil || c.load == nil || c.alg == nil {
		errs = append(errs, errors.New("Clock, LoadFunc, Limit: must not be nil"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("upstream.New %q: %w", name, err)
	}
	g := &Guard{name: name, gate: c.gate, tenantLimit: c.tenantLimit, load: c.load, clock: c.clock, reserve: c.reserve, shortenAt: c.shortenAt}
	if g.gate == nil {
		lopts := []concurrency.LimiterOpt{concurrency.Clock(c.clock.Now)}
		if c.onLimit != nil {
			lopts = append(lopts, concurrency.OnChange(c.onLimit))
		}
		g.gate = concurrency.NewLimiter(c.alg, lopts...)
	}
	var err error
	if g.queue, err = priority.NewQueue(g.gate, append([]priority.QueueOpt{priority.WithClock(c.clock)}, c.queueOpts...)...); err != nil {
		errs = append(errs, err)
	}
	if g.breaker, err = NewBreaker(append([]BreakerOpt{BreakerClock(c.clock.Now)}, c.breakerOpts...)...); err != nil {
		errs = append(errs, err)
	}
	if g.degrader, err = priority.NewDegrader(c.degraderOpts...); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("upstream.New %q: %w", name, err)
	}
	if g.tenantLimit != nil {
		g.tenants = concurrency.NewKeyed()
	}
	return g, nil
}

// Run does the Guard's background work until ctx ends: it follows the
// fleet's breaker (BreakerOptions(FleetWide(…))) and renews a shared
// gate's lease (SharedGate with a Run method, such as concurrency.Shared).
// Without either it returns when ctx ends. It returns nil.
func (g *Guard) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.breaker.Run(ctx) })
	if r, ok := g.gate.(interface{ Run(context.Context) error }); ok {
		wg.Go(func() { _ = r.Run(ctx) })
	}
	if g.reserve != nil {
		wg.Go(func() { _ = g.reserve.Run(ctx) })
	}
	<-ctx.Done()
	wg.Wait()
	return nil
}

// Name is the upstream's name.
func (g *Guard) Name() string { return g.name }

// Permit is an admitted call. Release it exactly once, with the call's
// outcome, when the upstream has answered (or failed).
type Permit struct {
	g      *Guard
	qp     priority.Permit
	tenant string
	probe  bool
	hold   Hold
	// shortened: a degradation level admitted the call only with a
	// shorter output (ShortenAt).
	shortened bool
}

// Probe reports whether the call is one of the half-open breaker's
// probes.
func (p Permit) Probe() bool { return p.probe }

// Shortened reports whether a degradation level admitted the call only
// with a shorter output (ShortenAt): the caller must cap its output.
func (p Permit) Shortened() bool { return p.shortened }

// Settle tells a reserved share counted in tokens (Reserved with
// ReserveTokens) what the call used, in place of the estimate Acquire
// took (Request.Tokens): 0 for an attempt that failed unbilled. Call it
// at most once, before or after Release; without a token share it does
// nothing.
func (p Permit) Settle(usedTokens int64) { p.hold.Settle(usedTokens) }

// Release ends the call: the slot goes to the next request, and the
// outcome and latency reach the limit's algorithm, the queue's estimate
// and the breaker. Releasing the zero Permit does nothing.
func (p Permit) Release(o concurrency.Outcome) {
	g := p.g
	if g == nil {
		return
	}
	// One clock read serves the queue, the limit's algorithm and the
	// breaker.
	now := g.clock.Now()
	p.qp.ReleaseAt(now, o)
	if g.tenants != nil {
		g.tenants.Release(p.tenant)
	}
	p.hold.Release()
	g.breaker.record(now, p.probe, now.Sub(p.qp.Start()), o)
}

// Acquire admits r or refuses it; see the package documentation for the
// order of the checks. It waits only in the priority queue, at most
// until r's deadline or ctx's end.
func (g *Guard) Acquire(ctx context.Context, r Request) (Permit, priority.Decision) {
	if !r.Priority.Valid() {
		r.Priority = schemas.PriorityNormal
	}
	// The level is updated before the breaker refuses, so that Stats shows
	// an open breaker's level 3.
	g.degrader.Update(g.load(g.currentLoad()))
	probe, ok, retry := g.breaker.Allow()
	if !ok {
		return Permit{}, priority.Decision{Reason: priority.BreakerOpen, Priority: r.Priority, RetryAfter: max(time.Second, retry)}
	}
	var shortened bool
	if !probe {
		// A probe passes a degraded level: the breaker closes only through
		// probes, and it has bounded them already.
		if d, ok := g.degrader.Check(r.Priority); !ok {
			if !g.shortenAt[d.Level-1] {
				return Permit{}, d
			}
			shortened = true
		}
	}
	if g.tenants != nil {
		if !g.tenants.TryAcquire(r.Tenant, g.tenantLimit(r.Tenant, g.gate.Limit())) {
			g.breaker.Record(probe, 0, concurrency.Ignored)
			return Permit{}, priority.Decision{Reason: priority.TenantLimit, Priority: r.Priority, RetryAfter: max(time.Second, g.queue.Stats().HoldMean)}
		}
	}
	var hold Hold
	if g.reserve != nil {
		n := int64(1)
		if g.reserve.unit == ReserveTokens {
			n = r.Tokens
		}
		var ok bool
		if hold, ok = g.reserve.Take(r.Priority, n); !ok {
			if g.tenants != nil {
				g.tenants.Release(r.Tenant)
			}
			g.breaker.Record(probe, 0, concurrency.Ignored)
			return Permit{}, priority.Decision{Reason: priority.ClassShare, Priority: r.Priority, RetryAfter: max(time.Second, g.queue.Stats().HoldMean)}
		}
	}
	qp, d := g.queue.Acquire(ctx, r.Priority, r.Deadline)
	if !d.Admitted() {
		if g.tenants != nil {
			g.tenants.Release(r.Tenant)
		}
		hold.Release()
		hold.Settle(0) // refused: none of its estimate is spent
		g.breaker.Record(probe, 0, concurrency.Ignored)
		return Permit{}, d
	}
	return Permit{g: g, qp: qp, tenant: r.Tenant, probe: probe, hold: hold, shortened: shortened}, d
}

func (g *Guard) currentLoad() Load {
	return Load{InFlight: g.gate.InFlight(), Limit: g.gate.Limit(), Waiting: g.queue.Waiting(),
		MaxWaiting: g.queue.MaxWaitingRequests(), Breaker: g.breaker.Stats().State}
}

// Stats is a snapshot of a Guard for metrics and the live view.
type Stats struct {
	Queue    priority.QueueStats
	InFlight int
	Breaker  BreakerStats
	Level    priority.Level
	Load     float64
}

// Stats returns a snapshot.
func (g *Guard) Stats() Stats {
	return Stats{Queue: g.queue.Stats(), InFlight: g.gate.InFlight(), Breaker: g.breaker.Stats(), Level: g.degrader.Level(), Load: g.degrader.Load()}
}

// Level updates the degradation level from the current load, as Acquire
// does, and returns it: for a gateway deciding before the call whether a
// request its level would refuse is better queued for later (a level read
// from the last Acquire would stay degraded while every request is
// queued).
func (g *Guard) Level() priority.Level { return g.degrader.Update(g.load(g.currentLoad())) }

// BreakerState is the state of the upstream's breaker: a gateway tries an
// upstream whose breaker is open after the others of its model.
func (g *Guard) BreakerState() State { return g.breaker.Stats().State }

// InFlightOf is the number of requests tenant has on this upstream,
// waiting or in flight; 0 without a tenant limit.
func (g *Guard) InFlightOf(tenant string) int {
	if g.tenants == nil {
		return 0
	}
	return g.tenants.InFlight(tenant)
}
