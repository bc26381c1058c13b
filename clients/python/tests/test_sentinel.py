"""Sentinel and strict mode on real processes: a primary, replicas and 3
sentinels (the REDIS_SERVER binary in sentinel mode). The primary is
SIGKILLed, the sentinels promote a replica, and decisions continue there;
strict mode grants only what a replica acknowledged (issue 25)."""
import asyncio
import glob
import os
import re
import signal
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel as RedisSentinel

from rltesting.proc import wait_until
from rltesting.replication import start_replica, wait_ack
from redis_ratelimit import Breaker, Panic, RateLimit, Strict, token_bucket
from redis_ratelimit.aio import AsyncRateLimit
from sentinels import SERVICE, Deployment
from support import client

LONG = 10**12
BUCKET = token_bucket("tb", 1000, 1, 10**9)    # never refills while a test runs (and in the Lua twin's range)
TIMEOUT_MS = 100                                # loaded CI machines: generous
# a sync call that reconnects asks the sentinels in turn, then connects:
# at most (1 + 3 sentinels + 1 connect) timeouts; async: one timeout
SYNC_BOUND = 5 * TIMEOUT_MS / 1000 + 0.25
ASYNC_BOUND = TIMEOUT_MS / 1000 + 0.25


def settled(primary):
    """After a full sync the primary streams to the replica (and counts it
    for WAIT) only from its first REPLCONF ACK, up to a second later."""
    c = primary.client()
    c.set("settle", 1)
    wait_ack(c)
    c.delete("settle")


# The failovers take seconds (the sentinels meet, then promote): only the
# newest redis-py line runs them (make test-clients-py runs it on every
# server); every line runs the refusal and strict-mode tests.
_LINES = [int(re.search(r"redis-py(\d+)", f).group(1)) for f in glob.glob(os.path.join(
    os.path.dirname(__file__), "..", "drivers", "redis-py*.txt"))]
newest_only = pytest.mark.skipif(
    bool(_LINES) and int(redis.__version__.split(".")[0]) < max(_LINES),
    reason="failover tests run on the newest redis-py line only")


@pytest.fixture
def deployment(server_factory):
    d = Deployment(server_factory)
    settled(d.primary)
    yield d
    d.close()


@pytest.fixture
def plain_deployment(server_factory):
    """The only replica has no module: after the failover, the Lua twins."""
    d = Deployment(server_factory, replica_module=(False,))
    settled(d.primary)
    yield d
    d.close()


def breaker():
    return Breaker(failures=2, open_ms=50)


def test_unbounded_sentinel_client_is_refused():
    # the primary's connections are bounded, the sentinels' are not
    s = RedisSentinel([("127.0.0.1", 1)], sentinel_kwargs={}, socket_timeout=0.1,
                      retry=Retry(NoBackoff(), 0))
    with pytest.raises(ValueError, match=r"sentinel client for 127.0.0.1:1.*sentinel_kwargs.*"
                                         r"socket_timeout.*from_sentinel"):
        RateLimit(s.master_for(SERVICE))
    if int(redis.__version__.split(".")[0]) >= 6:
        # redis-py 6+ retries with backoff by default: every sentinel client too
        s = RedisSentinel([("127.0.0.1", 1)], socket_timeout=0.1, retry=Retry(NoBackoff(), 0))
        with pytest.raises(ValueError, match=r"sentinel client.*retries"):
            RateLimit(s.master_for(SERVICE))
    b = {"socket_timeout": 0.1, "socket_connect_timeout": 0.1, "retry": Retry(NoBackoff(), 0)}
    s = RedisSentinel([("127.0.0.1", 1)], sentinel_kwargs=b, **b)
    RateLimit(s.master_for(SERVICE))          # bounded: accepted


