"""fixed_window (RL.FIXEDWINDOW / fixedwindow.lua) on each backend: the
limit per window, the boundary burst, from_first, headers, all_of with
fixed windows, leases, and the arguments refused before any I/O."""
import asyncio

import pytest
import redis.asyncio
from rltesting.clock import before_boundary, room, server_ms, wait_past
from rltesting.proc import wait_until
from support import client

from redis_ratelimit import (AsyncRateLimit, RateLimit, UnsupportedError, all_of,
                             fixed_window, headers, sliding_log, token_bucket)

HOUR = 3_600_000
# hour windows aligned to the epoch: a test starts with this much of one
# left (rltesting.clock.room), so no boundary falls among its calls
ROOM = 30_000


def backends(server):
    out = []
    for b in ("module", "lua"):
        rl = RateLimit(client(server.port), backend=b)
        rl.detect()
        out.append((b, rl))
    return out


# RL.MULTI's FIXEDWINDOW kind: in the module and in the Lua twin.
MULTI_BACKENDS = ("module", "lua")


def test_arguments_are_checked():
    for bad in ((0, 1000), (1, 0), (2**53, 1000), (1, 2**53), (1.5, 1000), ("3", 1000)):
        with pytest.raises(ValueError):
            fixed_window("fw", *bad)
    with pytest.raises(ValueError):
        fixed_window("fw", 1, 1000, from_first=1)
    with pytest.raises(ValueError):
        fixed_window("no spaces", 1, 1000)
    p = fixed_window("fw", 5, 1000, from_first=True)
    assert (p.kind, p.command, p.script, p.limit, p.window_ms, p.from_first) == \
        ("fixedwindow", "RL.FIXEDWINDOW", "fixedwindow", 5, 1000, True)
    assert p.args() == [5, 1000, "FROMFIRST"] and fixed_window("fw", 5, 1000).args() == [5, 1000]
    assert p.weighted(3).multi_spec() == ["FIXEDWINDOW", 5, 1000, "WEIGHT", 3, "FROMFIRST"]


