"""Differential: the module command and its Lua twin on the same server, on
two different keys, given the same call sequence. Each pair goes out in one
pipeline bracketed by two TIME calls:

    TIME -> T0, RL.X key_m ..., EVALSHA twin key_t ..., TIME -> T1

The server runs them in that order, so both calls read a clock within
[T0, T1]. Every state-changing event of the twin happens at most
D = max(T1 - T0 over the sequence so far) after the module's, so any time
the two replies compute (retry_after_ms, reset_after_ms) differ by less
than D/1000 + 1 ms (the +1 is the rounding up to whole ms). allowed, limit
and remaining must be equal: the sequences use periods and windows long
enough that nothing refills or expires while they run, and the tests that
do let time pass check exact equality only where the brackets prove that
no token, window or expiry boundary can fall between the two calls.

The twins on their own: test_lua_twins.py and test_lua_twins_multi.py.
"""
import random

import pytest
import redis

from rltesting.clock import room
from rltesting.proc import wait_until
from models import FixedWindow, ceil_div, sc_model, single
from twins import (
    ARG_ERRORS, CMDS, MULTI_ERRORS, Twins, agree_multi, limit_args, now_us, random_limits,
    random_multi_opts, raw_reply, tb_state, timed,
)

HOUR = 3_600_000


def module_and_twins(server_factory, mode):
    s = server_factory()  # with the module
    c = s.client()
    return c, Twins(c, mode)


@pytest.fixture
def both(server_factory):
    """The module and the scripts (EVALSHA) on one server."""
    c, tw = module_and_twins(server_factory, "eval")
    yield c, tw
    c.close()


@pytest.fixture(params=["eval", "fcall"])
def both_modes(server_factory, request):
    """The module and the scripts, through EVALSHA and through FCALL."""
    c, tw = module_and_twins(server_factory, request.param)
    yield c, tw
    c.close()


class Pair:
    """Sends the same call to the module (key m:*) and the twin (key t:*)."""

    def __init__(self, c, tw, cmd, name):
        self.c, self.tw, self.cmd = c, tw, cmd
        self.km, self.kt = f"m:{name}", f"t:{name}"
        self.D = 0  # the widest [T0, T1] bracket so far, us
        # A token bucket whose period grows from P to P' rescales its
        # fraction of a token: the twin's lag behind the module (a few us of
        # refill) then takes P'/P times as long to refill. The product of
        # those ratios stretches the time tolerance.
        self.stretch = 1.0
        self.log = []

    def call(self, *args):
        def fn(p):
            p.execute_command(self.cmd, self.km, *args)
            self.tw.send(p, self.cmd, self.kt, *args)

        t0, (rm, rt), t1 = timed(self.c, fn)
        self.D = max(self.D, t1 - t0)
        self.log.append((args, rm, rt, t0, t1))
        return t0, rm, rt, t1

    def tol(self):
        """How far two waits (ms) may differ: D, stretched, and the rounding."""
        return self.D * self.stretch / 1000 + 1

    def agree(self, rm, rt, exact=True):
        ctx = self.log[-1:]
        if isinstance(rm, Exception) or isinstance(rt, Exception):
            assert isinstance(rm, Exception) and isinstance(rt, Exception), ctx
            return
        tol = self.tol()
        if exact:
            assert rm[:3] == rt[:3], ctx
        else:
            assert rm[1] == rt[1], ctx
        for i in (3, 4):
            if exact and (rm[i] <= 0 or rt[i] <= 0):
                assert rm[i] == rt[i], (i, ctx)
            elif rm[i] >= 0 and rt[i] >= 0:
                assert abs(rm[i] - rt[i]) <= tol, (i, tol, ctx)
            else:
                assert rm[i] == rt[i], (i, ctx)

    def check(self, *args):
        t0, rm, rt, t1 = self.call(*args)
        self.agree(rm, rt)
        return rm, rt


