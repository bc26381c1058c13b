"""The in-flight guard (RL.CONCURRENCY) and reservations (reserve, then
settle), against real servers, on the module and on its Lua twin (issue 46,
item 3; clients/DESIGN.md, "In-flight limits" and "Reservations").

What each test would catch: a guard that does not release on some exit path
(an exception, a cancelled task, an explicit release then the exit), that
does not renew (its lease lapses under a long stream and a third holder
gets in), that keeps renewing a lease the server lost, that holds more than
the local limit while the breaker is open; a reservation that settles
twice, or sends the wrong amount back."""
import asyncio
import signal
import threading
import time

import pytest
import redis.asyncio
from rltesting.proc import wait_until
from support import LONG, client

from redis_ratelimit import (AsyncRateLimit, Breaker, Panic, RateLimit, concurrency, fixed_window,
                             token_bucket)

BACKENDS = ["module", "lua"]


def calm(aio=False):
    """Redis's decisions only: a loaded machine's slow answer must neither
    time out nor open the breaker (then the panic limits decide: the
    outage tests below do that on purpose). A sync client's timeout is its
    socket_timeout (support.client: 5 s)."""
    return {**({"timeout_ms": 5000} if aio else {}),
            "breaker": Breaker(failures=1000, latency_budget_ms=10**9)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_guard_releases_on_every_exit(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    inf = rl.inflight(concurrency("jobs", 2, 60_000))
    k = "rl:{t}:jobs"
    # held inside, released after: the third holder gets in only once one left
    with inf.hold(k) as a:
        assert a.allowed and a.decision.remaining == 1 and a.decision.source == backend
        with inf.hold(k) as b:
            assert b.allowed and b.decision.remaining == 0
            with inf.hold(k) as c:
                assert not c.allowed and c.decision.retry_after_ms > 0
        with inf.hold(k) as d:
            assert d.allowed, "b's exit released its unit"
    # an exception
    with pytest.raises(ZeroDivisionError):
        with inf.hold(k) as e:
            assert e.allowed
            1 / 0
    assert not e.held
    # an explicit release, then the exit: one RELEASE, nothing freed twice
    with inf.hold(k) as f, inf.hold(k) as g:
        assert f.allowed and g.allowed
        f.release()
        with inf.hold(k) as h:
            assert h.allowed, "f released early"
            with inf.hold(k) as i:
                assert not i.allowed, "f's exit freed nothing more"
    with inf.hold(k, cost=2) as j:
        assert j.allowed and j.decision.remaining == 0, "every unit came back"
    with inf.hold(k, cost=3) as big:
        assert not big.allowed and big.decision.retry_after_ms == -1
    inf.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_async_guard_releases_when_cancelled(server, backend):
    async def main():
        c = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        rl = AsyncRateLimit(c, backend=backend, **calm(aio=True))
        inf = rl.inflight(concurrency("streams", 1, 60_000))
        k = "rl:{t}:streams"
        entered = asyncio.Event()

        async def stream():
            async with inf.hold(k) as h:
                assert h.allowed
                entered.set()
                await asyncio.Event().wait()        # until cancelled

        task = asyncio.create_task(stream())
        await entered.wait()
        async with inf.hold(k) as other:
            assert not other.allowed, "the stream holds the only unit"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with inf.hold(k) as after:
            assert after.allowed, "the cancelled stream released its unit"
        with pytest.raises(RuntimeError):
            async with inf.hold(k) as x:
                raise RuntimeError("boom")
        assert not x.held
        async with inf.hold(k) as again:
            assert again.allowed
        await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stream_longer_than_its_lease_keeps_its_units(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    lease_ms = 1500
    inf = rl.inflight(concurrency("long", 1, lease_ms), renew_ms=100)
    k = "rl:{t}:long"
    with inf.hold(k) as h:
        assert h.allowed
        t0 = time.monotonic()
        # held well past one lease: only the renewals keep it
        wait_until(lambda: time.monotonic() - t0 > 2 * lease_ms / 1000 and h.renewals >= 3, timeout=30)
        with inf.hold(k) as other:
            assert not other.allowed, f"the lease lapsed under a renewed hold ({h.renewals} renewals)"
        assert not h.lost
    with inf.hold(k) as after:
        assert after.allowed
    inf.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_lease_the_server_lost_is_reported_not_renewed(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    inf = rl.inflight(concurrency("lost", 1, 60_000), renew_ms=50)
    k = "rl:{t}:lost"
    with inf.hold(k) as h:
        assert h.allowed
        rl.client.delete(k)               # the server forgets the lease (a flush, a failover)
        wait_until(lambda: h.lost, timeout=30)
        renewals = h.renewals
        calls = rl.metrics()["calls"]
        time.sleep(0.3)   # a window in which a renewer that went on would call 6 times
        assert rl.metrics()["calls"] == calls and h.renewals == renewals, "renewals stopped"
    inf.close()


def test_the_breaker_open_holds_are_local_and_bounded(server):
    rl = RateLimit(client(server.port, 0.05), breaker=Breaker(failures=1, open_ms=60_000))
    inf = rl.inflight(concurrency("jobs", 10, 60_000), panic=Panic(limit=2))
    k = "rl:{t}:jobs"
    with inf.hold(k) as remote:
        assert remote.decision.source == "module"
    server.proc.send_signal(signal.SIGSTOP)
    try:
        with inf.hold(k) as a, inf.hold(k) as b, inf.hold(k) as c:
            assert (a.allowed, b.allowed, c.allowed) == (True, True, False)
            assert {a.decision.source, b.decision.source, c.decision.source} == {"panic"}
            assert c.decision.retry_after_ms == 1 and inf.held_locally(k) == 2
        assert inf.held_locally(k) == 0, "local holds released on exit"
        with inf.hold(k, cost=3) as big:
            assert not big.allowed and big.decision.retry_after_ms == -1
    finally:
        server.proc.send_signal(signal.SIGCONT)
    inf.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flavour", ["sync", "asyncio"])
def test_an_unanswered_acquire_is_released_once_redis_answers(server, backend, flavour):
    """An ACQUIRE sent to a stopped server times out (the hold is decided
    locally) but is applied when the server wakes: without a RELEASE of its
    id, its unit stays held for the whole lease (60 s here). The library
    sends that RELEASE once the breaker has closed again."""
    k = "rl:{t}:one"
    pol = concurrency("one", 1, 60_000)
    # 100 ms: a stopped server's ACQUIRE times out; a loaded machine's answer
    # may too, so the warm-up below goes on until one is answered in time
    brk = {"breaker": Breaker(failures=1, open_ms=100)}

    if flavour == "sync":
        rl = RateLimit(client(server.port, 0.1), backend=backend, **brk)
        inf = rl.inflight(pol, renew_ms=50)

        def answered():
            with inf.hold(k) as w:  # the twin's script cached: the stalled EVALSHA applies
                return w.allowed and w.decision.source == backend and inf.late_releases() == 0
        wait_until(answered, timeout=30, what="an answered hold")
        server.proc.send_signal(signal.SIGSTOP)
        try:
            with inf.hold(k) as a:
                assert a.decision.source == "panic"
            assert inf.late_releases() == 1
        finally:
            server.proc.send_signal(signal.SIGCONT)
        # the first hold after open_ms is the probe; the unit is free once
        # the RELEASE went out (without it: denied for 60 s)
        wait_until(answered, timeout=30, what="the stalled ACQUIRE released")
        inf.close()
        return

    async def main():
        c = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        rl = AsyncRateLimit(c, backend=backend, timeout_ms=100, **brk)
        inf = rl.inflight(pol, renew_ms=50)

        async def answered():
            async with inf.hold(k) as w:
                return w.allowed and w.decision.source == backend and inf.late_releases() == 0

        async def until(what):
            t0 = time.monotonic()
            while not await answered():
                assert time.monotonic() - t0 < 30, what
                await asyncio.sleep(0.02)
        await until("an answered hold")
        server.proc.send_signal(signal.SIGSTOP)
        try:
            async with inf.hold(k) as a:
                assert a.decision.source == "panic"
            assert inf.late_releases() == 1
        finally:
            server.proc.send_signal(signal.SIGCONT)
        await until("the stalled ACQUIRE released")
        await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_threads_never_hold_more_than_the_limit(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    inf = rl.inflight(concurrency("pool", 3, 60_000))
    k = "rl:{t}:pool"
    held, peak, granted = [0], [0], [0]
    lock = threading.Lock()

    def worker():
        for _ in range(40):
            with inf.hold(k) as h:
                if not h.allowed:
                    continue
                with lock:
                    held[0] += 1
                    granted[0] += 1
                    peak[0] = max(peak[0], held[0])
                with lock:
                    held[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 3 and granted[0] >= 3
    with inf.hold(k, cost=3) as all_back:
        assert all_back.allowed, "every unit came back"
    inf.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reservation_gives_back_what_it_did_not_use_once(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    lim = rl.limiter(fixed_window("tpm", 1000, LONG))
    k = "rl:{t}:tpm"
    r = lim.reserve(k, 600)
    assert r.allowed and r.decision.remaining == 400
    d = r.settle(100)
    assert d is not None and d.remaining == 900, "500 given back"
    with pytest.raises(RuntimeError):
        r.settle(100)
    assert lim.limit(k, cost=0).remaining == 900, "the second settle sent nothing"
    # the estimate exactly: nothing sent
    r = lim.reserve(k, 300)
    assert r.settle(300) is None and lim.limit(k, cost=0).remaining == 600
    # denied: nothing was taken, nothing to settle
    r = lim.reserve(k, 700)
    assert not r.allowed and r.settle(0) is None and lim.limit(k, cost=0).remaining == 600
    # abandoned: stays charged at its estimate
    lim.reserve(k, 200)
    assert lim.limit(k, cost=0).remaining == 400


def test_an_async_reservation_settles_once(server):
    async def main():
        c = redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        lim = AsyncRateLimit(c, **calm(aio=True)).limiter(token_bucket("tok", 100, 1, LONG))
        r = await lim.reserve("rl:{t}:tok", 60)
        assert r.allowed
        d = await r.settle(20)
        assert d is not None and d.remaining == 80
        with pytest.raises(RuntimeError):
            await r.settle(20)
        await c.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reservation_takes_what_it_used_beyond_the_estimate_even_past_the_limit(server, backend):
    rl = RateLimit(client(server.port), backend=backend, **calm())
    lim = rl.limiter(fixed_window("tpm", 1000, LONG))
    k = "rl:{t}:debit"
    r = lim.reserve(k, 600)
    d = r.settle(900)                       # COST 300 FORCE
    assert d is not None and d.allowed and d.granted == 300 and d.remaining == 100
    r = lim.reserve(k, 100)
    assert r.allowed and r.decision.remaining == 0
    d = r.settle(500)                       # 400 past the limit: a debt
    assert d is not None and d.allowed and d.granted == 400 and d.remaining == 0
    denied = lim.limit(k)
    assert not denied.allowed and denied.retry_after_ms > 0, "later calls wait the debt out"
    # a refund repays the debt first: 400 back leaves the window exactly full
    assert lim.refund(k, 400).remaining == 0 and not lim.limit(k).allowed
    assert lim.refund(k, 1).remaining == 1
