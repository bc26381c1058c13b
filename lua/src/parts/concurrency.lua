-- Concurrency ----------------------------------------------------------------
--
-- An in-flight limit (RL.CONCURRENCY): at most `limit` units held at once
-- by leases. ACQUIRE sets the id's lease to COST units until now +
-- lease_ms (a retried ACQUIRE renews; the id's own units never count
-- against it); RELEASE frees it; RENEW moves a live lease's end to now +
-- lease_ms; a lease that lapses (now >= its end, TIME in us) holds nothing.
-- In RL.MULTI a grant ACQUIREs COST * WEIGHT units for the limit's id and
-- REFUND n gives n * WEIGHT of them back (the lease keeps its end).
--
-- State: one hash at the key, written only when a lease changes:
--   last      the instant (us) of the last write: a call is read at
--             max(now, last), so a clock stepping back frees nothing
--   =<id>     "<units>:<end_us>", one field per lease (the id verbatim,
--             binary-safe; the module keeps a 64-bit hash instead)
-- A write drops the lapsed leases; the key expires when its last lease
-- lapses (PEXPIRE reset_after_ms), and a release that leaves no live lease
-- deletes it. A call reads the whole hash (O(leases), like the module).
--
-- Exact arithmetic: every instant is below 2^53 us (the year 2255): a
-- lease that would end later (lease_ms above about 7 * 10^12 today) is
-- refused with an error; limit and COST have the module's full range.

--@include common.lua

-- limit lease_ms id, from argv[i] on: a parameter table, or nil and an error.
local function cc_params(argv, i)
  local limit = parse_int(argv[i], 1, MAX)
  if not limit then
    return nil, redis.error_reply('ERR limit must be an integer between 1 and 9007199254740991')
  end
  local lease_ms = parse_int(argv[i + 1], 1, MAX)
  if not lease_ms then
    return nil, redis.error_reply('ERR lease_ms must be an integer between 1 and 9007199254740991')
  end
  return {limit = limit, lease_ms = lease_ms, id = argv[i + 2]}
end

