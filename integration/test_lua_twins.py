"""The Lua twins (lua/*.lua): the three limiters as scripts, for servers that
cannot load the module.

Two kinds of tests:

* The twins on their own, on a plain redis-server without the module: fresh
  keys, draining, PARTIAL, COST 0, DRYRUN and denials write nothing, TTLs,
  errors, exact arithmetic at the edges of their range (including the
  helpers, checked against Python integers), replication by effects.

* Differential: the module command and its twin on the same server, on two
  different keys, given the same call sequence. Each pair goes out in one
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
"""
import hashlib
import os
import random
import re
import shutil
import socket
import subprocess
import sys

import pytest
import redis

from rltesting.proc import ROOT, wait_until
from models import MODELS, SlidingLog, ceil_div, log_model, multi, sc_model, single, tb_model

LUA_DIR = os.path.join(ROOT, "lua")
MAX = 2**53 - 1
FILES = {
    "RL.TOKENBUCKET": "tokenbucket.lua",
    "RL.SLIDINGLOG": "slidinglog.lua",
    "RL.SLIDINGCOUNTER": "slidingcounter.lua",
}
CMDS = list(FILES)
SCRIPTS = {**FILES, "RL.MULTI": "multi.lua"}


# Every file lua/build.py generates from lua/src/.
GENERATED = sorted(n for n in os.listdir(os.path.join(LUA_DIR, "src")) if n.endswith(".lua"))


def generated(name):
    with open(os.path.join(LUA_DIR, name)) as f:
        return f.read()


def source(cmd):
    return generated(SCRIPTS[cmd])


FUNCTIONS = {"RL.TOKENBUCKET": "rl_tokenbucket", "RL.SLIDINGLOG": "rl_slidinglog",
             "RL.SLIDINGCOUNTER": "rl_slidingcounter", "RL.MULTI": "rl_multi"}


class Twins:
    """The scripts loaded on one server, called like the commands: with
    EVALSHA (mode "eval"), or the same limiters from lua/library.lua with
    FCALL (mode "fcall")."""

    def __init__(self, client, mode="eval"):
        self.c, self.mode = client, mode
        self.sha = {cmd: client.script_load(source(cmd)) for cmd in SCRIPTS}
        if mode == "fcall":
            client.function_load(generated("library.lua"), replace=True)

    def send(self, p, cmd, key, *args):
        """Queue (on a pipeline) or make the call; `key` may be a list."""
        keys = key if isinstance(key, list) else [key]
        if self.mode == "fcall":
            return p.fcall(FUNCTIONS[cmd], len(keys), *keys, *args)
        return p.evalsha(self.sha[cmd], len(keys), *keys, *args)

    def __call__(self, cmd, key, *args):
        return self.send(self.c, cmd, key, *args)


def now_us(c):
    s, us = c.time()
    return s * 1_000_000 + us


def dirty(c):
    return int(c.info("persistence")["rdb_changes_since_last_save"])


def err_of(fn, *a):
    with pytest.raises(redis.ResponseError) as ei:
        fn(*a)
    return str(ei.value)


def raw_reply(port, *args):
    """The first line of the raw RESP reply (to see error codes like 'ERR')."""
    payload = f"*{len(args)}\r\n".encode()
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        payload += b"$%d\r\n%s\r\n" % (len(b), b)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(payload)
        buf = b""
        while b"\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    return buf.split(b"\r\n", 1)[0].decode()


def timed(c, fn):
    """(T0, result, T1): server clock read right before and after `fn`,
    in the same pipeline, so the call saw a time within [T0, T1]."""
    p = c.pipeline(transaction=False)
    p.time()
    fn(p)
    p.time()
    out = p.execute(raise_on_error=False)
    t0, t1 = out[0], out[-1]
    return t0[0] * 1_000_000 + t0[1], out[1:-1], t1[0] * 1_000_000 + t1[1]


@pytest.fixture
def plain(server_factory):
    """A redis-server without the module: the twins' natural habitat."""
    s = server_factory(module=False)
    c = s.client()
    c.port = s.port
    yield c
    c.close()


@pytest.fixture
def tw(plain):
    return Twins(plain)


# --------------------------------------------------------------------------
# The twins' states read back, for the models (integration/models.py).
# --------------------------------------------------------------------------

def tb_state(c, key):
    h = c.hgetall(key)
    if not h:
        return None
    return tuple(int(h[k]) for k in (b"tokens", b"frac", b"ts", b"scale"))


def assert_between(reply, lo, hi):
    """Each field of `reply` lies between the models at T0 and T1."""
    for i, (v, a, b) in enumerate(zip(reply, lo, hi)):
        assert min(a, b) <= v <= max(a, b), (i, reply, lo, hi)


# --------------------------------------------------------------------------
# The scripts themselves
# --------------------------------------------------------------------------

def test_scripts_load_with_script_load(tw):
    for cmd in CMDS:
        src = source(cmd)
        assert tw.sha[cmd] == hashlib.sha1(src.encode()).hexdigest()
        assert tw.c.script_exists(tw.sha[cmd]) == [True]


def test_scripts_touch_only_their_declared_keys():
    """Cluster safety: every redis.call except TIME names a key the caller
    declared: `key`, bound only to an element of KEYS (passed down as
    `keys`), or `s.key`, the same key kept with its state."""
    for name in GENERATED:
        src = generated(name)
        calls = re.findall(r"redis\.p?call\(\s*'([A-Z]+)'\s*(?:,\s*([A-Za-z_.\[\]0-9]+))?", src)
        assert calls, name
        for cmd, first in calls:
            if cmd == "TIME":
                assert not first
            else:
                assert first in ("key", "s.key", "s_key"), (name, cmd, first)
        # `key` is a function parameter or an element of `keys`; `s.key` is
        # the `key` a state was loaded from
        for m in re.finditer(r"\bkey\s*=\s*([^,}\n]+)", src):
            assert m.group(1).strip() in ("key", "keys[1]"), (name, m.group(0))
        for m in re.finditer(r"\.(load|write)\((\w+(?:\[\w+\])?)", src):
            assert m.group(2) in ("key", "keys[j]"), (name, m.group(0))
        # KEYS itself is only handed to the entry point; no key enumeration
        assert all(re.match(r"return rl_multi\(KEYS, ARGV\)$|local keys, argv = KEYS, ARGV$", line)
                   for line in src.splitlines() if "KEYS" in line and not line.startswith("--")), name
        assert not re.search(r"'(KEYS|SCAN)'", src)


