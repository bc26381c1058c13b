"""The Lua twin of RL.FIXEDWINDOW (lua/fixedwindow.lua, rl_fixedwindow in
lua/library.lua, the FIXEDWINDOW kind of multi.lua) on a plain
redis-server without the module, against the reference model
(integration/models.py, FixedWindow): random sequences across window
boundaries, epoch-aligned and FROMFIRST, with the stored state and its
absolute expiry checked after every call; the boundary burst (2 x limit
across one boundary); empty windows; errors; RL.MULTI with fixed windows.
The generic twin tests (test_lua_twins*.py) cover it too, through CMDS;
the module beside it: test_lua_twins_differential.py.
"""
import random

import pytest
import redis

from rltesting.clock import before_boundary, room, server_ms, time_ms, wait_past
from rltesting.proc import wait_until
from models import FixedWindow, multi, single
from twins import MAX, Twins, dirty, err_of, fw_state

CMD = "RL.FIXEDWINDOW"


@pytest.fixture(params=["eval", "fcall"])
def twm(plain, request):
    return Twins(plain, request.param)




def call_read(tw, key, *args):
    """(T0 ms, reply or error, T1 ms, state, PEXPIRETIME, T2 ms): the call
    between two server clock reads, its key read back in the same pipeline
    before a third (a key read back as gone may have expired by T2)."""
    p = tw.c.pipeline(transaction=False)
    p.time()
    tw.send(p, CMD, key, *args)
    p.time()
    p.hgetall(key)
    p.pexpiretime(key)
    p.time()
    t0, rep, t1, h, exp, t2 = p.execute(raise_on_error=False)
    state = tuple(int(h[k]) for k in (b"start", b"count")) if h else None
    return time_ms(t0), rep, time_ms(t1), state, exp, time_ms(t2)


def model_at(state, expiry, limit, window_ms, ff, cost, partial, dryrun, refund, t0, t1):
    """The model's (reply, written, new state) at each ms of [t0, t1]. The
    key stored `state` until `expiry` (its PEXPIREAT, set by the window it
    was written with): from that ms on, the call may find it gone (a window
    shortened and then lengthened again must not revive it)."""
    m = FixedWindow(limit, window_ms, ff)
    out = []
    for ms in range(t0, t1 + 1):
        seen = [state] if expiry is None or ms < expiry else [None] if ms > expiry else [state, None]
        out += [(ms, *single(m, s, ms * 1000, cost, partial, dryrun, refund)) for s in seen]
    return out


