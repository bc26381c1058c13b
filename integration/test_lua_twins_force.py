"""COST n FORCE (issue 46, item 2): the module and its Lua twin given the
same sequences of debits, plain calls, DRYRUN and REFUND, on the same
server (test_lua_twins_differential.py's Pair: each pair of calls in one
pipeline bracketed by TIME). Periods and windows of an hour or a day, so
nothing refills or expires while a sequence runs; a sequence of an aligned
window that crossed a boundary runs again on new keys. Debts stay within
the twin's exact range (lua.md).
"""
import random

import pytest
import redis

from rltesting.clock import room
from test_lua_twins_differential import ALIGNED, HOUR, ROOM, SEQ_PARAMS, Pair, module_and_twins, random_opts
from twins import CMDS, agree_multi, limit_args, random_limits, random_multi_opts, timed


@pytest.fixture(params=["eval", "fcall"])
def pair_modes(server_factory, request):
    c, tw = module_and_twins(server_factory, request.param)
    yield c, tw
    c.close()


def debit_opts(rng, limit):
    cost = rng.choice([0, 1, 2, limit, limit + 2, 2 * limit + 3, rng.randint(0, 3 * limit + 3)])
    opts = [["COST", str(cost)], [rng.choice(["FORCE", "force"])]]
    if rng.random() < 0.2:
        opts.append(["DRYRUN"])
    rng.shuffle(opts)
    return [x for g in opts for x in g]


@pytest.mark.parametrize("cmd", CMDS)
@pytest.mark.parametrize("seed", range(8))
def test_differential_debit_sequences(pair_modes, cmd, seed):
    c, tw = pair_modes
    rng = random.Random(9000 + seed * 31 + CMDS.index(cmd))
    lim = rng.choice([1, 3, 10, 50])
    for attempt in range(3):
        params = SEQ_PARAMS[cmd](rng, lim)
        room(c, HOUR, ROOM)
        pair = Pair(c, tw, cmd, f"debit:{seed}:{attempt}")
        for i in range(50):
            x = rng.random()
            if x < 0.35:
                opts = debit_opts(rng, params[0])
            elif x < 0.5:
                opts = ["REFUND", rng.choice([1, 2, lim, rng.randint(1, 3 * lim + 3)])]
            else:
                opts = random_opts(rng, params[0])
            rm, rt = pair.check(*params, *opts)
            if "FORCE" in [str(o).upper() for o in opts] and not isinstance(rm, Exception):
                assert rm[0] == 1 and rm[2] >= 0, (opts, rm)
        if cmd not in ALIGNED:
            break
        w = params[-1] * 1000
        if pair.log[0][3] // w == pair.log[-1][4] // w:
            break  # no window boundary crossed: the comparison stands


@pytest.mark.parametrize("cmd", CMDS)
def test_debit_past_the_limit_then_denied(pair_modes, cmd):
    """7 of a limit of 5 with FORCE: granted, remaining 0, the next call
    denied by both with the same wait."""
    c, tw = pair_modes
    room(c, HOUR, ROOM)
    params = [5, 1, HOUR] if cmd == "RL.TOKENBUCKET" else [5, HOUR]
    pair = Pair(c, tw, cmd, "seven")
    rm, rt = pair.check(*params, "COST", 7, "FORCE")
    assert rm[:3] == [1, 5, 0] and rm[3] > 0, rm
    rm, rt = pair.check(*params)
    assert rm[:3] == [0, 5, 0] and rm[3] > 0, rm


@pytest.mark.parametrize("cmd", CMDS)
def test_force_errors_match(pair_modes, cmd):
    c, tw = pair_modes
    lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
    for opts in (["FORCE", "PARTIAL"], ["PARTIAL", "FORCE"], ["FORCE", "FORCE"], ["FORCE", "REFUND", "1"],
                 ["REFUND", "1", "FORCE"]):
        pair = Pair(c, tw, cmd, "err")
        _, rm, rt, _ = pair.call(*lim, *opts)
        assert isinstance(rm, redis.ResponseError) and isinstance(rt, redis.ResponseError), (opts, rm, rt)
        assert str(rm) == str(rt) == "syntax error", (opts, rm, rt)
    assert not c.keys("*")


