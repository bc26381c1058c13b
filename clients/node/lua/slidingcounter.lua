-- RL.SLIDINGCOUNTER as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <limit> <window_ms> [COST n] [PARTIAL] [DRYRUN]
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (see SPEC.md).
--
-- Fixed windows of W = window_ms * 1000 us are aligned to multiples of W on
-- the server's Unix clock (TIME, in us). With cur units in the current window,
-- prev in the one before and e us since the current window began, a call is
-- granted when  prev*(W-e)/W + cur + COST <= limit,  compared exactly as
-- cur + COST + ceil(prev*(W-e)/W) <= limit (the same thing for integers).
-- A call is evaluated at max(now, win): if the clock stepped back behind the
-- stored window start, elapsed time counts as zero, and the durations in the
-- reply are measured from the real clock reading to the same instants (so
-- they include the gap), exactly as the module does.
--
-- State: one hash at KEYS[1], written only when units are granted:
--   win   start (us) of the window `cur` counts
--   cur   units granted in that window
--   prev  units granted in the window before it
-- Its TTL is reset_after_ms, so it disappears exactly when both windows have
-- stopped counting. If window_ms changes, the stored window is the one that
-- holds `win` under the new window_ms (counts carry over, as in the module).
--
-- Exact arithmetic. Lua numbers are doubles, exact for integers below 2^53.
-- prev*(W-e)/W and the retry bounds go through muldiv(), an exact
-- floor(a*b/c) with remainder, and sums of durations are rounded to ms part
-- by part, so limit and COST have the module's full range (up to 2^53-1).
-- The script needs W = window_ms * 1000 < 2^53: it accepts window_ms up to
-- 9007199254740 (about 285 years) and refuses more with an error (the module
-- accepts 1..2^53-1).

local MAX = 9007199254740991 -- 2^53 - 1, the largest argument
local TWO52 = 4503599627370496
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

-- floor(a / b) and a mod b, exactly, for integers 0 <= a < 2^53, 0 < b < 2^53
local function divmod(a, b)
  local r = fmod(a, b)
  return (a - r) / b, r
end

-- floor(a * b / c) and (a * b) mod c, exactly, for integers 0 <= a, b < 2^53
-- and 0 < c < 2^53; nil when the quotient would reach 2^53.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then -- the product itself is exact
    local r = fmod(p, c)
    return (p - r) / c, r
  end
  -- Binary long multiplication of a by the bits of b, keeping q*c + r =
  -- a * (the bits of b seen so far) with 0 <= r < c. Every sum is kept
  -- below 2^53 by comparing against c - x instead of adding first.
  local qa, ra = divmod(a, c)
  local bits, nb = {}, 0
  while b > 0 do
    local bit = fmod(b, 2)
    nb = nb + 1
    bits[nb] = bit
    b = (b - bit) / 2
  end
  local q, r = 0, 0
  for i = nb, 1, -1 do
    if q >= TWO52 then return nil end
    q = q * 2
    if r >= c - r then
      r = r - (c - r)
      q = q + 1
    else
      r = r * 2
    end
    if bits[i] == 1 then
      if q > MAX - qa then return nil end
      q = q + qa
      if r >= c - ra then
        if q >= MAX then return nil end
        r = r - (c - ra)
        q = q + 1
      else
        r = r + ra
      end
    end
  end
  return q, r
end

-- ceil((a + b + c) / 1000) for integers 0 <= a, b, c < 2^53 (the sum itself
-- may exceed 2^53; the milliseconds do not).
local function ceil_ms(a, b, c)
  local qa, ra = divmod(a, 1000)
  local qb, rb = divmod(b or 0, 1000)
  local qc, rc = divmod(c or 0, 1000)
  local q, r = qa + qb + qc, ra + rb + rc -- r < 3000
  while r > 0 do
    q = q + 1
    r = r - 1000
  end
  return q
end

local function err(msg)
  return redis.error_reply(msg)
