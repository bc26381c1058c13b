"""RL.FIXEDWINDOW against models, on the server's own clock:

* the module's contract (fwmodels.FixedWindow): random sequences of every
  option, both window modes, rule changes and expiring keys;
* envoyproxy/ratelimit's fixed windows (fwmodels.Envoy): for COST 1 the
  same decisions, the same `remaining`, and ceil(reset_after_ms / 1000)
  equal to its duration_until_reset, for every unit it has;
* INCR + PEXPIRE NX (fwmodels.IncrPexpireNx) for FROMFIRST.

Each call goes out in one pipeline bracketed by TIME: TIME -> T0, the call,
TIME -> T1, PEXPIRETIME. The module read its clock within [T0, T1], so a
model evaluated at both ends that answers the same at both is the answer;
where the two ends differ (a window boundary inside the bracket) nothing is
asserted and the key starts over. Waits are checked to lie between the two
ends' values; a window started by FROMFIRST starts at PEXPIRETIME − window,
which must lie in the bracket. No sleeps but a few milliseconds between the
calls of the tests that let windows turn over.
"""
import random
import time

import pytest

from fwmodels import UNITS, Envoy, FixedWindow, IncrPexpireNx
from rltesting.clock import server_ms, time_ms
from rltesting.replies import cached_time




def bracketed(c, *args):
    """(T0 ms, reply, T1 ms, PEXPIRETIME of the key)."""
    p = c.pipeline(transaction=False)
    p.time()
    p.execute_command(*args)
    p.time()
    p.execute_command("PEXPIRETIME", args[1])
    t0, rep, t1, pexp = p.execute()
    return time_ms(t0), rep, time_ms(t1), pexp


def kind(x):
    return (x > 0) - (x < 0)


class Key:
    """One key, its model and the model's state."""

    def __init__(self, c, name, rng):
        self.c, self.rng, self.base, self.gen = c, rng, name, 0
        self.limit = rng.choice([1, 2, 3, 5, 10])
        self.w = rng.choice([60, 150, 400, 3_600_000, 86_400_000])
        self.from_first = rng.random() < 0.5
        self.state = None
        self.name = name

    def restart(self):
        self.c.delete(self.name)
        self.gen += 1
        self.name = f"{self.base}:{self.gen}"
        self.state = None

    def model(self):
        return FixedWindow(self.limit, self.w, self.from_first)


def opts_for(rng, limit):
    r = rng.random()
    if r < 0.12:
        return {"refund": rng.randint(1, limit + 1)}
    o = {"cost": rng.choice([0, 1, 1, 1, 2, limit, limit + 1])}
    if rng.random() < 0.25:
        o["partial"] = True
    if rng.random() < 0.1:
        o["dryrun"] = True
    return o


def args_of(k, o):
    a = ["RL.FIXEDWINDOW", k.name, k.limit, k.w]
    if "refund" in o:
        a += ["REFUND", o["refund"]]
    else:
        a += ["COST", o["cost"]]
        a += ["PARTIAL"] if o.get("partial") else []
        a += ["DRYRUN"] if o.get("dryrun") else []
    if k.from_first:
        a.append("FROMFIRST")
    return a


