package gateway

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/sdk/go/concurrency"
	"github.com/sluicehq/sluice/sdk/go/resource"
	"github.com/sluicehq/sluice/sdk/go/upstream"
)

// Guards are the upstream.Guards of the upstreams the policy names under
// upstreams: one per upstream, built from its entry, rebuilt when a
// reload changes the entry (calls admitted by the old Guard release to it)
// and dropped when the entry goes. An upstream the policy does not name is
// not guarded. For an upstream the policy marks shared, the concurrency
// limit and the breaker are counted across every gateway process through
// Redis (concurrency.Shared, upstream.Fleet) under the configured prefix,
// and so are its reserved shares. Safe for concurrent use.
type Guards struct {
	rdb    redis.UniversalClient // nil: shared upstreams count in this process alone
	prefix string
	id     string // this process, in Redis's per-process counts
	log    *slog.Logger

	cur atomic.Pointer[map[string]*guardEntry]
	mu  sync.Mutex // serialises Update

	ctx  context.Context // the Guards' Run goroutines run until it ends
	stop context.CancelFunc
	wg   sync.WaitGroup

	onLimit func(upstream string, limit int)
	// redisTimeout bounds each Redis call of a shared upstream's counts
	// (0: the packages' default, 100 ms).
	redisTimeout time.Duration
	// resources, when not nil, is the process's CPU and memory use: each
	// Guard's degradation follows the higher of it and the upstream's own
	// load.
	resources *resource.Sampler
}

// FollowResources makes the degradation of the Guards built from now on
// follow the process's CPU and memory use as sampled by rs too, for the
// upstreams whose policy entry does not opt out (degradation.resources:
// false); call it before the first Update. It runs rs's sampling until
// Close.
func (s *Guards) FollowResources(rs *resource.Sampler) {
	s.resources = rs
	s.wg.Go(func() {
		_ = rs.Run(s.ctx, func(err error) {
			s.log.Warn("resource degradation: sampling failed; the last sample stays", "err", err)
		})
	})
}

// SetRedisTimeout bounds each Redis call of the shared upstreams' counts
// and fleet-wide breakers of the Guards built from now on
// (services.gateway.admission.shared_upstreams.redis_timeout); call it
// before the first Update.
func (s *Guards) SetRedisTimeout(d time.Duration) { s.redisTimeout = d }

type guardEntry struct {
	cfg  policy.Upstream
	g    *upstream.Guard
	stop context.CancelFunc
}

// NewGuards returns an empty set whose shared upstreams count through rdb
// (nil: every upstream counts in this process) under prefix, this process
// known as id. onLimit, when not nil, learns every change of an
// upstream's concurrency limit in this process. Close stops the Guards'
// background work.
func NewGuards(rdb redis.UniversalClient, prefix, id string, log *slog.Logger, onLimit func(upstream string, limit int)) *Guards {
	log = cmp.Or(log, slog.Default())
	s := &Guards{rdb: rdb, prefix: prefix, id: id, log: log, onLimit: onLimit}
	s.ctx, s.stop = context.WithCancel(context.Background())
	empty := map[string]*guardEntry{}
	s.cur.Store(&empty)
	return s
}

// Of returns the Guard of the upstream called name, or nil when the
// policy does not guard it (or s is nil).
func (s *Guards) Of(name string) *upstream.Guard {
	if s == nil {
		return nil
	}
	if e := (*s.cur.Load())[name]; e != nil {
		return e.g
	}
	return nil
}

// Names lists the guarded upstreams.
func (s *Guards) Names() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(*s.cur.Load()))
}

// Update follows p's upstreams section: entries that did not change keep
// their Guard (its queue, limit and breaker state), changed and new ones
// get a new Guard, removed ones are dropped. An entry whose Guard cannot
// be built keeps the old Guard (or none) and is reported in the error.
func (s *Guards) Update(p *policy.Policy) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.cur.Load()
	next := make(map[string]*guardEntry, len(old))
	var errs []error
	for _, name := range p.UpstreamNames() {
		u, _ := p.Upstream(name)
		if e := old[name]; e != nil && reflect.DeepEqual(e.cfg, u) {
			next[name] = e
			continue
		}
		g, err := s.build(u)
		if err != nil {
			errs = append(errs, err)
			if e := old[name]; e != nil {
				next[name] = e
			}
			continue
		}
		ctx, stop := context.WithCancel(s.ctx)
		s.wg.Go(func() { _ = g.Run(ctx) })
		next[name] = &guardEntry{cfg: u, g: g, stop: stop}
	}
	s.cur.Store(&next)
	for name, e := range old {
		if next[name] != e {
			e.stop()
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gateway: upstream guards: %v", errs)
	}
	return nil
}

