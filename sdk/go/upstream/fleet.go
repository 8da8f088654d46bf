package upstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fleet holds an upstream breaker's state in Redis for every gateway
// process that calls the upstream, so that the fleet opens together,
// sends Probes probes between all of its processes rather than Probes
// each, and reopens with a doubled open time when those probes fail —
// however few processes there are. Give it to each process's Breaker with
// FleetWide and run the Breaker's Run.
//
// One hash per upstream: state, until (Unix ms), backoff (ms), round (the
// opening's number; probe results of another round are ignored), passed
// (the round's probes that succeeded) and seq (the last probe id handed
// out). Beside it, in the same Cluster slot, a sorted set of the round's
// probes in flight: each probe's id scored with its deadline (Unix ms),
// the time it was handed out plus the breaker's probe deadline
// (ProbeTimeout and a margin). A probe whose result has not come by its
// deadline — its gateway died, or the call reporting it failed — is free
// again for any gateway, so a lost probe cannot hold the breaker
// half-open; a result that comes after its deadline counts for nothing
// unless it is a failure, which still reopens the breaker. Each state
// change also zeroes taken, the count that gateways of an earlier release
// keep instead, so that they go on working beside this one during a
// rolling upgrade. Times are the callers' clocks: open times and
// deadlines are tens of seconds or more, far above the skew of
// NTP-synchronised hosts.
type Fleet struct {
	rdb     redis.UniversalClient
	keys    []string // the state hash, the probes in flight
	timeout time.Duration
}

// NewFleet returns the fleet state of the upstream called upstream under
// prefix. timeout bounds each Redis call (0: 100 ms).
func NewFleet(rdb redis.UniversalClient, prefix, upstream string, timeout time.Duration) (*Fleet, error) {
	if rdb == nil || prefix == "" || upstream == "" {
		return nil, errors.New("upstream.NewFleet: rdb, prefix and upstream must be set")
	}
	if timeout == 0 {
		timeout = 100 * time.Millisecond
	}
	if timeout < time.Millisecond || timeout > 10*time.Second {
		return nil, fmt.Errorf("upstream.NewFleet: timeout %v is outside 1ms..10s", timeout)
	}
	key := prefix + "{" + upstream + "}:breaker"
	return &Fleet{rdb: rdb, keys: []string{key, key + ":probes"}, timeout: timeout}, nil
}

// fleetState is the fleet's breaker as a script answered it.
type fleetState struct {
	state   State
	until   time.Time
	backoff time.Duration
	round   int64
}

// Each script answers state, until, backoff, round (and the probe script
// first the id of the probe it granted, 0 for none). KEYS[1] is the state
// hash, KEYS[2] the sorted set of the probes in flight; ARGV[1] is always
// now in Unix ms and ARGV[2] the keys' time to live in ms.
const fleetAnswer = `
redis.call('PEXPIRE', h, ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
local v = redis.call('HMGET', h, 'state', 'until', 'backoff', 'round')
return {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4] or '0')}`

// tripScript opens a closed breaker for ARGV[3] ms (the first open time);
// an open or half-open one stays as it is (another process tripped it).
var tripScript = redis.NewScript(`
local h = KEYS[1]
if tonumber(redis.call('HGET', h, 'state') or '0') == 0 then
  local b = tonumber(ARGV[3])
  redis.call('HINCRBY', h, 'round', 1)
  redis.call('HSET', h, 'state', 1, 'until', tonumber(ARGV[1]) + b, 'backoff', b, 'passed', 0, 'taken', 0)
  redis.call('DEL', KEYS[2])
end` + fleetAnswer)

// probeScript half-opens an open breaker whose open time is over and
// hands out one of its ARGV[3] probes, due back within ARGV[4] ms: probes
// past their deadline are dropped first, so their places are free. It
// answers {probe id or 0, ...}.
var probeScript = redis.NewScript(`
local h, p = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local v = redis.call('HMGET', h, 'state', 'until', 'passed')
local st = tonumber(v[1] or '0')
local passed = tonumber(v[3] or '0')
if st == 1 and now >= tonumber(v[2] or '0') then
  st, passed = 2, 0
  redis.call('HSET', h, 'state', 2, 'passed', 0, 'taken', 0)
  redis.call('DEL', p)
end
local id = 0
if st == 2 then
  redis.call('ZREMRANGEBYSCORE', p, '-inf', now)
  if passed + redis.call('ZCARD', p) < tonumber(ARGV[3]) then
    id = redis.call('HINCRBY', h, 'seq', 1)
    redis.call('ZADD', p, now + tonumber(ARGV[4]), id)
  end
end
local a = (function()` + fleetAnswer + ` end)()
return {id, a[1], a[2], a[3], a[4]}`)

