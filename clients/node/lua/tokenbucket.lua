-- RL.TOKENBUCKET as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <capacity> <rate> <period_ms> [COST n] [PARTIAL] [DRYRUN]
--
-- Reply: {allowed, capacity, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (see SPEC.md).
--
-- The bucket holds at most `capacity` tokens, starts full and regains `rate`
-- tokens every `period_ms`, continuously, on the server clock (TIME, in us).
-- If the clock steps backwards, elapsed time counts as zero.
--
-- State: one hash at KEYS[1], written only when tokens are taken:
--   tokens  whole tokens in the bucket
--   frac    the fraction of a token, in 1/P tokens, where P = period in us
--           (0 <= frac < P): tokens + frac/P is the exact, rational content
--   ts      server time (us) the state is valid at
--   scale   the P that frac is counted in (it changes only if period_ms does)
-- Its TTL is reset_after_ms, so it disappears exactly when the bucket is full.
--
-- Exact arithmetic. Lua numbers are doubles, exact for integers below 2^53.
-- Every value the script computes is an integer below 2^53; products that
-- could be larger (rate * elapsed / P, missing tokens * P / rate) go through
-- muldiv(), an exact floor(a*b/c) with remainder. That holds when
--   * period_ms <= 9007199254740           (P = period_ms*1000 < 2^53), and
--   * capacity * period_ms * 1000 / rate < 2^53 (a full refill takes less
--     than 2^53 us, about 285 years).
-- Arguments beyond that are refused with an error (the module accepts all of
-- 1..2^53-1). Within it, the script answers exactly what the module answers.

local MAX = 9007199254740991 -- 2^53 - 1, the largest argument
local TWO52 = 4503599627370496
local MAX_PERIOD_MS = 9007199254740 -- period_ms * 1000 < 2^53
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
-- (fmod is exact; a - r is then an exact multiple of b).
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

-- ceil(us / 1000)
local function ceil_ms(us)
  local q, r = divmod(us, 1000)
  if r > 0 then q = q + 1 end
  return q
end

-- Microseconds until the bucket, holding n + f/P tokens now, holds n + d:
-- ceil((d*P - f) / rate) for d >= 1 and 0 <= f < P. nil if >= 2^53.
local function wait_us(d, f, P, rate)
  local q, r = muldiv(d, P, rate)
  if q == nil then return nil end
  if r >= f then
    r = r - f
  else
    local q2, r2 = divmod(f - r, rate)
    q = q - q2
    if r2 > 0 then
      q = q - 1
      r = rate - r2
    else
      r = 0
    end
  end
  if r > 0 then q = q + 1 end
  return q
end

local function err(msg)
  return redis.error_reply(msg)
end

-- Arguments ------------------------------------------------------------------

if #KEYS ~= 1 then
  return err('ERR the rl.tokenbucket script takes exactly 1 key')
end
local nargs = #ARGV
if nargs < 3 then
  return err("ERR wrong number of arguments for 'RL.TOKENBUCKET' command")
end
local capacity = parse_int(ARGV[1], 1, MAX)
if not capacity then
  return err('ERR capacity must be an integer between 1 and 9007199254740991')
end
local rate = parse_int(ARGV[2], 1, MAX)
if not rate then
  return err('ERR rate must be an integer between 1 and 9007199254740991')
end
local period_ms = parse_int(ARGV[3], 1, MAX)
if not period_ms then
  return err('ERR period_ms must be an integer between 1 and 9007199254740991')
end
local cost, partial, dryrun, has_cost = 1, false, false, false
local i = 4
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
-- The range of exact double arithmetic (see the header).
if period_ms > MAX_PERIOD_MS then
  return err('ERR period_ms is beyond the exact range of the Lua script (at most 9007199254740)')
end
local P = period_ms * 1000
if muldiv(capacity, P, rate) == nil then
  return err('ERR capacity*period_ms*1000/rate is beyond the exact range of the Lua script (a full refill must take less than 2^53 us)')
end

-- State ----------------------------------------------------------------------

local key = KEYS[1]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])

-- 'win' belongs to the sliding-counter script: a hash holding it is not ours.
local st = redis.pcall('HMGET', key, 'tokens', 'frac', 'ts', 'scale', 'win')
if st.err then return st end
if st[5] then
  return err('WRONGTYPE Operation against a key holding the wrong kind of value')
end

local n, f, t = capacity, 0, now -- a fresh bucket is full
if st[1] then
  local sn, sf, st_ts, sp = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
  if not (sn and sf and st_ts and sp) or sn < 0 or sf < 0 or sp < 1 or sf >= sp then
    return err('ERR the token bucket state at this key is corrupt')
  end
  n, f, t = sn, sf, st_ts
  if sp ~= P then
    -- period_ms changed: recount the fraction in the new unit (rounded down).
    f = muldiv(f, P, sp)
  end
  if n >= capacity then -- capacity may have been lowered: cap
    n, f = capacity, 0
  end
  if now > t then
    local elapsed = now - t
    if n < capacity then
      if elapsed >= wait_us(capacity - n, f, P, rate) then
        n, f = capacity, 0
      else
        -- rate*elapsed < (capacity-n)*P - f here, so nothing overflows.
        local q, r = muldiv(rate, elapsed, P)
        n = n + q
        if f >= P - r then
          f = f - (P - r)
          n = n + 1
        else
          f = f + r
        end
      end
    end
    t = now
  end -- else the clock stepped back (or did not move): nothing elapsed
end

-- Decision -------------------------------------------------------------------

local granted = 0
if cost <= n then
  granted = cost
elseif partial then
  granted = n
end
n = n - granted

local retry = 0
if granted < cost then
  if cost > capacity then
    retry = -1
  else
    retry = ceil_ms(wait_us(cost - n, f, P, rate))
  end
end
local reset = 0
if n < capacity then
  reset = ceil_ms(wait_us(capacity - n, f, P, rate))
end

if granted > 0 and not dryrun then
  redis.call('HSET', key, 'tokens', fmt(n), 'frac', fmt(f), 'ts', fmt(t), 'scale', fmt(P))
  redis.call('PEXPIRE', key, fmt(reset))
end

local allowed = granted
if not partial then
  allowed = (granted == cost) and 1 or 0
end
return {allowed, capacity, n, retry, reset}
