-- One limiter called like its command, as straight-line code: the template
-- that `--@expand single.lua <ALG>` (ALG = TB, SL, SC or FW) instantiates, with
-- `keys` = {key} and `argv` = the command's arguments after the key in scope.
-- Replies with the five integers {allowed, limit, remaining, retry_after_ms,
-- reset_after_ms}; after REFUND n, allowed is the number of units given back
-- and retry_after_ms the wait for one unit.
--
-- lua/build.py inlines the algorithm's functions (the `--@inline` lines) and
-- makes its tables p (parameters) and s (state) local variables p_<field>
-- and s_<field>, so that an EVAL script creates no table and no function
-- for them on each call; A.<name> is the algorithm's constant. The results
-- of an inlined function are named r_<name>, apart from its own locals.

--@include common.lua

if #keys ~= 1 then
  return redis.error_reply('ERR the ' .. A.script .. ' script takes exactly 1 key')
end
if #argv < A.nparams then
  return redis.error_reply("ERR wrong number of arguments for '" .. A.command .. "' command")
end
--@inline p = A.params(argv, 1)
--@inline local r_cost, r_partial, r_dryrun, r_refund, r_fromfirst, r_force = parse_options(argv, A.nparams + 1, nil, nil, A.fromfirst)
p.fromfirst = r_fromfirst
if p.range_err then return p.range_err end

local key = keys[1]
local clock = redis.call('TIME')
--@inline s = A.load(key, p, tonumber(clock[1]) * 1000000 + tonumber(clock[2]))

if r_refund then
  -- The reply after the refund, for a following request of one unit.
  --@inline local r_given = A.give(p, s, r_refund)
  --@inline local r_remaining, r_retry, r_reset = A.report(p, s, 1, 0, false)
  if r_given > 0 then
    --@inline A.write(key, p, s, r_reset)
  end
  return {r_given, p.limit, r_remaining, r_retry, r_reset}
end

if r_force then
  -- A debit: all COST units, past the limit if the debt stays in range
  -- (else decided as without FORCE, below); the reply is for a following
  -- request of one unit.
  --@inline local r_ok = A.debit_ok(p, s, r_cost)
  if r_ok then
    --@inline local r_left, r_wait, r_fresh = A.report(p, s, 1, r_cost, true)
    if r_cost > 0 and not r_dryrun then
      --@inline A.write(key, p, s, r_fresh)
    end
    return {1, p.limit, r_left, r_wait, r_fresh}
  end
end

local avail = s.avail
local granted = 0
if r_cost <= avail then
  granted = r_cost
elseif r_partial then
  granted = avail
end
--@inline local r_remaining, r_retry, r_reset = A.report(p, s, r_cost, granted, false)
if granted > 0 and not r_dryrun then
  --@inline A.write(key, p, s, r_reset)
end
local allowed = granted
if not r_partial then
  allowed = (granted == r_cost) and 1 or 0
end
return {allowed, p.limit, r_remaining, r_retry, r_reset}
