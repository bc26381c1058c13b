#!lua name=ratelimit
-- Every limiter as one Redis Functions library (Redis 7.0+, Valkey), from the
-- same parts as the EVAL scripts:
--
--   FUNCTION LOAD "$(cat lua/library.lua)"      (REPLACE to upgrade)
--   FCALL rl_tokenbucket 1 <key> <capacity> <rate> <period_ms> [options]
--   FCALL rl_slidinglog 1 <key> <limit> <window_ms> [options]
--   FCALL rl_slidingcounter 1 <key> <limit> <window_ms> [options]
--   FCALL rl_fixedwindow 1 <key> <limit> <window_ms> [options] [FROMFIRST]
--   FCALL rl_concurrency 1 <key> <limit> <lease_ms> ACQUIRE|RELEASE|RENEW <id> [options]
--   FCALL rl_multi <numkeys> <key> [<key> ...] <limit> [<limit> ...] [options]
--
-- Keys and arguments exactly as for the scripts tokenbucket.lua,
-- slidinglog.lua, slidingcounter.lua, fixedwindow.lua, concurrency.lua and multi.lua, with the same replies.
-- Unlike the script cache, a library is kept in RDB and AOF and replicated.

--@include compose.lua

redis.register_function('rl_tokenbucket', function(keys, argv)
--@expand single.lua TB
end)
redis.register_function('rl_slidinglog', function(keys, argv)
--@expand single.lua SL
end)
redis.register_function('rl_slidingcounter', function(keys, argv)
--@expand single.lua SC
end)
redis.register_function('rl_fixedwindow', function(keys, argv)
--@expand single.lua FW
end)
redis.register_function('rl_concurrency', rl_concurrency)
redis.register_function('rl_multi', rl_multi)
