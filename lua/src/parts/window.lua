--@include common.lua

-- The parameters of the windowed limiters (sliding log and sliding counter).
--
-- Exact arithmetic: the scripts need W = window_ms * 1000 < 2^53, so they
-- accept window_ms up to 9007199254740 (about 285 years) and refuse more with
-- an error (the module accepts 1..2^53-1).

local MAX_WINDOW_MS = 9007199254740 -- window_ms * 1000 < 2^53

-- limit window_ms, from argv[i] on: a parameter table, or nil and an error.
local function limit_window_params(argv, i)
  local limit = parse_int(argv[i], 1, MAX)
  if not limit then
    return nil, redis.error_reply('ERR limit must be an integer between 1 and 9007199254740991')
  end
  local window_ms = parse_int(argv[i + 1], 1, MAX)
  if not window_ms then
    return nil, redis.error_reply('ERR window_ms must be an integer between 1 and 9007199254740991')
  end
  -- The range of exact double arithmetic: an error the caller answers only
  -- once the options are read (p.range_err).
  local p = {limit = limit, window_ms = window_ms, W = window_ms * 1000}
  if window_ms > MAX_WINDOW_MS then
    p.range_err = redis.error_reply('ERR window_ms is beyond the exact range of the Lua script (at most 9007199254740)')
  end
  return p
end