def test_strict_timeout_must_fit_the_call():
    c = client(1, timeout=0.005)
    with pytest.raises(ValueError, match=r"Strict\(timeout_ms=...\).*5 ms"):
        RateLimit(c, strict=Strict(timeout_ms=5))
    assert RateLimit(c, strict=True).wait == (1, 4)
    assert RateLimit(c, strict=Strict(timeout_ms=1)).wait == (1, 1)
    with pytest.raises(ValueError, match="timeout_ms"):
        AsyncRateLimit(None, timeout_ms=1, strict=True)
    assert AsyncRateLimit(None, timeout_ms=5, strict=Strict(2, 3)).wait == (2, 3)


def _failover(d, decide, bound, want_source):
    """Grant 10, SIGKILL the primary, decide until the promoted replica
    answers with `want_source`. Every decision within `bound`; while no
    primary answers, decisions come from the panic limits."""
    for _ in range(10):
        assert decide().source == "module"
    wait_ack(d.primary.client())
    d.primary.kill9()
    sources = set()
    worst = 0.0
    deadline = time.monotonic() + 30
    while True:
        t0 = time.monotonic()
        dec = decide()
        worst = max(worst, time.monotonic() - t0)
        sources.add(dec.source)
        if dec.source == want_source:
            break
        assert dec.source == "panic", dec
        assert time.monotonic() < deadline, "no decision from the new primary"
    new = d.wait_promoted()
    assert worst <= bound, (worst, bound)
    assert "panic" in sources
    return dec, new


@newest_only
def test_sync_failover_module(deployment):
    rl = RateLimit.from_sentinel(deployment.addrs, SERVICE, timeout_ms=TIMEOUT_MS,
                                 breaker=breaker())
    lim = rl.limiter(BUCKET, panic=Panic(limit=5, window_ms=LONG))
    dec, new = _failover(deployment, lambda: lim.limit("k"), SYNC_BOUND, "module")
    # the replica had the 10 grants: the state carried over
    assert dec.allowed and dec.remaining <= 1000 - 11
    assert rl.metrics()["trips"] >= 1 and rl.backend == "module"


@newest_only
def test_async_failover_module(deployment):
    async def run():
        rl = AsyncRateLimit.from_sentinel(deployment.addrs, SERVICE, timeout_ms=TIMEOUT_MS,
                                          breaker=breaker())
        lim = rl.limiter(BUCKET, panic=Panic(limit=5, window_ms=LONG))
        loop = asyncio.get_running_loop()
        dec, _ = await loop.run_in_executor(
            None, _failover, deployment,
            lambda: asyncio.run_coroutine_threadsafe(lim.limit("k"), loop).result(),
            ASYNC_BOUND, "module")
        assert dec.allowed and dec.remaining <= 1000 - 11
        assert rl.metrics()["trips"] >= 1
    asyncio.run(run())


@newest_only
def test_failover_to_a_primary_without_the_module(plain_deployment):
    d = plain_deployment
    rl = RateLimit.from_sentinel(d.addrs, SERVICE, timeout_ms=TIMEOUT_MS, breaker=breaker())
    lim = rl.limiter(BUCKET, panic=Panic(limit=5, window_ms=LONG))
    dec, new = _failover(d, lambda: lim.limit("k"), SYNC_BOUND, "lua")
    # the new primary had no script cached: EVALSHA's NOSCRIPT was answered by EVAL
    assert rl.backend == "lua" and rl.metrics()["redetects"] == 1
    assert dec.allowed
    new.client().script_flush()
    assert lim.limit("k").source == "lua"


