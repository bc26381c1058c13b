"""Circuit breaker and panic mode against a real redis-server that is
stalled (SIGSTOP), killed and restarted, or slow (a busy script).

Bounds checked: no caller waits longer than the configured timeout (plus a
generous scheduling margin); the breaker trips after exactly `failures`
failed calls (or on the latency rule); while it is open decisions come from
the panic limits and never exceed them; after the server is back, a
half-open probe closes it and shared decisions and leases resume."""
import asyncio
import signal
import threading
import time

import pytest
import redis.asyncio
from rltesting.proc import wait_until
from support import LONG, client

from redis_ratelimit import (AsyncRateLimit, Breaker, Panic, RateLimit, sliding_log,
                             token_bucket)

TIMEOUT_MS = 50
MARGIN_S = 0.5          # scheduling noise on a busy machine; far above TIMEOUT_MS
PANIC = 5
POLICY = token_bucket("api", 100, 1, LONG)
LEASED = sliding_log("leased", 10_000, LONG)


def make(server, failures=3, open_ms=300):
    rl = RateLimit(client(server.port, TIMEOUT_MS / 1000),
                   breaker=Breaker(failures=failures, open_ms=open_ms))
    lim = rl.limiter(POLICY, panic=Panic(limit=PANIC))
    leased = rl.leased(LEASED, batch=20, idle_ms=60_000, panic=Panic(limit=PANIC))
    return rl, lim, leased


def timed(fn, *a, **kw):
    t0 = time.monotonic()
    d = fn(*a, **kw)
    return d, time.monotonic() - t0


def outage_then_recovery(server, stop, resume):
    rl, lim, leased = make(server)
    assert lim.limit("rl:{u}:api").source == "module"
    d = leased.limit("rl:{u}:leased")
    assert d.source == "module" and d.allowed
    held = leased.stranded()          # pre-debited units still usable locally
    assert held == 19
    calls_before = rl.metrics()["calls"]

    stop()
    # Callers keep coming; each returns within the timeout; the first
    # `failures` shared calls fail, then the breaker is open.
    results = []
    worst = 0.0
    for i in range(12):
        d, took = timed(lim.limit, "rl:{u}:api")
        results.append(d)
        worst = max(worst, took)
        assert took < TIMEOUT_MS / 1000 + MARGIN_S, (i, took)
    print(f"\nslowest call while Redis was away: {worst * 1000:.1f} ms "
          f"(timeout {TIMEOUT_MS} ms)")
    m = rl.metrics()
    assert m["failures"] == 3 and m["trips"] == 1 and m["trips_failures"] == 1
    assert m["state"] == "open"
    assert all(d.source == "panic" for d in results)
    # panic limits: exactly PANIC grants for the key, never more
    assert [d.allowed for d in results] == [True] * PANIC + [False] * (12 - PANIC)
    assert all(d.limit == PANIC for d in results)
    assert all(d.retry_after_ms >= 1 for d in results if not d.allowed)
    # another key has its own panic budget
    assert sum(lim.limit("rl:{v}:api").allowed for _ in range(9)) == PANIC
    # the leased limiter spends what it holds (pre-debited), then panic limits
    ds = [timed(leased.limit, "rl:{u}:leased") for _ in range(held + 10)]
    assert all(took < TIMEOUT_MS / 1000 + MARGIN_S for _, took in ds)
    srcs = [d.source for d, _ in ds]
    assert srcs[:held] == ["local"] * held and set(srcs[held:]) == {"panic"}, srcs
    assert sum(d.allowed for d, _ in ds[held:]) == PANIC
    # while open, no call reaches Redis but the half-open probes (one per open_ms)
    m = rl.metrics()
    assert m["calls"] - calls_before == m["failures"]
    assert m["calls"] - calls_before <= 3 + m["probes_failed"] + 1

    resume()
    # a half-open probe succeeds: back on the shared limit, leases resume
    wait_until(lambda: lim.limit("rl:{u}:api").source == "module", timeout=30,
               what="breaker closed again")
    m = rl.metrics()
    assert m["state"] == "closed" and m["probes_ok"] == 1
    leases = m["leases"]

    def leased_again():
        d = leased.limit("rl:{w}:leased")
        return d.allowed and d.source in ("module", "local")

    wait_until(leased_again, timeout=30, what="leases resumed")
    wait_until(lambda: rl.metrics()["leases"] > leases, timeout=30, what="a new lease")
    return rl


