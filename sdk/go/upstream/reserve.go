package upstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/schemas"
	"github.com/sluicehq/sluice/sdk/go/periodic"
)

// ReserveUnit is what a Reserve counts.
type ReserveUnit uint8

// The units.
const (
	// ReserveConcurrency counts calls in flight (and waiting in a Guard's
	// queue), released when they end.
	ReserveConcurrency ReserveUnit = iota + 1
	// ReserveRequests counts requests per minute.
	ReserveRequests
	// ReserveTokens counts tokens per minute: the estimate when a request
	// is admitted, corrected to what it used when its Hold is settled.
	ReserveTokens
)

// Reserve holds each priority class to its reserved share of an
// upstream's capacity once the upstream is saturated, across every
// gateway process that calls it (LiteLLM's reserved shares per priority):
//
//   - while the fleet's use stays at or below Saturation × Capacity, any
//     class may use idle capacity, its share or not;
//   - above it, a request is admitted only while its class stays within
//     its own share, or the part no class reserves (1 − the sum of the
//     shares, common to all) still has room for what the classes use
//     beyond their shares; and never beyond Capacity.
//
// So a class that borrowed idle capacity while the upstream was quiet
// keeps what it holds but gets no more once the upstream is busy, and a
// class with a reserved share finds it, up to the saturation headroom,
// however much the others want.
//
// The counts live in one Redis hash per upstream (hash tag {upstream}, so
// one slot of a Cluster, as the script needs), written by one script call
// per admission:
//
//	<prefix>{<upstream>}:reserve    field <class>|<process>  (concurrency) or
//	                                      <class>|<second>   (rates: one-minute window of 60 granules)
//	<prefix>{<upstream>}:reserve:leases   sorted set: process → lease expiry (concurrency)
//
// A process's concurrency counts are dropped when its lease expires (Run
// renews it), so a dead gateway's calls come back within the lease time.
// Times are Redis's own. When Redis cannot be reached a request is
// admitted (the Guard's concurrency limit and queue still bound the
// upstream) and the error counted.
type Reserve struct {
	rdb        redis.UniversalClient
	key, lease string
	id         string
	unit       ReserveUnit
	capacity   int64
	saturation float64
	shares     [schemas.NumPriorities]float64
	ttl        time.Duration
	timeout    time.Duration
	onError    func(error)

	errs    atomic.Int64
	refused [schemas.NumPriorities]atomic.Uint64
}

// ReserveConfig is what NewReserve needs.
type ReserveConfig struct {
	// Prefix and Upstream name the keys; ID names this process (unique
	// per process).
	Prefix, Upstream, ID string
	Unit                 ReserveUnit
	// Capacity is the upstream's capacity in Unit (per minute for the
	// rates); Saturation the share of it above which classes are held to
	// their Shares (0 < Saturation ≤ 1; shares add up to at most 1).
	Capacity   int64
	Saturation float64
	Shares     map[schemas.Priority]float64
	// LeaseTime (default 15 s) and Timeout (default 100 ms) as for
	// concurrency.Shared; OnError learns every Redis error.
	LeaseTime, Timeout time.Duration
	OnError            func(error)
}

// NewReserve returns the Reserve of c, checking every field.
func NewReserve(rdb redis.UniversalClient, c ReserveConfig) (*Reserve, error) {
	r := &Reserve{rdb: rdb, id: c.ID, unit: c.Unit, capacity: c.Capacity, saturation: c.Saturation,
		ttl: c.LeaseTime, timeout: c.Timeout, onError: c.OnError}
	if r.ttl == 0 {
		r.ttl = 15 * time.Second
	}
	if r.timeout == 0 {
		r.timeout = 100 * time.Millisecond
	}
	var errs []error
	if rdb == nil {
		errs = append(errs, errors.New("rdb: must not be nil"))
	}
	if c.Prefix == "" || c.Upstream == "" || c.ID == "" || len(c.Prefix)+len(c.Upstream)+len(c.ID) > 500 {
		errs = append(errs, fmt.Errorf("ReserveConfig.Prefix, Upstream, ID: %q, %q, %q must be non-empty and 500 bytes together at most", c.Prefix, c.Upstream, c.ID))
	}
	if c.Unit < ReserveConcurrency || c.Unit > ReserveTokens {
		errs = append(errs, fmt.Errorf("ReserveConfig.Unit: %d is not one of ReserveConcurrency, ReserveRequests, ReserveTokens", c.Unit))
	}
	if c.Capacity < 1 || c.Capacity > 1<<40 {
		errs = append(errs, fmt.Errorf("ReserveConfig.Capacity: %d is outside 1..%d", c.Capacity, int64(1)<<40))
	}
	if !(c.Saturation > 0 && c.Saturation <= 1) {
		errs = append(errs, fmt.Errorf("ReserveConfig.Saturation: %v is outside (0, 1]", c.Saturation))
	}
	sum := 0.0
	for cl, s := range c.Shares {
		if !cl.Valid() || !(s >= 0 && s <= 1) {
			errs = append(errs, fmt.Errorf("ReserveConfig.Shares: class %q share %v: want a class and a share in 0..1", string(cl), s))
			continue
		}
		r.shares[cl.Index()] = s
		sum += s
	}
	if sum > 1+1e-9 {
		errs = append(errs, fmt.Errorf("ReserveConfig.Shares: they add up to %.3g, more than 1", sum))
	}
	if r.ttl < 100*time.Millisecond || r.ttl > 10*time.Minute || r.timeout < time.Millisecond || r.timeout > 10*time.Second {
		errs = append(errs, fmt.Errorf("ReserveConfig.LeaseTime, Timeout: %v, %v are outside 100ms..10m and 1ms..10s", r.ttl, r.timeout))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("upstream.NewReserve: %w", err)
	}
	base := c.Prefix + "{" + c.Upstream + "}:reserve"
	r.key, r.lease = base, base+":leases"
	return r, nil
}

