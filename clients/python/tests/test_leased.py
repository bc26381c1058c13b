"""The leased limiter's local tier: no I/O per decision, one refill in
flight per key, denials from the last shared reply, refunds of idle and
evicted keys."""
import asyncio
import logging
import signal

import pytest
import redis.asyncio
from rltesting.proc import wait_until
from support import LONG, client

from redis_ratelimit import (AsyncRateLimit, Breaker, RateLimit, RateLimitError, sliding_log,
                             token_bucket)

BIG = sliding_log("big", 1_000_000, LONG)


def test_local_decisions_take_no_io(server):
    rl = RateLimit(client(server.port))
    lim = rl.leased(BIG, batch=50, low_water=0.2)
    srcs = [lim.limit("rl:{a}:big").source for _ in range(5000)]
    m = rl.metrics()
    # one lease per 40 decisions (refill at 10 left), the first on the caller's path
    assert srcs[0] == "module" and srcs.count("local") == 4999
    assert m["calls"] == m["leases"] <= 5000 // 40 + 3
    assert m["lease_tokens"] >= 5000
    # the server's count equals what was leased less what was given back,
    # once a refill the last decisions started is back (it can be in flight
    # when the snapshot above is taken; seen once in CI: 5,050 on the
    # server, 5,000 counted)
    def taken():
        d = rl.limiter(BIG).limit("rl:{a}:big", cost=0)
        return d.limit - d.remaining

    def leased():
        m = rl.metrics()
        return m["lease_tokens"] - m["refund_tokens"]
    wait_until(lambda: taken() == leased(), timeout=10,
               what="the server's count equal to the tokens leased and not given back")
    lim.close()
    assert rl.limiter(BIG).limit("rl:{a}:big", cost=0).remaining == BIG.limit - 5000


def test_one_refill_in_flight_per_key(server):
    rl = RateLimit(client(server.port, 0.3), breaker=Breaker(failures=100))
    lim = rl.leased(BIG, batch=10, low_water=0.5)
    for _ in range(4):
        assert lim.limit("rl:{a}:big").allowed          # 6 left, above the mark
    calls = rl.metrics()["calls"]
    server.proc.send_signal(signal.SIGSTOP)
    try:
        # below the mark from here: every decision would want a refill
        for _ in range(5):
            d = lim.limit("rl:{a}:big")
            assert d.allowed and d.source == "local"
        wait_until(lambda: rl.metrics()["calls"] == calls + 1, timeout=10, what="the refill")
        for _ in range(1):
            assert lim.limit("rl:{a}:big").source == "local"
        assert rl.metrics()["calls"] == calls + 1       # still one: single flight
        wait_until(lambda: rl.metrics()["failures"] == 1, timeout=10, what="its timeout")
    finally:
        server.proc.send_signal(signal.SIGCONT)


def test_exhausted_shared_limit_is_a_local_denial(server):
    rl = RateLimit(client(server.port))
    pol = token_bucket("tb", 30, 1, 3_600_000)
    lim = rl.leased(pol, batch=20, recheck_ms=60_000)
    ds = [lim.limit("rl:{a}:tb") for _ in range(40)]
    assert sum(d.allowed for d in ds) == 30
    calls = rl.metrics()["calls"]
    d = lim.limit("rl:{a}:tb")
    assert not d.allowed and d.source == "local"
    # the wait from the last shared reply (a 20-unit lease: ~20 h), minus the time since
    assert 19 * 3_600_000 < d.retry_after_ms <= 20 * 3_600_000
    assert rl.metrics()["calls"] == calls                 # no call for it


@pytest.mark.parametrize("backend", ["module", "lua"])
def test_idle_and_evicted_keys_give_their_tokens_back(server, backend):
    rl = RateLimit(client(server.port), backend=backend)
    lim = rl.leased(BIG, batch=50, max_keys=2, idle_ms=200)
    for k in ("a", "b", "c"):             # "a" is evicted when "c" comes in
        assert lim.limit(f"rl:{{{k}}}:big").allowed

    def used(k):
        d = rl.limiter(BIG).limit(f"rl:{{{k}}}:big", cost=0)
        return d.limit - d.remaining

    wait_until(lambda: used("a") == 1, timeout=10, what="the evicted key's refund")
    assert lim.stranded() == 98
    wait_until(lambda: used("b") == 1 and used("c") == 1, timeout=10, what="idle refunds")
    assert lim.stranded() == 0
    # the worker counts a refund when its reply is back, a moment after the
    # server applied it (which is what used() saw): wait for the count, then
    # require it to be exact
    wait_until(lambda: rl.metrics()["refunds"] >= 3, timeout=10, what="the refunds' count")
    m = rl.metrics()
    assert m["refund_tokens"] == 3 * 49 and m["refunds"] == 3