def test_sigstop_then_sigcont(server):
    rl = outage_then_recovery(server, lambda: server.proc.send_signal(signal.SIGSTOP),
                              lambda: server.proc.send_signal(signal.SIGCONT))
    m = rl.metrics()
    assert m["trips"] == 1 and m["decisions_panic"] >= 12 + 9 + 10


def test_killed_then_restarted(server):
    rl = outage_then_recovery(server, server.kill9, server.start)
    # the restarted server is empty: the shared limit starts over there
    assert server.client().exists("rl:{u}:api") == 1
    m = rl.metrics()
    assert m["trips"] == 1 and m["decisions_panic"] >= 12 + 9 + 10


def test_busy_script_trips_the_latency_rule(server):
    rl = RateLimit(client(server.port, 5.0),
                   breaker=Breaker(failures=1000, latency_budget_ms=20, latency_period_ms=200,
                                   latency_window=16, open_ms=60_000))
    lim = rl.limiter(POLICY, panic=Panic(limit=PANIC))
    assert lim.limit("rl:{u}:api").source == "module"
    stop = threading.Event()
    # a busy loop of a fixed length (~50-100 ms here), not one that watches
    # TIME: Valkey (8.1, 9.1) answers TIME inside a script with the time it started
    busy = "local x = 0 for i = 1, 6000000 do x = x + i end return 1"

    def hog():
        c = client(server.port, 30.0)
        while not stop.is_set():
            c.eval(busy, 0)

    t = threading.Thread(target=hog)
    t.start()
    try:
        def tripped():
            lim.limit("rl:{u}:api")
            return rl.metrics()["state"] == "open"

        wait_until(tripped, timeout=60, interval=0, what="latency trip")
    finally:
        stop.set()
        t.join()
    m = rl.metrics()
    assert m["trips_latency"] == 1 and m["trips_failures"] == 0 and m["failures"] == 0
    d = lim.limit("rl:{u}:api")
    assert d.source == "panic" and d.limit == PANIC


@pytest.mark.parametrize("outage", ["sigstop", "kill"])
def test_async_outage_bounded_by_timeout(server, outage):
    if outage == "sigstop":
        stop = lambda: server.proc.send_signal(signal.SIGSTOP)    # noqa: E731
        resume = lambda: server.proc.send_signal(signal.SIGCONT)  # noqa: E731
    else:
        stop, resume = server.kill9, server.start

    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=TIMEOUT_MS, breaker=Breaker(failures=3, open_ms=300))
        lim = rl.limiter(POLICY, panic=Panic(limit=PANIC))
        leased = rl.leased(LEASED, batch=20, idle_ms=60_000, panic=Panic(limit=PANIC))
        assert (await lim.limit("rl:{u}:api")).source == "module"
        assert (await leased.limit("rl:{u}:leased")).source == "module"
        stop()
        try:
            ds = []
            for _ in range(10):
                t0 = time.monotonic()
                ds.append(await lim.limit("rl:{u}:api"))
                assert time.monotonic() - t0 < TIMEOUT_MS / 1000 + MARGIN_S
            assert [d.source for d in ds] == ["panic"] * 10
            assert sum(d.allowed for d in ds) == PANIC
            m = rl.metrics()
            assert m["trips"] == 1 and m["failures"] == 3 and m["state"] == "open"
            srcs = [(await leased.limit("rl:{u}:leased")).source for _ in range(25)]
            assert srcs == ["local"] * 19 + ["panic"] * 6
        finally:
            resume()
        for _ in range(3000):
            if (await lim.limit("rl:{u}:api")).source == "module":
                break
            await asyncio.sleep(0.01)
        m = rl.metrics()
        assert m["state"] == "closed" and m["probes_ok"] == 1
        # leases resume: a new key is leased from the shared limit again
        d = await leased.limit("rl:{w}:leased")
        assert d.allowed and d.source == "module" and rl.metrics()["leases"] == m["leases"] + 1
        await rl.client.aclose()

    asyncio.run(main())


