"""Issue 33, continued: on Valkey's own clients the Lua twins decide where
the module is missing (EVALSHA, then EVAL after NOSCRIPT), exactly as the
module does; leased limiters conserve units across instances and give them
back on close; on a cluster each call goes to the key's node, and a stopped
node (or every node) keeps the bound. The kinds: valkey_drivers.py."""
import asyncio

import pytest
import valkey_drivers as vd
from redis.crc import key_slot
from rltesting.cluster import tags_in_slots
from support import LONG, Stopwatch, assert_same, key_of, sequence
from test_valkey_clients import BOUND_MS, stopped_run
from valkey_drivers import v

from redis_ratelimit import RateLimit, all_of, sliding_log, token_bucket

pytestmark = pytest.mark.skipif(not vd.KINDS, reason="no Valkey client on PYTHONPATH "
                                "(make test-clients-py runs the valkey-py6 and glide2 lines)")
KINDS = vd.KINDS or ["none"]


@pytest.mark.parametrize("kind", KINDS)
def test_lua_twins_decide_as_the_module_does(server, plain, kind):
    """A server without the module: detection picks Lua; a random sequence
    (every policy, RL.MULTI, partial, dry runs, refunds) decides there as
    the module decides on a server that has it."""
    async def main():
        m, close_m = await vd.make(kind, server.port, 5000)
        lua, close_l = await vd.make(kind, plain.port, 5000)
        assert await v(m.detect()) == "module" and await v(lua.detect()) == "lua"
        assert lua.has_multi
        lims, sw = {}, Stopwatch()
        for policy, tag, method, kw in sequence(7, 120, True, True):
            if policy.name not in lims:
                lims[policy.name] = (m.limiter(policy), lua.limiter(policy))
            lm, ll = lims[policy.name]
            with sw:
                a = await v(getattr(lm, method)(key_of("k", policy, tag), **kw))
                b = await v(getattr(ll, method)(key_of("k", policy, tag), **kw))
            assert a.source == "module" and b.source == "lua", (a, b)
            assert_same(a, b, int(sw.worst * 1000) * 2 + 2)
        # NOSCRIPT after SCRIPT FLUSH: EVAL caches the script again
        plain.client().script_flush()
        lim = lua.limiter(token_bucket("flushed", 3, 1, LONG))
        assert [(await v(lim.limit("f"))).remaining for _ in range(3)] == [2, 1, 0]
        assert lua.metrics()["failures"] == 0
        await close_m()
        await close_l()
    asyncio.run(main())


@pytest.fixture(params=["module", "lua"])
def backend_server(request, server, plain):
    return request.param, (server if request.param == "module" else plain)


@pytest.mark.parametrize("kind", KINDS)
def test_leased_limiters_conserve_units(backend_server, kind):
    """Two instances lease from one shared limit of 100: 150 requests get
    exactly 100 grants between them, and units leased but unused go back on
    close (REFUND), so the shared limit then holds what nobody used."""
    backend, srv = backend_server
    policy = sliding_log("cons", 100, LONG)

    async def main():
        made = [await vd.make(kind, srv.port, 5000) for _ in range(2)]
        leased = [rl.leased(policy, batch=10, idle_ms=60_000) for rl, _ in made]
        granted = 0
        for i in range(150):
            d = await v(leased[i % 2].limit("u"))
            assert d.source in (backend, "local"), d
            granted += d.allowed
        assert granted == 100
        for lim in leased:
            await v(lim.close())
        # a second round: 30 used of a fresh key, the rest given back
        leased = [rl.leased(policy, batch=20, idle_ms=60_000) for rl, _ in made]
        for i in range(30):
            assert (await v(leased[i % 2].limit("w"))).allowed
        assert sum(lim.stranded() for lim in leased) == 10   # 2 x 20 leased, 30 used
        for lim in leased:
            await v(lim.close())
        d = await v(made[0][0].limiter(policy).limit("w", dry_run=True))
        # 70 left: a dry run reports what would remain after it
        assert d.remaining == 69 and d.source == backend, d
        for _, closer in made:
            await closer()
    asyncio.run(main())


def calls_on(node, command="rl.tokenbucket", field="calls"):
    stats = node.client().info("commandstats")
    return next((v.get(field, 0) for k, v in stats.items()
                 if k.lower() == f"cmdstat_{command}"), 0)


@pytest.mark.parametrize("kind", KINDS)
def test_cluster_routing_and_bound(cluster, kind):
    """Each key's call lands on the node that holds its slot; then its
    owner stopped, and every node stopped: each decision within the bound."""
    port = cluster.nodes[0].port
    if kind == "valkey-py":     # the driver's default cluster client retries 3 times
        import valkey.cluster
        with pytest.raises(ValueError, match="cluster_error_retry_attempts") as e:
            RateLimit(valkey.cluster.ValkeyCluster(host="127.0.0.1", port=port,
                                                   socket_timeout=0.03))
        assert "RateLimit refuses this ValkeyCluster client" in str(e.value), e.value

    async def routed():
        rl, closer = await vd.make(kind, port, 5000, cluster=True)
        lim = rl.limiter(token_bucket("r", 100, 1, LONG))
        multi = rl.limiter(all_of(token_bucket("a", 100, 1, LONG), sliding_log("b", 50, LONG)))
        for s in cluster.nodes:
            s.client().config_resetstat()
        # one key in each node's first slots
        keys = []
        for lo, hi, _ in sorted(cluster._slot_map(cluster.nodes[0].client())):
            keys.append(f"rl:{{{tags_in_slots(lo, hi, 1)[0]}}}:r")
        for k in keys:
            for n in range(3):
                d = await v(lim.limit(k))
                assert d.source == "module" and d.remaining == 99 - n, d
            d = await v(multi.limit(k))         # RL.MULTI: its keys after numkeys
            assert d.source == "module" and d.remaining == 49, d
        for s in cluster.nodes:
            owned = sum(cluster.owner(key_slot(k.encode())) is s for k in keys)
            assert calls_on(s) == 3 * owned, (s.port, calls_on(s), owned)
            assert calls_on(s, "rl.multi") == owned, (s.port, owned)
            # straight to the owner: never a MOVED to follow
            for c in ("rl.tokenbucket", "rl.multi"):
                assert calls_on(s, c, "rejected_calls") == 0, (s.port, c)
        await closer()
    asyncio.run(routed())
    key = "rl:{c}:api"
    owner = cluster.owner(key_slot(key.encode()))
    for stopped, victims in (("owner", [owner]), ("every node", cluster.nodes)):
        worst, ds, m = asyncio.run(stopped_run(kind, cluster.nodes[0], victims, key, True))
        print(f"\n{vd.version(kind)} {kind} cluster, {stopped} stopped: slowest {worst:.1f} ms "
              f"{stopped_run.took}")
        assert worst < BOUND_MS, (stopped, stopped_run.took)
        assert {d.source for d in ds} == {"panic"}, ds
        assert m["trips"] == 1, m