def test_limit_per_window_and_headers(server):
    """`limit` per window, then denied until the window's end:
    retry_after_ms = reset_after_ms = the time left in the window (the same
    on both backends, measured from the window's start on the server)."""
    c = server.client()
    for b, rl in backends(server):
        lim = rl.limiter(fixed_window("api", 3, HOUR))
        key = f"rl:{{{b}}}:api"
        t0 = room(c, HOUR, ROOM)
        ds = [lim.limit(key) for _ in range(4)]
        t1 = server_ms(c)
        end = t0 - t0 % HOUR + HOUR
        assert [d.allowed for d in ds] == [True, True, True, False] and ds[0].source == b
        assert [d.remaining for d in ds] == [2, 1, 0, 0]
        d = ds[-1]
        assert end - t1 <= d.retry_after_ms == d.reset_after_ms <= end - t0
        h = headers(d)
        secs = -(-d.reset_after_ms // 1000)
        assert h == {"RateLimit-Policy": '"api";q=3;w=3600', "RateLimit": f'"api";r=0;t={secs}',
                     "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0",
                     "X-RateLimit-Reset": str(secs), "Retry-After": str(secs)}
        # the key expires exactly at the window's end
        assert c.pexpiretime(key) == end
        # COST above the limit: never (-1); an empty window is fresh
        d = lim.limit(f"rl:{{{b}}}:fresh", cost=4)
        assert (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms) == (False, 3, -1, 0)
        assert "Retry-After" not in headers(d) and c.exists(f"rl:{{{b}}}:fresh") == 0
        r = lim.refund(key, 2)
        assert r.granted == 2 and r.remaining == 2 and r.source == b


def test_boundary_burst(server):
    """Up to 2 x limit across one boundary: `limit` at the end of a window
    and `limit` at the start of the next, well within one window_ms.

    A 3 s window, the first burst started 1.44-1.5 s before a boundary
    (read from the server's clock) and the second right after it: each
    burst has about 1.5 s to land on its side. One that did not (a client
    stalled for over a second) runs again on a fresh key at a later
    boundary, up to 5 times."""
    c = server.client()
    for b, rl in backends(server):
        W = 3000
        lim = rl.limiter(fixed_window("burst", 4, W))
        for attempt in range(5):
            key = f"rl:{{{b}}}:burst:{attempt}"
            end = before_boundary(c, W, W // 2)
            t0 = server_ms(c)
            first = [lim.limit(key).allowed for _ in range(5)]
            ta = server_ms(c)
            wait_past(c, end, timeout=10)
            second = [lim.limit(key).allowed for _ in range(5)]
            t1 = server_ms(c)
            if ta < end and t1 - t0 < W:
                break
        else:
            raise AssertionError("no burst landed on its side of a boundary in 5 tries")
        assert first == second == [True] * 4 + [False]
        assert t1 - t0 < W  # 8 granted in less than one window


def test_from_first(server):
    """from_first: the window starts at the first grant (its key expires
    window_ms after it), not on a multiple of window_ms; once it ends, the
    next grant starts another.

    The first three calls must fall inside the window the first began: a
    run whose third call came after it ended (a stall of W) runs again on a
    fresh key, up to 3 times."""
    c = server.client()
    for b, rl in backends(server):
        W = 1000
        lim = rl.limiter(fixed_window("ff", 2, W, from_first=True))
        for attempt in range(3):
            key = f"rl:{{{b}}}:ff:{attempt}"
            t0 = server_ms(c)
            d = lim.limit(key)
            t1 = server_ms(c)
            assert d.allowed and d.reset_after_ms == W
            exp = c.pexpiretime(key)
            assert t0 + W <= exp <= t1 + W
            more = [lim.limit(key).allowed, lim.limit(key).allowed]
            if server_ms(c) < exp:
                break
        else:
            raise AssertionError(f"no three calls within {W} ms of the first in 3 tries")
        assert more == [True, False]
        wait_until(lambda: c.exists(key) == 0, timeout=5, what="the window to end")
        assert lim.limit(key).reset_after_ms == W and c.pexpiretime(key) >= exp + W - (exp - t0)


def test_all_of_with_fixed_windows(server):
    """RL.MULTI's FIXEDWINDOW kind: a per-second fixed window and an hourly
    one (from_first, weighted) beside a token bucket, all or nothing."""
    room(server.client(), HOUR, ROOM)
    for b, rl in backends(server):
        if b not in MULTI_BACKENDS:
            continue
        assert rl.has_multi
        pol = all_of(token_bucket("tb", 100, 1, HOUR), fixed_window("sec", 3, HOUR),
                     fixed_window("hour", 10, HOUR, from_first=True).weighted(2), name="fw")
        lim = rl.limiter(pol)
        key = f"rl:{{{b}}}:m"
        ds = [lim.limit(key) for _ in range(4)]
        assert [d.allowed for d in ds] == [True, True, True, False]
        # from_first: its window began at the first grant, a whole hour ahead
        assert ds[0].parts[2].reset_after_ms == HOUR
        d = ds[-1]
        assert d.binding == "sec" and [p.granted for p in d.parts] == [0, 0, 0]
        assert [p.remaining for p in d.parts] == [97, 0, 4]
        d = lim.limit(f"rl:{{{b}}}:n", cost=6, partial=True)
        assert d.granted == 3 and [p.granted for p in d.parts] == [3, 3, 6]
        d = lim.limit(f"rl:{{{b}}}:o", cost=2)
        assert d.allowed and d.binding == "sec" and [p.remaining for p in d.parts] == [98, 1, 6]
        assert headers(d)["RateLimit-Policy"] == \
            '"tb";q=100;w=360000, "sec";q=3;w=3600, "hour";q=10;w=3600'
        r = lim.refund(f"rl:{{{b}}}:o", 1)
        assert r.granted == 1 and [p.granted for p in r.parts] == [1, 1, 2]


def test_leased_fixed_window(server):
    """Leases take what is left (PARTIAL) in batches: never more than the
    window's limit, the rest denied locally from the last shared reply."""
    room(server.client(), HOUR, ROOM)
    for b, rl in backends(server):
        lim = rl.leased(fixed_window("lease", 25, HOUR), batch=10, low_water=0.2)
        key = f"rl:{{{b}}}:lease"
        ds = [lim.limit(key) for _ in range(40)]
        assert sum(d.allowed for d in ds) == 25
        assert all(not d.allowed for d in ds[25:]) and ds[-1].retry_after_ms > 0
        lim.close()
        d = rl.limiter(fixed_window("lease", 25, HOUR)).limit(key, cost=0)
        assert d.remaining == 0


def test_async_fixed_window(server):
    room(server.client(), HOUR, ROOM)

    async def main():
        for b in ("module", "lua"):
            rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                                timeout_ms=2000, backend=b)
            await rl.detect()
            lim = rl.limiter(fixed_window("a", 2, HOUR, from_first=True))
            ds = [await lim.limit(f"rl:{{{b}}}:a") for _ in range(3)]
            assert [d.allowed for d in ds] == [True, True, False] and ds[0].source == b
            if b in MULTI_BACKENDS:
                m = rl.limiter(all_of(fixed_window("x", 1, HOUR), sliding_log("y", 5, HOUR)))
                ds = [await m.limit(f"rl:{{{b}}}:m") for _ in range(2)]
                assert [d.allowed for d in ds] == [True, False] and ds[1].binding == "x"
            await rl.client.aclose()

    asyncio.run(main())


def test_a_module_without_fixed_window_refuses_before_any_call(server):
    """COMMAND INFO shows RL.FIXEDWINDOW on this module; a module older than
    it (COMMAND INFO's reply for it given to the detection as that server
    would answer) refuses fixed_window, alone or in all_of, before any call:
    an UnsupportedError, not an unknown command taken for a lost backend."""
    rl = RateLimit(client(server.port))
    assert rl.detect() == "module" and rl.has_fixed_window
    for forced in ("auto", "module"):
        old = RateLimit(client(server.port), backend=forced)
        old._set_backend([b"rl.tokenbucket", b"rl.multi", None])
        assert old.backend == "module" and old.has_multi and not old.has_fixed_window
        for pol in (fixed_window("f", 1, HOUR), all_of(fixed_window("f", 1, HOUR), sliding_log("l", 5, HOUR))):
            with pytest.raises(UnsupportedError, match="RL.FIXEDWINDOW"):
                old.limiter(pol).limit("rl:{old}:k")
        assert old.limiter(sliding_log("l", 5, HOUR)).limit("rl:{old}:l").allowed
        m = old.metrics()
        assert (m["calls"], m["failures"], m["redetects"]) == (1, 0, 0)
    lua = RateLimit(client(server.port), backend="lua")
    lua.detect()
    assert lua.has_fixed_window
