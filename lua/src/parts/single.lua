--@include common.lua

-- One limiter A (TB, SL or SC) called like its command: keys = {key}, argv =
-- the command's arguments after the key. Replies with the five integers:
-- {allowed, limit, remaining, retry_after_ms, reset_after_ms}; after
-- REFUND n, allowed is the number of units given back and retry_after_ms
-- the wait for one unit.
local function rl_single(A, keys, argv)
  if #keys ~= 1 then
    return redis.error_reply('ERR the ' .. A.script .. ' script takes exactly 1 key')
  end
  if #argv < A.nparams then
    return redis.error_reply("ERR wrong number of arguments for '" .. A.command .. "' command")
  end
  local p, e = A.params(argv, 1)
  if not p then return e end
  local cost, partial, dryrun, refund = parse_options(argv, A.nparams + 1)
  if not cost then return partial end
  if p.range_err then return p.range_err end

  local key = keys[1]
  local clock = redis.call('TIME')
  local s
  s, e = A.load(key, p, tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
  if not s then return e end

  if refund then
    -- The reply after the refund, for a following request of one unit.
    local given = A.give(p, s, refund)
    local remaining, retry, reset = A.report(p, s, 1, 0)
    if given > 0 then A.write(key, p, s, reset) end
    return {given, p.limit, remaining, retry, reset}
  end

  local avail = s.avail
  local granted = 0
  if cost <= avail then
    granted = cost
  elseif partial then
    granted = avail
  end
  local remaining, retry, reset = A.report(p, s, cost, granted)
  if granted > 0 and not dryrun then
    A.write(key, p, s, reset)
  end
  local allowed = granted
  if not partial then
    allowed = (granted == cost) and 1 or 0
  end
  return {allowed, p.limit, remaining, retry, reset}
end