def test_async_leased(server):
    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=2000)
        lim = rl.leased(BIG, batch=50)
        srcs = [(await lim.limit("rl:{a}:big")).source for _ in range(2000)]
        m = rl.metrics()
        assert srcs.count("local") >= 1999 - 10 and m["leases"] <= 2000 // 40 + 3
        d = await rl.limiter(BIG).limit("rl:{a}:big", cost=0)
        assert d.limit - d.remaining == m["lease_tokens"]
        await rl.client.aclose()

    asyncio.run(main())


def background_failures(caplog):
    return [r for r in caplog.records if r.name == "redis_ratelimit"]


def test_a_worker_failure_is_logged_and_the_worker_goes_on(server, caplog):
    """A background refill that Redis refuses (the key changed type:
    WRONGTYPE, a bug to fix, not an outage) goes to the "redis_ratelimit"
    logger with its traceback, and the worker thread goes on serving the
    other keys."""
    rl = RateLimit(client(server.port))
    lim = rl.leased(BIG, batch=10, low_water=0.5, idle_ms=60_000)
    assert lim.limit("rl:{w}:big").source == "module"        # 10 leased, 9 left
    raw = client(server.port)
    raw.delete("rl:{w}:big")
    raw.rpush("rl:{w}:big", "not a limiter")
    for _ in range(5):          # 4 left: below the mark, the worker refills
        assert lim.limit("rl:{w}:big").source == "local"
    wait_until(lambda: background_failures(caplog), timeout=10, what="the logged failure")
    (rec,) = background_failures(caplog)
    assert rec.levelno == logging.ERROR and "'big'" in rec.getMessage()
    assert rec.exc_info[0] is RateLimitError and "WRONGTYPE" in str(rec.exc_info[1])
    assert lim.worker.is_alive()
    for _ in range(6):          # another key: its own lease, then a refill by the worker
        assert lim.limit("rl:{v}:big").allowed
    wait_until(lambda: rl.metrics()["leases"] == 3, timeout=10, what="the refill, by the worker")
    raw.delete("rl:{w}:big")    # close() gives w's 4 back (REFUND, which WRONGTYPE would refuse)
    lim.close()


def test_an_async_background_failure_is_logged(server, caplog):
    """The asyncio limiter's refills run as tasks: a task's failure goes to
    the same logger (not to asyncio's "exception never retrieved")."""
    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=2000)
        lim = rl.leased(BIG, batch=10, low_water=0.5, idle_ms=60_000)
        assert (await lim.limit("rl:{w}:big")).source == "module"
        await rl.client.delete("rl:{w}:big")
        await rl.client.rpush("rl:{w}:big", "not a limiter")
        for _ in range(5):
            assert (await lim.limit("rl:{w}:big")).source == "local"
        for _ in range(1000):
            if background_failures(caplog):
                break
            await asyncio.sleep(0.01)
        (rec,) = background_failures(caplog)
        assert rec.levelno == logging.ERROR and "'big'" in rec.getMessage()
        assert rec.exc_info[0] is RateLimitError and "WRONGTYPE" in str(rec.exc_info[1])
        await rl.client.delete("rl:{w}:big")
        await lim.close()
        await rl.client.aclose()

    asyncio.run(main())


def test_refund_goes_back_into_the_reservoir(server):
    rl = RateLimit(client(server.port))
    lim = rl.leased(BIG, batch=10)
    assert lim.limit("rl:{r}:big").allowed
    assert lim.stranded() == 9
    d = lim.refund("rl:{r}:big", 1)
    assert d.granted == 1 and d.source == "local" and lim.stranded() == 10
    assert rl.metrics()["calls"] == 1          # no I/O for it

    async def main():
        arl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                             timeout_ms=2000)
        alim = arl.leased(BIG, batch=10)
        assert (await alim.limit("rl:{ar}:big")).allowed
        d = await alim.refund("rl:{ar}:big", 1)
        assert d.granted == 1 and alim.stranded() == 10
        await arl.client.aclose()

    asyncio.run(main())


def test_waiter_still_short_is_denied(server):
    """DESIGN.md: a caller that waited for the lease in flight and is still
    short is denied from the last shared reply; it takes no lease of its own
    (the refill stays off the caller's path). Node does the same
    (clients/node/test/leased.test.js)."""
    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=5000)
        lim = rl.leased(sliding_log("burst", 100_000, LONG), batch=2, low_water=0)
        key = "rl:{burst}:x"
        # the first caller takes the key's first lease on its path; three more
        # arrive while it is in flight and wait for it: it brings 2 units for 4
        ds = await asyncio.gather(*(lim.limit(key) for _ in range(4)))
        assert [(d.allowed, d.source) for d in ds] == \
            [(True, "module"), (True, "local"), (False, "local"), (False, "local")]
        for d in ds[2:]:
            assert d.retry_after_ms == 1          # the last reply granted all it asked
            assert d.remaining == 100_000 - 2     # reservoir 0 + the shared remaining
        m = rl.metrics()
        assert m["leases"] == 1 and m["lease_waits"] == 3 and m["calls"] == 1
        # the denial is not sticky: the next caller takes a lease
        d = await lim.limit(key)
        assert d.allowed and d.source == "module" and rl.metrics()["leases"] == 2
        await lim.close()
        await rl.client.aclose()

    asyncio.run(main())


