--@include tokenbucket.lua
--@include slidinglog.lua
--@include slidingcounter.lua
--@include fixedwindow.lua
--@include concurrency.lua

-- Several limits in one atomic call (RL.MULTI): keys = one key per limit,
-- argv = the limits, then the options:
--   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
--          | SLIDINGLOG limit window_ms [WEIGHT w]
--          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
--          | FIXEDWINDOW limit window_ms [WEIGHT w] [FROMFIRST]
--          | CONCURRENCY limit lease_ms id [WEIGHT w]
--   each limit then [CHECK] [SHADOW] (not with REFUND)
--   [COST n] [PARTIAL] [DRYRUN] [REFUND n]
-- The i-th limit applies to keys[i] and takes COST * WEIGHT of its units.
-- One clock read; every key is read and every limit decided before anything
-- is written; all or nothing.

local MULTI_ALGS = {TOKENBUCKET = TB, SLIDINGLOG = SL, SLIDINGCOUNTER = SC, FIXEDWINDOW = FW, CONCURRENCY = CC}
local MAX_LIMITS = 16

local OPTION_WORDS = {COST = true, PARTIAL = true, DRYRUN = true, REFUND = true}
local LIMIT_COUNT_ERR = 'ERR the number of limits must equal numkeys'
local SYNTAX_ERR = 'ERR syntax error'

