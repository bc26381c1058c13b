-- RL.FIXEDWINDOW as a Lua script, for servers that cannot load the module.
--
--   EVALSHA <sha> 1 <key> <limit> <window_ms> [COST n] [PARTIAL] [DRYRUN] [FROMFIRST]
--   EVALSHA <sha> 1 <key> <limit> <window_ms> REFUND n [FROMFIRST]
--
--   KEYS[1]  the window's key
--   ARGV     the command's arguments after the key, as RL.FIXEDWINDOW takes them
--
-- Reply: {allowed, limit, remaining, retry_after_ms, reset_after_ms}, the
-- same five integers as the module command (docs/contract.md, "Reply"); after REFUND n,
-- allowed is the number of units given back.

--@include fixedwindow.lua

local keys, argv = KEYS, ARGV
--@expand single.lua FW
