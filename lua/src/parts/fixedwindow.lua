-- Fixed window ---------------------------------------------------------------
--
-- At most `limit` units per window of window_ms, counted in ms on the
-- server's clock (TIME, rounded down to the ms, as the module reads its
-- clock). By default a window is aligned on the epoch:
-- [now - now % window_ms, that + window_ms). With FROMFIRST a window starts
-- at the first grant on a fresh key (no state, or now >= start + window_ms:
-- INCR + PEXPIRE NX). A call is granted when count + COST <= limit
-- (PARTIAL: min(COST, limit - count) units). The reply's durations run to
-- the window's end; an empty window (nothing counted) answers
-- remaining = limit and reset_after_ms = 0. Up to 2 * limit units can be
-- granted across one boundary: fixed windows' known weakness.
--
-- State: one hash at the key, written only when its count changes:
--   start   start (ms) of the window `count` counts
--   count   units granted in that window
-- It expires exactly when its window ends (PEXPIREAT start + window_ms); a
-- refund that leaves it at 0 deletes it. An epoch-aligned call whose window
-- is not the stored one (an old window, another window_ms) counts 0. A
-- call is evaluated at max(now, stored start): if the clock stepped back
-- behind the stored window, elapsed time counts as zero (its window goes
-- on) and the reply's durations include the gap, as in the module.
--
-- Exact arithmetic: every value is an integer below 2^53 (window ends
-- included: start + window_ms <= max(window_ms, 2 * now)), so limit, COST
-- and window_ms have the module's full range, except that FROMFIRST, whose
-- window ends at a stored start + window_ms, needs window_ms up to
-- 9007199254740 (about 285 years; window.lua) and refuses more with an
-- error.

--@include window.lua

-- limit window_ms, from argv[i] on: a parameter table, or nil and an error.
-- (FROMFIRST, an option, is set by the caller: p.fromfirst.)
local function fw_params(argv, i)
  local limit = parse_int(argv[i], 1, MAX)
  if not limit then
    return nil, redis.error_reply('ERR limit must be an integer between 1 and 9007199254740991')
  end
  local window_ms = parse_int(argv[i + 1], 1, MAX)
  if not window_ms then
    return nil, redis.error_reply('ERR window_ms must be an integer between 1 and 9007199254740991')
  end
  return {limit = limit, window_ms = window_ms, fromfirst = false}
end

local FW = {command = 'RL.FIXEDWINDOW', script = 'rl.fixedwindow', nparams = 2,
  params = fw_params, fromfirst = 1}

-- The window at `now` (us): {count, start (ms), left = ms to its end,
-- avail = units that can be taken}.
function FW.load(key, p, now)
  -- 'tokens' (token bucket), 'win' (sliding counter), 'last' (RL.CONCURRENCY's
  -- leases): not ours.
  local st = redis.pcall('HMGET', key, 'start', 'count', 'tokens', 'win', 'last')
  if st.err then return nil, st end
  if st[3] or st[4] or st[5] then return nil, redis.error_reply(WRONGTYPE) end
  local w = p.window_ms
  if p.fromfirst and w > MAX_WINDOW_MS then
    return nil, redis.error_reply('ERR window_ms is beyond the exact range of the Lua script with FROMFIRST (at most 9007199254740)')
  end
  local ms = divmod(now, 1000)
  -- the instant the call is evaluated at: if the clock stepped back behind
  -- the stored window's start, nothing elapsed (the durations in the
  -- reply are measured from the real clock, so they include the gap)
  local at = ms
  local sstart, scount = nil, nil
  if st[1] then
    sstart, scount = tonumber(st[1]), tonumber(st[2])
    if not (sstart and scount) or sstart < 0 or scount < 0 then
      return nil, redis.error_reply('ERR the fixed window state at this key is corrupt')
    end
    if sstart > at then at = sstart end
  end
  local count, start, left = 0, at, w + (at - ms)
  if p.fromfirst then
    -- the stored window goes on until at >= start + window_ms (compared
    -- as at - start, which stays exact)
    if sstart and scount > 0 and at - sstart < w then
      count, start = scount, sstart
      if sstart <= ms then left = w - (ms - sstart) else left = w + (sstart - ms) end
    end
  else
    local _, into = divmod(at, w)
    start, left = at - into, (w - into) + (at - ms)
    if sstart == start then count = scount end
  end
  local avail = 0
  if count < p.limit then avail = p.limit - count end
  return {count = count, start = start, left = left, avail = avail}
end

-- A refund of m units off the window's count (nothing in an old window).
function FW.give(p, s, m)
  local given = math.min(m, s.count)
  s.count = s.count - given
  local avail = 0
  if s.count < p.limit then avail = p.limit - s.count end
  s.avail = avail
  return given
end

-- A debit of `cost` units may pass the limit: the count stays at most
-- 2^53 - 1.
function FW.debit_ok(p, s, cost)
  return s.count + cost <= MAX
end

-- Take `taken` units (at most s.avail, or past it for a debit); then
-- remaining, retry_after_ms for `cost` units (after a debit: for a
-- following call of `cost`), reset_after_ms.
function FW.report(p, s, cost, taken, debit)
  local count2 = s.count + taken
  s.count = count2
  local remaining = s.avail - taken
  if remaining < 0 then remaining = 0 end
  local retry = 0
  if taken < cost or debit then
    if cost > p.limit then
      retry = -1
    elseif cost > remaining then
      retry = s.left
    end
  end
  local reset = 0
  if count2 > 0 then reset = s.left end
  return remaining, retry, reset
end

-- Store the window, expiring when it ends (a window that counts nothing is
-- not stored).
function FW.write(key, p, s, reset)
  if reset == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'start', fmt(s.start), 'count', fmt(s.count))
    redis.call('PEXPIREAT', key, fmt(s.start + p.window_ms))
  end
end
