package concurrency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// Shared is a gate whose calls in flight are counted across every
// gateway process that calls the same upstream, in Redis, for an upstream
// the policy says is shared (one provider account behind a fleet).
//
// Each process keeps its own count in a hash field (its id) and holds a
// lease on it — an entry in a sorted set scored with the lease's expiry,
// renewed by Run every third of the lease. A process that dies stops
// renewing; the first acquire after its lease expires drops its count, so
// its slots come back within the lease time (default 15 s) instead of
// never. Times come from Redis (TIME), so the processes' clocks need not
// agree.
//
// Each acquire is one script call (one round trip); each release one
// too. The limit is this process's Algorithm's: every process observes
// the same upstream, so their adaptive limits agree closely without
// sharing more. When Redis cannot be reached an acquire falls back to
// counting this process alone against the limit (fail open: the fleet may
// then exceed the limit by the number of processes, never stop), and a
// release that failed is retried by Run.
type Shared struct {
	rdb         redis.UniversalClient
	countsKey   string
	leasesKey   string
	releasedKey string
	id          string
	alg         Algorithm
	ttl         time.Duration
	timeout     time.Duration
	now         func() time.Time
	onError     func(error)
	limit       atomic.Int64
	local       atomic.Int64 // slots this process holds, counted in Redis or not
	localOnly   atomic.Int64 // slots taken while Redis was unreachable
	fleet       atomic.Int64 // the fleet's count as last seen
	unreleased  atomic.Int64 // releases Redis has not seen yet
	// releases numbers the releases sent to Redis; each records its
	// number there (releasedKey), so a renewal can tell whether a release
	// raced the count it read (see renewScript).
	releases    atomic.Int64
	redisErrors atomic.Int64
	mu          sync.Mutex // serialises Observe and the store of its limit
	// beforeRenew, when set, runs between a renewal's reading of the
	// slots held and its script (tests play interleavings with it).
	beforeRenew func()
}

// SharedOpt configures a Shared.
type SharedOpt interface{ applyShared(*Shared) }

type sharedOpt func(*Shared)

func (o sharedOpt) applyShared(s *Shared) { o(s) }

// LeaseTime is how long a process's count outlives its last renewal
// (default 15 s): the time a dead process's slots stay taken.
func LeaseTime(d time.Duration) SharedOpt { return sharedOpt(func(s *Shared) { s.ttl = d }) }

// RedisTimeout bounds each Redis call (default 100 ms); past it the call
// counts as failed.
func RedisTimeout(d time.Duration) SharedOpt { return sharedOpt(func(s *Shared) { s.timeout = d }) }

// SharedClock replaces time.Now as the time given to the Algorithm.
func SharedClock(now func() time.Time) SharedOpt { return sharedOpt(func(s *Shared) { s.now = now }) }

// OnRedisError is called with every Redis error (for logs and metrics);
// it must not block.
func OnRedisError(f func(error)) SharedOpt { return sharedOpt(func(s *Shared) { s.onError = f }) }

// NewShared returns the shared gate of the upstream called upstream, with
// keys under prefix and this process known as id (unique per process: a
// host name and a start time, say), whose limit alg sets.
func NewShared(rdb redis.UniversalClient, prefix, upstream, id string, alg Algorithm, opts ...SharedOpt) (*Shared, error) {
	s := &Shared{rdb: rdb, id: id, alg: alg, ttl: 15 * time.Second, timeout: 100 * time.Millisecond, now: time.Now}
	for _, o := range opts {
		o.applyShared(s)
	}
	var errs []error
	if rdb == nil || alg == nil {
		errs = append(errs, errors.New("rdb, alg: must not be nil"))
	}
	if prefix == "" || upstream == "" || id == "" || len(prefix)+len(upstream)+len(id) > 500 {
		errs = append(errs, fmt.Errorf("prefix, upstream, id: %q, %q, %q must be non-empty and 500 bytes together at most", prefix, upstream, id))
	}
	if s.ttl < 100*time.Millisecond || s.ttl > 10*time.Minute {
		errs = append(errs, fmt.Errorf("LeaseTime: %v is outside 100ms..10m", s.ttl))
	}
	if s.timeout < time.Millisecond || s.timeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("RedisTimeout: %v is outside 1ms..10s", s.timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("concurrency.NewShared: %w", err)
	}
	// The hash tag keeps both keys on one Redis Cluster slot, as the
	// script needs.
	base := prefix + "{" + upstream + "}:"
	s.countsKey, s.leasesKey, s.releasedKey = base+"inflight", base+"leases", base+"released"
	s.limit.Store(int64(alg.Limit()))
	return s, nil
}

