"""The Lua twins' REFUND and RL.MULTI (multi.lua), on a plain redis-server
without the module, against the reference models (integration/models.py):
refunds give back exactly and write only a change, RL.MULTI's random
sequences match the model, all-or-nothing and PARTIAL with weights,
concurrent calls grant exactly the tightest limit, and errors change
nothing. The other twin tests: test_lua_twins.py and
test_lua_twins_differential.py.
"""
import random

import pytest

from rltesting.clock import room
from rltesting.proc import wait_until
from models import MODELS, SlidingLog, ceil_div, multi, single
from twins import (
    ALGS, CMDS, MAX, MULTI_ERRORS, Twins, agree_multi, assert_between, dirty, err_of, fw_state,
    limit_args, now_us, random_limits, random_multi_opts, raw_reply, source, tb_state, timed,
)


def twin_state(c, alg, key):
    """A twin's key as the models' state."""
    if alg == "TOKENBUCKET":
        return tb_state(c, key)
    if alg == "SLIDINGLOG":
        entries = sorted((int(sc), int(m.split(b":")[1])) for m, sc in c.zrange(key, 0, -1, withscores=True)
                         if m != b"#")
        return entries or None
    if alg == "FIXEDWINDOW":
        return fw_state(c, key)
    h = c.hgetall(key)
    return tuple(int(h[k]) for k in (b"win", b"cur", b"prev")) if h else None


def shape(alg, state):
    """What of a state does not depend on the exact microsecond of a call:
    whole tokens; the units of each grant; the window and its counts."""
    if state is None:
        return None
    if alg == "TOKENBUCKET":
        return state[0]
    if alg == "SLIDINGLOG":
        return [u for _, u in state]
    return state


def dump_all(c, keys):
    return [(c.dump(k), c.pttl(k)) for k in keys]


@pytest.mark.parametrize("cmd", CMDS)
def test_refund_gives_back_and_writes_only_a_change(tw, cmd):
    """REFUND n on a fresh key creates nothing; after grants it gives back
    what was taken (never more), exactly as the model says; a refund that
    makes the limiter fresh deletes the key."""
    c = tw.c
    alg = cmd[3:]
    lim = [10, 1, 3_600_000] if cmd == "RL.TOKENBUCKET" else [10, 3_600_000]
    room(c, 3_600_000, 30_000)  # no hour's window ends among the calls
    model = MODELS[alg](*lim)
    before = dirty(c)
    assert tw(cmd, "k", *lim, "REFUND", 3) == [0, 10, 10, 0, 0]
    assert not c.exists("k") and dirty(c) == before
    for cost in (4, 3):
        tw(cmd, "k", *lim, "COST", cost)
    for n, given in ((2, 2), (1, 1), (100, 4)):
        state = twin_state(c, alg, "k")
        t0, (rep,), t1 = timed(c, lambda p: tw.send(p, cmd, "k", *lim, "REFUND", n))
        lo = single(model, state, t0, refund=n)
        hi = single(model, state, t1, refund=n)
        assert_between(rep, lo[0], hi[0])
        assert rep[0] == given and rep[2] == 10 - 7 + (2 + 1 + 4 if given == 4 else 2 + (n == 1))
        assert shape(alg, twin_state(c, alg, "k")) == shape(alg, lo[2])
        if rep[4]:
            assert 0 < c.pttl("k") <= rep[4]
    assert not c.exists("k")  # fresh again: deleted
    assert tw(cmd, "k", *lim, "REFUND", 1) == [0, 10, 10, 0, 0] and not c.exists("k")