@pytest.mark.parametrize("seed", range(3))
def test_fixed_window_matches_its_model(r, seed):
    rng = random.Random(f"fw-model-{seed}")
    keys = [Key(r, f"fwm:{seed}:{i}", rng) for i in range(6)]
    checked = skipped = 0
    # 700 calls, and more while fewer than 501 were checked: on a loaded
    # machine wider brackets straddle the short windows more often, and the
    # test makes more calls instead of failing (up to 7,000)
    for n in range(7000):
        if n >= 700 and checked > 500:
            break
        k = rng.choice(keys)
        if rng.random() < 0.04:
            k.limit = rng.choice([1, 2, 3, 5, 10])  # the count carries over
        if rng.random() < 0.02:
            k.w = rng.choice([60, 150, 400, 3_600_000])  # read under the new window
        o = opts_for(rng, k.limit)
        t0, rep, t1, pexp = bracketed(r, *args_of(k, o))
        m = k.model()
        (r0, s0), (r1, s1) = m.call(k.state, t0, **o), m.call(k.state, t1, **o)
        c0, start0, _ = m.read(k.state, t0)
        c1, start1, _ = m.read(k.state, t1)
        same_window = start0 == start1 or (k.from_first and c0 == c1 == 0)
        if r0[:3] != r1[:3] or [kind(x) for x in r0[3:]] != [kind(x) for x in r1[3:]] or not same_window \
                or c0 != c1 or (s0 is None) != (s1 is None):
            skipped += 1  # a boundary or an expiry inside the bracket
            k.restart()
            continue
        checked += 1
        ctx = (k.name, k.limit, k.w, k.from_first, o, k.state, t0, t1, rep, r0, r1)
        assert rep[:3] == r0[:3], ctx
        for i in (3, 4):
            lo, hi = sorted((r0[i], r1[i]))
            assert lo <= rep[i] <= hi, (i, ctx)
        if s0 is not None and s0 != k.state:
            # A write: the key expires at its window's end.
            start = s0[0]
            if start0 != start1:  # a FROMFIRST window started by this call
                start = pexp - k.w
                assert t0 <= start <= t1, ctx
            k.state = (start, s0[1], start + k.w)
            assert pexp == start + k.w, ctx
        elif s0 is None:
            k.state = None
            assert pexp == -2, ctx
        elif k.state is not None and k.state[2] > t1:
            assert pexp == k.state[2], ctx
    print(f"seed {seed}: {checked} calls checked exactly, {skipped} straddled a boundary")
    assert checked > 500, (checked, skipped)


def envoy_args(name, limit, unit, hits=1):
    return ["RL.FIXEDWINDOW", name, limit, UNITS[unit] * 1000, "COST", hits]


