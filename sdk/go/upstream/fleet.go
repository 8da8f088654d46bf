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
// opening's number; probe results of another round are ignored), taken
// and passed (the round's probes handed out and succeeded). Times are the
// callers' clocks: open times are tens of seconds, far above the skew of
// NTP-synchronised hosts.
type Fleet struct {
	rdb     redis.UniversalClient
	key     string
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
	return &Fleet{rdb: rdb, key: prefix + "{" + upstream + "}:breaker", timeout: timeout}, nil
}

// fleetState is the fleet's breaker as a script answered it.
type fleetState struct {
	state   State
	until   time.Time
	backoff time.Duration
	round   int64
}

// Each script answers state, until, backoff, round (and the probe script
// first whether it granted one). ARGV[1] is always now in Unix ms and
// ARGV[2] the key's time to live in ms.
const fleetAnswer = `
redis.call('PEXPIRE', h, ARGV[2])
local v = redis.call('HMGET', h, 'state', 'until', 'backoff', 'round')
return {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4] or '0')}`

// tripScript opens a closed breaker for ARGV[3] ms (the first open time);
// an open or half-open one stays as it is (another process tripped it).
var tripScript = redis.NewScript(`
local h = KEYS[1]
if tonumber(redis.call('HGET', h, 'state') or '0') == 0 then
  local b = tonumber(ARGV[3])
  redis.call('HINCRBY', h, 'round', 1)
  redis.call('HSET', h, 'state', 1, 'until', tonumber(ARGV[1]) + b, 'backoff', b, 'taken', 0, 'passed', 0)
end` + fleetAnswer)

// probeScript half-opens an open breaker whose open time is over and
// hands out one of its ARGV[3] probes; it answers {granted (0/1), ...}.
var probeScript = redis.NewScript(`
local h = KEYS[1]
local v = redis.call('HMGET', h, 'state', 'until', 'taken')
local st = tonumber(v[1] or '0')
local taken = tonumber(v[3] or '0')
if st == 1 and tonumber(ARGV[1]) >= tonumber(v[2] or '0') then
  st, taken = 2, 0
  redis.call('HSET', h, 'state', 2, 'taken', 0, 'passed', 0)
end
local granted = 0
if st == 2 and taken < tonumber(ARGV[3]) then
  redis.call('HINCRBY', h, 'taken', 1)
  granted = 1
end
local a = (function()` + fleetAnswer + ` end)()
return {granted, a[1], a[2], a[3], a[4]}`)

// resultScript records a probe of round ARGV[3] of the half-open breaker:
// ARGV[4] "fail" reopens it for twice its back-off, capped at ARGV[7] ms;
// "ok" counts a success and closes it after ARGV[5] (resetting the
// back-off to ARGV[6] ms); "ignored" hands the probe out again.
var resultScript = redis.NewScript(`
local h = KEYS[1]
local v = redis.call('HMGET', h, 'state', 'backoff', 'round')
if tonumber(v[1] or '0') == 2 and tonumber(v[3] or '0') == tonumber(ARGV[3]) then
  if ARGV[4] == 'fail' then
    local b = math.min(2 * tonumber(v[2] or '0'), tonumber(ARGV[7]))
    redis.call('HINCRBY', h, 'round', 1)
    redis.call('HSET', h, 'state', 1, 'until', tonumber(ARGV[1]) + b, 'backoff', b, 'taken', 0, 'passed', 0)
  elseif ARGV[4] == 'ignored' then
    redis.call('HINCRBY', h, 'taken', -1)
  elseif redis.call('HINCRBY', h, 'passed', 1) >= tonumber(ARGV[5]) then
    redis.call('HSET', h, 'state', 0, 'backoff', tonumber(ARGV[6]), 'taken', 0, 'passed', 0)
  end
end` + fleetAnswer)

// readScript reads the state.
var readScript = redis.NewScript(`local h = KEYS[1]` + fleetAnswer)

func (f *Fleet) run(s *redis.Script, now time.Time, ttl time.Duration, args ...any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	argv := append([]any{now.UnixMilli(), ttl.Milliseconds()}, args...)
	return s.Run(ctx, f.rdb, []string{f.key}, argv...).Int64Slice()
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

func (f *Fleet) probe(now time.Time, ttl time.Duration, probes int) (bool, fleetState, error) {
	v, err := f.run(probeScript, now, ttl, probes)
	if err != nil {
		return false, fleetState{}, err
	}
	if len(v) != 5 {
		return false, fleetState{}, fmt.Errorf("upstream: unexpected fleet probe answer %v", v)
	}
	fs, err := decodeFleet(v[1:])
	return v[0] == 1, fs, err
}

func (f *Fleet) result(now time.Time, ttl time.Duration, round int64, result string, probes int, first, maxOpen time.Duration) (fleetState, error) {
	v, err := f.run(resultScript, now, ttl, round, result, probes, first.Milliseconds(), maxOpen.Milliseconds())
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