def test_sync_waiter_still_short_is_denied(server):
    """The same rule for the thread-based LeasedLimiter: threads that waited
    for the lease in flight take none of their own. CLIENT PAUSE WRITE holds
    the first caller's lease (a write) in flight until the three others are
    waiting for it."""
    import threading

    rl = RateLimit(client(server.port, timeout=30))
    lim = rl.leased(sliding_log("burst", 100_000, LONG), batch=2, low_water=0)
    key = "rl:{burst}:sync"
    admin = client(server.port)
    out = []

    def caller():
        out.append(lim.limit(key))

    admin.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        first = threading.Thread(target=caller)
        first.start()
        wait_until(lambda: key in lim.entries and lim.entries[key].inflight, what="the first lease in flight")
        waiters = [threading.Thread(target=caller) for _ in range(3)]
        for t in waiters:
            t.start()
        wait_until(lambda: rl.metrics()["lease_waits"] == 3, what="three callers waiting for it")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    for t in [first] + waiters:
        t.join(30)
    assert sorted((d.allowed, d.source) for d in out) == \
        [(False, "local"), (False, "local"), (True, "local"), (True, "module")]
    for d in out:
        if not d.allowed:
            assert d.retry_after_ms == 1 and d.remaining == 100_000 - 2
    m = rl.metrics()
    assert m["leases"] == 1 and m["lease_waits"] == 3 and m["calls"] == 1
    lim.close()


def test_sync_waiter_after_a_failed_lease_gets_the_panic_limits(server):
    """The same rule for the thread-based LeasedLimiter: a thread that waited
    for a lease that brought no reply (SIGSTOP: it times out) gets the panic
    limits and sends no lease of its own (one call, one failure)."""
    import threading

    from redis_ratelimit import Panic

    rl = RateLimit(client(server.port, 2.0), breaker=Breaker(failures=100))
    lim = rl.leased(sliding_log("fail", 100_000, LONG), batch=1, low_water=0,
                    panic=Panic(limit=5, window_ms=LONG))
    assert lim.limit("rl:{known}:s").source == "module"     # the backend is known
    before = rl.metrics()
    key = "rl:{fresh}:s"
    out = []

    def caller():
        out.append(lim.limit(key))

    server.proc.send_signal(signal.SIGSTOP)
    try:
        first = threading.Thread(target=caller)
        first.start()
        wait_until(lambda: key in lim.entries and lim.entries[key].inflight,
                   what="the first lease in flight")
        waiter = threading.Thread(target=caller)
        waiter.start()
        wait_until(lambda: rl.metrics()["lease_waits"] == 1, what="a caller waiting for it")
        first.join(30)
        waiter.join(30)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert [(d.source, d.allowed, d.limit) for d in out] == [("panic", True, 5)] * 2
    m = rl.metrics()
    assert (m["calls"] - before["calls"], m["failures"] - before["failures"]) == (1, 1)
    lim.close()


def test_waiter_after_a_failed_lease_gets_the_panic_limits(server):
    """DESIGN.md: a waiter whose lease brought no reply in time gets the
    panic limits, as the caller that sent it does (not a local denial),
    whether a shared reply for the key is known from before or not. Node:
    the same test in clients/node/test/leased.test.js."""
    from redis_ratelimit import Panic

    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=100, breaker=Breaker(failures=100))
        lim = rl.leased(sliding_log("fail", 100_000, LONG), batch=1, low_water=0,
                        panic=Panic(limit=5, window_ms=LONG))
        assert (await lim.limit("rl:{known}:x")).source == "module"   # reservoir now empty
        server.proc.send_signal(signal.SIGSTOP)
        try:
            # per key: the first caller's lease times out, the second waits for it
            keys = ["rl:{known}:x", "rl:{known}:x", "rl:{fresh}:x", "rl:{fresh}:x"]
            ds = await asyncio.gather(*(lim.limit(k) for k in keys))
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert [(d.source, d.allowed, d.limit) for d in ds] == [("panic", True, 5)] * 4
        assert rl.metrics()["lease_waits"] == 2
        await rl.client.aclose()

    asyncio.run(main())
