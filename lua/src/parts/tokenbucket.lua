-- Token bucket ---------------------------------------------------------------
--
-- The bucket holds at most `capacity` tokens, starts full and regains `rate`
-- tokens every `period_ms`, continuously, on the server clock (TIME, in us).
-- If the clock steps backwards, elapsed time counts as zero.
--
-- State: one hash at the key, written only when tokens are taken or given
-- back:
--   tokens  whole tokens in the bucket
--   frac    the fraction of a token, in 1/P tokens, where P = period in us
--           (0 <= frac < P): tokens + frac/P is the exact, rational content
--   ts      server time (us) the state is valid at
--   scale   the P that frac is counted in (it changes only if period_ms does)
-- Its TTL is reset_after_ms, so it disappears exactly when the bucket is full.
--
-- Exact arithmetic: products that could reach 2^53 (rate * elapsed / P,
-- missing tokens * P / rate) go through muldiv(). That holds when
--   * period_ms <= 9007199254740           (P = period_ms*1000 < 2^53), and
--   * capacity * period_ms * 1000 / rate < 2^53 (a full refill takes less
--     than 2^53 us, about 285 years).
-- Arguments beyond that are refused with an error (the module accepts all of
-- 1..2^53-1). Within it, the script answers exactly what the module answers.

--@include common.lua

local MAX_PERIOD_MS = 9007199254740 -- period_ms * 1000 < 2^53

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

local TB = {command = 'RL.TOKENBUCKET', script = 'rl.tokenbucket', nparams = 3, fromfirst = 0}

-- capacity rate period_ms, from argv[i] on: a parameter table, or nil and
-- an error.
function TB.params(argv, i)
  local capacity = parse_int(argv[i], 1, MAX)
  if not capacity then
    return nil, redis.error_reply('ERR capacity must be an integer between 1 and 9007199254740991')
  end
  local rate = parse_int(argv[i + 1], 1, MAX)
  if not rate then
    return nil, redis.error_reply('ERR rate must be an integer between 1 and 9007199254740991')
  end
  local period_ms = parse_int(argv[i + 2], 1, MAX)
  if not period_ms then
    return nil, redis.error_reply('ERR period_ms must be an integer between 1 and 9007199254740991')
  end
  -- The range of exact double arithmetic (see above): an error the caller
  -- answers only once the options are read (p.range_err).
  local p = {limit = capacity, capacity = capacity, rate = rate, period_ms = period_ms,
    P = period_ms * 1000}
  if period_ms > MAX_PERIOD_MS then
    p.range_err = redis.error_reply('ERR period_ms is beyond the exact range of the Lua script (at most 9007199254740)')
  elseif muldiv(capacity, p.P, rate) == nil then
    p.range_err = redis.error_reply('ERR capacity*period_ms*1000/rate is beyond the exact range of the Lua script (a full refill must take less than 2^53 us)')
  end
  return p
end

-- The bucket at `now`: {n = whole tokens, f = fraction in 1/P, t = time,
-- avail = whole tokens that can be taken}.
function TB.load(key, p, now)
  -- 'win' belongs to the sliding counter, 'count' to the fixed window,
  -- 'last' to RL.CONCURRENCY's leases: a hash holding any is not ours.
  local st = redis.pcall('HMGET', key, 'tokens', 'frac', 'ts', 'scale', 'win', 'count', 'last')
  if st.err then return nil, st end
  if st[5] or st[6] or st[7] then return nil, redis.error_reply(WRONGTYPE) end
  local capacity, rate, P = p.capacity, p.rate, p.P
  local n, f, t = capacity, 0, now -- a fresh bucket is full
  if st[1] then
    local sn, sf, st_ts, sp = tonumber(st[1]), tonumber(st[2]), tonumber(st[3]), tonumber(st[4])
    -- (negative whole tokens: a debt left by FORCE)
    if not (sn and sf and st_ts and sp) or sn < -MAX or sf < 0 or sp < 1 or sf >= sp then
      return nil, redis.error_reply('ERR the token bucket state at this key is corrupt')
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
  local avail = 0
  if n > 0 then avail = n end
  return {n = n, f = f, t = t, avail = avail}
end

-- A debit of `cost` tokens may go below zero: the whole tokens stay at or
-- above -(2^53 - 1), and a full refill from there takes less than 2^53 us
-- (the script's exact range; the module's range is wider, lua.md).
function TB.debit_ok(p, s, cost)
  local ok = false
  local n = s.n - cost
  if n >= -MAX and p.capacity - n <= MAX and muldiv(p.capacity - n, p.P, p.rate) ~= nil then ok = true end
  return ok
end

-- A refund of m tokens: min(capacity, tokens + m). Returns the whole tokens
-- given back (a fraction of a token missing counts as one).
function TB.give(p, s, m)
  local room = p.capacity - s.n
  local given = 0 -- full: fresh, nothing to give back
  if room > 0 then
    if m >= room then
      s.n, s.f = p.capacity, 0
      given = room
    else
      s.n = s.n + m
      given = m
    end
  end
  return given
end

-- Take `taken` units (at most s.avail, or past it for a debit); then
-- remaining, retry_after_ms for `cost` units (after a debit: for a
-- following call of `cost`), reset_after_ms.
function TB.report(p, s, cost, taken, debit)
  local capacity, n = p.capacity, s.n - taken
  s.n = n
  local retry = 0
  if taken < cost or debit then
    if cost > capacity then
      retry = -1
    elseif cost > n then
      retry = ceil_ms(wait_us(cost - n, s.f, p.P, p.rate))
    end
  end
  local reset = 0
  if n < capacity then
    reset = ceil_ms(wait_us(capacity - n, s.f, p.P, p.rate))
  end
  local remaining = 0
  if n > 0 then remaining = n end
  return remaining, retry, reset
end

-- Store the state with TTL reset_after_ms (a full bucket is not stored).
function TB.write(key, p, s, reset)
  if reset == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'tokens', fmt(s.n), 'frac', fmt(s.f), 'ts', fmt(s.t), 'scale', fmt(p.P))
    redis.call('PEXPIRE', key, fmt(reset))
  end
end