def opts_of(rng, limit):
    """(option words, cost, partial, dryrun, refund)."""
    if rng.random() < 0.15:
        n = rng.choice([1, 2, rng.randint(1, limit + 2)])
        return ["REFUND", n], 1, False, False, n
    cost = rng.choice([0, 1, 1, 1, 2, rng.randint(0, limit + 2)])
    partial, dryrun = rng.random() < 0.3, rng.random() < 0.15
    groups = [["COST", cost]] if cost != 1 or rng.random() < 0.3 else []
    groups += [["PARTIAL"]] * partial + [["DRYRUN"]] * dryrun
    rng.shuffle(groups)
    return [x for g in groups for x in g], cost, partial, dryrun, None


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_match_the_model(twm, seed):
    """Short windows (boundaries crossed many times) and long ones; limits
    and windows changed mid-sequence; FROMFIRST on and off on the same key.
    Each reply is the model's at an instant between the clock reads around
    the call, the stored (start, count) is the model's new state, and the
    key expires exactly at the window's end."""
    rng = random.Random(seed)
    key = f"fw:{seed}"
    limit, window_ms = rng.choice([1, 3, 10, 1000]), rng.choice([20, 50, 200, 3_600_000])
    ff = seed % 2 == 1
    state = expiry = None
    crossed = 0
    for i in range(150):
        if rng.random() < 0.05:
            limit = rng.choice([1, 2, 5, 10, 60])
        if rng.random() < 0.05:
            window_ms = rng.choice([20, 50, 200, 3_600_000])
        if rng.random() < 0.05:
            ff = not ff
        words, cost, partial, dryrun, refund = opts_of(rng, limit)
        args = [limit, window_ms, *words] + (["fromfirst" if rng.random() < 0.5 else "FROMFIRST"] if ff else [])
        if ff and rng.random() < 0.5:
            args = [limit, window_ms, args[-1], *words]  # FROMFIRST before the others
        t0, rep, t1, got, exp, t2 = call_read(twm, key, *args)
        cands = model_at(state, expiry, limit, window_ms, ff, cost, partial, dryrun, refund, t0, t1)

        def fits(c):
            # the state the call leaves, and when its key expires; read back
            # as gone when that window ended before the read (by T2)
            want, until = (c[3], None if c[3] is None else c[3][0] + window_ms) if c[2] else (state, expiry)
            return c[1] == rep and (want == got or (got is None and until is not None and until <= t2))

        ok = [c for c in cands if fits(c)]
        assert ok, (i, args, state, rep, got, cands)
        if ok[0][2] and got is not None:
            expiry = got[0] + window_ms  # written: PEXPIREAT the window's end
            if state is not None and got[0] != state[0]:
                crossed += 1
        if got is not None:
            # gone by its PEXPIRETIME (the pipeline is not a transaction)
            # only once its window has ended by the last clock read
            assert exp == expiry or (exp == -2 and expiry is not None and expiry <= t2), (i, args, got, exp, t2)
        state = got
    if window_ms <= 200:
        assert crossed > 0 or limit > 100  # boundaries were crossed


def test_boundary_burst_is_two_limits(tw):
    """The known weakness: `limit` granted at the end of one window and
    `limit` at the start of the next, 2 x limit within much less than one
    window_ms, each window refusing the one more with retry_after_ms = the
    time to its end.

    A 4 s window; the first burst (one pipeline) starts 0.94-1 s before a
    boundary read from the server's clock (rltesting.clock), the second
    right after it. A burst that did not land on its side (the pipeline
    stalled for most of a second) runs again on a fresh key at a later
    boundary, up to 5 times."""
    c = tw.c
    L, W = 5, 4000
    for attempt in range(5):
        key = f"b:{attempt}"
        end = before_boundary(c, W, 1000)
        p = c.pipeline(transaction=False)
        p.time()
        for _ in range(L + 1):
            tw.send(p, CMD, key, L, W)
        p.time()
        first = p.execute()
        t_first, t_first_done = time_ms(first[0]), time_ms(first[-1])
        first = first[1:-1]
        wait_past(c, end, timeout=10)
        p = c.pipeline(transaction=False)
        for _ in range(L + 1):
            tw.send(p, CMD, key, L, W)
        p.time()
        second = p.execute()
        t_last = time_ms(second[-1])
        second = second[:-1]
        if t_first_done < end and t_last - t_first < W // 2:
            break
    else:
        raise AssertionError("no burst landed on its side of a boundary in 5 tries")
    assert [r[0] for r in first] == [1] * L + [0]
    denied = first[-1]
    assert denied[2] == 0 and end - t_first_done <= denied[3] <= end - t_first and denied[3] == denied[4]
    assert [r[0] for r in second] == [1] * L + [0]
    assert t_last - t_first < W // 2  # 2 x limit in under half a window


def test_empty_window_and_fresh_replies(tw):
    """Nothing counted in the current window: remaining = limit and
    reset_after_ms = 0, and nothing is written (COST 0, COST > limit, a
    refund to a fresh key), epoch-aligned or FROMFIRST."""
    c = tw.c
    before = dirty(c)
    for ff in ([], ["FROMFIRST"]):
        assert tw(CMD, "k", 5, 60_000, "COST", 0, *ff) == [1, 5, 5, 0, 0]
        assert tw(CMD, "k", 5, 60_000, "COST", 0, "PARTIAL", *ff) == [0, 5, 5, 0, 0]
        assert tw(CMD, "k", 5, 60_000, "COST", 6, *ff) == [0, 5, 5, -1, 0]
        assert tw(CMD, "k", 5, 60_000, "COST", 6, "PARTIAL", *ff)[:4] == [5, 5, 0, -1]
        c.delete("k")
        before = dirty(c)
        assert tw(CMD, "k", 5, 60_000, "REFUND", 2, *ff) == [0, 5, 5, 0, 0]
    assert not c.exists("k") and dirty(c) == before


