"""Type-checked by `mypy --strict` in `make lint`, never run: the public API
as a user calls it, annotations and all (as clients/node/test/types/usage.ts
does for the Node declarations). Each `type: ignore[...]` marks a wrong
call that must stay an error: --strict warns about an unused ignore, so
lint fails if the types ever accept it."""
from __future__ import annotations

import dataclasses
from typing import Dict, List

import redis
import redis.asyncio

from redis_ratelimit import (AsyncRateLimit, Backend, Breaker, Decision, LeasedLimiter, Limiter,
                             MetricsSnapshot, Panic, Part, Policy, RateLimit, Source, Strict, all_of,
                             fixed_window, headers, key_slot, make_key, problem, sliding_counter, sliding_log,
                             token_bucket)
from redis_ratelimit.aio import AsyncLeasedLimiter, AsyncLimiter
from redis_ratelimit.asgi import RateLimitMiddleware


def sync_usage(client: redis.Redis) -> int:
    backend: Backend = "auto"
    rl = RateLimit(client, backend=backend, breaker=Breaker(failures=3, open_ms=500))
    strict = RateLimit.from_url("redis://localhost:6379", timeout_ms=50,
                                strict=Strict(replicas=1, timeout_ms=40))
    on_sentinel = RateLimit.from_sentinel([("localhost", 26379)], "mymaster", timeout_ms=50,
                                          backend="lua")
    api = token_bucket("api", 100, 100, 60_000)
    per_min: Policy = fixed_window("min", 60, 60_000, from_first=True)
    both = all_of(api, sliding_log("day", 10_000, 86_400_000).weighted(2), per_min, name="both")
    lim: Limiter = rl.limiter(both, panic=Panic(instances=4))
    d: Decision = lim.limit(make_key("t", "u"), cost=2, partial=True)
    back: Decision = lim.refund(["rl:{t}:api", "rl:{t}:day"], 2)
    parts: List[Part] = list(d.parts)
    source: Source = d.source
    h: Dict[str, str] = headers(d)
    body = problem(d, instance="/x")
    leased: LeasedLimiter = strict.leased(sliding_counter("cnt", 50, 1_000), batch=10,
                                          low_water=0.2, max_keys=1000, idle_ms=5000,
                                          recheck_ms=250, panic=Panic(limit=10, window_ms=1000))
    with leased:
        ld = leased.limit("k", cost=1)
        stranded = leased.stranded()
    m: MetricsSnapshot = rl.metrics()
    state: str = m["state"]
    seconds: float = rl.timeout_s + on_sentinel.timeout_s
    same: Decision = dataclasses.replace(d, granted=0)
    print(parts, source, h, body["status"], state, seconds, same, back, bool(ld))
    return d.remaining + d.retry_after_ms + stranded + key_slot("k") + m["unreplicated"]


async def async_usage(client: redis.asyncio.Redis) -> bool:
    rl = AsyncRateLimit(client, timeout_ms=5, strict=True)
    other = AsyncRateLimit.from_url("redis://localhost:6379", timeout_ms=5, cluster=True)
    lim: AsyncLimiter = rl.limiter(token_bucket("api", 10, 1, 1000))
    d = await lim.limit("rl:{a}:api", dry_run=True)
    leased: AsyncLeasedLimiter = other.leased(token_bucket("api", 10, 1, 1000))
    async with leased:
        ld = await leased.limit("k")
    return d.allowed and ld.allowed and rl.timeout_s > 0


def wrong_usage(client: redis.Redis, d: Decision) -> None:
    RateLimit(client, backend="redis")  # type: ignore[arg-type]
    RateLimit(client, timeout_ms=5)  # type: ignore[call-arg]
    rl = RateLimit(client)
    rl.leased(all_of(token_bucket("a", 1, 1, 1)))  # type: ignore[arg-type]
    rl.limiter(token_bucket("a", 1, 1, 1)).limit("k", cost="2")  # type: ignore[arg-type]
    d.allowed = False  # type: ignore[misc]
    token_bucket("a", 1.5, 1, 1)  # type: ignore[arg-type]
    bad: Source = "redis"  # type: ignore[assignment]
    print(bad)


async def asgi_usage(client: redis.asyncio.Redis) -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        return None
    lim = AsyncRateLimit(client).limiter(token_bucket("api", 10, 1, 1000))
    RateLimitMiddleware(app, routes=[("/api/", lim), ("/admin", ["POST"], lim)])
