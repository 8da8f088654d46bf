-- admit.lua: check every rule of one admission, then debit all of them or
-- none. Shared by every Sluice SDK; the layout below is a contract, see the
-- package documentation of sdk/go/admission ("Scripts").
--
-- KEYS[i]  state of rule instance i: a token bucket hash {t = tokens,
--          ts = ms of the last update}, a sliding window hash
--          {<granule index> = units debited in that granule} or a
--          calendar period hash {<period id> = units debited in that
--          period}: one field, the current period's (older ones are
--          deleted when met).
-- ARGV[1]  n, the number of rules (= #KEYS)
-- then 7 values per rule; rule i starts at ARGV[2 + (i-1)*7]:
--   kind     "b" token bucket, "w" sliding window, "p" calendar period
--   limit    bucket: burst (capacity); window: most units in one window;
--            period: most units in one period
--   rate     bucket: refill in units per ms; window: length in ms;
--            period: the current period's id, its start in Unix ms (the
--            caller's clock and calendar: periods follow a time zone)
--   granule  bucket: 0; window: granule length in ms; period: the
--            current period's end in Unix ms
--   need     units this request debits (at least 1)
--   want     further units the caller asks for as a local lease (0: none)
--   floor    units this request must leave untouched (a priority reserve)
-- ARGV[2 + n*7], optional: the time to use instead of Redis's TIME, Unix
--          ms (tests move it past a window's length; production never
--          passes it, so every gateway shares Redis's clock)
--
-- Every rule is checked before any is debited, so a refusal by rule i
-- leaves no debit anywhere (expired window granules are deleted on the way:
-- that changes no count).
--
-- Reply, every rule admits:  {1, now_ms, then per rule: remaining, grant, reset_ms}
--   remaining  units left after this debit and the lease (not below 0)
--   grant      lease units debited on top of need (0 <= grant <= want)
--   reset_ms   ms until the rule is back to its full limit
-- Reply, rule i refuses:     {0, now_ms, i, available, retry_ms}
--   retry_ms   ms until need fits; -1 if it never fits (need > limit - floor)
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2 + n * 7])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local st = {}

-- A period's hash lives until its period ends (and 1 s more); a gateway
-- whose clock is behind never shortens the life another gave it.
local function expire_at(key, end_ms)
  local ttl = math.max(1, math.ceil(end_ms - now)) + 1000
  local cur = redis.call('PTTL', key)
  if cur < 0 or cur < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

-- The reply of rule i refusing need: the units it has available and the
-- ms until need fits, retry() (-1 when it never fits: need > limit - floor).
local function refused(i, need, avail, limit, floor, retry)
  local ms = -1
  if need <= limit - floor then
    ms = retry()
  end
  return {0, math.floor(now), i, math.floor(math.max(avail, 0)), ms}
end

-- Fields of expired granules or periods go as they are met.
local function drop(key, dead)
  if #dead > 0 then
    redis.call('HDEL', key, unpack(dead))
  end
end

-- The ms until need fits in a sliding window whose hash is h: the oldest
-- granules leave first; granule g stops counting at (g+1)*gran + length.
local function window_retry(h, oldest, gran, length, need, avail)
  local live = {}
  for j = 1, #h, 2 do
    local g = tonumber(h[j])
    if g >= oldest then
      live[#live + 1] = {g, tonumber(h[j + 1])}
    end
  end
  table.sort(live, function(x, y) return x[1] < y[1] end)
  local freed = 0
  for _, e in ipairs(live) do
    freed = freed + e[2]
    if need <= avail + freed then
      return math.max(0, math.ceil((e[1] + 1) * gran + length - now))
    end
  end
  return -1
end

for i = 1, n do
  local b = 2 + (i - 1) * 7
  local kind, limit, rate = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local need, floor = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 6])
  local key = KEYS[i]
  if kind == 'b' then
    local v = redis.call('HMGET', key, 't', 'ts')
    local tokens, ts = tonumber(v[1]), tonumber(v[2])
    if tokens == nil or ts == nil then
      tokens = limit
    elseif now > ts then
      tokens = math.min(limit, tokens + (now - ts) * rate)
    end
    local avail = tokens - floor
    if need > avail then
      return refused(i, need, avail, limit, floor, function() return math.ceil((need - avail) / rate) end)
    end
    st[i] = tokens
  elseif kind == 'p' then
    local id = tonumber(ARGV[b + 2])
    local h = redis.call('HGETALL', key)
    local used, dead = 0, {}
    for j = 1, #h, 2 do
      local g = tonumber(h[j])
      if g == id then
        used = tonumber(h[j + 1])
      elseif g < id then
        dead[#dead + 1] = h[j]
      end
    end
    drop(key, dead)
    local avail = limit - used - floor
    if need > avail then
      return refused(i, need, avail, limit, floor, function() return math.max(1, math.ceil(tonumber(ARGV[b + 3]) - now)) end)
    end
    st[i] = used
  else
    local gran = tonumber(ARGV[b + 3])
    local oldest = math.floor((now - rate) / gran)
    local h = redis.call('HGETALL', key)
    local used, dead = 0, {}
    for j = 1, #h, 2 do
      if tonumber(h[j]) < oldest then
        dead[#dead + 1] = h[j]
      else
        used = used + tonumber(h[j + 1])
      end
    end
    drop(key, dead)
    local avail = limit - used - floor
    if need > avail then
      return refused(i, need, avail, limit, floor, function() return window_retry(h, oldest, gran, rate, need, avail) end)
    end
    st[i] = used
  end
end

local out = {1, math.floor(now)}
for i = 1, n do
  local b = 2 + (i - 1) * 7
  local kind, limit, rate = ARGV[b], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
  local need, want, floor = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
  local key = KEYS[i]
  if kind == 'b' then
    local tokens = st[i]
    local grant = math.max(0, math.min(want, math.floor(tokens - floor - need)))
    tokens = tokens - need - grant
    redis.call('HSET', key, 't', string.format('%.6f', tokens), 'ts', string.format('%.3f', now))
    local full = math.ceil((limit - tokens) / rate)
    redis.call('PEXPIRE', key, full + 1000)
    out[#out + 1] = math.floor(math.max(tokens, 0))
    out[#out + 1] = grant
    out[#out + 1] = full
  elseif kind == 'p' then
    local used, ends = st[i], tonumber(ARGV[b + 3])
    local grant = math.max(0, math.min(want, limit - floor - used - need))
    redis.call('HINCRBY', key, ARGV[b + 2], string.format('%d', need + grant))
    expire_at(key, ends)
    out[#out + 1] = math.max(0, limit - used - need - grant)
    out[#out + 1] = grant
    out[#out + 1] = math.max(0, math.ceil(ends - now))
  else
    local gran = tonumber(ARGV[b + 3])
    local used = st[i]
    local grant = math.max(0, math.min(want, limit - floor - used - need))
    local cur = math.floor(now / gran)
    redis.call('HINCRBY', key, string.format('%d', cur), string.format('%d', need + grant))
    redis.call('PEXPIRE', key, rate + gran + 1000)
    out[#out + 1] = math.max(0, limit - used - need - grant)
    out[#out + 1] = grant
    out[#out + 1] = math.max(0, math.ceil((cur + 1) * gran + rate - now))
  end
end
return out
