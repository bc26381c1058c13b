"""all_of (RL.MULTI / multi.lua) and refunds, on each backend this build
has. The module vs Lua comparison of the same calls is in
test_differential.py (it includes all_of and refunds when both backends
have them)."""
import asyncio

import redis.asyncio
from support import LONG, client

from redis_ratelimit import (AsyncRateLimit, RateLimit, all_of, headers,
                             problem, sliding_counter, sliding_log, token_bucket)

POL = all_of(token_bucket("burst", 5, 1, LONG), sliding_log("day", 3, LONG))


def backends(server):
    out = []
    for b in ("module", "lua"):
        rl = RateLimit(client(server.port), backend=b)
        rl.detect()
        out.append((b, rl))
    return out


def test_all_of_all_or_nothing(server):
    tried = 0
    for b, rl in backends(server):
        assert rl.has_multi
        tried += 1
        lim = rl.limiter(POL)
        key = f"rl:{{{b}}}:u"
        ds = [lim.limit(key) for _ in range(4)]
        assert [d.allowed for d in ds] == [True, True, True, False]
        assert all(d.source == b for d in ds)
        d = ds[-1]
        assert d.binding == "day" and d.retry_after_ms > 0
        assert [p.policy for p in d.parts] == ["burst", "day"]
        assert [p.granted for p in d.parts] == [0, 0]
        # nothing was taken by the denied call: burst still has 2
        assert [p.remaining for p in d.parts] == [2, 0]
        assert problem(d)["violated-policies"] == ["day"]
        assert headers(d)["RateLimit-Policy"] == f'"burst";q=5;w={-(-5 * LONG // 1000)}, ' \
                                                 f'"day";q=3;w={LONG // 1000}'
        # PARTIAL: the largest g every part can take
        d = lim.limit(f"rl:{{{b}}}:v", cost=4, partial=True)
        assert d.granted == 3 and not d.allowed
        # weights: 2 units of "w" per unit of cost
        wpol = all_of(token_bucket("a", 10, 1, 10**11), sliding_counter("w", 10, LONG).weighted(2))
        d = rl.limiter(wpol).limit(f"rl:{{{b}}}:w", cost=3)
        assert d.allowed and [p.granted for p in d.parts] == [3, 6]
        assert d.binding == "w" and [p.remaining for p in d.parts] == [7, 4]
    assert tried == 2


def test_refund(server):
    tried = 0
    for b, rl in backends(server):
        lim = rl.limiter(sliding_log("log", 5, LONG))
        key = f"rl:{{{b}}}:r"
        tried += 1
        for _ in range(5):
            assert lim.limit(key).allowed
        assert not lim.limit(key).allowed
        r = lim.refund(key, 2)
        assert r.granted == 2 and r.remaining == 2 and r.source == b
        assert [lim.limit(key).allowed for _ in range(3)] == [True, True, False]
        assert rl.metrics()["refund_tokens"] == 2
        # a fresh key: nothing to give back, nothing written
        r = lim.refund(f"rl:{{{b}}}:fresh", 3)
        assert r.granted == 0 and server.client().exists(f"rl:{{{b}}}:fresh") == 0
        m = rl.limiter(POL)
        mk = f"rl:{{{b}}}:m"
        for _ in range(3):
            m.limit(mk)
        r = m.refund(mk, 1)
        assert r.granted == 1 and [p.granted for p in r.parts] == [1, 1]
        assert m.limit(mk).allowed
    assert tried == 2


def test_async_all_of(server):
    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=2000, backend="lua")
        await rl.detect()
        lim = rl.limiter(POL)
        ds = [await lim.limit("rl:{a}:u") for _ in range(4)]
        assert [d.allowed for d in ds] == [True, True, True, False]
        assert ds[-1].binding == "day" and ds[-1].source == "lua"
        await rl.client.aclose()

    asyncio.run(main())
