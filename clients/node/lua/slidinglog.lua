-- RL.SLIDINGLOG as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <limit> <window_ms> [COST n] [PARTIAL] [DRYRUN]
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (see SPEC.md).
--
-- Exact: a call is granted when the units granted at times t with
-- now - W < t <= now (W = window in us, now = server TIME in us), plus COST,
-- do not exceed limit. If the clock steps backwards, the newest grant time
-- is used as now: elapsed time counts as zero.
--
-- State: one sorted set at KEYS[1], written only when units are granted:
--   * one entry per distinct grant time: score = time in us, member =
--     "<time_us>:<units>" (a grant of COST n costs one entry, like a grant of
--     1; two grants in the same microsecond share an entry);
--   * the member "#", score = -(units in the window): the running total,
--     so a call never sums the whole window. Its score is <= 0 and every
--     time is > 0, so it always sorts first and time ranges never touch it.
-- A call reads the newest entry and the entries that have left the window
-- (O(log n + expired)); a grant trims those with one ZREMRANGEBYSCORE and
-- adds its entry and the new total with one ZADD; the TTL is window_ms,
-- so the key disappears exactly when the window is empty. Only a call that
-- is refused walks the window from its oldest entry (just far enough to find
-- the retry time).
--
-- Exact arithmetic. Lua numbers are doubles, exact for integers below 2^53.
-- The script needs W = window_ms * 1000 < 2^53, so it accepts window_ms up to
-- 9007199254740 (about 285 years) and refuses more with an error (the module
-- accepts 1..2^53-1). limit and COST have the module's full range.

local MAX = 9007199254740991 -- 2^53 - 1, the largest argument
local MAX_WINDOW_MS = 9007199254740 -- window_ms * 1000 < 2^53
local fmod = math.fmod

local function fmt(x)
  return string.format('%d', x)
end

-- A numeric argument as the module reads it: 1 to 16 ASCII digits (no sign,
-- no spaces; leading zeros allowed) with a value in lo..hi, or nil.
local function parse_int(s, lo, hi)
  if #s > 16 or not string.find(s, '^[0-9]+$') then return nil end
  local v = tonumber(s) -- exact: at most 16 digits, checked against hi < 2^53
  if v < lo or v > hi then return nil end
  return v
end

-- ceil(us / 1000), exactly, for 0 <= us < 2^53
local function ceil_ms(us)
  local r = fmod(us, 1000)
  local q = (us - r) / 1000
  if r > 0 then q = q + 1 end
  return q
end

-- The units of an entry "<time_us>:<units>".
local function units(member)
  return tonumber(string.match(member, ':([0-9]+)$')) or 0
end

local function err(msg)
  return redis.error_reply(msg)
end

-- Arguments ------------------------------------------------------------------

if #KEYS ~= 1 then
  return err('ERR the rl.slidinglog script takes exactly 1 key')
end
local nargs = #ARGV
if nargs < 2 then
  return err("ERR wrong number of arguments for 'RL.SLIDINGLOG' command")
end
local limit = parse_int(ARGV[1], 1, MAX)
if not limit then
  return err('ERR limit must be an integer between 1 and 9007199254740991')
end
local window_ms = parse_int(ARGV[2], 1, MAX)
if not window_ms then
  return err('ERR window_ms must be an integer between 1 and 9007199254740991')
end
local cost, partial, dryrun, has_cost = 1, false, false, false
local i = 3
while i <= nargs do
  local opt = string.upper(ARGV[i])
  if opt == 'COST' and not has_cost and i < nargs then
    cost = parse_int(ARGV[i + 1], 0, MAX)
    if not cost then
      return err('ERR COST must be an integer between 0 and 9007199254740991')
    end
    has_cost = true
    i = i + 2
  elseif opt == 'PARTIAL' and not partial then
    partial = true
    i = i + 1
  elseif opt == 'DRYRUN' and not dryrun then
    dryrun = true
    i = i + 1
  else
    return err('ERR syntax error')
  end
end
if window_ms > MAX_WINDOW_MS then
  return err('ERR window_ms is beyond the exact range of the Lua script (at most 9007199254740)')
end
local W = window_ms * 1000

-- State ----------------------------------------------------------------------

local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
if last.err then return last end
local newest, newest_member = nil, nil
if last[2] then
  local s = tonumber(last[2])
  if s and s > 0 then
    newest, newest_member = s, last[1]
  end
end
if newest and newest > now then
  now = newest -- the clock stepped back: nothing elapsed since the last grant
end
local cutoff = now - W -- grants at t <= cutoff have left the window
local cutoff_arg = '0'
if cutoff > 0 then cutoff_arg = fmt(cutoff) end
if newest and newest <= cutoff then newest = nil end

-- "#" (score <= 0) and the entries that have left the window.
local gone = redis.call('ZRANGEBYSCORE', key, '-inf', cutoff_arg, 'WITHSCORES')
local total, expired, n_expired = 0, 0, 0
for j = 1, #gone, 2 do
  if gone[j] == '#' then
    total = -tonumber(gone[j + 1])
  else
    expired = expired + units(gone[j])
    n_expired = n_expired + 1
  end
end
local used = total - expired -- units granted in the window
if used < 0 then used = 0 end

-- Decision -------------------------------------------------------------------

local avail = 0
if used < limit then avail = limit - used end
local granted = 0
if cost <= avail then
  granted = cost
elseif partial then
  granted = avail
end
local after = used + granted
local remaining = 0
if after < limit then remaining = limit - after end

local retry = 0
if granted < cost then
  if cost > limit then
    retry = -1
  else
    -- The same call fits once `need` units have left the window: find the
    -- oldest grant t_k whose expiry frees that many; retry at t_k + W.
    -- (0 < need <= after: the walk always ends, at the latest at the units
    -- this call granted now.)
    local need = (after - limit) + cost
    local acc, tk = 0, nil
    local lo = '(' .. cutoff_arg
    local offset, batch = 0, 16
    while tk == nil do
      local rows = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', offset, batch)
      for j = 1, #rows, 2 do
        acc = acc + units(rows[j])
        if acc >= need then
          tk = tonumber(rows[j + 1])
          break
        end
      end
      if tk == nil then
        if #rows < 2 * batch then break end
        offset = offset + batch
        if batch < 1024 then batch = batch * 2 end
      end
    end
    if tk == nil then tk = now end -- covered by this call's own grant
    retry = ceil_ms(W - (now - tk))
  end
end

local reset = 0
if granted > 0 then
  reset = window_ms -- the newest grant is now
elseif newest then
  reset = ceil_ms(W - (now - newest))
end

if granted > 0 and not dryrun then
  if n_expired > 0 then
    redis.call('ZREMRANGEBYSCORE', key, '(0', cutoff_arg)
  end
  local u = granted
  if newest == now then
    -- A grant in the same microsecond (or after the clock stepped back):
    -- fold it into the newest entry.
    u = u + units(newest_member)
    redis.call('ZREM', key, newest_member)
  end
  local t = fmt(now)
  redis.call('ZADD', key, fmt(-after), '#', t, t .. ':' .. fmt(u))
  redis.call('PEXPIRE', key, fmt(reset))
end

local allowed = granted
if not partial then
  allowed = (granted == cost) and 1 or 0
end
return {allowed, limit, remaining, retry, reset}