def test_cluster_node_stalled(cluster):
    """A stalled cluster node: calls stay within the timeout, the breaker
    opens, panic limits decide; SIGCONT and the module decides again. A
    cluster client that would retry a timed-out call is refused."""
    from redis.cluster import RedisCluster
    from redis.crc import key_slot
    from support import cluster_client
    port = cluster.nodes[0].port
    with pytest.raises(ValueError, match="cluster_error_retry_attempts"):
        RateLimit(RedisCluster(host="127.0.0.1", port=port, socket_timeout=1))
    rl = RateLimit(cluster_client(port, TIMEOUT_MS / 1000),
                   breaker=Breaker(failures=3, open_ms=300))
    lim = rl.limiter(POLICY, panic=Panic(limit=PANIC))
    key = "rl:{c}:api"
    assert lim.limit(key).source == "module"
    victim = cluster.owner(key_slot(key.encode()))
    victim.proc.send_signal(signal.SIGSTOP)
    try:
        ds = []
        for _ in range(10):
            d, took = timed(lim.limit, key)
            ds.append(d)
            assert took < TIMEOUT_MS / 1000 + MARGIN_S, took
        assert [d.source for d in ds] == ["panic"] * 10
        assert sum(d.allowed for d in ds) == PANIC
        assert rl.metrics()["trips"] == 1
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: lim.limit(key).source == "module", timeout=30, what="breaker closed")


def _count_calls(rl, on_request_path):
    """Every Redis call the limiter makes, as (made on the request path,
    sent as the half-open probe): rl.call wrapped, the real call made."""
    seen = []
    real = rl.call

    def counted(mod_args, lua, probe=False, *a, **kw):
        seen.append((on_request_path(), probe))
        return real(mod_args, lua, probe, *a, **kw)

    rl.call = counted
    return seen


def _outage_decisions(decide, rl, probes):
    """Decisions on a few keys (every reservoir short: each one takes the
    slow path) until the worker has made `probes` failed probes; the
    slowest one's time."""
    worst, n = 0.0, 0
    end = time.monotonic() + 30
    while rl.metrics()["probes_failed"] < probes:
        assert time.monotonic() < end, "no probe failed in 30 s"
        d, took = decide(f"rl:{{k{n % 7}}}:leased")
        assert d.source == "panic" or n == 0, (n, d)   # the first one opens the breaker
        worst = max(worst, took)
        n += 1
    return worst, n


