-- adjust.lua: apply signed corrections to rule instances without a check:
-- settlements (actual usage minus the estimate), returned lease rests,
-- refunds of a partial refusal on Redis Cluster, and debits a gateway made
-- while Redis was unreachable. Shared by every Sluice SDK; see the package
-- documentation of sdk/go/admission ("Scripts").
--
-- ARGV[1]  marker TTL in ms. When > 0, KEYS[1] is a marker key: if it
--          exists nothing is applied and the reply is 0 (this settlement
--          was applied before: a retry); otherwise it is set with that TTL
--          and the corrections are applied. When 0 there is no marker.
-- ARGV[2]  n, the number of rule instances
-- then 6 values per instance; instance i starts at ARGV[3 + (i-1)*6] and
-- its key is KEYS[i] (KEYS[i+1] with a marker):
--   kind     "b" token bucket, "w" sliding window, "p" calendar period
--   limit    bucket: burst; window and period: limit
--   rate     bucket: refill in units per ms; window: length in ms;
--            period: the current period's id (start, Unix ms)
--   granule  bucket: 0; window: granule length in ms; period: the
--            current period's end (Unix ms)
--   delta    units: > 0 charges, < 0 refunds
--   at       window refunds: the granule index the refunded units were
--            debited in (-1: the current granule). A refund never takes a
--            granule below 0 and is dropped once that granule has left
--            the window. Charges always go to the current granule.
--            Periods likewise: a refund goes to the period id at (-1:
--            the current one) while its field exists, a charge to the
--            current period.
-- ARGV[3 + n*6], optional: the time to use instead of Redis's TIME, Unix
--          ms (as in admit.lua)
--
-- A bucket is refilled to now first; a refund never lifts it above its
-- burst, a charge may take it below 0 (a debt later requests wait for).
-- Reply: 1 applied, 0 skipped (marker present).
local ttl = tonumber(ARGV[1])
local first = 1
if ttl > 0 then
  if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ttl) == false then
    return 0
  end
  first = 2
end
local n = tonumber(ARGV[2])
local now = tonumber(ARGV[3 + n * 6])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

-- A refund takes units back from field f of key, never below 0; a field
-- left at 0 goes.
local function refund(key, f, units)
  local u = tonumber(redis.call('HGET', key, f))
  if u ~= nil then
    local left = u - math.min(u, units)
    if left > 0 then
      redis.call('HSET', key, f, string.format('%d', left))
    else
      redis.call('HDEL', key, f)
    end
  end
end

for i = 1, n do
  local b = 3 + (i - 1) * 6
  local kind, limit, rate = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local delta, at = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  local key = KEYS[first + i - 1]
  if delta ~= 0 then
    if kind == 'b' then
      local v = redis.call('HMGET', key, 't', 'ts')
      local tokens, ts = tonumber(v[1]), tonumber(v[2])
      if tokens == nil or ts == nil then
        tokens = limit
      elseif now > ts then
        tokens = math.min(limit, tokens + (now - ts) * rate)
      end
      tokens = math.min(limit, tokens - delta)
      redis.call('HSET', key, 't', string.format('%.6f', tokens), 'ts', string.format('%.3f', now))
      redis.call('PEXPIRE', key, math.ceil((limit - tokens) / rate) + 1000)
    elseif kind == 'p' then
      if delta > 0 then
        redis.call('HINCRBY', key, ARGV[b + 2], string.format('%d', delta))
        -- As admit.lua's expire_at: a period's hash lives until its end.
        local ttl = math.max(1, math.ceil(tonumber(ARGV[b + 3]) - now)) + 1000
        local cur = redis.call('PTTL', key)
        if cur < 0 or cur < ttl then
          redis.call('PEXPIRE', key, ttl)
        end
      else
        local f = ARGV[b + 2]
        if at >= 0 then f = ARGV[b + 5] end
        refund(key, f, -delta)
      end
    else
      local gran = tonumber(ARGV[b + 3])
      local cur = math.floor(now / gran)
      if delta > 0 then
        redis.call('HINCRBY', key, string.format('%d', cur), string.format('%d', delta))
        redis.call('PEXPIRE', key, rate + gran + 1000)
      else
        local g = cur
        if at >= 0 then g = at end
        if g >= math.floor((now - rate) / gran) then
          refund(key, string.format('%d', g), -delta)
        end
      end
    end
  end
end
return 1
