"""The Lua twin of RL.CONCURRENCY (lua/concurrency.lua, rl_concurrency in
lua/library.lua, the CONCURRENCY limit of multi.lua) against the module, on
one server: the same calls on two keys (m:* for the module, t:* for the
twin) in one pipeline bracketed by TIME (test_lua_twins_differential.py's
Pair), through EVALSHA and FCALL. allowed, limit and remaining must be
equal; retry_after_ms and reset_after_ms within the bracket's width. The
random sequences use leases of 10 minutes or more, so nothing lapses while
they run; the lapse test waits on the server's clock. Then the twin alone
on a plain server: the key's expiry, errors in the module's words, and a
twin's key refused by the other twins (WRONGTYPE).
"""
import random

import pytest

from rltesting.clock import time_ms, wait_past
from test_lua_twins_differential import Pair, module_and_twins
from twins import MAX, Twins, err_of

CMD = "RL.CONCURRENCY"
LONG = 600_000


@pytest.fixture(params=["eval", "fcall"])
def both(server_factory, request):
    c, tw = module_and_twins(server_factory, request.param)
    yield c, tw
    c.close()


def random_call(rng, limit, ids):
    rid = rng.choice(ids)
    x = rng.random()
    if x < 0.6:
        opts = []
        cost = rng.choice([0, 1, 1, 2, 3, limit, limit + 1, rng.randint(0, limit + 1)])
        if cost != 1 or rng.random() < 0.2:
            opts += [rng.choice(["COST", "cost"]), cost]
        if rng.random() < 0.3:
            opts.append(rng.choice(["PARTIAL", "partial"]))
        if rng.random() < 0.15:
            opts.append("DRYRUN")
        return [rng.choice(["ACQUIRE", "acquire"]), rid, *opts]
    if x < 0.85:
        return [rng.choice(["RELEASE", "Release"]), rid]
    return ["RENEW", rid]