end

-- Arguments ------------------------------------------------------------------

if #KEYS ~= 1 then
  return err('ERR the rl.slidingcounter script takes exactly 1 key')
end
local nargs = #ARGV
if nargs < 2 then
  return err("ERR wrong number of arguments for 'RL.SLIDINGCOUNTER' command")
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

-- 'tokens' belongs to the token-bucket script: a hash holding it is not ours.
local st = redis.pcall('HMGET', key, 'win', 'cur', 'prev', 'tokens')
if st.err then return st end
if st[4] then
  return err('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local at = now -- the instant the call is evaluated at
local k, e = divmod(now, W) -- its window index, us since that window began
local start = k * W
local cur, prev = 0, 0
if st[1] then
  local swin, scur, sprev = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
  if not (swin and scur and sprev) or swin < 0 or scur < 0 or sprev < 0 then
    return err('ERR the sliding counter state at this key is corrupt')
  end
  if swin > at then
    -- the clock stepped back behind the stored window: nothing elapsed
    at = swin
    k, e = divmod(at, W)
  end
  local ks = divmod(swin, W) -- the stored window under this window_ms
  if ks == k then
    cur, prev = scur, sprev
    -- (a start written under another window_ms may lie inside this window:
    -- keep it, so the evaluation instant never moves backwards)
    start = math.max(k * W, swin)
  else
    start = k * W
    if ks == k - 1 then prev = scur end -- older: both windows are empty
  end
end
local lag = at - now -- > 0 only when the clock stepped back

-- Decision -------------------------------------------------------------------

-- ceil(prev * (W - e) / W): the previous window's weight, in whole units.
local weight = 0
if prev > 0 then
  local q, r = muldiv(prev, W - e, W)
  weight = q
  if r > 0 then weight = weight + 1 end
end
local avail = 0
if cur < limit and limit - cur > weight then avail = limit - cur - weight end
local granted = 0
if cost <= avail then
  granted = cost
elseif partial then
  granted = avail
end
local cur2 = cur + granted

local retry = 0
if granted < cost then
  if cost > limit then
    retry = -1
  else
    local wait, wait2 = 0, 0 -- in us: wait + wait2 (each < 2^53)
    local m = nil
    if cur2 <= limit - cost and prev > 0 then
      -- In this window once prev's weight has shrunk enough:
      -- prev*(W-x) <= (limit-cost-cur2)*W  <=>  x >= W - floor((limit-cost-cur2)*W/prev).
      m = muldiv(limit - cost - cur2, W, prev) -- nil: beyond 2^53, so >= W
    end
    if cur2 <= limit - cost and (prev == 0 or m == nil or m > 0) then
      if m ~= nil and W - m > e then wait = (W - m) - e end
    else
      -- Only in the next window, where cur2 becomes prev:
      -- cur2*(W-x) + cost*W <= limit*W  <=>  x >= W - floor((limit-cost)*W/cur2),
      -- or else at the start of the window after, where both count zero.
      wait = W - e
      local m2 = nil -- (cur2 == 0: nothing counts against it there)
      if cur2 > 0 then m2 = muldiv(limit - cost, W, cur2) end
      if m2 == nil or m2 >= W then
        wait2 = 0
      else
        wait2 = W - m2 -- (W when cost == limit: the window after)
      end
    end
    retry = ceil_ms(wait, wait2, lag)
  end
end

local reset = 0
if cur2 > 0 then
  reset = ceil_ms(W, W - e, lag)
elseif prev > 0 then
  reset = ceil_ms(W - e, lag)
end

if granted > 0 and not dryrun then
  redis.call('HSET', key, 'win', fmt(start), 'cur', fmt(cur2), 'prev', fmt(prev))
  redis.call('PEXPIRE', key, fmt(reset))
end

local allowed = granted
if not partial then
  allowed = (granted == cost) and 1 or 0
end
return {allowed, limit, avail - granted, retry, reset}
