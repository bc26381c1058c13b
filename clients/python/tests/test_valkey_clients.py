"""Issue 33: Valkey's own clients (valkey-py, GLIDE sync and asyncio) keep
the library's contract. The bound: with the server stopped (SIGSTOP), every
decision under two timeouts (stall_probe.BOUND_MS: no second wait), from
the panic limits, the breaker tripping after exactly its `failures`; after
SIGCONT the module decides again. An outage the client sees as a refused connection (killed,
restarted) counts the same way. Clients that could wait longer are refused
with a message naming the setting. Strict mode grants only what a replica
acknowledged. The kinds: valkey_drivers.py."""
import asyncio
import signal
import time

import pytest
import stall_probe
import valkey_drivers as vd
from rltesting.proc import wait_until
from rltesting.replication import start_replica
from test_sentinel import settled
from valkey_drivers import module_again, v

from redis_ratelimit import AsyncRateLimit, Breaker, Panic, RateLimit, Strict, token_bucket

pytestmark = pytest.mark.skipif(not vd.KINDS, reason="no Valkey client on PYTHONPATH "
                                "(make test-clients-py runs the valkey-py6 and glide2 lines)")
KINDS = vd.KINDS or ["none"]
BOUND_MS = stall_probe.BOUND_MS
TIMEOUT_MS = stall_probe.TIMEOUT_MS
KEY = stall_probe.KEY


async def stopped_run(kind, server, victims=None, key=KEY, cluster=False):
    """stall_probe's measurement on a client of `kind`: (slowest ms, decisions, metrics)."""
    rl, lim, closer = await vd.first_from_module(
        kind, server.port, TIMEOUT_MS, stall_probe.POLICY, key, cluster,
        {"breaker": stall_probe.breaker()}, panic=Panic(limit=5, window_ms=60_000))
    victims = victims or [server]
    for s in victims:
        s.proc.send_signal(signal.SIGSTOP)
    took, ds = [], []
    try:
        for _ in range(stall_probe.CALLS):
            t0 = time.monotonic()
            ds.append(await v(lim.limit(key)))
            took.append(time.monotonic() - t0)
        m = rl.metrics()
    finally:
        for s in victims:
            s.proc.send_signal(signal.SIGCONT)
    await module_again(lim, key)
    await closer()
    stopped_run.took = [round(t * 1000, 1) for t in took]    # for the failure message
    return max(took) * 1000, ds, m


@pytest.mark.parametrize("kind", KINDS)
def test_sigstop_slowest_decision_within_timeout(server, kind):
    worst, ds, m = asyncio.run(stopped_run(kind, server))
    print(f"\n{vd.version(kind)} {kind}: slowest {worst:.1f} ms")
    assert worst < BOUND_MS, stopped_run.took
    assert {d.source for d in ds} == {"panic"}, ds
    assert sum(d.allowed for d in ds) == 5, ds
    # the breaker counted the timeouts as failures (an outage, not a bug)
    assert m["failures"] == 3 and m["trips"] == 1, m


@pytest.mark.parametrize("kind", KINDS)
def test_killed_then_restarted(server, kind):
    """A refused connection (the client's ConnectionError, GLIDE's
    "connect failed") is an outage too: panic, then the module again."""
    async def main():
        rl, closer = await vd.make(kind, server.port, 200,
                                   breaker=Breaker(failures=3, open_ms=100))
        lim = rl.limiter(stall_probe.POLICY, panic=Panic(limit=5, window_ms=60_000))
        assert (await v(lim.limit(KEY))).source == "module"
        server.kill9()
        ds = []
        for _ in range(8):
            t0 = time.monotonic()
            ds.append(await v(lim.limit(KEY)))
            assert time.monotonic() - t0 <= 0.2 + 0.5
        assert {d.source for d in ds} == {"panic"}, ds
        assert rl.metrics()["trips"] == 1
        server.start()
        await module_again(lim, KEY)
        await closer()
    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_clients_that_could_wait_longer_are_refused(kind):
    """Each refusal names the setting (and the kind's own module)."""
    if kind == "valkey-py":
        import valkey
        from valkey.backoff import ExponentialBackoff
        from valkey.retry import Retry
        for kw, says in [({"retry_on_timeout": True}, "retry_on_timeout"),
                         ({"retry": Retry(ExponentialBackoff(), 3)}, "3 times, with backoff"),
                         ({"socket_connect_timeout": 1.0}, "socket_connect_timeout (1.0 s"),
                         ({"socket_timeout": None}, "no socket_timeout")]:
            kw = {"socket_timeout": 0.03, **kw}
            with pytest.raises(ValueError) as e:
                RateLimit(valkey.Valkey(host="127.0.0.1", port=1, **kw))
            assert says in str(e.value), e.value
            assert "from redis." not in str(e.value), e.value
        # the driver's default client is bounded as it is
        assert RateLimit(valkey.Valkey(host="127.0.0.1", port=1, socket_timeout=0.03)).timeout_s \
            == 0.03
    elif kind == "glide-sync":
        import glide_sync as g
        addrs = [g.NodeAddress("127.0.0.1", 1)]
        lazy = g.GlideClient.create(g.GlideClientConfiguration(addrs, request_timeout=30,
                                                               lazy_connect=True))
        with pytest.raises(ValueError) as e:
            RateLimit(lazy)
        assert "connection_timeout (2000 ms" in str(e.value) and "lazy_connect" in str(e.value)
        ok = g.GlideClient.create(g.GlideClientConfiguration(
            addrs, request_timeout=30, lazy_connect=True,
            advanced_config=g.AdvancedGlideClientConfiguration(connection_timeout=30)))
        assert RateLimit(ok).timeout_s == 0.03
        with pytest.raises(ValueError, match="use RateLimit"):
            AsyncRateLimit(ok)
        lazy.close()
        ok.close()
    elif kind == "glide-async":
        import glide as g

        async def main():
            c = await g.GlideClient.create(g.GlideClientConfiguration(
                [g.NodeAddress("127.0.0.1", 1)], lazy_connect=True))
            with pytest.raises(ValueError, match="use AsyncRateLimit"):
                RateLimit(c)
            # asyncio: bounded by AsyncRateLimit's timeout_ms whatever GLIDE's settings
            assert AsyncRateLimit(c, timeout_ms=30).timeout_s == 0.03
            await c.close()
        asyncio.run(main())
    else:
        pytest.skip("asyncio: every call is bounded by timeout_ms (asyncio.wait_for)")