@pytest.mark.parametrize("seed", range(4))
def test_random_sequences_agree_with_the_module(both, seed):
    c, tw = both
    rng = random.Random(f"cc-{seed}")
    limit = rng.choice([1, 3, 5, 10, 2**40, MAX])
    ids = [f"id{i}" for i in range(rng.choice([2, 4, 8]))] + ["", "\x00bin"]
    pair = Pair(c, tw, CMD, f"seq{seed}")
    leases = [LONG, LONG + 1, 2 * LONG, 3_600_000]
    for _ in range(150):
        pair.check(rng.choice([limit, limit, max(1, limit // 2)]), rng.choice(leases), *random_call(rng, limit, ids))


def test_errors_are_the_module_s(both):
    c, tw = both
    c.set("str", "x")
    cases = [
        [1, 1000, "ACQUIRE"], [0, 1000, "ACQUIRE", "a"], [1, 0, "ACQUIRE", "a"], [1, 2**53, "ACQUIRE", "a"],
        [1, 1000, "ACQUIRE", "a", "COST", -1], [1, 1000, "TAKE", "a"], [1, 1000, "ACQUIRE", "a", "COST"],
        [1, 1000, "ACQUIRE", "a", "REFUND", 1], [1, 1000, "ACQUIRE", "a", "REFUND", "x"],
        [1, 1000, "ACQUIRE", "a", "PARTIAL", "PARTIAL"], [1, 1000, "RELEASE", "a", "DRYRUN"],
        [1, 1000, "RENEW", "a", "b"], ["x", 0, "TAKE", "a"], [1, 1000, "ACQUIRE", "a", "FROMFIRST"],
        [1, 1000, "ACQUIRE", "a", "COST", "1.5"],
    ]
    for args in cases:
        m = err_of(c.execute_command, CMD, "m:e", *args)
        t = err_of(tw, CMD, "t:e", *args)
        assert m == t, (args, m, t)
    assert err_of(c.execute_command, CMD, "str", 1, 1000, "ACQUIRE", "a").startswith("WRONGTYPE")
    assert err_of(tw, CMD, "str", 1, 1000, "ACQUIRE", "a").startswith("WRONGTYPE")


def test_multi_with_a_concurrency_limit_agrees(both):
    c, tw = both
    rng = random.Random(46)
    for case in range(30):
        n = rng.choice([1, 2, 3])
        pos = rng.randrange(n)
        limits = []
        for j in range(n):
            if j == pos:
                limits += ["CONCURRENCY", rng.choice([1, 3, 10]), LONG, f"r{rng.randrange(3)}"]
            else:
                limits += rng.choice([["TOKENBUCKET", 5, 1, 3_600_000], ["SLIDINGLOG", 4, LONG],
                                      ["FIXEDWINDOW", 6, 2**40]])
            if rng.random() < 0.3:
                limits += ["WEIGHT", rng.choice([1, 2])]
        keys = [f"{{c{case}}}:{j}" for j in range(n)]
        for _ in range(12):
            rid = f"r{rng.randrange(3)}"
            lim = [rid if w.startswith("r") and len(w) == 2 else w for w in map(str, limits)]
            opts = rng.choice([[], [], ["COST", 2], ["PARTIAL", "COST", 3], ["DRYRUN"], ["REFUND", 1]])
            p = c.pipeline(transaction=False)
            p.time()
            p.execute_command("RL.MULTI", n, *[f"m{k}" for k in keys], *lim, *opts)
            tw.send(p, "RL.MULTI", [f"t{k}" for k in keys], *lim, *opts)
            p.time()
            t0, rm, rt, t1 = p.execute(raise_on_error=False)
            ctx = (lim, opts, rm, rt)
            assert rm[0] == rt[0] and rm[1:3] == rt[1:3] and rm[5] == rt[5], ctx
            tol = (time_ms(t1) - time_ms(t0)) + 1
            for a, b in zip(rm[6], rt[6]):
                assert a[:3] == b[:3], ctx
                for i in (3, 4):
                    assert a[i] == b[i] or (a[i] > 0 and b[i] > 0 and abs(a[i] - b[i]) <= tol), ctx


def test_lapsed_leases_free_their_units(both):
    """Both free a lease's units when it lapses, on the server's clock."""
    c, tw = both
    pair = Pair(c, tw, CMD, "lapse")
    t0, rm, rt, t1 = pair.call(1, 200, "ACQUIRE", "a")
    assert rm == rt == [1, 1, 0, 0, 200]
    _, rm, rt, _ = pair.call(1, LONG, "ACQUIRE", "b")
    assert rm[:3] == rt[:3] == [0, 1, 0]
    # Past both leases' ends (t1 + 200 ms; the keys live through that ms).
    wait_past(c, t1 // 1000 + 202)
    assert c.exists(pair.km) == 0 and c.exists(pair.kt) == 0
    _, rm, rt, _ = pair.call(1, LONG, "ACQUIRE", "b")
    assert rm == rt == [1, 1, 0, 0, LONG]
    _, rm, rt, _ = pair.call(1, LONG, "RENEW", "a")
    assert rm[:4] == rt[:4] == [0, 1, 0, -1]


def test_the_twin_alone(plain):
    tw = Twins(plain)
    assert tw(CMD, "k", 2, LONG, "ACQUIRE", "a") == [1, 2, 1, 0, LONG]
    # Its hash: the last write's instant and the leases.
    h = plain.hgetall("k")
    assert set(h) == {b"last", b"=a"} and h[b"=a"].startswith(b"1:")
    assert 0 < plain.pttl("k") <= LONG
    assert tw(CMD, "k", 2, LONG, "RELEASE", "a") == [1, 2, 2, 0, 0]
    assert plain.exists("k") == 0
    # The other twins refuse its key, and it refuses theirs.
    tw(CMD, "k", 2, LONG, "ACQUIRE", "a")
    for cmd, params in [("RL.TOKENBUCKET", [5, 1, 1000]), ("RL.SLIDINGCOUNTER", [5, 1000]),
                        ("RL.FIXEDWINDOW", [5, 1000]), ("RL.SLIDINGLOG", [5, 1000])]:
        assert err_of(tw, cmd, "k", *params).startswith("WRONGTYPE"), cmd
        tw(cmd, f"o:{cmd}", *params)
        assert err_of(tw, CMD, f"o:{cmd}", 2, LONG, "ACQUIRE", "a").startswith("WRONGTYPE"), cmd
    # Beyond the exact range of doubles: an error, nothing written.
    assert "exact range" in err_of(tw, CMD, "big", 1, MAX, "ACQUIRE", "a")
    assert plain.exists("big") == 0
