-- RL.TOKENBUCKET as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <capacity> <rate> <period_ms> [COST n] [PARTIAL] [DRYRUN]
--   EVALSHA <sha> 1 <key> <capacity> <rate> <period_ms> REFUND n
--
--   KEYS[1]  the bucket's key
--   ARGV     the command's arguments after the key, as RL.TOKENBUCKET takes them
--
-- Reply: {allowed, capacity, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (docs/contract.md, "Reply"); after REFUND n,
-- allowed is the number of tokens given back.

--@include tokenbucket.lua

local keys, argv = KEYS, ARGV
--@expand single.lua TB