def test_generated_scripts_are_up_to_date(tmp_path):
    """lua/*.lua are generated from lua/src/ by lua/build.py and committed:
    they are what the generator writes, and the check notices a file edited
    by hand. The client packages' copies are generated, not committed:
    `--out DIR` (what the package builds run) writes exactly the EVAL
    scripts, equal to lua/*.lua, and replaces a stale one."""
    build = os.path.join(LUA_DIR, "build.py")
    r = subprocess.run([sys.executable, build, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in GENERATED:
        assert generated(name).split("\n")[int(name == "library.lua")].startswith(
            "-- Generated by lua/build.py from lua/src/%s " % name)
    shutil.copytree(LUA_DIR, tmp_path / "lua")
    edited = tmp_path / "lua" / "slidinglog.lua"
    with open(edited, "a") as f:
        f.write("-- edited by hand\n")
    build = str(tmp_path / "lua" / "build.py")
    r = subprocess.run([sys.executable, build, "--check"], capture_output=True, text=True)
    assert r.returncode == 1 and "lua/slidinglog.lua" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, build], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert edited.read_text() == generated("slidinglog.lua")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "multi.lua").write_text("-- stale\n")
    (pkg / "gone.lua").write_text("-- no template makes this any more\n")
    r = subprocess.run([sys.executable, build, "--out", str(pkg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(pkg)) == [n for n in GENERATED if n != "library.lua"]
    for name in os.listdir(pkg):
        assert (pkg / name).read_text() == generated(name), name


def helper_script(cmd, call):
    src = source(cmd)
    names = ["MAX", "TWO52", "fmod"]
    head = "\n".join(
        m.group(0) for n in names for m in [re.search(r"^local %s = .*$" % n, src, re.M)] if m
    )
    funcs = "\n".join(
        re.search(r"^local function %s\(.*?^end$" % n, src, re.M | re.S).group(0)
        for n in ("fmt", "divmod", "muldiv", "ceil_ms", "wait_us")
        if re.search(r"^local function %s\(" % n, src, re.M)
    )
    return head + "\n" + funcs + "\n" + call


def test_muldiv_is_exact(plain):
    """floor(a*b/c) and the remainder, against Python integers, on the slow
    (two-limb) and fast paths, including overflow detection."""
    script = helper_script("RL.TOKENBUCKET", """
local out = {}
for i = 1, #ARGV, 3 do
  local q, r = muldiv(tonumber(ARGV[i]), tonumber(ARGV[i+1]), tonumber(ARGV[i+2]))
  if q == nil then out[#out+1] = 'nil' else out[#out+1] = fmt(q) .. ' ' .. fmt(r) end
end
return out
""")
    rng = random.Random(5)
    edge = [0, 1, 2, 3, 999, 1000, 1001, 2**26, 2**26 + 1, 2**52 - 1, 2**52, 2**52 + 1, MAX - 1, MAX]
    cases = []
    for a in edge:
        for b in edge:
            for c in (1, 2, 3, 1000, 2**26 + 3, 2**52 + 7, MAX - 2, MAX):
                cases.append((a, b, c))
    for _ in range(3000):
        bits = [rng.randint(1, 53) for _ in range(3)]
        cases.append(tuple(rng.randint(1 if i == 2 else 0, 2**b - 1) for i, b in enumerate(bits)))
    sha = plain.script_load(script)
    for i in range(0, len(cases), 500):
        chunk = cases[i:i + 500]
        got = plain.evalsha(sha, 0, *[x for t in chunk for x in t])
        for (a, b, c), g in zip(chunk, got):
            q, r = divmod(a * b, c)
            want = b"nil" if q >= 2**53 else f"{q} {r}".encode()
            assert g == want, (a, b, c, g, want)


def test_wait_us_and_ceil_ms_are_exact(plain):
    script = helper_script("RL.TOKENBUCKET", """
local out = {}
for i = 1, #ARGV, 4 do
  local w = wait_us(tonumber(ARGV[i]), tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3]))
  if w == nil then out[#out+1] = 'nil' else out[#out+1] = fmt(w) .. ' ' .. fmt(ceil_ms(w)) end
end
return out
""")
    rng = random.Random(7)
    cases = []
    for _ in range(2000):
        P = rng.choice([1000, 3_600_000_000, rng.randint(1, 2**53 - 1), rng.randint(1000, 10**12)])
        rate = rng.choice([1, 7, rng.randint(1, 2**53 - 1), rng.randint(1, 10**6)])
        d = rng.choice([1, 2, rng.randint(1, 2**53 - 1), rng.randint(1, 10**9)])
        f = rng.randint(0, P - 1)
        cases.append((d, f, P, rate))
    sha = plain.script_load(script)
    for i in range(0, len(cases), 400):
        chunk = cases[i:i + 400]
        got = plain.evalsha(sha, 0, *[x for t in chunk for x in t])
        for (d, f, P, rate), g in zip(chunk, got):
            w = ceil_div(d * P - f, rate)
            # the q from muldiv(d, P, rate) must stay < 2^53 for an answer
            want = b"nil" if d * P // rate >= 2**53 else f"{w} {ceil_div(w, 1000)}".encode()
            assert g == want, (d, f, P, rate, g, want)


# --------------------------------------------------------------------------
# The twins on their own (no module)
# --------------------------------------------------------------------------

def test_fresh_key_replies(tw):
    c = tw.c
    assert tw("RL.TOKENBUCKET", "b", 5, 2, 1000) == [1, 5, 4, 0, 500]
    assert tw("RL.SLIDINGLOG", "l", 5, 1000) == [1, 5, 4, 0, 1000]
    t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.SLIDINGCOUNTER"], 1, "c", 5, 60_000))
    assert_between(rep, sc_model(None, 5, 60_000, 1, False, t0), sc_model(None, 5, 60_000, 1, False, t1))
    assert rep[:4] == [1, 5, 4, 0] and 60_000 < rep[4] <= 120_000
    # the counter stores the aligned window start
    h = c.hgetall("c")
    assert int(h[b"win"]) % 60_000_000 == 0 and int(h[b"cur"]) == 1 and int(h[b"prev"]) == 0


def test_token_bucket_drain_and_refill_wait(tw):
    c = tw.c
    C, rate, period = 3, 1, 3_600_000
    state = None
    for left in (2, 1, 0):
        rep = tw("RL.TOKENBUCKET", "b", C, rate, period)
        new = tb_state(c, "b")
        want, _ = tb_model(state, C, rate, period, 1, False, new[2])
        assert rep == want and rep[2] == left
        state = new
    # denied: exact against the model for the bracketing server times
    t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.TOKENBUCKET"], 1, "b", C, rate, period))
    lo, _ = tb_model(state, C, rate, period, 1, False, t0)
    hi, _ = tb_model(state, C, rate, period, 1, False, t1)
    assert_between(rep, lo, hi)
    assert rep[:3] == [0, 3, 0] and 0 < rep[3] <= period and 2 * period < rep[4] <= 3 * period
    assert tb_state(c, "b") == state  # a denial writes nothing


def test_token_bucket_state_is_exact_with_big_numbers(tw):
    """Refill across the two-limb path: a crafted state in the past, then
    grants; the stored ts says exactly which `now` the script used."""
    c = tw.c
    C, rate, period = 10**15, 10**12 + 7, 86_400_000  # C*P = 8.64e25, refill 8.6e13 us
    P = period * 1000
    now = now_us(c)
    state = (123_456_789_012, P - 12345, now - 3_000_000, P)
    c.hset("b", mapping=dict(zip(["tokens", "frac", "ts", "scale"], map(str, state))))
    for cost, partial in [(10**12, False), (7, True), (3 * 10**14, True), (0, False), (1, False)]:
        args = [C, rate, period, "COST", cost] + (["PARTIAL"] if partial else [])
        rep = tw("RL.TOKENBUCKET", "b", *args)
        new = tb_state(c, "b")
        if new != state:
            want, st = tb_model(state, C, rate, period, cost, partial, new[2])
            assert rep == want and st == new
            state = new
    # the period changes: the fraction is recounted in the new unit (floor)
    period2 = 86_400_001
    rep = tw("RL.TOKENBUCKET", "b", C, rate, period2, "COST", 5)
    new = tb_state(c, "b")
    want, st = tb_model(state, C, rate, period2, 5, False, new[2])
    assert rep == want and st == new


def test_token_bucket_extreme_arguments(tw):
    c = tw.c
    big_p = 9007199254740  # the largest period the script takes
    rep = tw("RL.TOKENBUCKET", "b", MAX, MAX, big_p, "COST", MAX)
    assert rep == [1, MAX, 0, 0, big_p]
    st = tb_state(c, "b")
    assert st[:2] == (0, 0)
    assert c.pttl("b") <= big_p
    # about a token per us comes back; a DRYRUN for all of them is refused
    args = [MAX, MAX, big_p, "COST", MAX, "DRYRUN"]
    t0, (rep2,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.TOKENBUCKET"], 1, "b", *args))
    lo, _ = tb_model(st, MAX, MAX, big_p, MAX, False, t0)
    hi, _ = tb_model(st, MAX, MAX, big_p, MAX, False, t1)
    assert_between(rep2, lo, hi)
    assert rep2[0] == 0 and rep2[3] > 0 and tb_state(c, "b") == st
    # capacity lowered: tokens are capped at the new capacity
    assert tw("RL.TOKENBUCKET", "k", 10, 1, 3_600_000, "COST", 2) [2] == 8
    assert tw("RL.TOKENBUCKET", "k", 4, 1, 3_600_000, "COST", 0)[2] == 4


def test_token_bucket_clock_stepping_back_counts_as_zero(tw):
    c = tw.c
    P = 60_000 * 1000
    future = now_us(c) + 10**12
    c.hset("b", mapping={"tokens": 2, "frac": P - 1, "ts": future, "scale": P})
    rep = tw("RL.TOKENBUCKET", "b", 5, 1, 60_000)
    want, st = tb_model((2, P - 1, future, P), 5, 1, 60_000, 1, False, future)
    assert rep == want and tb_state(c, "b") == st
    assert st[2] == future  # time never goes backwards in the state


def test_sliding_log_drain_and_retry(tw):
    c = tw.c
    for left in (2, 1, 0):
        assert tw("RL.SLIDINGLOG", "l", 3, 60_000)[:4] == [1, 3, left, 0]
    entries = [(int(s), int(m.split(b":")[1])) for m, s in c.zrange("l", 0, -1, withscores=True) if m != b"#"]
    assert len(entries) == 3 and c.zscore("l", "#") == -3
    t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.SLIDINGLOG"], 1, "l", 3, 60_000, "COST", 2))
    assert_between(rep, log_model(entries, 3, 60_000, 2, False, t0), log_model(entries, 3, 60_000, 2, False, t1))
    assert rep[:3] == [0, 3, 0]


def test_sliding_log_retry_walks_the_window(tw):
    """The retry time is that of the oldest grant whose expiry frees enough:
    100 crafted grants one second apart, with varied units, walked across
    several read batches."""
    c = tw.c
    W_ms = 3_600_000
    now = now_us(c)
    rng = random.Random(3)
    entries = [(now - 200_000_000 + j * 1_000_000, rng.randint(1, 5)) for j in range(100)]
    total = sum(u for _, u in entries)
    c.zadd("l", {"#": -total, **{f"{t}:{u}": t for t, u in entries}})
    for cost in (1, 7, total // 2, total - 1, total):
        t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.SLIDINGLOG"], 1, "l", total, W_ms, "COST", cost))
        lo = log_model(entries, total, W_ms, cost, False, t0)
        hi = log_model(entries, total, W_ms, cost, False, t1)
        assert_between(rep, lo, hi)
        assert rep[0] == 0 and rep[3] > 0
    # a grant trims nothing here (all inside the window), folds nothing, and
    # keeps the running total in "#"
    rep = tw("RL.SLIDINGLOG", "l", total + 5, W_ms, "COST", 3, "PARTIAL")
    assert rep[:3] == [3, total + 5, 2]
    assert c.zscore("l", "#") == -(total + 3) and c.zcard("l") == 102


def test_sliding_log_trims_expired_grants_on_grant_only(tw):
    c = tw.c
    now = now_us(c)
    W_ms = 10_000
    old = [(now - 50_000_000 + j, 1) for j in range(5)]  # long expired
    live = [(now - 1_000_000, 2)]
    c.zadd("l", {"#": -7, **{f"{t}:{u}": t for t, u in old + live}})
    # 2 units in the window, limit 3: COST 2 is refused and trims nothing
    before = dirty(c)
    rep = tw("RL.SLIDINGLOG", "l", 3, W_ms, "COST", 2)
    assert rep[:3] == [0, 3, 1] and dirty(c) == before and c.zcard("l") == 7
    rep = tw("RL.SLIDINGLOG", "l", 3, W_ms, "COST", 1)
    assert rep[:3] == [1, 3, 0]
    members = c.zrange("l", 0, -1, withscores=True)
    assert members[0] == (b"#", -3.0) and len(members) == 3  # "#", live, new
    assert c.pttl("l") <= W_ms


def test_sliding_log_same_time_grants_share_an_entry(tw):
    """After the clock steps back (a grant stored in the future), the newest
    grant time is used as now, and grants at that time fold into one entry."""
    c = tw.c
    future = now_us(c) + 5_000_000_000
    c.zadd("l", {"#": -2, f"{future}:2": future})
    rep = tw("RL.SLIDINGLOG", "l", 10, 1000, "COST", 3)
    assert rep == [1, 10, 5, 0, 1000]
    assert c.zrange("l", 0, -1, withscores=True) == [(b"#", -5.0), (f"{future}:5".encode(), float(future))]


def test_sliding_counter_previous_window_and_retry(tw):
    """A crafted previous window: the weight prev*(W-e)/W, the retry inside
    the window and across into the next one, against the exact model."""
    c = tw.c
    # (limit, window_ms, stored window relative to now's, stored cur, stored prev, cost)
    for limit, W_ms, back, scur, sprev, cost in [
        (10, 60_000, 1, 8, 0, 3),     # last window's 8 become prev
        (10, 60_000, 1, 10, 3, 10),
        (10, 60_000, 2, 10, 10, 10),  # older: both windows are empty again
        (10, 60_000, 0, 1, 8, 9),     # fits once prev's weight is gone
        (10, 60_000, 0, 3, 8, 9),     # fits only well into the next window
        (10, 60_000, 0, 3, 8, 7),
        (MAX, 9007199254740, 0, 1, MAX - 5, 7),  # two-limb weight, widest window
        (MAX, 9007199254740, 0, MAX - 9, MAX, 11),
        (MAX, 4503599627370, 0, MAX - 9, MAX, MAX),
        (10**15, 86_400_000, 0, 10**9, 10**15 - 1, 10**14),
        (10**15, 86_400_000, 1, 10**15 - 1, 0, 10**14),
    ]:
        W = W_ms * 1000
        k = now_us(c) // W
        if k < back:
            continue
        state = ((k - back) * W, scur, sprev)
        c.hset("c", mapping=dict(zip(["win", "cur", "prev"], map(str, state))))
        args = [limit, W_ms, "COST", cost]
        t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.SLIDINGCOUNTER"], 1, "c", *args))
        c.delete("c")
        if t0 // W != k or t1 // W != k:
            continue  # a window began while setting up: the case is void
        lo = sc_model(state, limit, W_ms, cost, False, t0)
        hi = sc_model(state, limit, W_ms, cost, False, t1)
        assert_between(rep, lo, hi)


def test_sliding_counter_clock_back_stays_in_stored_window(tw):
    """A stored window in the future (the clock stepped back): the call is
    evaluated at its start, and the waits count the gap from the real clock."""
    c = tw.c
    W = 60_000_000
    future = (now_us(c) // W + 1000) * W
    for win in (future, future + 12_345_678):  # the second: written under another window_ms
        c.hset("c", mapping={"win": win, "cur": 3, "prev": 4})
        for cost in (2, 5, 11):
            args = [10, 60_000, "COST", cost, "DRYRUN"]
            t0, (rep,), t1 = timed(c, lambda p: p.evalsha(tw.sha["RL.SLIDINGCOUNTER"], 1, "c", *args))
            assert_between(rep, sc_model((win, 3, 4), 10, 60_000, cost, False, t0),
                           sc_model((win, 3, 4), 10, 60_000, cost, False, t1))
        rep = tw("RL.SLIDINGCOUNTER", "c", 10, 60_000, "COST", 2)
        assert rep[:4] == sc_model((win, 3, 4), 10, 60_000, 2, False, win)[:4] == [1, 10, 1, 0]
        assert rep[4] >= (2 * W - win % W + win - now_us(c)) // 1000
        assert c.hgetall("c") == {b"win": str(win).encode(), b"cur": b"5", b"prev": b"4"}


@pytest.mark.parametrize("cmd", CMDS)
def test_partial_cost_zero_and_impossible_cost(tw, cmd):
    c = tw.c
    lim = [5, 1, 3_600_000] if cmd == "RL.TOKENBUCKET" else [5, 3_600_000]
    call = lambda *o: tw(cmd, "k", *lim, *o)  # noqa: E731
    # COST 0 on a fresh key: granted, reports the state, creates nothing
    before = dirty(c)
    r0 = call("COST", 0)
    assert r0[:4] == [1, 5, 5, 0] and r0[4] == 0
    assert call("COST", 0, "PARTIAL")[0] == 0  # PARTIAL: units granted
    assert not c.exists("k") and dirty(c) == before
    # PARTIAL takes what is there
    assert call("COST", 3)[:3] == [1, 5, 2]
    r = call("PARTIAL", "COST", 4)
    assert r[:3] == [2, 5, 0] and r[3] > 0
    # COST above the limit can never be granted: -1, nothing written
    before = dirty(c)
    r = call("COST", 6)
    assert r[0] == 0 and r[3] == -1 and dirty(c) == before
    assert call("COST", 6, "PARTIAL")[3] == -1


@pytest.mark.parametrize("cmd", CMDS)
def test_dryrun_and_denials_write_nothing(tw, cmd):
    c = tw.c
    lim = [3, 1, 3_600_000] if cmd == "RL.TOKENBUCKET" else [3, 3_600_000]
    before = dirty(c)
    r = tw(cmd, "k", *lim, "DRYRUN")
    assert r[:4] == [1, 3, 2, 0] and not c.exists("k") and dirty(c) == before
    # DRYRUN answers what the call would: compare with the real call
    r_dry = tw(cmd, "k", *lim, "dryrun", "COST", 2)
    r_real = tw(cmd, "k", *lim, "COST", 2)
    assert r_dry[:4] == r_real[:4] and abs(r_dry[4] - r_real[4]) <= 1_000
    dump, ttl = c.dump("k"), c.pttl("k")
    assert ttl > 0
    before = dirty(c)
    for opts in (["DRYRUN"], ["COST", 2], ["COST", 5], ["COST", 0], ["COST", 2, "DRYRUN", "PARTIAL"]):
        tw(cmd, "k", *lim, *opts)
    assert c.dump("k") == dump and dirty(c) == before and 0 < c.pttl("k") <= ttl
    # a grant is a write
    tw(cmd, "k", *lim)
    assert dirty(c) > before


@pytest.mark.parametrize("cmd", CMDS)
def test_ttl_is_reset_after_and_key_vanishes_when_fresh(tw, cmd):
    c = tw.c
    lim = [2, 1, 300] if cmd == "RL.TOKENBUCKET" else [2, 300]
    t0, (r,), _ = timed(c, lambda p: p.evalsha(tw.sha[cmd], 1, "k", *lim))
    ttl = c.pttl("k")
    assert 0 < ttl <= r[4]
    wait_until(lambda: not c.exists("k"), timeout=10, what="key to expire")
    # the key was gone exactly because the limiter was fresh again
    r = tw(cmd, "k", *lim, "DRYRUN", "COST", 2)
    assert r[:4] == [1, 2, 0, 0]
    assert tw(cmd, "k", *lim, "COST", 0)[4] == 0


def test_numbers_as_the_module_reads_them(tw):
    """1 to 16 ASCII digits, leading zeros allowed."""
    assert tw("RL.SLIDINGLOG", "a", "0000000000000005", "060000", "COST", "0002")[:3] == [1, 5, 3]
    assert tw("RL.SLIDINGLOG", "a", "9007199254740991", 60_000, "COST", "0")[:3] == [1, MAX, MAX - 2]


def test_options_any_order_any_case(tw):
    a = tw("RL.SLIDINGLOG", "a", 5, 60_000, "dryrun", "cost", "2", "Partial")
    b = tw("RL.SLIDINGLOG", "b", 5, 60_000, "PARTIAL", "DRYRUN", "COST", "2")
    assert a == b == [2, 5, 3, 0, 60_000]


ARG_ERRORS = {
    "RL.TOKENBUCKET": [
        ([0, 1, 1000], "capacity"), (["-1", 1, 1000], "capacity"), (["x", 1, 1000], "capacity"),
        ([2**53, 1, 1000], "capacity"), (["1.5", 1, 1000], "capacity"), (["", 1, 1000], "capacity"),
        ([" 1", 1, 1000], "capacity"), (["+1", 1, 1000], "capacity"), (["1 ", 1, 1000], "capacity"),
        (["00000000000000001", 1, 1000], "capacity"),
        ([1, 0, 1000], "rate"), ([1, "1e3", 1000], "rate"), ([1, 1, 0], "period_ms"),
        ([1, 1, "99999999999999999999"], "period_ms"),
    ],
    "RL.SLIDINGLOG": [
        ([0, 1000], "limit"), ([2**53, 1000], "limit"), ([1, 0], "window_ms"), ([1, "-5"], "window_ms"),
    ],
    "RL.SLIDINGCOUNTER": [
        ([0, 1000], "limit"), (["ten", 1000], "limit"), ([1, 0], "window_ms"), ([1, 2**53], "window_ms"),
    ],
}


@pytest.mark.parametrize("cmd", CMDS)
def test_errors(tw, cmd):
    c = tw.c
    lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
    c.set("str", "x")
    call = lambda *a: tw(cmd, "k", *a)  # noqa: E731
    assert err_of(call, *lim[:-1]) == f"wrong number of arguments for '{cmd}' command"
    assert err_of(call) == f"wrong number of arguments for '{cmd}' command"
    for args, arg in ARG_ERRORS[cmd]:
        lo = 0 if arg == "cost" else 1
        assert err_of(call, *args) == f"{arg} must be an integer between {lo} and {MAX}", args
    for bad in ("-1", "x", str(2**53), "1.0"):
        assert err_of(call, *lim, "COST", bad) == f"COST must be an integer between 0 and {MAX}"
    for opts in (["FOO"], ["COST"], ["COST", 1, "COST", 1], ["PARTIAL", "partial"],
                 ["DRYRUN", "DRYRUN"], ["COST", 1, "x"], [""]):
        assert err_of(call, *lim, *opts) == "syntax error", opts
    # the wrong number of keys
    assert "exactly 1 key" in err_of(c.evalsha, tw.sha[cmd], 0, *lim)
    assert "exactly 1 key" in err_of(c.evalsha, tw.sha[cmd], 2, "a", "b", *lim)
    # another type, including another twin's key
    other = {"RL.TOKENBUCKET": "RL.SLIDINGCOUNTER", "RL.SLIDINGCOUNTER": "RL.TOKENBUCKET",
             "RL.SLIDINGLOG": "RL.TOKENBUCKET"}[cmd]
    tw(other, "o", *([5, 1, 1000] if other == "RL.TOKENBUCKET" else [5, 1000]))
    before = dirty(c)
    for key in ("str", "o"):
        assert err_of(tw, cmd, key, *lim).startswith("WRONGTYPE"), key
    assert dirty(c) == before and not c.exists("k")
    # the error code is ERR (redis-py strips it), for a raw client
    assert raw_reply(c.port, "EVALSHA", tw.sha[cmd], 1, "k", *lim, "BAD") == "-ERR syntax error"


def test_arguments_beyond_the_exact_range_are_refused(tw):
    c = tw.c
    e = err_of(tw, "RL.TOKENBUCKET", "k", 1, 1, 9007199254741)
    assert e.startswith("period_ms is beyond the exact range of the Lua script")
    # a full refill must take < 2^53 us: capacity 2^53-1 at one token a second does not
    e = err_of(tw, "RL.TOKENBUCKET", "k", MAX, 1, 1000)
    assert e.startswith("capacity*period_ms*1000/rate is beyond the exact range")
    assert tw("RL.TOKENBUCKET", "k", MAX, 2 * 10**6, 1000, "DRYRUN")[0] == 1  # 2^52 us: fine
    e = err_of(tw, "RL.SLIDINGLOG", "k", 1, 9007199254741)
    assert e.startswith("window_ms is beyond the exact range of the Lua script")
    assert tw("RL.SLIDINGLOG", "k", 1, 9007199254740, "DRYRUN")[0] == 1
    e = err_of(tw, "RL.SLIDINGCOUNTER", "k", 1, 9007199254741)
    assert e.startswith("window_ms is beyond the exact range of the Lua script")
    assert tw("RL.SLIDINGCOUNTER", "k", 1, 9007199254740, "DRYRUN")[0] == 1
    assert not c.exists("k")


def test_huge_limits_and_costs(tw):
    c = tw.c
    assert tw("RL.SLIDINGLOG", "l", MAX, 60_000, "COST", MAX - 1) == [1, MAX, 1, 0, 60_000]
    r = tw("RL.SLIDINGLOG", "l", MAX, 60_000, "COST", 2, "PARTIAL")
    assert r[:3] == [1, MAX, 0] and 0 < r[3] <= 60_000
    assert c.zscore("l", "#") == -MAX
    r = tw("RL.SLIDINGLOG", "l", MAX, 60_000, "COST", MAX)
    assert r[:3] == [0, MAX, 0] and 0 < r[3] <= 60_000
    r = tw("RL.SLIDINGCOUNTER", "c", MAX, 60_000, "COST", MAX)
    assert r[:4] == [1, MAX, 0, 0]
    r = tw("RL.SLIDINGCOUNTER", "c", MAX, 60_000, "COST", MAX, "DRYRUN")
    assert r[:3] == [0, MAX, 0] and r[3] > 0
    assert c.hget("c", "cur") == str(MAX).encode()


def test_replicated_by_effects(server_factory):
    master = server_factory(module=False)
    replica = server_factory(module=False)
    m, rp = master.client(), replica.client()
    m.config_set("repl-diskless-sync-delay", 0)  # the initial sync starts at once
    rp.replicaof("127.0.0.1", master.port)
    wait_until(lambda: rp.info("replication").get("master_link_status") == "up", what="replica link")
    tw = Twins(m)
    rng = random.Random(11)
    keys = []
    lims = {"RL.TOKENBUCKET": [10, 3, 60_000], "RL.SLIDINGLOG": [10, 60_000], "RL.SLIDINGCOUNTER": [10, 60_000]}
    for i in range(400):
        cmd = CMDS[i % 3]
        key = f"{cmd}:{i % 7}"
        keys.append(key)
        opts = rng.choice([[], ["COST", rng.randint(0, 12)], ["PARTIAL", "COST", 4], ["DRYRUN"],
                           ["REFUND", rng.randint(1, 4)]])
        tw(cmd, key, *lims[cmd], *opts)
        if i % 4 == 0:  # RL.MULTI over keys the single calls use too
            picked = rng.sample(range(7), 2)
            mk = [f"{CMDS[(i + j) % 3]}:{k}" for j, k in enumerate(picked)]
            keys += mk
            args = [x for j in range(2) for x in [CMDS[(i + j) % 3][3:], *lims[CMDS[(i + j) % 3]],
                                                  "WEIGHT", j + 1]]
            tw("RL.MULTI", mk, *args, *rng.choice([[], ["COST", 3, "PARTIAL"], ["REFUND", 2]]))
    wait_until(lambda: rp.info("replication")["master_repl_offset"] == m.info("replication")["master_repl_offset"],
               what="replica to catch up")
    for key in set(keys):
        if not m.exists(key):
            continue
        assert m.execute_command("DEBUG", "DIGEST-VALUE", key) == rp.execute_command("DEBUG", "DIGEST-VALUE", key)
        assert rp.pttl(key) > 0
    m.close()
    rp.close()


def test_cluster_mode_with_hash_tags(server_factory):
    s = server_factory(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"], module=False)
    c = s.client()
    c.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    wait_until(lambda: c.execute_command("CLUSTER", "INFO").decode().find("cluster_state:ok") >= 0,
               what="cluster ok")
    tw = Twins(c)
    assert tw("RL.TOKENBUCKET", "rl:{tenant}:a", 2, 1, 1000)[0] == 1
    assert tw("RL.SLIDINGLOG", "rl:{tenant}:b", 2, 1000)[0] == 1
    assert tw("RL.SLIDINGCOUNTER", "rl:{tenant}:c", 2, 1000)[0] == 1
    # several keys: one slot (a hash tag) or the server refuses
    limits = ["TOKENBUCKET", 2, 1, 1000, "SLIDINGLOG", 2, 1000]
    assert tw("RL.MULTI", ["rl:{tenant}:a", "rl:{tenant}:b"], *limits)[:2] == [1, 2]
    with pytest.raises(redis.ResponseError, match="^CROSSSLOT"):
        tw("RL.MULTI", ["rl:{tenant}:a", "rl:{other}:b"], *limits)
    c.close()


# --------------------------------------------------------------------------
# REFUND and RL.MULTI (multi.lua), against the models (integration/models.py)
# --------------------------------------------------------------------------

ALGS = ["TOKENBUCKET", "SLIDINGLOG", "SLIDINGCOUNTER"]


def twin_state(c, alg, key):
    """A twin's key as the models' state."""
    if alg == "TOKENBUCKET":
        return tb_state(c, key)
    if alg == "SLIDINGLOG":
        entries = sorted((int(sc), int(m.split(b":")[1])) for m, sc in c.zrange(key, 0, -1, withscores=True)
                         if m != b"#")
        return entries or None
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
    k = now_us(c) // W
    c.hset("c", mapping={"win": k * W, "cur": 3, "prev": 4})
    rep = tw("RL.SLIDINGCOUNTER", "c", 10, 3_600_000, "REFUND", 5)
    if now_us(c) // W != k:
        pytest.skip("a window began during the test")
    assert rep[0] == 5 and twin_state(c, "SLIDINGCOUNTER", "c") == (k * W, 0, 2)
    assert tw("RL.SLIDINGCOUNTER", "c", 10, 3_600_000, "REFUND", 5)[:3] == [2, 10, 10]
    assert not c.exists("c")


@pytest.mark.parametrize("cmd", CMDS)
def test_refund_errors(tw, cmd):
    c = tw.c
    lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
    tw(cmd, "k", *lim, "COST", 2)
    before = (dirty(c), c.dump("k"))
    for opts in (["REFUND", 1, "COST", 1], ["COST", 1, "REFUND", 1], ["REFUND", 1, "PARTIAL"],
                 ["DRYRUN", "REFUND", 1], ["REFUND", 1, "REFUND", 1], ["REFUND"],
                 ["COST", 1, "REFUND", 0], ["REFUND", 1, "COST", "x"]):
        assert err_of(tw, cmd, "k", *lim, *opts) == "syntax error", opts
    for bad in ("0", "-1", "x", str(2**53)):
        assert err_of(tw, cmd, "k", *lim, "REFUND", bad) == f"REFUND must be an integer between 1 and {MAX}"
    assert (dirty(c), c.dump("k")) == before


def random_limits(rng, n, big=False):
    """n random limits (algorithm, parameters, weight) whose states do not
    change by themselves while a test runs (nothing refills or expires);
    `big`: limits and weights far beyond double-digit counts."""
    out = []
    for _ in range(n):
        alg = rng.choice(ALGS)
        if big:
            lim = rng.choice([10**8, 10**12, 2**40 + 1, 10**15])
            params = [min(lim, 10**8), 1, 60_000] if alg == "TOKENBUCKET" else [lim, 86_400_000]
            w = rng.choice([1, 7, 10**3, 10**6])
        else:
            lim = rng.choice([1, 3, 10, 50, 1000])
            params = [lim, rng.choice([1, 2]), rng.choice([3_600_000, 86_400_000])] if alg == "TOKENBUCKET" \
                else [lim, rng.choice([3_600_000, 86_400_000])]
            w = rng.choice([1, 1, 2, 3])
        out.append((alg, params, w))
    return out


def limit_args(limits, rng=None):
    args = []
    for alg, params, w in limits:
        args += [alg if rng is None else rng.choice([alg, alg.lower()]), *params]
        if w != 1 or (rng and rng.random() < 0.2):
            args += ["WEIGHT", w]
    return args


def random_multi_opts(rng, limits):
    """(option words, cost, partial, dryrun, refund)."""
    top = max(p[0] // w for _, p, w in limits)
    cap = MAX // max(w for _, _, w in limits)  # COST (REFUND) * WEIGHT <= 2^53 - 1
    if rng.random() < 0.2:
        n = min(cap, rng.choice([1, 2, 5, rng.randint(1, 60), rng.randint(1, top + 2)]))
        return ["REFUND", n], 1, False, False, n
    cost = min(cap, rng.choice([0, 1, 1, 1, 2, 3, rng.randint(0, top + 2), top // 3 + 1]))
    partial, dryrun = rng.random() < 0.3, rng.random() < 0.15
    groups = [["COST", cost]] if cost != 1 or rng.random() < 0.3 else []
    groups += [["PARTIAL"]] * partial + [["DRYRUN"]] * dryrun
    rng.shuffle(groups)
    return [x for g in groups for x in g], cost, partial, dryrun, None


def agree_multi(rep, want, tol, ctx):
    """The twin's seven elements against the model's: integers exact,
    durations within `tol` ms. When the call was denied, two limits whose
    waits are within the tolerance may bind either way."""
    def close(a, b):
        return a == b or (a > 0 and b > 0 and abs(a - b) <= tol)

    assert len(rep) == 7 and len(rep[6]) == len(want[6]), ctx
    for r, w in zip(rep[6], want[6]):
        assert r[:3] == w[:3] and close(r[3], w[3]) and close(r[4], w[4]), (r, w, ctx)
    assert rep[0] == want[0] and close(rep[3], want[3]), ctx
    b = rep[5]
    if b != want[5]:
        assert rep[3] > 0 and want[3] > 0 and close(rep[6][b][3], want[6][want[5]][3]), ctx
    assert rep[1:3] == rep[6][b][1:3] and rep[4] == rep[6][b][4], ctx


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


MULTI_ERRORS = [  # (ARGV, KEYS, the error), in the module's wording
    ([], [], "wrong number of arguments for 'RL.MULTI' command"),
    (["SLIDINGLOG", 5], ["a"], "wrong number of arguments for 'RL.MULTI' command"),
    (["SLIDINGLOG", 5, 1000] * 17, [f"k{i}" for i in range(17)], "numkeys must be an integer between 1 and 16"),
    (["TOKENBUCKET", 5, 1, 1000], ["a", "b"], "the number of limits must equal numkeys"),
    (["SLIDINGLOG", 5, 1000] * 2, ["a"], "the number of limits must equal numkeys"),
    (["COST", 1, "X"], ["a"], "the number of limits must equal numkeys"),
    (["SLIDINGLOG", 5, 1000] * 2, ["a", "a"], "every key must be distinct"),
    (["FIXEDWINDOW", 5, 1000], ["a"], "syntax error"),
    (["SLIDINGLOG", 5], ["a", "b"], "syntax error"),
    (["SLIDINGLOG", 0], ["a", "b"], f"limit must be an integer between 1 and {MAX}"),
    (["SLIDINGLOG", 0, 1000], ["a"], f"limit must be an integer between 1 and {MAX}"),
    (["TOKENBUCKET", 5, "x", 1000], ["a"], f"rate must be an integer between 1 and {MAX}"),
    (["SLIDINGLOG", 5, 1000, "WEIGHT", 0], ["a"], f"WEIGHT must be an integer between 1 and {MAX}"),
    (["SLIDINGLOG", 5, 1000, "WEIGHT"], ["a"], "syntax error"),
    (["SLIDINGLOG", 5, 1000, "WEIGHT", 3, "COST", 2**52], ["a"], f"COST * WEIGHT must not exceed {MAX}"),
    (["SLIDINGLOG", 5, 1000, "WEIGHT", 3, "REFUND", 2**52], ["a"], f"REFUND * WEIGHT must not exceed {MAX}"),
    (["SLIDINGLOG", 5, 1000, "COST", 1, "REFUND", 1], ["a"], "syntax error"),
    (["SLIDINGLOG", 5, 1000, "REFUND", 1, "COST", "x"], ["a"], "syntax error"),
    (["SLIDINGLOG", 5, 1000, "PARTIAL", "PARTIAL"], ["a"], "syntax error"),
    (["SLIDINGLOG", 5, 1000, "COST", -1], ["a"], f"COST must be an integer between 0 and {MAX}"),
    (["SLIDINGLOG", 5, 9007199254741], ["a"], "window_ms is beyond the exact range of the Lua script"),
]


def test_multi_errors_change_nothing(tw):
    c = tw.c
    for k, alg, lim in (("a", "SLIDINGLOG", [5, 1000]), ("b", "SLIDINGLOG", [5, 1000]),
                        ("t", "TOKENBUCKET", [5, 1, 1000]), ("c", "SLIDINGCOUNTER", [5, 1000])):
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


# --------------------------------------------------------------------------
# Differential: module vs twin on the same server
# --------------------------------------------------------------------------

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

    def agree(self, rm, rt, exact=True):
        ctx = self.log[-1:]
        if isinstance(rm, Exception) or isinstance(rt, Exception):
            assert isinstance(rm, Exception) and isinstance(rt, Exception), ctx
            return
        tol = self.D * self.stretch / 1000 + 1
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
}


@pytest.mark.parametrize("cmd", CMDS)
@pytest.mark.parametrize("seed", range(16))
def test_differential_random_sequences(both_modes, cmd, seed):
    c, tw = both_modes
    rng = random.Random(seed * 31 + CMDS.index(cmd))
    lim = rng.choice([1, 3, 10, 50, 10**8 if cmd == "RL.TOKENBUCKET" else 10**15])
    params = SEQ_PARAMS[cmd](rng, lim)
    for attempt in range(3):
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
        if cmd != "RL.SLIDINGCOUNTER":
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
    # each refuses the other's keys (and strings) with WRONGTYPE
    c.set("s", "x")
    for cmd in CMDS:
        lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
        c.execute_command(cmd, f"m:{cmd}", *lim)
        tw(cmd, f"t:{cmd}", *lim)
    for cmd in CMDS:
        lim = [5, 1, 1000] if cmd == "RL.TOKENBUCKET" else [5, 1000]
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
    while True:
        t0, rm, rt, t1 = pair.call(limit, W_ms, "COST", 2, "DRYRUN")
        if t0 // W == k and t1 // W == k:
            pair.agree(rm, rt)  # still the filled window: exact
            exact += 1
        elif t0 // W == k + 1 and t1 // W == k + 1:
            w0 = ceil_div(10 * (W - (t0 - (k + 1) * W)), W)
            w1 = ceil_div(10 * (W - (t1 - (k + 1) * W)), W)
            pair.agree(rm, rt, exact=(w0 == w1))
            exact += w0 == w1
            if w0 == w1:
                assert rm[:3] == sc_model(state, limit, W_ms, 2, False, t0)[:3]
        elif t0 // W >= k + 2:
            pair.agree(rm, rt)
            break
        else:
            pair.agree(rm, rt, exact=False)  # the pair straddled a boundary
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
        pair = Pair(c, tw, cmd, f"refund:{seed}:{attempt}")
        for i in range(50):
            if rng.random() < 0.25:
                opts = ["REFUND", rng.choice([1, 2, lim, rng.randint(1, 2 * lim + 2)])]
            else:
                opts = random_opts(rng, params[0])
            pair.check(*params, *opts)
        if cmd != "RL.SLIDINGCOUNTER":
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
        c.execute_command("RL.TOKENBUCKET", "m:tb", 5, 1, 1000)
        tw("RL.TOKENBUCKET", "t:tb", 5, 1, 1000)
        for args in (["SLIDINGLOG", 5, 1000, "SLIDINGLOG", 5, 1000],
                     ["SLIDINGLOG", 5, 1000, "SLIDINGCOUNTER", 5, 1000, "REFUND", 1]):
            with pytest.raises(redis.ResponseError, match="^WRONGTYPE"):
                call([f"{prefix}:x", f"{prefix}:tb"], *args)
        assert not c.exists(f"{prefix}:x")
