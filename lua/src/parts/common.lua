-- Shared helpers: numbers as the module reads them, exact integer arithmetic
-- on doubles, the options.
--
-- Cost. An EVAL script runs its whole text on every call, so every function
-- it defines is created anew each time (about 1,000 instructions apiece on
-- Redis 7.0); the parts keep the number of functions small and call the
-- clock (TIME) and redis.error_reply directly. A Functions library defines
-- them once, at FUNCTION LOAD.
--
-- Exact arithmetic. Lua numbers are doubles, exact for integers below 2^53.
-- Every value the scripts compute is an integer below 2^53; products that
-- could be larger go through muldiv(), an exact floor(a*b/c) with remainder.

local MAX = 9007199254740991 -- 2^53 - 1, the largest argument
local TWO52 = 4503599627370496
local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'

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
  local r = math.fmod(a, b)
  return (a - r) / b, r
end

-- floor(a * b / c) and (a * b) mod c, exactly, for integers 0 <= a, b < 2^53
-- and 0 < c < 2^53; nil when the quotient would reach 2^53.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then -- the product itself is exact
    local r = math.fmod(p, c)
    return (p - r) / c, r
  end
  -- Binary long multiplication of a by the bits of b, keeping q*c + r =
  -- a * (the bits of b seen so far) with 0 <= r < c. Every sum is kept
  -- below 2^53 by comparing against c - x instead of adding first.
  local qa, ra = divmod(a, c)
  local bits, nb = {}, 0
  while b > 0 do
    local bit = math.fmod(b, 2)
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

-- ceil((a + b + c) / 1000) for integers 0 <= a, b, c < 2^53; b and c may be
-- omitted (the sum itself may exceed 2^53; the milliseconds do not).
-- (divmod written out: this runs once or twice on every call.)
local function ceil_ms(a, b, c)
  local r = math.fmod(a, 1000)
  local q = (a - r) / 1000
  if b then
    local rb = math.fmod(b, 1000)
    q, r = q + (b - rb) / 1000, r + rb
  end
  if c then
    local rc = math.fmod(c, 1000)
    q, r = q + (c - rc) / 1000, r + rc
  end
  while r > 0 do -- r < 3000
    q = q + 1
    r = r - 1000
  end
  return q
end

-- The options every command takes after its parameters, from argv[i] on:
--   [COST n] [PARTIAL] [DRYRUN] [REFUND n] [FORCE]
-- and, when ff == 1 (RL.FIXEDWINDOW), [FROMFIRST] with either,
-- in any order and case, each at most once; REFUND and the others exclude
-- each other (the second one named is a syntax error, as in the module).
-- FORCE (a debit) excludes PARTIAL and REFUND.
-- Returns cost, partial, dryrun, refund (nil unless REFUND), fromfirst, force, or
-- nil and an error reply; a word in `other` (RL.MULTI: an algorithm's name,
-- one limit too many) answers `other_err` instead of a syntax error.
local function parse_options(argv, i, other, other_err, ff)
  local nargs = #argv
  local cost, partial, dryrun, has_cost, refund, fromfirst, force = 1, false, false, false, nil, false, false
  while i <= nargs do
    local opt = argv[i]
    if opt ~= 'COST' and opt ~= 'PARTIAL' and opt ~= 'DRYRUN' and opt ~= 'REFUND' and opt ~= 'FROMFIRST'
        and opt ~= 'FORCE' then
      opt = string.upper(opt) -- (most callers write them upper-case already)
    end
    if opt == 'COST' and not has_cost and not refund and i < nargs then
      cost = parse_int(argv[i + 1], 0, MAX)
      if not cost then
        return nil, redis.error_reply('ERR COST must be an integer between 0 and 9007199254740991')
      end
      has_cost = true
      i = i + 2
    elseif opt == 'PARTIAL' and not partial and not refund and not force then
      partial = true
      i = i + 1
    elseif opt == 'DRYRUN' and not dryrun and not refund then
      dryrun = true
      i = i + 1
    elseif opt == 'REFUND' and not refund and not (has_cost or partial or dryrun or force) and i < nargs then
      refund = parse_int(argv[i + 1], 1, MAX)
      if not refund then
        return nil, redis.error_reply('ERR REFUND must be an integer between 1 and 9007199254740991')
      end
      i = i + 2
    elseif opt == 'FORCE' and not force and not partial and not refund then
      force = true
      i = i + 1
    elseif opt == 'FROMFIRST' and ff == 1 and not fromfirst then
      fromfirst = true
      i = i + 1
    elseif other and other[opt] then
      return nil, redis.error_reply(other_err)
    else
      return nil, redis.error_reply('ERR syntax error')
    end
  end
  return cost, partial, dryrun, refund, fromfirst, force
end
