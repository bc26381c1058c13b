"""What the Lua twin suites share (test_lua_twins.py, test_lua_twins_multi.py,
test_lua_twins_differential.py): the generated scripts, the Twins caller
(EVALSHA or FCALL), the plain-server and twin fixtures, the server clock,
raw replies and the twins' states read back for the models."""
import os
import socket

import pytest
import redis

from rltesting.proc import ROOT


LUA_DIR = os.path.join(ROOT, "lua")
MAX = 2**53 - 1
FILES = {
    "RL.TOKENBUCKET": "tokenbucket.lua",
    "RL.SLIDINGLOG": "slidinglog.lua",
    "RL.SLIDINGCOUNTER": "slidingcounter.lua",
    "RL.FIXEDWINDOW": "fixedwindow.lua",
}
CMDS = list(FILES)
# RL.CONCURRENCY's twin is loaded with the others; its grammar is not the
# rate limits' (CMDS), so its own suite tests it
# (test_lua_twins_concurrency.py).
SCRIPTS = {**FILES, "RL.CONCURRENCY": "concurrency.lua", "RL.MULTI": "multi.lua"}


def generated(name):
    with open(os.path.join(LUA_DIR, name)) as f:
        return f.read()


def source(cmd):
    return generated(SCRIPTS[cmd])


FUNCTIONS = {"RL.TOKENBUCKET": "rl_tokenbucket", "RL.SLIDINGLOG": "rl_slidinglog",
             "RL.SLIDINGCOUNTER": "rl_slidingcounter", "RL.FIXEDWINDOW": "rl_fixedwindow",
             "RL.CONCURRENCY": "rl_concurrency", "RL.MULTI": "rl_multi"}


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


def fw_state(c, key):
    h = c.hgetall(key)
    if not h:
        return None
    return tuple(int(h[k]) for k in (b"start", b"count"))


def assert_between(reply, lo, hi):
    """Each field of `reply` lies between the models at T0 and T1."""
    for i, (v, a, b) in enumerate(zip(reply, lo, hi)):
        assert min(a, b) <= v <= max(a, b), (i, reply, lo, hi)


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
    "RL.FIXEDWINDOW": [
        ([0, 1000], "limit"), ([2**53, 1000], "limit"), (["1e3", 1000], "limit"), ([1, 0], "window_ms"),
        ([1, 2**53], "window_ms"), ([1, "-5"], "window_ms"),
    ],
}


ALGS = ["TOKENBUCKET", "SLIDINGLOG", "SLIDINGCOUNTER", "FIXEDWINDOW"]
# A fixed window of 2^40 ms (about 34.8 years) on the epoch: the current
# one began in 2004 and ends in 2039, so it never rolls over in a test.
FW_WINDOW_MS = 2**40


def random_limits(rng, n, big=False):
    """n random limits (algorithm, parameters, weight) whose states do not
    change by themselves while a test runs (nothing refills or expires);
    `big`: limits and weights far beyond double-digit counts."""
    out = []
    for _ in range(n):
        alg = rng.choice(ALGS)
        if big:
            lim = rng.choice([10**8, 10**12, 2**40 + 1, 10**15])
            params = [min(lim, 10**8), 1, 60_000] if alg == "TOKENBUCKET" \
                else [lim, FW_WINDOW_MS] if alg == "FIXEDWINDOW" else [lim, 86_400_000]
            w = rng.choice([1, 7, 10**3, 10**6])
        else:
            lim = rng.choice([1, 3, 10, 50, 1000])
            params = [lim, rng.choice([1, 2]), rng.choice([3_600_000, 86_400_000])] if alg == "TOKENBUCKET" \
                else [lim, FW_WINDOW_MS] if alg == "FIXEDWINDOW" else [lim, rng.choice([3_600_000, 86_400_000])]
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


MULTI_ERRORS = [  # (ARGV, KEYS, the error), in the module's wording
    ([], [], "wrong number of arguments for 'RL.MULTI' command"),
    (["SLIDINGLOG", 5], ["a"], "wrong number of arguments for 'RL.MULTI' command"),
    (["SLIDINGLOG", 5, 1000] * 17, [f"k{i}" for i in range(17)], "numkeys must be an integer between 1 and 16"),
    (["TOKENBUCKET", 5, 1, 1000], ["a", "b"], "the number of limits must equal numkeys"),
    (["SLIDINGLOG", 5, 1000] * 2, ["a"], "the number of limits must equal numkeys"),
    (["COST", 1, "X"], ["a"], "the number of limits must equal numkeys"),
    (["SLIDINGLOG", 5, 1000] * 2, ["a", "a"], "every key must be distinct"),
    (["FIXEDWINDOWS", 5, 1000], ["a"], "syntax error"),
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
    (["SLIDINGLOG", 5, 1000, "CHECK", "REFUND", 1], ["a"], "syntax error"),
    (["SLIDINGLOG", 5, 1000, "SHADOW", "REFUND", 1, "TOKENBUCKET"], ["a"], "the number of limits must equal numkeys"),
    (["TOKENBUCKET", 5, 1, 1000, "SHADOW", "CHECK"], ["a"], "syntax error"),
    (["TOKENBUCKET", 5, 1, 1000, "CHECK", "CHECK"], ["a"], "syntax error"),
    (["TOKENBUCKET", 5, 1, 1000, "CHECK", "WEIGHT", 2], ["a"], "syntax error"),
]