-- nparams: its numbers (the catalogue's arguments); id = 1: the word after
-- them, the holder's id.
local CC = {command = 'RL.CONCURRENCY', script = 'rl.concurrency', nparams = 2, id = 1,
  params = cc_params, fromfirst = 0}

local CC_RANGE_ERR = 'ERR lease_ms is beyond the exact range of the Lua script (a lease must end before 2^53 us)'

-- The leases at `now` (us): {t = the instant they are read at, own, own_end
-- (the id's live lease, 0 when none), others (the other ids' live units),
-- live = {{end, units, id}, ...}, gone = the fields of lapsed leases, avail}.
function CC.load(key, p, now)
  local all = redis.pcall('HGETALL', key)
  if all.err then return nil, all end
  local last = 0
  local raw = {}
  for j = 1, #all, 2 do
    local f = all[j]
    if string.sub(f, 1, 1) == '=' then
      raw[#raw + 1] = {f, all[j + 1]}
    elseif f == 'last' then
      last = tonumber(all[j + 1])
      if not last then return nil, redis.error_reply('ERR the concurrency state at this key is corrupt') end
    else
      -- another limiter's hash (tokens, win, start, ...): not ours
      return nil, redis.error_reply(WRONGTYPE)
    end
  end
  local t = now
  if last > t then t = last end
  -- A lease taken or renewed now must end inside the exact range.
  if t + p.lease_ms * 1000 >= 9007199254740992 then return nil, redis.error_reply(CC_RANGE_ERR) end
  local s = {t = t, now = now, own = 0, own_end = 0, others = 0, live = {}, gone = {}, taken = 0, gave = false}
  for _, kv in ipairs(raw) do
    local u, e = string.match(kv[2], '^([0-9]+):([0-9]+)$')
    u, e = tonumber(u), tonumber(e)
    if not (u and e) or u < 1 then
      return nil, redis.error_reply('ERR the concurrency state at this key is corrupt')
    end
    local id = string.sub(kv[1], 2)
    if e <= t then
      s.gone[#s.gone + 1] = kv[1]
    elseif id == p.id then
      s.own, s.own_end = u, e
    else
      s.others = s.others + u
      s.live[#s.live + 1] = {e, u, id}
    end
  end
  s.avail = 0
  if s.others < p.limit then s.avail = p.limit - s.others end
  return s
end

-- Give m of the id's units back (RELEASE: all of them); the lease keeps
-- its end. The wait that follows is a new id's: the id's units count.
function CC.give(p, s, m)
  local given = math.min(m, s.own)
  s.own = s.own - given
  if s.own == 0 then s.own_end = 0 end
  s.gave = true
  return given
end

-- Take `taken` units (at most s.avail; 0: the lease stays as it is), or
-- with RENEW set its end; then remaining, retry_after_ms for `want`
-- units, reset_after_ms. (CC.load checked that a new lease's end is exact.)
function CC.report(p, s, want, taken)
  if taken > 0 then
    s.own, s.own_end, s.taken = taken, s.t + p.lease_ms * 1000, taken
  end
  local held = s.others + s.own
  local remaining = 0
  if held < p.limit then remaining = p.limit - held end
  local retry = 0
  if taken == want then
    retry = 0
  elseif want > p.limit then
    retry = -1
  else
    -- The units that must lapse first: the others', and the id's own after
    -- a give (a new id's wait); walked in the order they end.
    local counted = s.others
    local ends = {}
    for k, l in ipairs(s.live) do ends[k] = l end
    if s.gave and s.own > 0 then
      counted = counted + s.own
      ends[#ends + 1] = {s.own_end, s.own}
    end
    if counted + want > p.limit then
      local over = counted + want - p.limit
      table.sort(ends, function(a, b) return a[1] < b[1] end)
      local freed = 0
      for _, l in ipairs(ends) do
        freed = freed + l[2]
        if freed >= over then
          retry = ceil_ms(l[1] - s.now)
          break
        end
      end
    end
  end
  local last = s.own_end
  for _, l in ipairs(s.live) do
    if l[1] > last then last = l[1] end
  end
  local reset = 0
  if last > 0 then reset = ceil_ms(last - s.now) end
  return remaining, retry, reset
end

-- Store the leases (the id's as it is now), dropping the lapsed ones;
-- expiring when the last lease ends; deleted when none is left.
function CC.write(key, p, s, reset)
  if s.own == 0 and #s.live == 0 then
    redis.call('DEL', key)
    return
  end
  local gone = s.gone
  if s.own == 0 then gone[#gone + 1] = '=' .. p.id end
  for j = 1, #gone, 500 do
    redis.call('HDEL', key, unpack(gone, j, math.min(j + 499, #gone)))
  end
  if s.own > 0 then
    redis.call('HSET', key, 'last', fmt(s.t), '=' .. p.id, fmt(s.own) .. ':' .. fmt(s.own_end))
  else
    redis.call('HSET', key, 'last', fmt(s.t))
  end
  redis.call('PEXPIRE', key, fmt(reset))
end

-- RL.CONCURRENCY key limit lease_ms ACQUIRE id [COST n] [PARTIAL] [DRYRUN]
--                                   | RELEASE id | RENEW id
-- (keys = {key}, argv = the arguments after the key): the five integers,
-- with the module's errors in the module's order.
local function rl_concurrency(keys, argv)
  if #keys ~= 1 then
    return redis.error_reply('ERR the rl.concurrency script takes exactly 1 key')
  end
  if #argv < 4 then
    return redis.error_reply("ERR wrong number of arguments for 'RL.CONCURRENCY' command")
  end
  local limit = parse_int(argv[1], 1, MAX)
  if not limit then
    return redis.error_reply('ERR limit must be an integer between 1 and 9007199254740991')
  end
  local lease_ms = parse_int(argv[2], 1, MAX)
  if not lease_ms then
    return redis.error_reply('ERR lease_ms must be an integer between 1 and 9007199254740991')
  end
  local p = {limit = limit, lease_ms = lease_ms, id = argv[4]}
  local action = string.upper(argv[3])
  local cost, partial, dryrun = 1, false, false
  if action == 'ACQUIRE' then
    -- COST n, PARTIAL, DRYRUN, each at most once (no REFUND: RELEASE is
    -- this command's), read from the left as the module reads them
    local i, has_cost = 5, false
    while i <= #argv do
      local opt = string.upper(argv[i])
      if opt == 'COST' and not has_cost and i < #argv then
        cost = parse_int(argv[i + 1], 0, MAX)
        if not cost then
          return redis.error_reply('ERR COST must be an integer between 0 and 9007199254740991')
        end
        has_cost, i = true, i + 2
      elseif opt == 'PARTIAL' and not partial then
        partial, i = true, i + 1
      elseif opt == 'DRYRUN' and not dryrun then
        dryrun, i = true, i + 1
      else
        return redis.error_reply('ERR syntax error')
      end
    end
  elseif #argv > 4 or (action ~= 'RELEASE' and action ~= 'RENEW') then
    return redis.error_reply('ERR syntax error')
  end
  local key = keys[1]
  local clock = redis.call('TIME')
  local s, e = CC.load(key, p, tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
  if not s then return e end
  if action == 'RELEASE' then
    local given = CC.give(p, s, s.own)
    local remaining, retry, reset = CC.report(p, s, 1, 0)
    if given > 0 then CC.write(key, p, s, reset) end
    return {given, limit, remaining, retry, reset}
  end
  if action == 'RENEW' then
    if s.own == 0 then
      local remaining, _, reset = CC.report(p, s, 0, 0)
      return {0, limit, remaining, -1, reset}
    end
    s.own_end = s.t + lease_ms * 1000
    local remaining, _, reset = CC.report(p, s, 0, 0)
    CC.write(key, p, s, reset)
    return {1, limit, remaining, 0, reset}
  end
  local granted = 0
  if cost <= s.avail then
    granted = cost
  elseif partial then
    granted = s.avail
  end
  local remaining, retry, reset = CC.report(p, s, cost, granted)
  if granted > 0 and not dryrun then CC.write(key, p, s, reset) end
  local allowed = granted
  if not partial then
    allowed = (granted == cost) and 1 or 0
  end
  return {allowed, limit, remaining, retry, reset}
end