def test_refund_token_bucket_keeps_its_fraction(tw):
    """tokens + n, capped at the capacity; the fraction of a token stays."""
    c = tw.c
    P = 3_600_000 * 1000
    now = now_us(c)
    c.hset("b", mapping={"tokens": 2, "frac": P // 3, "ts": now, "scale": P})
    rep = tw("RL.TOKENBUCKET", "b", 5, 1, 3_600_000, "REFUND", 2)
    st = tb_state(c, "b")
    assert rep[:4] == [2, 5, 4, 0] and st[0] == 4 and P // 3 <= st[1] < P // 3 + 10**5
    rep = tw("RL.TOKENBUCKET", "b", 5, 1, 3_600_000, "REFUND", 2)  # only one missing (and a bit)
    assert rep == [1, 5, 5, 0, 0] and not c.exists("b")


def test_refund_sliding_log_newest_first(tw):
    """Limit 10 filled by ten grants at distinct times; REFUND 3 takes back
    the three newest: three grants fit at once, the fourth waits exactly
    until the oldest grant leaves the window, and retry_after_ms says so."""
    c = tw.c
    W_ms = 60_000
    for _ in range(10):
        assert tw("RL.SLIDINGLOG", "l", 10, W_ms)[0] == 1
    entries = twin_state(c, "SLIDINGLOG", "l")
    assert len(entries) == 10  # distinct times
    assert tw("RL.SLIDINGLOG", "l", 10, W_ms, "REFUND", 3)[:3] == [3, 10, 3]
    assert twin_state(c, "SLIDINGLOG", "l") == entries[:7]
    assert c.zscore("l", "#") == -7
    for _ in range(3):
        assert tw("RL.SLIDINGLOG", "l", 10, W_ms)[0] == 1
    t0, (rep,), t1 = timed(c, lambda p: tw.send(p, "RL.SLIDINGLOG", "l", 10, W_ms))
    oldest = entries[0][0]
    assert rep[:3] == [0, 10, 0]
    assert ceil_div(oldest + W_ms * 1000 - t1, 1000) <= rep[3] <= ceil_div(oldest + W_ms * 1000 - t0, 1000)
    # a refund that still leaves no unit free (the limit was lowered): its
    # retry_after_ms is the wait for one unit, as the model says
    state = twin_state(c, "SLIDINGLOG", "l")
    t0, (rep,), t1 = timed(c, lambda p: tw.send(p, "RL.SLIDINGLOG", "l", 5, W_ms, "REFUND", 1))
    lo, hi = (single(SlidingLog(5, W_ms), state, t, refund=1)[0] for t in (t0, t1))
    assert_between(rep, lo, hi)
    assert rep[:3] == [1, 5, 0] and rep[3] > 0
    # a partial entry: REFUND 2 of a grant of 3 keeps 1 unit at its time
    assert tw("RL.SLIDINGLOG", "m", 10, W_ms, "COST", 3)[0] == 1
    (t, _), = twin_state(c, "SLIDINGLOG", "m")
    assert tw("RL.SLIDINGLOG", "m", 10, W_ms, "REFUND", 2)[:3] == [2, 10, 9]
    assert twin_state(c, "SLIDINGLOG", "m") == [(t, 1)] and c.zscore("m", "#") == -1


def test_refund_sliding_counter_never_below_zero(tw):
    """Off the current window first, then the previous; never below zero."""
    c = tw.c
    W = 3_600_000_000
    k = room(c, 3_600_000, 30_000) * 1000 // W  # no window begins among the calls
    c.hset("c", mapping={"win": k * W, "cur": 3, "prev": 4})
    rep = tw("RL.SLIDINGCOUNTER", "c", 10, 3_600_000, "REFUND", 5)
    assert rep[0] == 5 and twin_state(c, "SLIDINGCOUNTER", "c") == (k * W, 0, 2)
    assert tw("RL.SLIDINGCOUNTER", "c", 10, 3_600_000, "REFUND", 5)[:3] == [2, 10, 10]
    assert not c.exists("c")


@pytest.mark.parametrize("cmd", CMDS)
def test_refund_errors(tw, cmd):
    """An hour's window, started with 30 s of it left at least: the key
    must outlive the test (a fixed window of 1000 ms, aligned to the epoch,
    ended mid-test on a loaded CI machine)."""
    c = tw.c
    W = 3_600_000
    lim = [5, 1, W] if cmd == "RL.TOKENBUCKET" else [5, W]
    room(c, W, 30_000)
    tw(cmd, "k", *lim, "COST", 2)
    before = (dirty(c), c.dump("k"))
    for opts in (["REFUND", 1, "COST", 1], ["COST", 1, "REFUND", 1], ["REFUND", 1, "PARTIAL"],
                 ["DRYRUN", "REFUND", 1], ["REFUND", 1, "REFUND", 1], ["REFUND"],
                 ["COST", 1, "REFUND", 0], ["REFUND", 1, "COST", "x"]):
        assert err_of(tw, cmd, "k", *lim, *opts) == "syntax error", opts
    for bad in ("0", "-1", "x", str(2**53)):
        assert err_of(tw, cmd, "k", *lim, "REFUND", bad) == f"REFUND must be an integer between 1 and {MAX}"
    assert (dirty(c), c.dump("k")) == before


@pytest.mark.parametrize("mode", ["eval", "fcall"])
@pytest.mark.parametrize("seed", range(12))
def test_multi_random_sequences_match_the_model(plain, mode, seed):
    """1 to 4 limits of mixed algorithms and weights; COST, PARTIAL, DRYRUN,
    REFUND; now and then a single-limit call on one of the keys or a rule
    change. Every reply equals the model's (each limit evaluated on its own
    at the same instant, committed all or nothing), and the stored states
    are the model's."""
    c = plain
    tw = Twins(c, mode)
    rng = random.Random(1000 + seed)
    for attempt in range(3):
        limits = random_limits(rng, rng.randint(1, 4), big=seed >= 8)
        room(c, 3_600_000, 30_000)  # the counters' windows are whole hours
        keys = [f"{{s{seed}}}:{attempt}:{i}" for i in range(len(limits))]
        states = [None] * len(limits)
        D, t_first = 0, None
        for step in range(50):
            if rng.random() < 0.05:
                i = rng.randrange(len(limits))
                alg, params, w = limits[i]
                params = list(params)
                params[0] = rng.choice([1, 2, 5, 10, 60])  # a rule change: new limit
                limits[i] = (alg, params, w)
            if rng.random() < 0.15:  # a single-limit call on one key
                i = rng.randrange(len(limits))
                alg, params, _ = limits[i]
                opts, cost, partial, dryrun, refund = random_multi_opts(rng, [limits[i]])
                t0, (rep,), t1 = timed(c, lambda p: tw.send(p, "RL." + alg, keys[i], *params, *opts))
                want, _, new = single(MODELS[alg](*params), states[i], t0, cost, partial, dryrun, refund)
                ctx = (step, alg, params, opts, rep, want)
                assert rep[:3] == want[:3], ctx
                states[i] = new
            else:
                opts, cost, partial, dryrun, refund = random_multi_opts(rng, limits)
                args = limit_args(limits, rng) + opts
                t0, (rep,), t1 = timed(c, lambda p: tw.send(p, "RL.MULTI", keys, *args))
                D = max(D, t1 - t0)
                want, _, new = multi([(MODELS[a](*p), s, w) for (a, p, w), s in zip(limits, states)],
                                     t0, cost, partial, dryrun, refund)
                agree_multi(rep, want, D / 1000 + 1, (step, args, rep, want))
                states = new
            t_first = t_first or t0
            for (alg, _, _), key, st in zip(limits, keys, states):
                assert shape(alg, twin_state(c, alg, key)) == shape(alg, st), (step, alg, key)
        windows = {p[-1] for a, p, _ in limits if a == "SLIDINGCOUNTER"}
        if all(t_first // (w * 1000) == t1 // (w * 1000) for w in windows):
            break  # no counter window began during the sequence


def test_multi_one_limit_answers_as_the_single_script(tw):
    """RL.MULTI with one limit of weight 1 answers what the single command
    answers (elements 1-5; after a REFUND element 1 is n when anything was
    given back)."""
    c = tw.c
    rng = random.Random(77)
    for alg in ALGS:
        params = [5, 1, 3_600_000] if alg == "TOKENBUCKET" else [5, 3_600_000]
        D = 0
        for step in range(40):
            opts, *_, refund = random_multi_opts(rng, [(alg, params, 1)])

            def fn(p):
                tw.send(p, "RL." + alg, f"s:{alg}", *params, *opts)
                tw.send(p, "RL.MULTI", [f"m:{alg}"], alg, *params, *opts)

            t0, (rs, rm), t1 = timed(c, fn)
            D = max(D, t1 - t0)
            ctx = (alg, step, opts, rs, rm)
            assert rm[1:3] == rs[1:3] and rm[5] == 0 and rm[6][0][1:3] == rs[1:3], ctx
            assert rm[0] == (rs[0] if refund is None else refund * (rs[0] > 0)), ctx
            for i in (3, 4):
                assert rm[i] == rs[i] or (rm[i] > 0 and rs[i] > 0 and abs(rm[i] - rs[i]) <= D / 1000 + 1), ctx
            assert shape(alg, twin_state(c, alg, f"s:{alg}")) == shape(alg, twin_state(c, alg, f"m:{alg}")), ctx


def test_multi_all_or_nothing_short_and_long_window(tw):
    """5 per 200 ms and 20 per 12 s on two keys (the per-second + per-minute
    case, five times faster): 5 granted per short window; every denial
    leaves both keys byte-identical with their TTLs; after four short windows
    at that pace the long limit binds."""
    c = tw.c
    keys = ["rl:{u1}:s", "rl:{u1}:m"]
    limits = ["SLIDINGLOG", 5, 200, "SLIDINGLOG", 20, 12_000]
    granted = 0
    for rnd in range(5):
        for i in range(7):
            before = dump_all(c, keys)
            rep = tw("RL.MULTI", keys, *limits)
            if rep[0] == 1:
                granted += 1
                # in the last round both have as many left: the tie binds the first
                assert rep[5] == 0 and rep[2] == min(r[2] for r in rep[6])
                continue
            after = dump_all(c, keys)
            for (d, ttl), (d0, ttl0) in zip(after, before):
                if ttl0 > 20:  # (a key about to expire may be gone by now)
                    assert d == d0 and 0 < ttl <= ttl0, (before, after, rep)
            if granted < 20:
                assert rep[5] == 0 and 0 < rep[3] <= 200 and rep[6][1][0] == 0
            else:
                assert rep[5] == 1 and 10_000 < rep[3] <= 12_000 and rep[6][0][0] == 0
        assert granted == min(5 * (rnd + 1), 20)
        end = now_us(c)  # after this round's grants: wait until they left the short window
        wait_until(lambda: now_us(c) > end + 200_000, timeout=5, what="200 ms to pass")
    assert granted == 20 and c.zscore(keys[1], "#") == -20


def test_multi_partial_with_weights(tw):
    """Limits with 7 and 10 units left and weights 1 and 2: COST 8 PARTIAL
    takes 5 requests (5 and 10 units)."""
    c = tw.c
    room(c, 3_600_000, 30_000)  # the counter's hour does not turn among the calls
    tw("RL.SLIDINGCOUNTER", "{p}a", 10, 3_600_000, "COST", 3)
    tw("RL.SLIDINGLOG", "{p}b", 12, 3_600_000, "COST", 2)
    rep = tw("RL.MULTI", ["{p}a", "{p}b"], "SLIDINGCOUNTER", 10, 3_600_000, "SLIDINGLOG", 12, 3_600_000,
             "WEIGHT", 2, "COST", 8, "PARTIAL")
    assert rep[:3] == [5, 12, 0] and rep[5] == 1
    assert [r[:3] for r in rep[6]] == [[5, 10, 2], [10, 12, 0]]
    assert c.hget("{p}a", "cur") == b"8" and c.zscore("{p}b", "#") == -12


def test_multi_concurrent_calls_grant_exactly_the_tightest_limit(server_factory):
    """Many connections at once on (capacity 100, limit 150): exactly 100
    granted, and the 150-limit key holds exactly those 100."""
    import threading
    s = server_factory(module=False)
    c = s.client()
    sha = c.script_load(source("RL.MULTI"))
    args = ["TOKENBUCKET", 100, 1, 3_600_000, "SLIDINGLOG", 150, 3_600_000]
    counts = []

    def worker():
        cc = s.client()
        p = cc.pipeline(transaction=False)
        for _ in range(40):
            p.evalsha(sha, 2, "{c}b", "{c}l", *args)
        counts.append(sum(r[0] for r in p.execute()))
        cc.close()

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(counts) == 20 and sum(counts) == 100
    assert c.zscore("{c}l", "#") == -100 and int(c.hget("{c}b", "tokens")) == 0
    c.close()


def test_multi_errors_change_nothing(tw):
    c = tw.c
    # windows of an hour, 30 s of it left at least: every key outlives the
    # test, so no expiry moves dirty
    room(c, 3_600_000, 30_000)
    for k, alg, lim in (("a", "SLIDINGLOG", [5, 3_600_000]), ("b", "SLIDINGLOG", [5, 3_600_000]),
                        ("t", "TOKENBUCKET", [5, 1, 3_600_000]), ("c", "SLIDINGCOUNTER", [5, 3_600_000])):
        tw("RL." + alg, k, *lim)
    c.set("s", "x")
    keys = ["a", "b", "t", "c", "s"]
    before = (dirty(c), dump_all(c, keys))
    for args, ks, text in MULTI_ERRORS:
        e = err_of(tw, "RL.MULTI", ks, *args)
        assert e.startswith(text), (args, ks, e)
    # WRONGTYPE: a string, or another algorithm's key, anywhere in the call
    for ks, args in ((["a", "s"], ["SLIDINGLOG", 5, 1000] * 2),
                     (["a", "t"], ["SLIDINGLOG", 5, 1000, "SLIDINGLOG", 5, 1000]),
                     (["c", "a"], ["TOKENBUCKET", 5, 1, 1000, "SLIDINGLOG", 5, 1000]),
                     (["t", "a"], ["SLIDINGCOUNTER", 5, 1000, "SLIDINGLOG", 5, 1000, "REFUND", 1])):
        assert err_of(tw, "RL.MULTI", ks, *args).startswith("WRONGTYPE"), (ks, args)
    assert (dirty(c), [d for d, _ in dump_all(c, keys)]) == (before[0], [d for d, _ in before[1]])
    assert raw_reply(c.port, "EVALSHA", tw.sha["RL.MULTI"], 1, "a", "SLIDINGLOG", 5, 1000, "X") \
        == "-ERR syntax error"