@newest_only
def test_sync_bound_with_the_sentinels_and_the_primary_stalled(deployment):
    """The sync bound the README states: a decision that must find the
    primary again asks the sentinels in turn, each bounded by the timeout,
    so it takes at most (2 + number of sentinels) x the timeout, also when
    every sentinel and the primary are stalled (SIGSTOP: connections are
    accepted by the kernel, nothing answers). The breaker never opens here,
    so every decision makes the call."""
    d = deployment
    rl = RateLimit.from_sentinel(d.addrs, SERVICE, timeout_ms=TIMEOUT_MS,
                                 breaker=Breaker(failures=10**6, latency_budget_ms=10**6))
    lim = rl.limiter(BUCKET, panic=Panic(limit=100, window_ms=LONG))
    assert lim.limit("k").source == "module"
    stalled = [d.primary.proc] + [s.proc for s in d.sentinels]
    times, sources = [], []

    def decide():
        for _ in range(4):
            t0 = time.monotonic()
            sources.append(lim.limit("k").source)
            times.append(time.monotonic() - t0)
    for p in stalled:
        p.send_signal(signal.SIGSTOP)
    try:
        t = threading.Thread(target=decide, daemon=True)
        t.start()
        t.join(30)
        hung = t.is_alive()
        m = rl.metrics()
    finally:
        for p in stalled:
            p.send_signal(signal.SIGCONT)
    t.join(30)
    assert not hung, f"a decision did not return within 30 s ({times})"
    bound = (2 + len(d.sentinels)) * TIMEOUT_MS / 1000
    assert max(times) <= bound + 0.25, (times, bound)
    assert sources == ["panic"] * 4, sources
    # every decision made the call and failed: none was skipped by the breaker
    assert m["failures"] == 4 and m["state"] == "closed", m
    # after the first timeout the connection is dropped: the later decisions
    # asked the stalled sentinels, each of them for a whole timeout
    assert max(times[1:]) >= len(d.sentinels) * TIMEOUT_MS / 1000, times


@pytest.fixture
def pair(server_factory, request):
    module = request.param == "module"
    # hz 100: WAIT's timeout is checked at the server's cron resolution
    # (1000/hz ms; 100 ms at the default hz 10)
    primary = server_factory(["--hz", "100"], module=module)
    if module:
        rep = start_replica(server_factory, primary)
    else:
        primary.client().config_set("repl-diskless-sync-delay", 0)
        rep = server_factory(["--replicaof", "127.0.0.1", str(primary.port)], module=False)
        wait_until(lambda: rep.client().info("replication")["master_link_status"] == "up",
                   what="replica link up")
    settled(primary)
    yield primary, rep, request.param
    if rep.alive():
        rep.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("pair", ["module", "lua"], indirect=True)
def test_strict_grants_only_what_a_replica_acknowledged(pair):
    primary, rep, backend = pair
    rl = RateLimit(client(primary.port, timeout=0.2), breaker=Breaker(failures=3, open_ms=50),
                   strict=Strict(replicas=1, timeout_ms=50))
    lim = rl.limiter(BUCKET, panic=Panic(limit=2, window_ms=LONG))
    for _ in range(3):
        d = lim.limit("k")
        assert d.allowed and d.source == backend
    assert lim.limit("k", dry_run=True).source == backend      # no WAIT: no write
    rep.proc.send_signal(signal.SIGSTOP)
    try:
        m0 = rl.metrics()
        shared = primary.client()
        for _ in range(6):
            t0 = time.monotonic()
            d = lim.limit("k")
            assert time.monotonic() - t0 <= 0.2 + 0.25
            # never a grant from the shared limit without a copy: panic decides
            assert d.source == "panic", d
        m = rl.metrics()
        # 3 sent, then the breaker opened: grants WAIT did not see copied
        # (on a loaded machine one may time out first: a failure too)
        assert m["failures"] - m0["failures"] == 3 and m["trips"] == 1
        assert m["unreplicated"] - m0["unreplicated"] >= 1
        # a refund is never waited for (a lost refund only denies more)
        # leases too: an unacknowledged lease puts nothing in a reservoir
        time.sleep(0.06)                     # the breaker half-opens after open_ms
        leased = rl.leased(BUCKET, batch=10)
        d = leased.limit("lease")
        assert d.source == "panic" and leased.stranded() == 0, d
        leased.close()
        assert int(shared.info("replication")["connected_slaves"]) == 1
    finally:
        rep.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: lim.limit("k").source == backend, what="strict grants after SIGCONT")
    assert rl.metrics()["state"] == "closed"
