-- RL.CONCURRENCY as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <limit> <lease_ms> ACQUIRE <id> [COST n] [PARTIAL] [DRYRUN]
--   EVALSHA <sha> 1 <key> <limit> <lease_ms> RELEASE <id>
--   EVALSHA <sha> 1 <key> <limit> <lease_ms> RENEW <id>
--
--   KEYS[1]  the leases' key
--   ARGV     the command's arguments after the key, as RL.CONCURRENCY takes them
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (docs/contract.md,
-- "RL.CONCURRENCY"); after RELEASE, allowed is the number of units freed.

--@include concurrency.lua

return rl_concurrency(KEYS, ARGV)