def test_from_first_window_starts_at_the_first_grant(tw):
    """FROMFIRST: the first grant starts a window at that ms (PEXPIREAT
    start + window_ms), later grants in it keep its start; the window runs
    out and the next grant starts a new one (INCR + PEXPIRE NX)."""
    c = tw.c
    # the three calls must fall inside the window the first began: a run
    # whose last call came after it ended (a stall of W) runs again on a
    # fresh key, up to 3 times
    W = 1000
    for attempt in range(3):
        k = f"f:{attempt}"
        t0, rep, t1, st, exp, t2 = call_read(tw, k, 3, W, "FROMFIRST")
        assert rep == [1, 3, 2, 0, W] and t0 <= st[0] <= t1 and st[1] == 1 and exp == st[0] + W
        start = st[0]
        t0b, rep2, t1b, st2, exp2, _ = call_read(tw, k, 3, W, "COST", 2, "FROMFIRST")
        _, rep3, _, _, _, t2 = call_read(tw, k, 3, W, "FROMFIRST")
        if t2 < start + W:
            break
    else:
        raise AssertionError(f"no three calls within {W} ms of the first in 3 tries")
    assert rep2[:4] == [1, 3, 0, 0] and start + W - t1b <= rep2[4] <= start + W - t0b
    assert st2 == (start, 3) and exp2 == start + W
    assert rep3[:3] == [0, 3, 0] and 0 < rep3[3] <= W and rep3[3] == rep3[4]
    # the same key read epoch-aligned: its start is not a window of W ms
    # (unless by chance), so it counts 0 there
    if start % W:
        assert tw(CMD, k, 3, W, "DRYRUN")[:3] == [1, 3, 2]
    wait_until(lambda: not c.exists(k), timeout=5, what="the window to end")
    t0, rep, t1, st, exp, t2 = call_read(tw, k, 3, W, "fromfirst")
    assert rep == [1, 3, 2, 0, W] and st[0] >= start + W and t0 <= st[0] <= t1


def test_from_first_window_ends_at_start_plus_window(tw):
    """A FROMFIRST window covers [start, start + window_ms): at
    start + window_ms (or later) the count is 0 and a grant starts a new
    window there. The state is written one window before the clock read
    that precedes the call, so the call sees it ended, exactly or later."""
    c = tw.c
    for later in (0, 1, 7):
        t = server_ms(c)
        c.hset("e", mapping={"start": t - 1000 - later, "count": 3})
        c.pexpire("e", 60_000)
        t0, rep, t1, st, exp, t2 = call_read(tw, "e", 5, 1000, "FROMFIRST", "COST", 2)
        assert rep == [1, 5, 3, 0, 1000], (later, rep)
        assert t0 <= st[0] <= t1 and st[1] == 2 and exp == st[0] + 1000