// acquireScript drops the counts (and release numbers, KEYS[3]) of
// processes whose lease expired, then takes a slot for ARGV[1] if the
// fleet holds fewer than ARGV[2], renewing its lease for ARGV[3] ms. It
// answers {taken (0/1), fleet count after}.
var acquireScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for i = 1, #dead do
  redis.call('HDEL', KEYS[1], dead[i])
  redis.call('HDEL', KEYS[3], dead[i])
end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local total = 0
local vals = redis.call('HVALS', KEYS[1])
for i = 1, #vals do total = total + tonumber(vals[i]) end
if total >= tonumber(ARGV[2]) then return {0, total} end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
redis.call('PEXPIRE', KEYS[2], 2 * ttl)
return {1, total + 1}`)

// releaseScript returns ARGV[2] slots of ARGV[1]; a count that reaches
// zero (or below, when the lease had lapsed and another process dropped
// the count) is removed. ARGV[3] > 0 is the release's number, recorded in
// KEYS[2] (the highest seen) for renewScript; ARGV[4] is the lease time in
// ms.
var releaseScript = redis.NewScript(`
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2]))
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
local seq = tonumber(ARGV[3])
if seq > 0 then
  if seq > tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') then
    redis.call('HSET', KEYS[2], ARGV[1], seq)
  end
  redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[4]))
end
return n`)

// renewScript renews ARGV[1]'s lease for ARGV[3] ms and, if its count was
// dropped while the lease had lapsed (a long pause), restores it to
// ARGV[2], this process's own count of slots held as read when ARGV[4]
// releases had been sent. The count is absent after a release took it to
// zero too; so it is restored only if the last release Redis recorded
// (KEYS[3]) is that very one, or none is recorded (the record is dropped
// with the count): a release that landed after the count was read would
// otherwise come back as a slot nobody holds, and one still on its way
// when it was read would be taken twice.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
if not redis.call('HGET', KEYS[1], ARGV[1]) and tonumber(ARGV[2]) > 0 then
  local seen = redis.call('HGET', KEYS[3], ARGV[1])
  if not seen or tonumber(seen) == tonumber(ARGV[4]) then
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
redis.call('PEXPIRE', KEYS[2], 2 * ttl)
return 1`)

func (s *Shared) fail(err error) {
	s.redisErrors.Add(1)
	if s.onError != nil {
		s.onError(err)
	}
}

// TryAcquire takes a slot if the fleet holds fewer than the limit. With
// Redis unreachable it takes one if this process alone holds fewer.
func (s *Shared) TryAcquire() bool {
	limit := s.limit.Load()
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	res, err := acquireScript.Run(ctx, s.rdb, []string{s.countsKey, s.leasesKey, s.releasedKey}, s.id, limit, s.ttl.Milliseconds()).Int64Slice()
	if err != nil || len(res) != 2 {
		if err == nil {
			err = fmt.Errorf("acquire script answered %v", res)
		}
		s.fail(fmt.Errorf("concurrency: shared acquire for %s: %w", s.countsKey, err))
		for {
			n := s.local.Load()
			if n >= limit {
				return false
			}
			if s.local.CompareAndSwap(n, n+1) {
				s.localOnly.Add(1)
				return true
			}
		}
	}
	s.fleet.Store(res[1])
	if res[0] == 1 {
		s.local.Add(1)
		return true
	}
	return false
}