@pytest.mark.parametrize("seed", range(8))
def test_differential_multi_debit_sequences(pair_modes, seed):
    """RL.MULTI sequences (1-4 mixed rate limits, WEIGHT) in which a third
    of the calls are debits (COST n FORCE, sometimes DRYRUN), mixed with
    takes, PARTIAL and REFUND: the module and multi.lua give the same seven
    elements."""
    c, tw = pair_modes
    rng = random.Random(12000 + seed)
    for attempt in range(3):
        limits = [lim for lim in random_limits(rng, 6) if lim[0] != "CONCURRENCY"][: rng.randint(1, 4)]
        room(c, HOUR, ROOM)
        km = [f"{{m{seed}}}:{attempt}:{i}" for i in range(len(limits))]
        kt = [f"{{t{seed}}}:{attempt}:{i}" for i in range(len(limits))]
        D, log = 0, []
        for step in range(40):
            if rng.random() < 0.35:
                top = max(p[0] // w for _, p, w in limits)
                cost = rng.choice([0, 1, 2, top, top + 3, rng.randint(0, 2 * top + 3)])
                opts = ["COST", cost, "FORCE"] + (["DRYRUN"] if rng.random() < 0.2 else [])
            else:
                opts = random_multi_opts(rng, limits)[0]
            args = limit_args(limits, rng) + opts

            def fn(p):
                p.execute_command("RL.MULTI", len(km), *km, *args)
                tw.send(p, "RL.MULTI", kt, *args)

            t0, (rm, rt), t1 = timed(c, fn)
            D = max(D, t1 - t0)
            log.append((t0, t1))
            ctx = (step, limits, args, rm, rt)
            assert not isinstance(rm, Exception) and not isinstance(rt, Exception), ctx
            agree_multi(rt, rm, D / 1000 + 1, ctx)
            if "FORCE" in args:
                assert rm[0] == 1, ctx
        windows = {p[-1] * 1000 for a, p, _ in limits if a in ("SLIDINGCOUNTER", "FIXEDWINDOW")}
        if all(log[0][0] // w == log[-1][1] // w for w in windows):
            break  # no aligned window began during the sequence


def test_multi_force_refusals_match(pair_modes):
    c, tw = pair_modes
    for args in (["TOKENBUCKET", 5, 1, HOUR, "CHECK", "FORCE"], ["SLIDINGLOG", 5, HOUR, "SHADOW", "FORCE"],
                 ["CONCURRENCY", 5, HOUR, "id", "FORCE"], ["FIXEDWINDOW", 5, HOUR, "FORCE", "PARTIAL"]):
        rm = rt = None
        try:
            c.execute_command("RL.MULTI", 1, "m:x", *args)
        except redis.ResponseError as e:
            rm = str(e)
        try:
            tw("RL.MULTI", ["t:x"], *args)
        except redis.ResponseError as e:
            rt = str(e)
        assert rm == rt == "syntax error", (args, rm, rt)
    assert not c.keys("*")


def test_twin_bucket_declines_a_debt_beyond_its_exact_range(pair_modes):
    """lua.md: the twin's bucket takes a debit only while a full refill from
    the debt stays below 2^53 us; past that it decides as without FORCE
    (denied), where the module, whose range is the contract's, takes it."""
    c, tw = pair_modes
    # 10^12 ms a token: a bucket of 5 refills in 5 * 10^15 us < 2^53.
    params = [5, 1, 10**12]
    assert tw("RL.TOKENBUCKET", "t:in", *params, "COST", 8, "FORCE")[:3] == [1, 5, 0]
    assert tw("RL.TOKENBUCKET", "t:out", *params, "COST", 10, "FORCE")[:3] == [0, 5, 5]
    assert c.execute_command("RL.TOKENBUCKET", "m:out", *params, "COST", 10, "FORCE")[:3] == [1, 5, 0]