-- The arguments are checked in the module's order, so that a call gets the
-- same error from both: arity, numkeys, each limit from the left, the
-- options, distinct keys, COST (REFUND) * WEIGHT; then the script's own
-- range of exact arithmetic.
local function rl_multi(keys, argv)
  local nkeys, nargs = #keys, #argv
  if 1 + nkeys + nargs < 5 then
    return redis.error_reply("ERR wrong number of arguments for 'RL.MULTI' command")
  end
  if nkeys < 1 or nkeys > MAX_LIMITS then
    return redis.error_reply('ERR numkeys must be an integer between 1 and 16')
  end
  -- numkeys limits: an algorithm's name, its parameters, an optional WEIGHT
  -- (and for FIXEDWINDOW an optional FROMFIRST, after WEIGHT).
  local lims, i, flagged = {}, 1, false
  for j = 1, nkeys do
    local word = argv[i]
    if word == nil then return redis.error_reply(LIMIT_COUNT_ERR) end
    word = string.upper(word)
    local A = MULTI_ALGS[word]
    if not A then
      return redis.error_reply(OPTION_WORDS[word] and LIMIT_COUNT_ERR or SYNTAX_ERR)
    end
    -- its words: the numbers, and a CONCURRENCY limit's id after them
    local nwords = A.nparams + (A.id or 0)
    if i + nwords > nargs then
      -- Parameters missing: a bad one before them is named, else syntax.
      local padded = {}
      for k = 1, nwords do padded[k] = argv[i + k] or '1' end
      local _, e = A.params(padded, 1)
      return e or redis.error_reply(SYNTAX_ERR)
    end
    local p, e = A.params(argv, i + 1)
    if not p then return e end
    i = i + 1 + nwords
    local w = 1
    if argv[i] and string.upper(argv[i]) == 'WEIGHT' then
      if i == nargs then return redis.error_reply(SYNTAX_ERR) end
      w = parse_int(argv[i + 1], 1, MAX)
      if not w then
        return redis.error_reply('ERR WEIGHT must be an integer between 1 and 9007199254740991')
      end
      i = i + 2
    end
    if A.fromfirst == 1 and argv[i] and string.upper(argv[i]) == 'FROMFIRST' then
      p.fromfirst = true
      i = i + 1
    end
    -- then CHECK (takes nothing, denies when its units do not fit) and
    -- SHADOW (never denies; on a grant takes its units if they fit)
    local check, shadow = false, false
    if argv[i] and string.upper(argv[i]) == 'CHECK' then
      check, flagged = true, true
      i = i + 1
    end
    if argv[i] and string.upper(argv[i]) == 'SHADOW' then
      shadow, flagged = true, true
      i = i + 1
    end
    lims[j] = {A = A, p = p, w = w, check = check, shadow = shadow}
  end
  local cost, partial, dryrun, refund, _, force = parse_options(argv, i, MULTI_ALGS, LIMIT_COUNT_ERR)
  if not cost then return partial end
  if refund and flagged then return redis.error_reply(SYNTAX_ERR) end
  if force then
    -- a debit takes from every limit: not with CHECK or SHADOW, nor past a
    -- concurrency limit
    if flagged then return redis.error_reply(SYNTAX_ERR) end
    for j = 1, nkeys do
      if lims[j].A == CC then return redis.error_reply(SYNTAX_ERR) end
    end
  end
  local n = nkeys
  for j = 2, n do
    for j2 = 1, j - 1 do
      if keys[j2] == keys[j] then return redis.error_reply('ERR every key must be distinct') end
    end
  end
  -- COST * WEIGHT (or REFUND * WEIGHT) must stay within 2^53 - 1.
  for j = 1, n do
    if lims[j].w > 1 and (refund or cost) > divmod(MAX, lims[j].w) then
      if refund then
        return redis.error_reply('ERR REFUND * WEIGHT must not exceed 9007199254740991')
      end
      return redis.error_reply('ERR COST * WEIGHT must not exceed 9007199254740991')
    end
  end
  for j = 1, n do
    if lims[j].p.range_err then return lims[j].p.range_err end
  end

  local clock = redis.call('TIME')
  local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local st = {}
  for j = 1, n do
    local L = lims[j]
    local s, e = L.A.load(keys[j], L.p, now)
    if not s then return e end
    st[j] = s
  end

  -- The limits that decide the call: those without SHADOW (all of them
  -- when every limit has SHADOW, and the call then takes COST).
  local all_shadow = true
  for j = 1, n do
    if not lims[j].shadow then all_shadow = false end
  end
  local function counts(j) return all_shadow or not lims[j].shadow end

  -- Decide: took[j] units taken (or given back), wanted[j] = COST * WEIGHT.
  local took, wanted = {}, {}
  local allowed, granted = 0, true
  if force then
    -- FORCE: every limit takes COST * WEIGHT past its limit, unless a debt
    -- would leave its range (then the call is decided as without FORCE).
    for j = 1, n do
      local L = lims[j]
      if not L.A.debit_ok(L.p, st[j], cost * L.w) then force = false end
    end
  end
  if force then
    for j = 1, n do
      wanted[j], took[j] = lims[j].w, cost * lims[j].w
    end
    allowed = 1
  elseif refund then
    for j = 1, n do
      local L = lims[j]
      took[j] = L.A.give(L.p, st[j], refund * L.w)
      if took[j] > 0 then allowed = refund end
    end
  else
    local g = cost
    for j = 1, n do
      local L = lims[j]
      local a = st[j].avail
      if counts(j) and not all_shadow then
        if partial then
          local q = divmod(a, L.w)
          if q < g then g = q end
        elseif a < cost * L.w then
          g = 0
        end
      end
    end
    for j = 1, n do
      local L = lims[j]
      wanted[j], took[j] = cost * L.w, g * L.w
      -- CHECK takes nothing; SHADOW takes its units only if they fit
      if L.check or (L.shadow and took[j] > st[j].avail) then took[j] = 0 end
    end
    granted = (g == cost)
    if partial then
      allowed = g
    elseif granted then
      allowed = 1
    end
  end

  -- Each limit takes its units (or has given some back) and replies. The
  -- binding limit: when granted (or refunded), the fewest whole requests
  -- left (remaining / WEIGHT), else the longest wait (-1 longest); ties to
  -- the lowest index. retry_after_ms: the longest wait (0 when granted; for
  -- a refund, the wait for one more request).
  -- (With SHADOW limits, the binding limit and the wait are the others'.)
  local replies, b, best = {}, 1, nil
  local retry = 0
  for j = 1, n do
    if counts(j) then b = j break end
  end
  for j = 1, n do
    local L = lims[j]
    local rem, wait, reset
    if refund then -- the reply for a following request (WEIGHT units)
      rem, wait, reset = L.A.report(L.p, st[j], L.w, 0)
    elseif force then -- the same, after the debit
      rem, wait, reset = L.A.report(L.p, st[j], L.w, took[j], true)
    else
      rem, wait, reset = L.A.report(L.p, st[j], wanted[j], took[j])
    end
    replies[j] = {took[j], L.p.limit, rem, wait, reset}
    if granted and counts(j) then
      local left = divmod(rem, L.w)
      if best == nil or left < best then b, best = j, left end
    end
    if counts(j) and retry ~= -1 and (wait == -1 or wait > retry) then
      retry = wait
      if not granted then b = j end
    end
  end
  if granted and not refund and not force then retry = 0 end

  if refund then
    for j = 1, n do
      if took[j] > 0 then lims[j].A.write(keys[j], lims[j].p, st[j], replies[j][5]) end
    end
  elseif not dryrun then
    for j = 1, n do
      if took[j] > 0 then lims[j].A.write(keys[j], lims[j].p, st[j], replies[j][5]) end
    end
  end
  local rb = replies[b]
  return {allowed, rb[2], rb[3], retry, rb[5], b - 1, replies}
end