def test_clock_stepping_back_counts_as_zero(tw):
    """A stored window that starts after the server's clock (the clock
    stepped back): the call is evaluated at that start, so the window
    goes on (not a fresh one), and reset/retry run from the real clock to
    its end (the gap included), epoch-aligned or FROMFIRST."""
    c = tw.c
    # the stored start is a minute ahead, so the calls see it ahead of the
    # clock however long they take (up to 55 s)
    for ff, lead in ((False, 60_000), (True, 60_321)):
        t = server_ms(c)
        start = (t // 1000 + 60) * 1000 if not ff else t + lead
        c.hset("b", mapping={"start": start, "count": 3})
        c.pexpire("b", 120_000)
        opts = ["FROMFIRST"] * ff
        t0, rep, t1, st, exp, _ = call_read(tw, "b", 5, 1000, "COST", 1, *opts)
        assert rep[:4] == [1, 5, 1, 0] and start + 1000 - t1 <= rep[4] <= start + 1000 - t0, (ff, rep)
        assert rep in [m[1] for m in model_at((start, 3), None, 5, 1000, ff, 1, False, False, None, t0, t1)]
        assert st == (start, 4) and exp == start + 1000
        rep = tw(CMD, "b", 5, 1000, "COST", 2, *opts)
        assert rep[:3] == [0, 5, 1] and rep[3] == rep[4] > 4_000, (ff, rep)
        c.delete("b")


def test_lowered_limit_and_changed_window(tw):
    """count above a lowered limit: remaining 0, denied until the window
    ends; another window_ms (epoch-aligned) is another window: counts 0."""
    c = tw.c
    W = 3_600_000
    room(c, W, 30_000)  # the hour's window holds every call
    assert tw(CMD, "l", 10, W, "COST", 8)[:3] == [1, 10, 2]
    rep = tw(CMD, "l", 5, W)
    assert rep[:3] == [0, 5, 0] and rep[3] == rep[4] > 0
    assert tw(CMD, "l", 5, W, "REFUND", 2)[:3] == [2, 5, 0]
    assert tw(CMD, "l", 5, W, "REFUND", 100)[:3] == [6, 5, 5] and not c.exists("l")
    # window_ms changed: an hour's window is not a window of 7 s (unless
    # the hour began within these 7 s and is a multiple of 7 s)
    tw(CMD, "w", 10, W, "COST", 4)
    state = fw_state(c, "w")
    t0, rep, t1, got, _, t2 = call_read(tw, "w", 10, 7_000, "DRYRUN")
    assert rep in [m[1] for m in model_at(state, None, 10, 7_000, False, 1, False, True, None, t0, t1)]
    if state[0] != t1 - t1 % 7_000:
        assert rep[:3] == [1, 10, 9]
    assert got == state


def test_full_range_and_exact_expiry(tw):
    """limit, COST and window_ms up to 2^53 - 1 (epoch-aligned: the window
    starts at 0 and ends at window_ms, so every sum stays below 2^53);
    FROMFIRST needs start + window_ms < 2^53 and refuses longer windows."""
    c = tw.c
    rep = tw(CMD, "x", MAX, MAX, "COST", MAX - 1)
    assert rep[:4] == [1, MAX, 1, 0] and rep[4] > 0
    assert fw_state(c, "x") == (0, MAX - 1) and c.pexpiretime("x") == MAX
    rep = tw(CMD, "x", MAX, MAX, "COST", 2)
    assert rep[:3] == [0, MAX, 1] and rep[3] == rep[4] > 0
    e = err_of(tw, CMD, "y", 1, 9007199254741, "FROMFIRST")
    assert e.startswith("window_ms is beyond the exact range of the Lua script with FROMFIRST")
    t0, rep, t1, st, exp, t2 = call_read(tw, "y", 1, 9007199254740, "FROMFIRST")
    assert rep == [1, 1, 0, 0, 9007199254740] and exp == st[0] + 9007199254740
    assert not c.exists("z") and tw(CMD, "z", 1, MAX, "COST", 1)[0] == 1


def test_fromfirst_errors_and_other_commands(tw):
    c = tw.c
    call = lambda *a: tw(CMD, "k", 5, 1000, *a)  # noqa: E731
    for opts in (["FROMFIRST", "fromfirst"], ["FROMFIRST", "FROMFIRST", "COST", 1], ["REFUND", 1, "COST", 1],
                 ["FROMFIRST", "REFUND", 1, "DRYRUN"], ["FROMFIRST", "X"], ["FROM", "FIRST"]):
        assert err_of(call, *opts) == "syntax error", opts
    assert call("REFUND", 1, "FROMFIRST") == [0, 5, 5, 0, 0]
    assert call("FROMFIRST", "REFUND", 1) == [0, 5, 5, 0, 0]
    # FROMFIRST belongs to RL.FIXEDWINDOW only
    for cmd, lim in (("RL.TOKENBUCKET", [5, 1, 1000]), ("RL.SLIDINGLOG", [5, 1000]),
                     ("RL.SLIDINGCOUNTER", [5, 1000])):
        assert err_of(tw, cmd, "k", *lim, "FROMFIRST") == "syntax error", cmd
    # each of the hash twins refuses the others' keys (hour-long limits: a
    # 1 s window aligned to the epoch could end, and its key go, mid-loop;
    # the hour's window has 30 s left at least)
    room(c, 3_600_000, 30_000)
    tw(CMD, "fw", 5, 3_600_000)
    tw("RL.TOKENBUCKET", "tb", 5, 1, 3_600_000)
    tw("RL.SLIDINGCOUNTER", "sc", 5, 3_600_000)
    for cmd, lim, key in (("RL.TOKENBUCKET", [5, 1, 1000], "fw"), ("RL.SLIDINGCOUNTER", [5, 1000], "fw"),
                          (CMD, [5, 1000], "tb"), (CMD, [5, 1000], "sc")):
        with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
            tw(cmd, key, *lim)
    c.hset("bad", mapping={"start": "x", "count": 1})
    assert err_of(tw, CMD, "bad", 5, 1000) == "the fixed window state at this key is corrupt"
    assert not c.exists("k")


# --------------------------------------------------------------------------
# RL.MULTI with fixed windows (multi.lua, rl_multi)
# --------------------------------------------------------------------------

def test_multi_with_fixed_windows_matches_the_model(twm):
    """Three FIXEDWINDOW limits (epoch-aligned and FROMFIRST, weighted,
    short and long windows) in random RL.MULTI calls: each reply is the
    model's at an instant between the clock reads, and every key holds the
    model's state, expiring at its window's end."""
    c, rng = twm.c, random.Random(7)
    for rnd in range(30):
        keys = [f"{{m}}:{rnd}:{j}" for j in range(3)]
        states = [None] * 3
        lims = [(rng.choice([2, 5, 10]), rng.choice([30, 100, 3_600_000]), rng.random() < 0.5, rng.choice([1, 1, 2]))
                for _ in range(3)]
        for i in range(10):
            words, cost, partial, dryrun, refund = opts_of(rng, 6)
            args = []
            for lim, w, ff, wt in lims:
                args += ["FIXEDWINDOW", lim, w] + (["WEIGHT", wt] if wt != 1 else []) + (["FROMFIRST"] if ff else [])
            args += words
            p = c.pipeline(transaction=False)
            p.time()
            twm.send(p, "RL.MULTI", keys, *args)
            p.time()
            for k in keys:
                p.hgetall(k)
                p.pexpiretime(k)
            p.time()
            out = p.execute(raise_on_error=False)
            t0, t1, t2 = time_ms(out[0]), time_ms(out[2]), time_ms(out[-1])
            rep = out[1]
            got = [tuple(int(h[f]) for f in (b"start", b"count")) if h else None for h in out[3:-1:2]]
            for g, exp, (_, w, _, _) in zip(got, out[4:-1:2], lims):
                # The pipeline is not one transaction: a key read back may
                # expire before its PEXPIRETIME (-2), only once its window
                # has ended by the last clock read.
                assert g is None or exp == g[0] + w or (exp == -2 and g[0] + w <= t2), (rnd, i, g, exp, t2)
            models = [(FixedWindow(lim, w, ff), s, wt) for (lim, w, ff, wt), s in zip(lims, states)]
            ok = []
            for ms in range(t0, t1 + 1):
                want, written, new = multi(models, ms * 1000, cost, partial, dryrun, refund)
                # a key read back as gone: its window ended before the read
                # (when written, at new start + w; else it was already gone
                # or ended: the model's state is then no longer counted)
                if want == rep and all(n == g or (g is None and n is not None and n[0] + lw[1] <= t2)
                                       for n, g, lw in zip(new, got, lims)):
                    ok.append(ms)
            assert ok, (rnd, i, args, states, rep, got)
            states = got