// resultScript records probe ARGV[8] of round ARGV[3] of the half-open
// breaker: ARGV[4] "fail" reopens it for twice its back-off, capped at
// ARGV[7] ms, whenever it comes; "ok" counts a success and closes it
// after ARGV[5] (resetting the back-off to ARGV[6] ms), and "ignored"
// frees the probe's place, both only while the probe is still within its
// deadline (after it, its place was freed and may be another's).
var resultScript = redis.NewScript(`
local h, p = KEYS[1], KEYS[2]
local v = redis.call('HMGET', h, 'state', 'backoff', 'round')
if tonumber(v[1] or '0') == 2 and tonumber(v[3] or '0') == tonumber(ARGV[3]) then
  local due = tonumber(redis.call('ZSCORE', p, ARGV[8]) or '0')
  local held = due > tonumber(ARGV[1])
  redis.call('ZREM', p, ARGV[8])
  if ARGV[4] == 'fail' then
    local b = math.min(2 * tonumber(v[2] or '0'), tonumber(ARGV[7]))
    redis.call('HINCRBY', h, 'round', 1)
    redis.call('HSET', h, 'state', 1, 'until', tonumber(ARGV[1]) + b, 'backoff', b, 'passed', 0, 'taken', 0)
    redis.call('DEL', p)
  elseif held and ARGV[4] == 'ok' and redis.call('HINCRBY', h, 'passed', 1) >= tonumber(ARGV[5]) then
    redis.call('HSET', h, 'state', 0, 'backoff', tonumber(ARGV[6]), 'passed', 0, 'taken', 0)
    redis.call('DEL', p)
  end
end` + fleetAnswer)

// readScript reads the state.
var readScript = redis.NewScript(`local h = KEYS[1]` + fleetAnswer)

func (f *Fleet) run(s *redis.Script, now time.Time, ttl time.Duration, args ...any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	argv := append([]any{now.UnixMilli(), ttl.Milliseconds()}, args...)
	return s.Run(ctx, f.rdb, f.keys, argv...).Int64Slice()
}

func decodeFleet(v []int64) (fleetState, error) {
	if len(v) != 4 || v[0] < 0 || v[0] > int64(HalfOpen) {
		return fleetState{}, fmt.Errorf("upstream: unexpected fleet breaker answer %v", v)
	}
	return fleetState{state: State(v[0]), until: time.UnixMilli(v[1]), backoff: time.Duration(v[2]) * time.Millisecond, round: v[3]}, nil
}

func (f *Fleet) trip(now time.Time, ttl, first time.Duration) (fleetState, error) {
	v, err := f.run(tripScript, now, ttl, first.Milliseconds())
	if err != nil {
		return fleetState{}, err
	}
	return decodeFleet(v)
}

// probe asks for one of the round's probes, due back within due; id 0
// means none was granted.
func (f *Fleet) probe(now time.Time, ttl time.Duration, probes int, due time.Duration) (int64, fleetState, error) {
	v, err := f.run(probeScript, now, ttl, probes, due.Milliseconds())
	if err != nil {
		return 0, fleetState{}, err
	}
	if len(v) != 5 || v[0] < 0 {
		return 0, fleetState{}, fmt.Errorf("upstream: unexpected fleet probe answer %v", v)
	}
	fs, err := decodeFleet(v[1:])
	return v[0], fs, err
}

// result reports probe id of round; id 0 (a probe this process cannot
// name) counts only a failure.
func (f *Fleet) result(now time.Time, ttl time.Duration, round, id int64, result string, probes int, first, maxOpen time.Duration) (fleetState, error) {
	v, err := f.run(resultScript, now, ttl, round, result, probes, first.Milliseconds(), maxOpen.Milliseconds(), id)
	if err != nil {
		return fleetState{}, err
	}
	return decodeFleet(v)
}

func (f *Fleet) read(now time.Time, ttl time.Duration) (fleetState, error) {
	v, err := f.run(readScript, now, ttl)
	if err != nil {
		return fleetState{}, err
	}
	return decodeFleet(v)
}