// build makes the Guard of u: the policy's options, and for a shared
// upstream the shared gate and the fleet-wide breaker.
func (s *Guards) build(u policy.Upstream) (*upstream.Guard, error) {
	opts, err := u.GuardOptions()
	if err != nil {
		return nil, err
	}
	name := u.Name
	onLimit := func(_, n int) {
		if s.onLimit != nil {
			s.onLimit(name, n)
		}
	}
	opts = append(opts, upstream.OnLimitChange(onLimit))
	if rs := s.resources; rs != nil && u.FollowResources {
		// One atomic load per request: the sampler reads the system in
		// the background.
		opts = append(opts, upstream.LoadFunc(func(l upstream.Load) float64 { return max(upstream.DefaultLoad(l), rs.Load()) }))
	}
	if u.Shared && s.rdb != nil {
		alg, err := u.Algorithm()
		if err != nil {
			return nil, err
		}
		logErr := func(err error) {
			s.log.Warn("upstream guard: Redis error; counting in this process meanwhile", "upstream", name, "err", err)
		}
		sopts := []concurrency.SharedOpt{concurrency.OnRedisError(logErr)}
		if s.redisTimeout > 0 {
			sopts = append(sopts, concurrency.RedisTimeout(s.redisTimeout))
		}
		gate, err := concurrency.NewShared(s.rdb, s.prefix, name, s.id, alg, sopts...)
		if err != nil {
			return nil, err
		}
		fleet, err := upstream.NewFleet(s.rdb, s.prefix, name, s.redisTimeout)
		if err != nil {
			return nil, err
		}
		opts = append(opts, upstream.SharedGate(gate), upstream.BreakerOptions(upstream.FleetWide(fleet, 0), upstream.OnFleetError(logErr)))
	}
	if rv := u.Reserved; rv != nil && s.rdb != nil {
		// Reserved shares hold across the fleet, so they always count in
		// Redis.
		units := map[string]upstream.ReserveUnit{policy.ReserveConcurrency: upstream.ReserveConcurrency,
			policy.ReserveRequests: upstream.ReserveRequests, policy.ReserveTokens: upstream.ReserveTokens}
		capacity := rv.Capacity
		if capacity == 0 {
			capacity = int64(u.Max)
		}
		r, err := upstream.NewReserve(s.rdb, upstream.ReserveConfig{Prefix: s.prefix, Upstream: name, ID: s.id, Unit: units[rv.Unit],
			Capacity: capacity, Saturation: rv.Saturation, Shares: rv.Shares, Timeout: s.redisTimeout,
			OnError: func(err error) {
				s.log.Warn("reserved shares: Redis error; admitting meanwhile", "upstream", name, "err", err)
			}})
		if err != nil {
			return nil, fmt.Errorf("upstreams.%s.reserved: %w", name, err)
		}
		opts = append(opts, upstream.Reserved(r))
	}
	g, err := upstream.New(name, opts...)
	if err != nil {
		return nil, fmt.Errorf("upstreams.%s: %w", name, err)
	}
	return g, nil
}

// Close stops every Guard's background work (a shared gate gives its
// slots back to the fleet) and waits for it.
func (s *Guards) Close() {
	if s == nil {
		return
	}
	s.stop()
	s.wg.Wait()
}

// outcomeOf classifies an upstream attempt for the Guard's limit, queue
// estimate and breaker: a failure is the provider's (no answer, a timeout,
// 429 or 5xx); a caller that went away says nothing of the upstream.
func outcomeOf(status int, err error, callerGone bool) concurrency.Outcome {
	switch {
	case callerGone:
		return concurrency.Ignored
	case err != nil, status == http.StatusTooManyRequests, status >= 500:
		return concurrency.Failure
	}
	return concurrency.Success
}
