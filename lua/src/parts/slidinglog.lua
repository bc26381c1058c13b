-- Sliding log ----------------------------------------------------------------
--
-- Exact: a call is granted when the units granted at times t with
-- now - W < t <= now (W = window in us, now = server TIME in us), plus COST,
-- do not exceed limit. If the clock steps backwards, the newest grant time
-- is used as now: elapsed time counts as zero.
--
-- State: one sorted set at the key, written only when units are granted or
-- given back:
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
-- the retry time), and only a refund walks it from its newest.
--
-- Exact arithmetic: see window.lua; limit and COST have the module's full
-- range.

--@include window.lua

-- The units of an entry "<time_us>:<units>".
local function log_units(member)
  return tonumber(string.match(member, ':([0-9]+)$')) or 0
end

local SL = {command = 'RL.SLIDINGLOG', script = 'rl.slidinglog', nparams = 2,
  params = limit_window_params, fromfirst = 0}

-- The log at `now`: the units in the window (used; avail = what can be
-- taken) and what a write needs.
function SL.load(key, p, now)
  local last = redis.pcall('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last.err then return nil, last end
  local newest, newest_member = nil, nil
  if last[2] then
    local sc = tonumber(last[2])
    if sc and sc > 0 then
      newest, newest_member = sc, last[1]
    end
  end
  if newest and newest > now then
    now = newest -- the clock stepped back: nothing elapsed since the last grant
  end
  local cutoff = now - p.W -- grants at t <= cutoff have left the window
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
      expired = expired + log_units(gone[j])
      n_expired = n_expired + 1
    end
  end
  local used = total - expired -- units granted in the window
  if used < 0 then used = 0 end
  local avail = 0
  if used < p.limit then avail = p.limit - used end
  return {key = key, now = now, cutoff_arg = cutoff_arg, newest = newest, newest_member = newest_member,
    used = used, n_expired = n_expired, granted = 0, avail = avail}
end

-- A refund of m units: the newest units in the window leave it, the most
-- recent grant first. Returns the units given back.
function SL.give(p, s, m)
  local given = 0 -- nothing in the window: nothing to give back
  if s.used > 0 then
    if m > s.used then m = s.used end
    -- Walk from the newest entry: entries wholly given back, then at most one
    -- that keeps part of its units, then the entry that becomes the newest.
    local left, lowest, keep, keep_units = m, nil, nil, 0
    local newest = nil
    local offset, batch = 0, 16
    while newest == nil do
      local rows = redis.call('ZREVRANGEBYSCORE', s.key, '+inf', '(' .. s.cutoff_arg,
        'WITHSCORES', 'LIMIT', offset, batch)
      for j = 1, #rows, 2 do
        local u = log_units(rows[j])
        if left == 0 then
          newest = tonumber(rows[j + 1]) -- the first entry that stays whole
          break
        elseif u <= left then
          left = left - u
          lowest = rows[j + 1] -- its score
        else
          keep, keep_units = rows[j], u - left
          newest = tonumber(rows[j + 1])
          left = 0
          break
        end
      end
      if newest == nil then
        if #rows < 2 * batch then break end -- the window is walked
        offset = offset + batch
        if batch < 1024 then batch = batch * 2 end
      end
    end
    s.given, s.lowest, s.keep, s.keep_units = m, lowest, keep, keep_units
    s.used, s.newest = s.used - m, newest
    given = m
  end
  return given
end

-- A debit of `cost` units may pass the limit (one entry, whatever its
-- units): the units in the window stay at most 2^53 - 1.
function SL.debit_ok(p, s, cost)
  return s.used + cost <= MAX
end

-- Take `taken` units (at most s.avail, or past it for a debit); then
-- remaining, retry_after_ms for `cost` units (after a debit: for a
-- following call of `cost`), reset_after_ms.
function SL.report(p, s, cost, taken, debit)
  local limit, now = p.limit, s.now
  s.granted = taken
  local after = s.used + s.granted
  local remaining = 0
  if after < limit then remaining = limit - after end
  local retry = 0
  if taken < cost or debit then
    if cost > limit then
      retry = -1
    elseif cost > remaining then
      -- The same call fits once `need` units have left the window: find the
      -- oldest grant t_k whose expiry frees that many; retry at t_k + W.
      -- (0 < need <= after: the walk always ends, at the latest at the units
      -- this call granted now.)
      local need = (after - limit) + cost
      local acc, tk = 0, nil
      local lo = '(' .. s.cutoff_arg
      local offset, batch = 0, 16
      while tk == nil do
        local rows = redis.call('ZRANGEBYSCORE', s.key, lo, '+inf', 'WITHSCORES', 'LIMIT', offset, batch)
        for j = 1, #rows, 2 do
          acc = acc + log_units(rows[j])
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
      retry = ceil_ms(p.W - (now - tk))
    end
  end
  local reset = 0
  if s.granted > 0 then
    reset = p.window_ms -- the newest grant is now
  elseif s.newest then
    reset = ceil_ms(p.W - (now - s.newest))
  end
  return remaining, retry, reset
end

-- Trim what left the window, apply the grant or refund, store the total,
-- TTL reset_after_ms (an empty log is not stored).
function SL.write(key, p, s, reset)
  if reset == 0 then
    redis.call('DEL', key)
  else
    if s.n_expired > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '(0', s.cutoff_arg)
    end
    local after = s.used + s.granted
    if s.granted > 0 then
      local u = s.granted
      if s.newest == s.now then
        -- A grant in the same microsecond (or after the clock stepped back):
        -- fold it into the newest entry.
        u = u + log_units(s.newest_member)
        redis.call('ZREM', key, s.newest_member)
      end
      local t = fmt(s.now)
      redis.call('ZADD', key, fmt(-after), '#', t, t .. ':' .. fmt(u))
    else -- a refund
      if s.lowest then
        redis.call('ZREMRANGEBYSCORE', key, s.lowest, '+inf')
      end
      if s.keep then
        redis.call('ZREM', key, s.keep)
        local t = fmt(s.newest)
        redis.call('ZADD', key, fmt(-after), '#', t, t .. ':' .. fmt(s.keep_units))
      else
        redis.call('ZADD', key, fmt(-after), '#')
      end
    end
    redis.call('PEXPIRE', key, fmt(reset))
  end
end