def random_opts(rng, limit):
    cost = rng.choice([0, 1, 1, 1, 2, 3, limit, limit + 1, rng.randint(0, limit + 2),
                       max(1, limit // 3)])
    groups = []
    if cost != 1 or rng.random() < 0.3:
        groups.append([rng.choice(["COST", "cost", "Cost"]), str(cost)])
    if rng.random() < 0.3:
        groups.append([rng.choice(["PARTIAL", "partial"])])
    if rng.random() < 0.2:
        groups.append([rng.choice(["DRYRUN", "dryRun"])])
    rng.shuffle(groups)
    return [x for g in groups for x in g]


# Periods and windows long enough that nothing refills or expires while a
# sequence runs (a token every minute or slower: < 1 token in the test).
SEQ_PARAMS = {
    "RL.TOKENBUCKET": lambda rng, lim: [lim, rng.choice([1, 2]), rng.choice([3_600_000, 86_400_000])]
    if lim <= 100 else [lim, 1, 60_000],
    "RL.SLIDINGLOG": lambda rng, lim: [lim, rng.choice([3_600_000, 86_400_000])],
    "RL.SLIDINGCOUNTER": lambda rng, lim: [lim, rng.choice([3_600_000, 86_400_000])],
    "RL.FIXEDWINDOW": lambda rng, lim: [lim, rng.choice([3_600_000, 86_400_000])],
}
# The windowed commands whose windows are aligned on the clock: a sequence
# starts with 30 s of the hour left (rltesting.clock.room; every window of
# the sequences is a whole number of hours, so their boundaries are hours'),
# and one that crossed a boundary all the same is run again with new keys.
ALIGNED = ("RL.SLIDINGCOUNTER", "RL.FIXEDWINDOW")
ROOM = 30_000


@pytest.mark.parametrize("cmd", CMDS)
@pytest.mark.parametrize("seed", range(16))
def test_differential_random_sequences(both_modes, cmd, seed):
    c, tw = both_modes
    rng = random.Random(seed * 31 + CMDS.index(cmd))
    lim = rng.choice([1, 3, 10, 50, 10**8 if cmd == "RL.TOKENBUCKET" else 10**15])
    params = SEQ_PARAMS[cmd](rng, lim)
    for attempt in range(3):
        room(c, HOUR, ROOM)
        pair = Pair(c, tw, cmd, f"{seed}:{attempt}")
        windows = {params[-1]}
        for i in range(60):
            if rng.random() < 0.05 and lim < 10**8:
                params[0] = rng.choice([1, 2, 5, 10, 60])  # a rule change: new limit
            if rng.random() < 0.04 and lim < 10**8:
                # ... or a new period / window (still long: nothing refills)
                new = rng.choice([3_600_000, 7_200_000, 86_400_000, 90_000_000])
                if cmd == "RL.TOKENBUCKET":
                    pair.stretch *= max(1.0, new / params[-1])
                params[-1] = new
                windows.add(params[-1])
            pair.check(*params, *random_opts(rng, params[0]))
        if cmd not in ALIGNED:
            break
        t_first, t_last = pair.log[0][3], pair.log[-1][4]
        if all(t_first // (w * 1000) == t_last // (w * 1000) for w in windows):
            break  # no window boundary crossed: the comparison stands
        # a fixed window began during the sequence: rerun with new keys


def test_differential_errors_and_wrongtype(both_modes):
    c, tw = both_modes
    cases = []
    for cmd in CMDS:
        lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
        cases += [(cmd, lim[:-1], None), (cmd, lim + ["FOO"], "syntax error"),
                  (cmd, lim + ["COST"], "syntax error"), (cmd, lim + ["DRYRUN", "dryrun"], "syntax error"),
                  (cmd, lim + ["COST", "1", "PARTIAL", "COST", "2"], "syntax error"),
                  (cmd, lim + ["COST", "-1"], "cost"), (cmd, lim + ["COST", "x"], "cost")]
        cases += [(cmd, a, arg) for a, arg in ARG_ERRORS[cmd] if arg in ("capacity", "rate", "period_ms", "limit", "window_ms")]
    for cmd, args, what in cases:
        pair = Pair(c, tw, cmd, "err")
        _, rm, rt, _ = pair.call(*args)
        assert isinstance(rm, redis.ResponseError) and isinstance(rt, redis.ResponseError), (cmd, args, rm, rt)
        em, et = str(rm), str(rt)
        # the same text, word for word
        assert em == et, (cmd, args, em, et)
        if what == "syntax error":
            assert em == "syntax error"
        elif what is not None:
            assert em.lower().startswith(what + " must be an integer between"), (cmd, args, em)
        # and the same error code
        assert raw_reply(c.connection_pool.connection_kwargs["port"], cmd, "k", *args).startswith("-ERR ")
    assert not c.keys("*")
    # each refuses the other's keys (and strings) with WRONGTYPE (hour-long
    # limits: no key may expire, nor a fixed window end, during the loop)
    c.set("s", "x")
    for cmd in CMDS:
        lim = [5, 1, HOUR] if cmd == "RL.TOKENBUCKET" else [5, HOUR]
        c.execute_command(cmd, f"m:{cmd}", *lim)
        tw(cmd, f"t:{cmd}", *lim)
    for cmd in CMDS:
        lim = [5, 1, HOUR] if cmd == "RL.TOKENBUCKET" else [5, HOUR]
        for other in CMDS:
            with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
                tw(cmd, f"m:{other}", *lim)
            with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
                c.execute_command(cmd, f"t:{other}", *lim)
        for do in (lambda: tw(cmd, "s", *lim), lambda: c.execute_command(cmd, "s", *lim)):
            with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
                do()


def test_differential_token_bucket_refill(both):
    """A fast bucket (a token every 50 ms) drained, then watched while it
    refills. The twin's state is the module's shifted later by at most D, so
    the module's whole tokens at its call equal some twin token count over
    [T0, T1 + D]; where the twin's floor is constant over that span, the
    replies must agree exactly."""
    c, tw = both
    C, rate, period = 5, 1, 50
    P = period * 1000
    pair = Pair(c, tw, "RL.TOKENBUCKET", "refill")
    for _ in range(C):
        pair.check(C, rate, period)
    state = tb_state(c, pair.kt)
    exact = 0
    deadline_us = state[2] + 6 * period * 1000
    while True:
        t0, rm, rt, t1 = pair.call(C, rate, period, "COST", 2, "DRYRUN")

        def tokens(x):  # the twin's whole tokens at time x
            return min(C, (state[0] * P + state[1] + rate * max(0, x - state[2])) // P)

        if tokens(t0) == tokens(t1 + pair.D):
            pair.agree(rm, rt)
            exact += 1
        elif rm[0] != rt[0]:
            # The two straddle the boundary of the 2nd token: one is
            # granted, one denied. The granted reply's reset_after counts
            # the 2 tokens it would take, 2 periods more than the other's.
            g, d = (rm, rt) if rm[0] else (rt, rm)
            tol, ctx = pair.tol(), pair.log[-1:]
            assert g[1:4] == [C, 0, 0] and d[1:3] == [C, 1] and 0 < d[3] <= tol, ctx
            assert abs(g[4] - 2 * period - d[4]) <= tol, ctx
        else:
            pair.agree(rm, rt, exact=False)
            assert abs(rm[2] - rt[2]) <= 1
        if t0 > deadline_us:
            break
        wait_until(lambda: now_us(c) > t1 + 7_000, timeout=5, what="7 ms to pass")
    assert rm[:3] == rt[:3] == [1, C, C - 2] and exact > 0


def test_differential_sliding_log_expiry(both):
    """Two bursts of grants 400 ms apart in a 1 s window, compared while the
    first burst expires and then the second. An entry's in-window status is
    certain for both when its bracket [T0_j, T1_j] lies entirely before or
    after now - W for every now in the query's bracket; then the replies
    must agree exactly."""
    c, tw = both
    W_ms = 1000
    W = W_ms * 1000
    pair = Pair(c, tw, "RL.SLIDINGLOG", "expiry")
    grants = []  # brackets of the grant pairs
    for _ in range(2):
        pair.check(6, W_ms, "COST", 2)
        grants.append(pair.log[-1][3:])
    first_end = pair.log[-1][4]
    wait_until(lambda: now_us(c) > first_end + 400_000, timeout=5, what="400 ms to pass")
    for _ in range(2):
        pair.check(6, W_ms)
        grants.append(pair.log[-1][3:])
    exact = 0
    end = pair.log[-1][4] + W + 50_000
    while True:
        t0, rm, rt, t1 = pair.call(6, W_ms, "COST", 3, "DRYRUN")
        certain = all(g1 <= t0 - W or g0 > t1 - W for g0, g1 in grants)
        pair.agree(rm, rt, exact=certain)
        exact += certain
        if t0 > end:
            break
        wait_until(lambda: now_us(c) > t1 + 20_000, timeout=5, what="20 ms to pass")
    # all expired: both fresh (a DRYRUN answers as the grant would: reset W)
    assert rm == rt == [1, 6, 3, 0, W_ms] and exact > 0


def test_differential_sliding_counter_previous_window(both):
    """Fill a 1 s window, then compare while its count fades as the previous
    window. Both keys hold the same (window, cur, prev) when the fill pairs
    fell inside one window; the weight ceil(prev*(W-e)/W) is the same for
    both calls when it is constant over the query's bracket."""
    c, tw = both
    W_ms, limit = 1000, 10
    W = W_ms * 1000
    for attempt in range(5):
        # start early in a window so the fill stays inside it
        wait_until(lambda: now_us(c) % W < W // 4, timeout=5, what="a window to begin")
        pair = Pair(c, tw, "RL.SLIDINGCOUNTER", f"prev:{attempt}")
        for cost in (4, 3, 3):
            pair.check(limit, W_ms, "COST", cost)
        k = pair.log[0][3] // W
        if pair.log[-1][4] // W == k:
            break
    else:
        pytest.fail("could not fill a window within one window")
    state = (k * W, 10, 0)
    exact = 0

    def one_side(r, t0, t1):
        """A weight step or a window boundary fell inside [t0, t1]: each
        call ran on one side of it (steps are 100 ms apart), on the state
        both keys hold, so its reply is the model's on that side: exact in
        allowed, limit and remaining, its waits within the bracket. (The
        waits jump at a boundary: a reset of 1,001 ms before it, 2,000 after.)"""
        tol = pair.tol()
        sides = [sc_model(state, limit, W_ms, 2, False, x) for x in (t0, t1)]
        assert any(r[:3] == m[:3] and all(abs(r[i] - m[i]) <= tol for i in (3, 4)) for m in sides), \
            (r, sides, pair.log[-1:])

    while True:
        t0, rm, rt, t1 = pair.call(limit, W_ms, "COST", 2, "DRYRUN")
        if t0 // W == k and t1 // W == k:
            pair.agree(rm, rt)  # still the filled window: exact
            exact += 1
        elif t0 // W == k + 1 and t1 // W == k + 1 and \
                ceil_div(10 * (W - (t0 - (k + 1) * W)), W) == ceil_div(10 * (W - (t1 - (k + 1) * W)), W):
            pair.agree(rm, rt)  # one weight over the bracket: exact
            exact += 1
            assert rm[:3] == sc_model(state, limit, W_ms, 2, False, t0)[:3]
        elif t0 // W >= k + 2:
            pair.agree(rm, rt)
            break
        else:  # the pair straddled a weight step or a window boundary
            one_side(rm, t0, t1)
            one_side(rt, t0, t1)
        wait_until(lambda: now_us(c) > t1 + 20_000, timeout=5, what="20 ms to pass")
    # both windows aged out: fresh (reset is that of the grant the DRYRUN describes)
    assert rm[:4] == rt[:4] == [1, limit, limit - 2, 0] and exact > 1


# --------------------------------------------------------------------------
# Differential: REFUND and RL.MULTI, module vs twin on the same server
# --------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", CMDS)
@pytest.mark.parametrize("seed", range(8))
def test_differential_refund_sequences(both_modes, cmd, seed):
    """Random single-command sequences in which a quarter of the calls are
    REFUND n: the same replies from the module and the twin."""
    c, tw = both_modes
    rng = random.Random(5000 + seed * 31 + CMDS.index(cmd))
    lim = rng.choice([1, 3, 10, 50])
    for attempt in range(3):
        params = SEQ_PARAMS[cmd](rng, lim)
        room(c, HOUR, ROOM)
        pair = Pair(c, tw, cmd, f"refund:{seed}:{attempt}")
        for i in range(50):
            if rng.random() < 0.25:
                opts = ["REFUND", rng.choice([1, 2, lim, rng.randint(1, 2 * lim + 2)])]
            else:
                opts = random_opts(rng, params[0])
            pair.check(*params, *opts)
        if cmd not in ALIGNED:
            break
        w = params[-1] * 1000
        if pair.log[0][3] // w == pair.log[-1][4] // w:
            break  # no window boundary crossed: the comparison stands


@pytest.mark.parametrize("seed", range(12))
def test_differential_multi_sequences(both_modes, seed):
    """Random RL.MULTI sequences (1-4 mixed limits, WEIGHT, COST, PARTIAL,
    DRYRUN, REFUND, single calls and rule changes on the same keys): the
    module and multi.lua give the same seven elements."""
    c, tw = both_modes
    rng = random.Random(9000 + seed)
    for attempt in range(3):
        limits = random_limits(rng, rng.randint(1, 4), big=seed >= 8)
        room(c, HOUR, ROOM)
        km = [f"{{m{seed}}}:{attempt}:{i}" for i in range(len(limits))]
        kt = [f"{{t{seed}}}:{attempt}:{i}" for i in range(len(limits))]
        D, log = 0, []
        for step in range(40):
            if rng.random() < 0.05:
                i = rng.randrange(len(limits))
                alg, params, w = limits[i]
                limits[i] = (alg, [rng.choice([1, 2, 5, 10, 60])] + list(params[1:]), w)
            if rng.random() < 0.15:  # a single-limit call on one of the keys
                i = rng.randrange(len(limits))
                alg, params, _ = limits[i]
                opts = random_multi_opts(rng, [limits[i]])[0]

                def fn(p):
                    p.execute_command("RL." + alg, km[i], *params, *opts)
                    tw.send(p, "RL." + alg, kt[i], *params, *opts)
            else:
                args = limit_args(limits, rng) + random_multi_opts(rng, limits)[0]

                def fn(p):
                    p.execute_command("RL.MULTI", len(km), *km, *args)
                    tw.send(p, "RL.MULTI", kt, *args)

            t0, (rm, rt), t1 = timed(c, fn)
            D = max(D, t1 - t0)
            log.append((t0, t1))
            ctx = (step, limits, rm, rt)
            assert not isinstance(rm, Exception) and not isinstance(rt, Exception), ctx
            if len(rm) == 7:
                agree_multi(rt, rm, D / 1000 + 1, ctx)
            else:
                tol = D / 1000 + 1
                assert rm[:3] == rt[:3], ctx
                assert all(a == b or (a > 0 and b > 0 and abs(a - b) <= tol) for a, b in zip(rm[3:], rt[3:])), ctx
        windows = {p[-1] * 1000 for a, p, _ in limits if a == "SLIDINGCOUNTER"}
        if all(log[0][0] // w == log[-1][1] // w for w in windows):
            break  # no counter window began during the sequence


@pytest.mark.parametrize("seed", range(8))
def test_differential_multi_check_and_shadow(both_modes, seed):
    """Random RL.MULTI takes whose limits carry CHECK and SHADOW (1-4 mixed
    limits, WEIGHT, COST, PARTIAL, DRYRUN, single calls on the same keys):
    the module and multi.lua give the same seven elements; a CHECK limit's
    key never changes, and a call denied with a limit without SHADOW
    writes nothing anywhere."""
    c, tw = both_modes
    rng = random.Random(9500 + seed)
    for attempt in range(3):
        limits = random_limits(rng, rng.randint(1, 4), big=seed >= 6)
        flags = [rng.choice([[], [], ["CHECK"], ["SHADOW"], ["CHECK", "SHADOW"]]) for _ in limits]
        room(c, HOUR, ROOM)
        km = [f"{{m{seed}}}:f{attempt}:{i}" for i in range(len(limits))]
        kt = [f"{{t{seed}}}:f{attempt}:{i}" for i in range(len(limits))]
        D, log = 0, []
        for step in range(40):
            if rng.random() < 0.15:  # a single-limit call on one of the keys
                i = rng.randrange(len(limits))
                alg, params, _ = limits[i]
                opts = random_multi_opts(rng, [limits[i]])[0]

                def fn(p):
                    p.execute_command("RL." + alg, km[i], *params, *opts)
                    tw.send(p, "RL." + alg, kt[i], *params, *opts)
                check = None
            else:
                opts = random_multi_opts(rng, limits)[0]
                if "REFUND" in opts:
                    opts = []
                words = []
                for (alg, params, w), f in zip(limits, flags):
                    words += [rng.choice([alg, alg.lower()]), *params]
                    if w != 1 or rng.random() < 0.2:
                        words += ["WEIGHT", w]
                    words += [rng.choice([x, x.lower()]) for x in f]
                args = words + opts
                before = [c.dump(k) for k in km]

                def fn(p):
                    p.execute_command("RL.MULTI", len(km), *km, *args)
                    tw.send(p, "RL.MULTI", kt, *args)
                check = (before, args)

            t0, (rm, rt), t1 = timed(c, fn)
            D = max(D, t1 - t0)
            log.append((t0, t1))
            ctx = (step, limits, flags, rm, rt)
            assert not isinstance(rm, Exception) and not isinstance(rt, Exception), ctx
            if len(rm) == 7:
                agree_multi(rt, rm, D / 1000 + 1, ctx)
                before, args = check
                after = [c.dump(k) for k in km]
                vetoed = rm[0] == 0 and any("SHADOW" not in f for f in flags)
                dryrun = any(str(a).upper() == "DRYRUN" for a in args)
                for i, f in enumerate(flags):
                    if "CHECK" in f or vetoed:  # took nothing (a DRYRUN says what it would take)
                        assert rm[6][i][0] == 0 and after[i] == before[i], (i, ctx)
                    if dryrun or rm[6][i][0] == 0:
                        assert after[i] == before[i], (i, ctx)
            else:
                tol = D / 1000 + 1
                assert rm[:3] == rt[:3], ctx
                assert all(a == b or (a > 0 and b > 0 and abs(a - b) <= tol) for a, b in zip(rm[3:], rt[3:])), ctx
        windows = {p[-1] * 1000 for a, p, _ in limits if a == "SLIDINGCOUNTER"}
        if all(log[0][0] // w == log[-1][1] // w for w in windows):
            break  # no counter window began during the sequence


def test_differential_multi_and_refund_errors(both_modes):
    """Every error: the same text from the module and the twin; WRONGTYPE
    for another algorithm's key on both sides."""
    c, tw = both_modes
    cases = [(args, ks) for args, ks, text in MULTI_ERRORS if "Lua script" not in text]
    for args, ks in cases:
        def fn(p):
            p.execute_command("RL.MULTI", len(ks), *[f"m:{k}" for k in ks], *args)
            tw.send(p, "RL.MULTI", [f"t:{k}" for k in ks], *args)
        _, (rm, rt), _ = timed(c, fn)
        assert isinstance(rm, redis.ResponseError) and isinstance(rt, redis.ResponseError), (args, ks, rm, rt)
        assert str(rm) == str(rt), (args, ks, str(rm), str(rt))
    for cmd in CMDS:
        lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
        for opts in (["REFUND", 0], ["REFUND", 1, "COST", 1], ["COST", 1, "REFUND", 0], ["REFUND"],
                     ["REFUND", "x"], ["DRYRUN", "REFUND", 2], ["REFUND", 2, "PARTIAL"]):
            _, rm, rt, _ = Pair(c, tw, cmd, "err").call(*lim, *opts)
            assert isinstance(rm, redis.ResponseError) and str(rm) == str(rt), (cmd, opts, rm, rt)
    assert not c.keys("*")
    for prefix, call in (("m", lambda k, *a: c.execute_command("RL.MULTI", len(k), *k, *a)),
                         ("t", lambda k, *a: tw("RL.MULTI", list(k), *a))):
        c.execute_command("RL.TOKENBUCKET", "m:tb", 5, 1, HOUR)
        tw("RL.TOKENBUCKET", "t:tb", 5, 1, HOUR)
        for args in (["SLIDINGLOG", 5, 1000, "SLIDINGLOG", 5, 1000],
                     ["SLIDINGLOG", 5, 1000, "SLIDINGCOUNTER", 5, 1000, "REFUND", 1]):
            with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
                call([f"{prefix}:x", f"{prefix}:tb"], *args)
        assert not c.exists(f"{prefix}:x")


# --------------------------------------------------------------------------
# Differential: RL.FIXEDWINDOW and its twin across window boundaries
# --------------------------------------------------------------------------

def fw_candidates(states, limit, w, ff, opts, t0, t1, rep, exp):
    """The states the model can be in after a call between t0 and t1 (ms)
    from any of `states` that answers `rep` and, when it writes, sets the
    key's expiry `exp` to the window's end."""
    cost, partial, dryrun, refund = opts
    out = set()
    m = FixedWindow(limit, w, ff)
    for s in states:
        for ms in range(t0, t1 + 1):
            want, written, new = single(m, s, ms * 1000, cost, partial, dryrun, refund)
            # (-2: the key's window ended before PEXPIRETIME read it)
            if want != rep or (written and new is not None and exp != new[0] + w
                               and not (exp == -2 and new[0] + w <= t1)):
                continue
            out.add(new if written else s)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_differential_fixed_window_across_boundaries(both_modes, seed):
    """Short windows (boundaries crossed every few calls), epoch-aligned and
    FROMFIRST, random options and REFUND: the module's and the twin's
    replies are each the model's at an instant between the clock reads
    around the pair, from the state that instant's history leaves, with the
    key expiring at the window's end (PEXPIRETIME); and where both calls
    fell in the same window from the same state, they are equal."""
    c, tw = both_modes
    rng = random.Random(700 + seed)
    limit, w, ff = rng.choice([1, 3, 10]), rng.choice([25, 60, 150]), seed % 2 == 1
    sm, st = {None}, {None}
    same = 0
    for i in range(120):
        if rng.random() < 0.04:
            limit = rng.choice([1, 2, 5, 10])
        if rng.random() < 0.04:
            ff = not ff
        if rng.random() < 0.15:
            n = rng.choice([1, 2, limit + 1])
            words, opts = ["REFUND", n], (1, False, False, n)
        else:
            cost = rng.choice([0, 1, 1, 2, limit, limit + 1])
            partial, dryrun = rng.random() < 0.3, rng.random() < 0.15
            words = ["COST", cost] + ["PARTIAL"] * partial + ["DRYRUN"] * dryrun
            opts = (cost, partial, dryrun, None)
        args = [limit, w, *words] + ["FROMFIRST"] * ff

        def fn(p):
            p.execute_command("RL.FIXEDWINDOW", f"m:fw{seed}", *args)
            tw.send(p, "RL.FIXEDWINDOW", f"t:fw{seed}", *args)
            p.pexpiretime(f"m:fw{seed}")
            p.pexpiretime(f"t:fw{seed}")

        t0, (rm, rt, em, et), t1 = timed(c, fn)
        t0, t1 = t0 // 1000, t1 // 1000
        ctx = (i, args, sorted(sm, key=str), sorted(st, key=str), rm, rt, t0, t1)
        nm = fw_candidates(sm, limit, w, ff, opts, t0, t1, rm, em)
        nt = fw_candidates(st, limit, w, ff, opts, t0, t1, rt, et)
        assert nm and nt, ctx
        if t0 // w == t1 // w and sm == st and len(sm) == 1 and not ff:
            assert rm[:3] == rt[:3], ctx
            same += 1
        sm, st = nm, nt
    assert same > 0
