-- Sliding counter ------------------------------------------------------------
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
-- State: one hash at the key, written only when units are granted or given
-- back:
--   win   start (us) of the window `cur` counts
--   cur   units granted in that window
--   prev  units granted in the window before it
-- Its TTL is reset_after_ms, so it disappears exactly when both windows have
-- stopped counting. If window_ms changes, the stored window is the one that
-- holds `win` under the new window_ms (counts carry over, as in the module).
--
-- Exact arithmetic: prev*(W-e)/W and the retry bounds go through muldiv(),
-- and sums of durations are rounded to ms part by part, so limit and COST
-- have the module's full range (up to 2^53-1). The script needs
-- W = window_ms * 1000 < 2^53: it accepts window_ms up to 9007199254740
-- (about 285 years) and refuses more with an error (the module accepts
-- 1..2^53-1).

--@include window.lua

local SC = {command = 'RL.SLIDINGCOUNTER', script = 'rl.slidingcounter', nparams = 2,
  params = limit_window_params, fromfirst = 0}

-- Units that can be taken with cur in the current window and prev in the one
-- before, e us into the current one: limit - cur - ceil(prev*(W-e)/W), or 0.
local function sc_avail(limit, W, e, cur, prev)
  local weight = 0
  if prev > 0 then
    local q, r = muldiv(prev, W - e, W)
    weight = q
    if r > 0 then weight = weight + 1 end
  end
  local avail = 0
  if cur < limit and limit - cur > weight then avail = limit - cur - weight end
  return avail
end

-- The counter at `now`: {cur, prev, e, start, lag, avail}.
function SC.load(key, p, now)
  -- 'tokens' belongs to the token bucket, 'count' to the fixed window,
  -- 'last' to RL.CONCURRENCY's leases: a hash holding any is not ours.
  local st = redis.pcall('HMGET', key, 'win', 'cur', 'prev', 'tokens', 'count', 'last')
  if st.err then return nil, st end
  if st[4] or st[5] or st[6] then return nil, redis.error_reply(WRONGTYPE) end
  local W = p.W
  local at = now -- the instant the call is evaluated at
  local k, e = divmod(now, W) -- its window index, us since that window began
  local start = k * W
  local cur, prev = 0, 0
  if st[1] then
    local swin, scur, sprev = tonumber(st[1]), tonumber(st[2]), tonumber(st[3])
    if not (swin and scur and sprev) or swin < 0 or scur < 0 or sprev < 0 then
      return nil, redis.error_reply('ERR the sliding counter state at this key is corrupt')
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
  --@inline local r_avail = sc_avail(p.limit, W, e, cur, prev)
  return {cur = cur, prev = prev, e = e, start = start, lag = at - now, avail = r_avail}
end

-- A refund of m units: off the current window's count, then what is left of
-- m off the previous window's, never below zero. Returns the units given back.
function SC.give(p, s, m)
  local given = 0
  if s.cur > 0 then
    given = math.min(m, s.cur)
    s.cur = s.cur - given
  end
  if given < m and s.prev > 0 then
    local g2 = math.min(m - given, s.prev)
    s.prev = s.prev - g2
    given = given + g2
  end
  --@inline local r_avail = sc_avail(p.limit, p.W, s.e, s.cur, s.prev)
  s.avail = r_avail
  return given
end

-- A debit of `cost` units may pass the limit: the current window's count
-- stays at most 2^53 - 1.
function SC.debit_ok(p, s, cost)
  return s.cur + cost <= MAX
end

-- Take `taken` units (at most s.avail, or past it for a debit); then
-- remaining, retry_after_ms for `cost` units (after a debit: for a
-- following call of `cost`), reset_after_ms.
function SC.report(p, s, cost, taken, debit)
  local limit, W, e, prev, lag = p.limit, p.W, s.e, s.prev, s.lag
  local cur2 = s.cur + taken
  s.cur = cur2
  local remaining = s.avail - taken
  if remaining < 0 then remaining = 0 end
  local retry = 0
  if taken < cost or debit then
    if cost > limit then
      retry = -1
    elseif cost > remaining then
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
  return remaining, retry, reset
end

-- Store the state with TTL reset_after_ms (a counter that no longer counts
-- anything is not stored).
function SC.write(key, p, s, reset)
  if reset == 0 then
    redis.call('DEL', key)
  else
    redis.call('HSET', key, 'win', fmt(s.start), 'cur', fmt(s.cur), 'prev', fmt(s.prev))
    redis.call('PEXPIRE', key, fmt(reset))
  end
end