def check_envoy(r, name, limit, unit, model, calls):
    """`calls` COST 1 requests on one key against the model; returns how
    many were compared (a bracket across a window boundary starts over)."""
    compared = 0
    for _ in range(calls):
        t0, rep, t1, pexp = bracketed(r, *envoy_args(name, limit, unit))
        u = UNITS[unit]
        if t0 // 1000 // u != t1 // 1000 // u:
            r.delete(name)
            model.counts.clear()
            continue
        over, remaining, duration = model.hit(t0)
        _, _, duration1 = Envoy(limit, unit).hit(t1)
        assert rep[0] == (0 if over else 1), (unit, rep, over)
        assert rep[2] == remaining, (unit, rep, remaining)
        # duration_until_reset at the module's instant lies between the
        # two ends' (equal when both are in the same second).
        reset_s = -(-rep[4] // 1000)
        assert duration1 <= reset_s <= duration, (unit, rep, duration, duration1)
        if t0 // 1000 == t1 // 1000:
            assert reset_s == duration
        # The key is the window envoy's cache key names: it ends there.
        now_s = t0 // 1000
        assert pexp == (now_s - now_s % u + u) * 1000
        assert rep[3] == (0 if not over else rep[4])
        compared += 1
    return compared


@pytest.mark.parametrize("unit", ["MINUTE", "HOUR", "DAY", "WEEK", "MONTH", "YEAR"])
def test_envoy_fixed_windows_long_units(r, unit):
    for limit in (1, 3, 10):
        n = check_envoy(r, f"envoy:{unit}:{limit}", limit, unit, Envoy(limit, unit), 2 * limit + 3)
        assert n >= limit + 2, n


def test_envoy_fixed_windows_per_second_across_boundaries(r):
    """SECOND windows turning over while the calls run: decisions,
    remaining and the reset in seconds follow envoy's counters."""
    models = {limit: Envoy(limit, "SECOND") for limit in (1, 2, 4)}
    start = server_ms(r)
    compared = 0
    rng = random.Random("envoy-second")
    # 2.6 s of calls, and more while fewer than 100 were compared (a loaded
    # machine makes fewer calls a second), up to 60 s
    while server_ms(r) < start + 2600 or (compared < 100 and server_ms(r) < start + 60_000):
        limit = rng.choice(list(models))
        compared += check_envoy(r, f"envoy:s:{limit}", limit, "SECOND", models[limit], 1)
        time.sleep(0.005)
    seen = {w for m in models.values() for w in m.counts}
    assert len(seen) >= 2, "the calls spanned at least two windows"
    assert compared >= 100, compared


def test_envoy_counts_denied_hits_and_this_module_does_not(r):
    """For hits_addend > 1 envoy adds a denied request's hits too; the
    module's denials consume nothing. Same window, same calls: COST 3 on a
    limit of 4 twice, then COST 1."""
    w = UNITS["HOUR"]
    for _ in range(5):
        t0 = server_ms(r)
        reps = [r.execute_command("RL.FIXEDWINDOW", "envoy:cost", 4, w * 1000, "COST", n) for n in (3, 3, 1)]
        if server_ms(r) // 1000 // w == t0 // 1000 // w:
            break
        r.delete("envoy:cost")
    e = Envoy(4, "HOUR")
    env = [e.hit(t0, n) for n in (3, 3, 1)]
    assert [x[0] for x in env] == [False, True, True], "envoy: 3, then 6 > 4, then 7 > 4"
    assert [x[0] for x in reps] == [1, 0, 1], "module: 3, denied (nothing counted), then 4"
    assert reps[2][2] == 0


@pytest.mark.parametrize("seed", range(2))
def test_from_first_matches_incr_pexpire_nx(r, seed):
    """FROMFIRST against INCR + PEXPIRE NX read as a limit: the same
    decisions and remaining, and reset_after_ms equal to the PTTL the INCR
    key would have. They differ in one millisecond only: INCR's key lives
    through the millisecond start + window (Redis expires a key once now >
    its expiry), the module's window is [start, start + window); brackets
    containing that millisecond are not compared."""
    rng = random.Random(f"incr-{seed}")
    limit, w = rng.choice([(2, 120), (3, 200), (1, 80)])
    name, gen = f"ff:incr:{seed}", 0
    model = IncrPexpireNx(limit, w)
    start = server_ms(r)
    compared = restarts = windows = 0
    # 1.5 s of calls, and more while too few were compared (a loaded machine
    # makes fewer calls a second), up to 60 s
    while server_ms(r) < start + 1500 or ((compared <= 50 or windows < 3) and server_ms(r) < start + 60_000):
        key = f"{name}:{gen}"
        t0, rep, t1, pexp = bracketed(r, "RL.FIXEDWINDOW", key, limit, w, "FROMFIRST")
        exp = model.expire_at
        boundary = exp is not None and t0 <= exp + 1 and exp <= t1 + 1
        if boundary:
            gen += 1
            restarts += 1
            model = IncrPexpireNx(limit, w)
            continue
        if model.expire_at is None or t0 > model.expire_at:
            # The INCR starts a window; its start is the module's instant.
            at = pexp - w
            assert t0 <= at <= t1, (t0, at, t1)
            windows += 1
        else:
            at = t0
        allowed, remaining, pttl = model.hit(at)
        assert rep[0] == int(allowed), (rep, allowed, model.count)
        assert rep[2] == remaining
        assert pexp == model.expire_at, "the key expires when INCR's key would"
        t_lo, t_hi = max(at, t0), t1 if at == t0 else at
        assert model.expire_at - t_hi <= rep[4] <= model.expire_at - t_lo, (rep, model.expire_at, t0, t1)
        compared += 1
        time.sleep(rng.choice([0, 0.002, 0.01, 0.03]))
    assert compared > 50 and windows >= 3, (compared, windows, restarts)


def test_from_first_expires_as_incr_pexpire_nx_in_one_transaction(r):
    """On the same server, in one MULTI, INCR + PEXPIRE NX and FROMFIRST
    get the same expiry (where the module shares the command's cached time:
    Redis 7.2+, Valkey; Redis 7.0's module clock is read separately)."""
    if not cached_time(r):
        pytest.skip("Redis before 7.2: the module reads its own clock, not the command's")
    for i in range(20):
        p = r.pipeline(transaction=True)
        p.incr(f"incr:{i}")
        p.pexpire(f"incr:{i}", 250, nx=True)
        p.execute_command("RL.FIXEDWINDOW", f"fw:{i}", 5, 250, "FROMFIRST")
        p.pexpiretime(f"incr:{i}")
        p.pexpiretime(f"fw:{i}")
        _, _, rep, e1, e2 = p.execute()
        assert rep == [1, 5, 4, 0, 250]
        assert e1 == e2