// reserveScript decides one admission. KEYS[1] the counts hash, KEYS[2]
// the leases (concurrency). ARGV: mode ("c" concurrency, "w" window),
// class index (0 low .. 3 critical), need, capacity, saturation, the four
// shares (low first), process id, lease ms. Answers {admitted 0/1, the
// fleet's use before, the class's use before, the field debited}.
var reserveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode, ci, need, cap, sat = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local shares = {tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])}
local pid, ttl = ARGV[10], tonumber(ARGV[11])
local gone = {}
if mode == 'c' then
  local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
  for i = 1, #dead do gone[dead[i]] = true end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
end
local oldest = math.floor(now / 1000) - 59
local used = {0, 0, 0, 0}
local h = redis.call('HGETALL', KEYS[1])
local drop = {}
for j = 1, #h, 2 do
  local sep = string.find(h[j], '|', 1, true)
  local c = tonumber(string.sub(h[j], 1, sep - 1))
  local rest = string.sub(h[j], sep + 1)
  if (mode == 'c' and gone[rest]) or (mode == 'w' and tonumber(rest) < oldest) then
    drop[#drop + 1] = h[j]
  else
    used[c + 1] = used[c + 1] + tonumber(h[j + 1])
  end
end
if #drop > 0 then redis.call('HDEL', KEYS[1], unpack(drop)) end
local total = used[1] + used[2] + used[3] + used[4]
local own = used[ci + 1]
local ok = total + need <= sat * cap
if not ok and total + need <= cap then
  local mine = shares[ci + 1] * cap
  if own + need <= mine then
    ok = true
  else
    local common = (1 - shares[1] - shares[2] - shares[3] - shares[4]) * cap
    local beyond = 0
    for i = 1, 4 do beyond = beyond + math.max(0, used[i] - shares[i] * cap) end
    local more = math.max(0, own + need - mine) - math.max(0, own - mine)
    ok = beyond + more <= common
  end
end
if not ok then return {0, total, own, ''} end
local field
if mode == 'c' then
  field = ci .. '|' .. pid
  redis.call('ZADD', KEYS[2], now + ttl, pid)
  redis.call('PEXPIRE', KEYS[2], 2 * ttl)
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
else
  field = ci .. '|' .. math.floor(now / 1000)
  redis.call('PEXPIRE', KEYS[1], 61000)
end
redis.call('HINCRBY', KEYS[1], field, need)
return {1, total, own, field}`)

// releaseReserveScript takes ARGV[2] back from field ARGV[1], removing it
// at zero.
var releaseReserveScript = redis.NewScript(`
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], -tonumber(ARGV[2]))
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n`)

// settleReserveScript corrects the use of field ARGV[1] by ARGV[2] (the
// real tokens less the estimate) while the field is still in the window;
// a field gone from it needs no correction. The count never goes below
// zero.
var settleReserveScript = redis.NewScript(`
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local n = redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
if n <= 0 then redis.call('HDEL', KEYS[1], ARGV[1]) end
return n`)

// Hold is what an admitted request holds of a Reserve; Release it when
// the call ends (it gives concurrency back; a rate's use stays counted
// for its minute), and Settle a token hold with what the call used. The
// zero Hold does nothing.
type Hold struct {
	r     *Reserve
	field string
	n     int64
}

// Take asks for n units (1 for concurrency and requests, the estimate for
// tokens) for a request of class c. ok false refuses it: its class is
// over its share above the saturation threshold. With Redis unreachable
// it admits.
func (r *Reserve) Take(c schemas.Priority, n int64) (h Hold, ok bool) {
	if !c.Valid() {
		c = schemas.PriorityNormal
	}
	n = max(n, 1)
	mode := "w"
	if r.unit == ReserveConcurrency {
		mode = "c"
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	s := r.shares
	res, err := reserveScript.Run(ctx, r.rdb, []string{r.key, r.lease}, mode, c.Index(), n, r.capacity,
		strconv.FormatFloat(r.saturation, 'f', -1, 64), s[0], s[1], s[2], s[3], r.id, r.ttl.Milliseconds()).Slice()
	if err != nil || len(res) != 4 {
		r.fail(fmt.Errorf("upstream: reserved shares of %s: %w", r.key, errOr(err, res)))
		return Hold{}, true
	}
	if v, _ := res[0].(int64); v != 1 {
		r.refused[c.Index()].Add(1)
		return Hold{}, false
	}
	field, _ := res[3].(string)
	if r.unit == ReserveRequests {
		return Hold{}, true // a request stays counted for its minute
	}
	return Hold{r: r, field: field, n: n}, true
}

func errOr(err error, res []any) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("the script answered %v", res)
}

func (r *Reserve) fail(err error) {
	r.errs.Add(1)
	if r.onError != nil {
		r.onError(err)
	}
}

// Release gives a concurrency hold back; other holds stay counted.
func (h Hold) Release() {
	if h.r == nil || h.r.unit != ReserveConcurrency {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.r.timeout)
	defer cancel()
	if err := releaseReserveScript.Run(ctx, h.r.rdb, []string{h.r.key}, h.field, h.n).Err(); err != nil {
		// The lease drops the count if this process dies; while it lives
		// the count stays too high until the lease lapses unrenewed.
		h.r.fail(fmt.Errorf("upstream: reserved shares release of %s: %w", h.r.key, err))
	}
}

// Settle corrects a token hold from the estimate it took to the tokens
// the call used (0 for a call that failed before any was billed), so that
// the class's and the fleet's use for the minute count what was spent:
// an estimate above the real use gives the difference back, one below it
// adds the rest. Call it at most once per Hold; it does nothing for the
// other units, or once the hold's second has left the one-minute window.
// With Redis unreachable the estimate stays counted (and the error
// counted).
func (h Hold) Settle(used int64) {
	if h.r == nil || h.r.unit != ReserveTokens || used == h.n {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.r.timeout)
	defer cancel()
	if err := settleReserveScript.Run(ctx, h.r.rdb, []string{h.r.key}, h.field, max(used, 0)-h.n).Err(); err != nil {
		h.r.fail(fmt.Errorf("upstream: reserved shares settlement of %s: %w", h.r.key, err))
	}
}

// Refused is how many requests of class c the Reserve refused.
func (r *Reserve) Refused(c schemas.Priority) uint64 { return r.refused[c.Index()].Load() }

// RedisErrors is how many Redis calls failed.
func (r *Reserve) RedisErrors() int64 { return r.errs.Load() }

// Run renews this process's concurrency lease every third of the lease
// time until ctx ends, then removes its counts. For the rate units it
// only waits for ctx. It returns nil.
func (r *Reserve) Run(ctx context.Context) error {
	if r.unit != ReserveConcurrency {
		<-ctx.Done()
		return nil
	}
	periodic.Every(ctx, r.ttl/3, func() { r.renew(ctx) })
	r.shutdown()
	return nil
}

// renew extends this process's concurrency lease; an error that comes of
// ctx ending is no failure.
func (r *Reserve) renew(ctx context.Context) {
	c, cancel := context.WithTimeout(ctx, r.timeout)
	err := renewReserveScript.Run(c, r.rdb, []string{r.lease}, r.id, r.ttl.Milliseconds()).Err()
	cancel()
	if err != nil && ctx.Err() == nil {
		r.fail(fmt.Errorf("upstream: reserved shares lease of %s: %w", r.key, err))
	}
}

// shutdown removes this process's counts of every class and its lease.
// Run's ctx has ended by now, so it has a bound of its own.
func (r *Reserve) shutdown() {
	c, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	fields := make([]string, schemas.NumPriorities)
	for i := range fields {
		fields[i] = strconv.Itoa(i) + "|" + r.id
	}
	p := r.rdb.TxPipeline()
	p.HDel(c, r.key, fields...)
	p.ZRem(c, r.lease, r.id)
	if _, err := p.Exec(c); err != nil {
		r.fail(fmt.Errorf("upstream: reserved shares shutdown of %s: %w", r.key, err))
	}
}

var renewReserveScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return 1`)