@pytest.fixture
def pair(server_factory):
    primary = server_factory(["--hz", "100"])     # WAIT's timeout at 10 ms resolution
    rep = start_replica(server_factory, primary)
    settled(primary)
    yield primary, rep
    if rep.alive():
        rep.proc.send_signal(signal.SIGCONT)


@pytest.mark.parametrize("kind", KINDS)
def test_strict_grants_only_what_a_replica_acknowledged(pair, kind):
    """WAIT follows each grant on the client's connection (valkey-py: a
    pipeline; GLIDE: a non-atomic batch on its one multiplexed connection)."""
    primary, rep = pair
    policy = token_bucket("strict", 100, 1, 10**12)

    async def main():
        rl, lim, closer = await vd.first_from_module(
            kind, primary.port, 200, policy, "k", make_kw={
                "strict": Strict(1, 50), "breaker": Breaker(failures=3, open_ms=60_000)},
            panic=Panic(limit=2, window_ms=60_000))
        for _ in range(3):
            d = await v(lim.limit("k"))
            assert d.allowed and d.source == "module", d
        rep.proc.send_signal(signal.SIGSTOP)
        try:
            for _ in range(5):
                t0 = time.monotonic()
                d = await v(lim.limit("k"))
                assert time.monotonic() - t0 <= 0.2 + 0.25
                assert d.source == "panic", d       # never a grant without a copy
            m = rl.metrics()
            assert m["failures"] == 3 and m["trips"] == 1 and m["unreplicated"] >= 1, m
        finally:
            rep.proc.send_signal(signal.SIGCONT)
        await closer()
    asyncio.run(main())


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_are_classified_by_their_code(server, kind):
    """BUSY (a script running too long) is an outage: the panic limits
    decide and the breaker counts it; WRONGTYPE (a key of another type) is
    a bug to fix: RateLimitError, never a panic grant. GLIDE reports both as
    "CODE: text" (glide.translate keeps the code for core.is_outage)."""
    import threading

    from redis_ratelimit import RateLimitError
    admin = server.client()
    admin.config_set("busy-reply-threshold", 10)
    admin.set("rl:{s}:api", "a string")

    async def main():
        rl, lim, closer = await vd.first_from_module(
            kind, server.port, 500, stall_probe.POLICY, KEY, panic=Panic(limit=5))
        with pytest.raises(RateLimitError, match="WRONGTYPE"):
            await v(lim.limit("rl:{s}:api"))
        busy = threading.Thread(target=_run_forever, args=(server,), daemon=True)
        busy.start()
        wait_until(lambda: "BUSY" in _error_of(server), what="the script holding the server")
        try:
            d = await v(lim.limit(KEY))
            assert d.source == "panic", d
            assert rl.metrics()["failures"] == 1
        finally:
            admin.script_kill()
            busy.join(10)
        await module_again(lim, KEY)
        await closer()
    asyncio.run(main())


def _error_of(server):
    try:
        server.client().ping()
    except Exception as e:  # noqa: BLE001 - BUSY is what we wait for
        return str(e)
    return ""


def _run_forever(server):
    """A script that runs until SCRIPT KILL."""
    try:
        server.client().eval("while true do end", 0)
    except Exception:   # noqa: BLE001 - "Script killed by user"
        pass
