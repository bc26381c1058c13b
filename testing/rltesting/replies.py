"""What the tests send and check: the four commands' arguments, the
options, reply invariants, INFO fields and keyspace digests."""
import json
import math
import time


def module_commands():
    """(command, limit-arguments) for each of the four commands."""
    return [
        ("RL.TOKENBUCKET", lambda limit, ms: [limit, limit, ms]),
        ("RL.SLIDINGLOG", lambda limit, ms: [limit, ms]),
        ("RL.SLIDINGCOUNTER", lambda limit, ms: [limit, ms]),
        ("RL.FIXEDWINDOW", lambda limit, ms: [limit, ms]),
    ]


# Parameters under which no unit ever comes back in a test's lifetime (the
# next token, window or log entry is ~285,000 years away): replies are then
# time-independent and grants can be counted exactly.
HUGE = (1 << 53) - 1
NEVER = {
    "RL.TOKENBUCKET": lambda limit: [limit, 1, HUGE],
    "RL.SLIDINGLOG": lambda limit: [limit, HUGE],
    "RL.SLIDINGCOUNTER": lambda limit: [limit, HUGE],
    "RL.FIXEDWINDOW": lambda limit: [limit, HUGE],
}
COMMANDS = ("RL.TOKENBUCKET", "RL.SLIDINGLOG", "RL.SLIDINGCOUNTER", "RL.FIXEDWINDOW")
TYPE_NAMES = {
    "RL.TOKENBUCKET": "rl-tokbkt",
    "RL.SLIDINGLOG": "rl-slilog",
    "RL.SLIDINGCOUNTER": "rl-slicnt",
    "RL.FIXEDWINDOW": "rl-fixwin",
}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def options(cost=None, partial=False, dryrun=False, refund=None):
    """The options every command takes, as arguments (None/False: absent)."""
    args = [] if cost is None else ["COST", cost]
    if partial:
        args.append("PARTIAL")
    if dryrun:
        args.append("DRYRUN")
    if refund is not None:
        args += ["REFUND", refund]
    return args


def rl(client, cmd, key, params, cost=None, partial=False, dryrun=False):
    """One rate-limit call; returns the five integers, checked for shape."""
    reply = client.execute_command(cmd, key, *params, *options(cost, partial, dryrun))
    check_reply(reply, cost if cost is not None else 1, partial, params[0])
    return reply


def check_reply(reply, cost, partial, limit):
    """Invariants every reply keeps, whatever the state."""
    assert isinstance(reply, list) and len(reply) == 5, reply
    assert all(isinstance(x, int) for x in reply), reply
    allowed, lim, remaining, retry, reset = reply
    assert lim == limit, reply
    assert 0 <= remaining <= limit, reply
    assert reset >= 0, reply
    if partial:
        assert 0 <= allowed <= cost, reply
        full = allowed == cost
    else:
        assert allowed in (0, 1), reply
        full = allowed == 1
    if full:
        assert retry == 0, reply
    elif cost > limit:
        assert retry == -1, reply
    else:
        assert retry > 0, reply


def granted_units(reply, cost, partial):
    """Units a reply says were granted."""
    if partial:
        return reply[0]
    return cost if reply[0] == 1 else 0


def info_field(client, field, section=None):
    """One field of INFO (as returned by redis-py: int, str, ...)."""
    return client.info(section or "everything").get(field)


def keyspace(client, pattern="*"):
    """{key: (type, DEBUG DIGEST-VALUE, PEXPIRETIME)} for every key."""
    out = {}
    for k in client.scan_iter(match=pattern, count=1000):
        t = _s(client.type(k))
        if t == "none":
            continue
        d = _s(client.execute_command("DEBUG", "DIGEST-VALUE", k)[0])
        out[_s(k)] = (t, d, client.execute_command("PEXPIRETIME", k))
    return out


def db_digest(client):
    """DEBUG DIGEST: the whole dataset, values and expiries."""
    return _s(client.execute_command("DEBUG", "DIGEST"))


def load_json(path):
    with open(path) as f:
        return json.load(f)


def least_memory_usage(c, key, malloc):
    """MEMORY USAGE of `key`. A libc-malloc build (`malloc`, as
    proc.SERVER.malloc says: the Valkey wheels) counts each allocation's
    malloc_usable_size, which glibc rounds up by up to 24 bytes when it
    reuses a slightly larger free chunk, so the same value can read 16 bytes
    more after a DEBUG RELOAD than before. There the smallest reading over
    fresh copies (same name length, same TTL) is the size without that
    slack; jemalloc's size classes need no such care."""
    best = c.memory_usage(key, samples=0)
    if not malloc.startswith("libc"):
        return best
    copies = ["~%0*d" % (len(key) - 1, i) for i in range(16)]
    for name in copies:
        c.copy(key, name, replace=True)
        best = min(best, c.memory_usage(name, samples=0))
    c.delete(*copies)
    return best


def cached_time(r):
    """Whether the module reads the command's cached time (Redis 7.2+ and
    Valkey: every call of one MULTI sees the same instant), or its own clock
    per call (Redis 7.0)."""
    info = r.info("server")
    major, minor = (int(x) for x in info["redis_version"].split(".")[:2])
    return "valkey_version" in info or (major, minor) >= (7, 2)


class ClockSlack:
    """How far apart two calls made back to back in one transaction may
    answer a field that counts down with time (a wait, a reset, an expiry).

    Where every call of a MULTI sees the same instant (cached_time) the
    only difference is the rounding: 1 ms. Where the module reads its own
    clock per call (Redis 7.0), the two calls are as far apart as the
    server took between them, and a stored instant (the oldest entry, the
    last update) as far apart as in the transaction that wrote it: each at
    most that transaction's round trip, as the client measured it. So the
    slack is 1 ms plus twice the longest round trip so far. Run the
    transactions through execute() so it sees them."""

    def __init__(self, r):
        self.cached = cached_time(r)
        self.longest_ms = 0

    def execute(self, pipe, **kw):
        t0 = time.perf_counter()
        out = pipe.execute(**kw)
        self.longest_ms = max(self.longest_ms, math.ceil((time.perf_counter() - t0) * 1000))
        return out

    def close(self, u, v):
        """u and v are equal, or both positive and within the slack."""
        slack = 1 if self.cached else 1 + 2 * self.longest_ms
        return u == v or (u > 0 and v > 0 and abs(u - v) <= slack)
