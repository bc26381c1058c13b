"""The module and the Lua twins give the same Decisions for the same
sequence of calls: sync and asyncio, standalone and cluster.

Both backends run on the same servers (the module is loaded; the Lua
limiter is forced with backend="lua" and uses other keys). Each operation
goes to the module, then at once to the twin; units, limits, names and
parts must be equal, and times (retry/reset) may differ by no more than
the time between the two calls (measured), since the server clock moved."""
import asyncio

import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from support import Stopwatch, assert_same, client, cluster_client, key_of, sequence

from redis_ratelimit import AsyncRateLimit, RateLimit

N = 300


def run_sync(make_client, seed):
    m = RateLimit(make_client(), backend="module")
    lua = RateLimit(make_client(), backend="lua")
    assert m.detect() == "module" and lua.detect() == "lua"
    # RL.MULTI and REFUND are in the contract (docs/contract.md, "RL.MULTI", "Refunds"): both
    # backends must have them, and the sequences use them
    assert m.has_multi and lua.has_multi
    with_multi = with_refund = True
    lims = {}
    sw = Stopwatch()
    n = 0
    for policy, tag, method, kw in sequence(seed, N, with_multi, with_refund):
        if policy.name not in lims:
            lims[policy.name] = (m.limiter(policy), lua.limiter(policy))
        lm, ll = lims[policy.name]
        with sw:
            a = getattr(lm, method)(key_of("m", policy, tag), **kw)
            b = getattr(ll, method)(key_of("l", policy, tag), **kw)
        assert a.source == "module" and b.source == "lua"
        assert_same(a, b, int(sw.worst * 1000) * 2 + 2)
        n += 1
    assert m.metrics()["decisions_module"] + m.metrics()["refunds"] >= n - 1
    return with_multi, with_refund


async def run_async(make_client, seed):
    m = AsyncRateLimit(make_client(), backend="module", timeout_ms=5000)
    lua = AsyncRateLimit(make_client(), backend="lua", timeout_ms=5000)
    assert await m.detect() == "module" and await lua.detect() == "lua"
    assert m.has_multi and lua.has_multi
    with_multi = True
    sw = Stopwatch()
    lims = {}
    for policy, tag, method, kw in sequence(seed, N, with_multi, True):
        if policy.name not in lims:
            lims[policy.name] = (m.limiter(policy), lua.limiter(policy))
        lm, ll = lims[policy.name]
        with sw:
            a = await getattr(lm, method)(key_of("m", policy, tag), **kw)
            b = await getattr(ll, method)(key_of("l", policy, tag), **kw)
        assert a.source == "module" and b.source == "lua"
        assert_same(a, b, int(sw.worst * 1000) * 2 + 2)
    await m.client.aclose()
    await lua.client.aclose()
    return with_multi


@pytest.mark.parametrize("seed", [1, 2])
def test_standalone_sync(server, seed):
    run_sync(lambda: client(server.port), seed)


def test_standalone_async(server):
    asyncio.run(run_async(lambda: redis.asyncio.Redis(host="127.0.0.1", port=server.port), 3))


def test_cluster_sync_and_async(cluster):
    port = cluster.nodes[0].port
    run_sync(lambda: cluster_client(port), 4)
    asyncio.run(run_async(lambda: AsyncCluster(host="127.0.0.1", port=port), 5))
    # the keys went to more than one node: the calls were routed
    used = sum(1 for s in cluster.nodes if s.client().dbsize() > 0)
    assert used >= 2


def test_lua_backend_on_a_server_without_the_module(plain, server):
    """auto picks Lua where the module is absent; the answers match the module's."""
    rl_plain = RateLimit(client(plain.port))
    rl_mod = RateLimit(client(server.port))
    assert rl_plain.detect() == "lua" and rl_mod.detect() == "module"
    sw = Stopwatch()
    for policy, tag, method, kw in sequence(7, 200, False, False):
        with sw:
            a = getattr(rl_mod.limiter(policy), method)(key_of("k", policy, tag), **kw)
            b = getattr(rl_plain.limiter(policy), method)(key_of("k", policy, tag), **kw)
        assert_same(a, b, int(sw.worst * 1000) * 2 + 2)
    # the scripts were loaded once each (then EVALSHA)
    assert rl_plain.metrics()["calls"] == 200


def test_noscript_after_script_flush(plain):
    rl = RateLimit(client(plain.port))
    lim = rl.limiter(sequence(1, 1, False, False)[0][0])
    d1 = lim.limit("rl:{a}:x")
    plain.client().script_flush()
    d2 = lim.limit("rl:{a}:x")
    assert d1.source == d2.source == "lua"
    assert d2.remaining == d1.remaining - 1


def test_backend_is_detected_once(server, plain):
    """One COMMAND INFO per client, whatever the number of calls; the Lua
    scripts are sent whole once (NOSCRIPT), then run by EVALSHA."""
    from redis_ratelimit import UnsupportedError
    for srv, want in ((server, "module"), (plain, "lua")):
        srv.client().config_resetstat()
        rl = RateLimit(client(srv.port))
        lim = rl.limiter(sequence(9, 1, False, False)[0][0])
        for i in range(100):
            assert lim.limit(f"rl:{{d{i % 5}}}:x").source == want
        stats = srv.client().info("commandstats")
        assert stats["cmdstat_command|info"]["calls"] == 1, stats
        if want == "lua":
            assert stats["cmdstat_eval"]["calls"] == 1
            assert stats["cmdstat_evalsha"]["calls"] == 100
    with pytest.raises(UnsupportedError):
        RateLimit(client(plain.port), backend="module").detect()


def test_lua_where_command_is_not_permitted(server_factory):
    """Managed services often rename or forbid COMMAND: auto picks the Lua
    twins there (and backend="lua" never asks)."""
    srv = server_factory(["--rename-command", "COMMAND", ""], module=False)
    rl = RateLimit(client(srv.port))
    assert rl.detect() == "lua"
    d = rl.limiter(sequence(1, 1, False, False)[0][0]).limit("rl:{x}:y")
    assert d.allowed and d.source == "lua"
    srv.client().config_resetstat()
    forced = RateLimit(client(srv.port), backend="lua")
    assert forced.detect() == "lua" and forced.has_multi
    assert "cmdstat_command|info" not in srv.client().info("commandstats")