// Release returns a slot and gives the call to the Algorithm.
func (s *Shared) Release(latency time.Duration, o Outcome) {
	n := s.local.Add(-1) + 1
	if lo := s.localOnly.Load(); lo > 0 && s.localOnly.CompareAndSwap(lo, lo-1) {
		// A slot Redis never counted.
	} else {
		// Numbered after the local count went down: a renewal that read
		// the count before this release also read a smaller number.
		seq := s.releases.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		err := releaseScript.Run(ctx, s.rdb, []string{s.countsKey, s.releasedKey}, s.id, 1, seq, s.ttl.Milliseconds()).Err()
		cancel()
		if err != nil {
			s.fail(fmt.Errorf("concurrency: shared release for %s: %w", s.countsKey, err))
			s.unreleased.Add(1)
		} else {
			s.fleet.Add(-1)
		}
	}
	if o == Ignored {
		return
	}
	smp := Sample{Latency: latency, InFlight: int(max(n, s.fleet.Load())), Outcome: o}
	s.mu.Lock()
	s.limit.Store(int64(s.alg.Observe(s.now(), smp)))
	s.mu.Unlock()
}

// Limit is the current limit, the fleet's.
func (s *Shared) Limit() int { return int(s.limit.Load()) }

// InFlight is the fleet's count as last seen by this process (at its
// last acquire), adjusted by its own releases since.
func (s *Shared) InFlight() int { return int(max(0, s.fleet.Load())) }

// Local is the number of slots this process holds.
func (s *Shared) Local() int { return int(s.local.Load()) }

// RedisErrors is how many Redis calls failed.
func (s *Shared) RedisErrors() int64 { return s.redisErrors.Load() }

// Remote tells a priority.Queue that slots are also freed by other
// processes, so it must retry waiting requests rather than wait for a
// local release.
func (s *Shared) Remote() bool { return true }

// Run renews this process's lease every third of LeaseTime and retries
// releases that failed, until ctx ends; then it removes this process's
// count and lease, so that a clean shutdown frees its slots at once. It
// returns nil; Redis errors go to OnRedisError and are retried.
func (s *Shared) Run(ctx context.Context) error {
	periodic.Every(ctx, s.ttl/3, func() { s.renew(ctx) })
	s.shutdown()
	return nil
}

// shutdown removes this process's count, lease and last release number.
// Run's ctx has ended by now, so it has a bound of its own.
func (s *Shared) shutdown() {
	c, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	p := s.rdb.TxPipeline()
	p.HDel(c, s.countsKey, s.id)
	p.ZRem(c, s.leasesKey, s.id)
	p.HDel(c, s.releasedKey, s.id)
	if _, err := p.Exec(c); err != nil {
		s.fail(fmt.Errorf("concurrency: shared shutdown for %s: %w", s.countsKey, err))
	}
}

func (s *Shared) renew(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if n := s.unreleased.Load(); n > 0 {
		// No number: these releases were numbered when first sent, and
		// a renewal does not restore a count until a later release
		// records a number again.
		if err := releaseScript.Run(c, s.rdb, []string{s.countsKey, s.releasedKey}, s.id, n, 0, s.ttl.Milliseconds()).Err(); err != nil {
			s.fail(fmt.Errorf("concurrency: shared release retry for %s: %w", s.countsKey, err))
			return
		}
		s.unreleased.Add(-n)
	}
	// The number first, then the count: Release lowers the count first,
	// then numbers itself.
	seq := s.releases.Load()
	counted := s.local.Load() - s.localOnly.Load()
	if counted <= 0 {
		return
	}
	if s.beforeRenew != nil {
		s.beforeRenew()
	}
	if err := renewScript.Run(c, s.rdb, []string{s.countsKey, s.leasesKey, s.releasedKey}, s.id, counted, s.ttl.Milliseconds(), seq).Err(); err != nil {
		s.fail(fmt.Errorf("concurrency: shared lease renewal for %s: %w", s.countsKey, err))
	}
}
