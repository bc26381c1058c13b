-- RL.MULTI as a Lua script, for servers that cannot load the module:
-- several limits decided in one atomic call, all or nothing.
--
--   EVALSHA <sha> <numkeys> <key> [<key> ...] <limit> [<limit> ...]
--           [COST n] [PARTIAL] [DRYRUN] [REFUND n]
--   limit := TOKENBUCKET capacity rate period_ms [WEIGHT w]
--          | SLIDINGLOG limit window_ms [WEIGHT w]
--          | SLIDINGCOUNTER limit window_ms [WEIGHT w]
--
--   KEYS     one key per limit, 1 to 16, distinct (numkeys = EVALSHA's)
--   ARGV     the limits, in the order of their keys, then the options: the
--            arguments RL.MULTI takes after its keys
--
-- The i-th limit applies to KEYS[i] and takes COST * WEIGHT of its units.
-- Each key holds the same state as the single-limit script of its algorithm
-- (tokenbucket.lua, slidinglog.lua, slidingcounter.lua), so a key can be used
-- by both.
--
-- Reply (seven elements, as RL.MULTI; docs/contract.md, "RL.MULTI"):
--   1 1/0 (g with PARTIAL; after REFUND n: n when any limit took units back)
--   2 limit, 3 remaining, 5 reset_after_ms: of the binding limit
--   4 retry_after_ms: 0 when granted, else the longest wait of the limits,
--     -1 when one never can
--   6 binding: the 0-based index of the binding limit
--   7 one {units, limit, remaining, retry_after_ms, reset_after_ms} per limit

--@include compose.lua

return rl_multi(KEYS, ARGV)