def test_leased_probes_from_the_worker_never_the_request(server):
    """Redis stopped, the breaker open and half-open: every half-open probe
    of the leased limiter is sent by its worker thread, none by a request
    (a request answers from the panic limits at once); after SIGCONT a
    worker probe closes the breaker and decisions come from Redis again.
    Node: the same test in clients/node/test/leased.test.js."""
    rl = RateLimit(client(server.port, TIMEOUT_MS / 1000),
                   breaker=Breaker(failures=1, open_ms=100))
    lim = rl.leased(LEASED, batch=1, low_water=0, idle_ms=60_000,
                    panic=Panic(limit=10**6))
    assert lim.limit("rl:{u}:leased").source == "module"
    seen = _count_calls(rl, lambda: threading.current_thread() is not lim.worker)
    # the worker sends one probe at a time and counts its failure before the
    # next: at each failure the breaker records, the probes the worker sent
    # and the failed probes counted must agree (read any other time, the
    # next probe may already be out: 4 sent, 3 failed)
    at_failure = []
    real_failure = rl.breaker.failure

    def failure(probe=False):
        real_failure(probe)
        at_failure.append(([p for req, p in seen if not req].count(True),
                           rl.metrics()["probes_failed"]))

    rl.breaker.failure = failure

    server.proc.send_signal(signal.SIGSTOP)
    try:
        worst, n = _outage_decisions(lambda k: timed(lim.limit, k), rl, 3)
        m = rl.metrics()
        on_path = [p for req, p in seen if req]
        by_worker = [p for req, p in seen if not req]
        print(f"\n{n} decisions while Redis was stopped, slowest {worst * 1000:.1f} ms; "
              f"calls on the request path {on_path}, by the worker {by_worker}; "
              f"(probes sent, failed probes counted) at each failure {at_failure}")
        # the one call on a request's path is the lease that opened the breaker
        assert on_path == [False] and m["trips"] == 1
        assert all(sent == counted for sent, counted in at_failure), at_failure
        assert by_worker.count(True) >= m["probes_failed"] >= 3
        assert worst < TIMEOUT_MS / 1000 + MARGIN_S
    finally:
        server.proc.send_signal(signal.SIGCONT)

    # back: a probe (the worker's) closes the breaker, Redis decides again
    wait_until(lambda: lim.limit("rl:{k1}:leased").source == "module", timeout=30,
               interval=0.005, what="a decision from Redis again")
    m = rl.metrics()
    assert m["state"] == "closed" and m["probes_ok"] == 1
    assert [p for req, p in seen if req and p] == []
    assert [p for req, p in seen if not req].count(True) == m["probes_failed"] + 1
    lim.close()


def test_async_leased_probes_from_a_task_never_the_request(server):
    """As test_leased_probes_from_the_worker_never_the_request, asyncio:
    the probe is a background task, never the request's own."""

    async def main():
        rl = AsyncRateLimit(redis.asyncio.Redis(host="127.0.0.1", port=server.port),
                            timeout_ms=TIMEOUT_MS, breaker=Breaker(failures=1, open_ms=100))
        lim = rl.leased(LEASED, batch=1, low_water=0, idle_ms=60_000,
                        panic=Panic(limit=10**6))
        assert (await lim.limit("rl:{u}:leased")).source == "module"
        request = asyncio.current_task()
        seen = _count_calls(rl, lambda: asyncio.current_task() is request)

        async def decide(k):
            t0 = time.monotonic()
            d = await lim.limit(k)
            await asyncio.sleep(0)          # the background tasks run
            return d, time.monotonic() - t0

        server.proc.send_signal(signal.SIGSTOP)
        try:
            worst, n, end = 0.0, 0, time.monotonic() + 30
            while rl.metrics()["probes_failed"] < 3:
                assert time.monotonic() < end, "no probe failed in 30 s"
                d, took = await decide(f"rl:{{k{n % 7}}}:leased")
                assert d.source == "panic" or n == 0, (n, d)
                worst = max(worst, took)
                n += 1
            m = rl.metrics()
            on_path = [p for req, p in seen if req]
            by_tasks = [p for req, p in seen if not req]
            assert on_path == [False] and m["trips"] == 1
            assert by_tasks.count(True) == m["probes_failed"] >= 3
            assert worst < TIMEOUT_MS / 1000 + MARGIN_S
        finally:
            server.proc.send_signal(signal.SIGCONT)
        end = time.monotonic() + 30
        while (await decide("rl:{k1}:leased"))[0].source != "module":
            assert time.monotonic() < end, "no decision from Redis in 30 s"
            await asyncio.sleep(0.005)
        m = rl.metrics()
        assert m["state"] == "closed" and m["probes_ok"] == 1
        assert [p for req, p in seen if req and p] == []
        assert [p for req, p in seen if not req].count(True) == m["probes_failed"] + 1
        await lim.close()
        await rl.client.aclose()

    asyncio.run(main())
