"""What the sync and asyncio clients share: the calls they send, how replies
become Decisions, which errors count as Redis being unavailable, and the
Lua scripts shipped in the package."""
import hashlib
from importlib import resources

import redis

from .decision import Decision, Part
from .policies import MAX, AllOf, Policy

SCRIPTS = ("tokenbucket", "slidinglog", "slidingcounter", "multi")
MODULE, LUA, LOCAL, PANIC = "module", "lua", "local", "panic"


class RateLimitError(Exception):
    """Redis refused a call for a reason that is not an outage (a key of
    another type, bad arguments): a bug to fix, not a reason to panic."""


class UnsupportedError(RateLimitError):
    """The backend lacks what this call needs (RL.MULTI, REFUND)."""


def script_text(name):
    try:
        return (resources.files("redis_ratelimit") / "lua" / f"{name}.lua").read_text()
    except FileNotFoundError:
        return None


class Scripts:
    """Script texts and their SHA1s, read once from the package."""

    def __init__(self):
        self.text = {}
        self.sha = {}
        for n in SCRIPTS:
            t = script_text(n)
            if t is not None:
                self.text[n] = t
                self.sha[n] = hashlib.sha1(t.encode()).hexdigest()


_SCRIPTS = None


def scripts():
    global _SCRIPTS
    if _SCRIPTS is None:
        _SCRIPTS = Scripts()
    return _SCRIPTS


_FAILURE_PREFIXES = ("BUSY", "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN",
                     "NOREPLICAS", "READONLY", "MISCONF")


def is_outage(exc):
    """True when the error means Redis cannot answer now (down, slow,
    busy, failing over): the breaker counts it and panic limits decide."""
    if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                        redis.exceptions.ClusterError, redis.exceptions.ClusterDownError,
                        redis.exceptions.TryAgainError, redis.exceptions.ReadOnlyError,
                        redis.exceptions.RedisClusterException, OSError, TimeoutError)):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        return str(exc).startswith(_FAILURE_PREFIXES)
    return False


def check_cost(cost, lo=0):
    if type(cost) is not int or not lo <= cost <= MAX:
        raise ValueError(f"cost must be an integer from {lo} to 2^53-1, not {cost!r}")


def options(cost, partial, dry_run):
    opts = [] if cost == 1 else ["COST", cost]
    if partial:
        opts.append("PARTIAL")
    if dry_run:
        opts.append("DRYRUN")
    return opts


def call_for(policy, key, opts):
    """(module command args, (script, keys, argv)) for one call."""
    if isinstance(policy, Policy):
        return ([policy.command, key, *policy.params, *opts],
                (policy.script, [key], [*policy.params, *opts]))
    keys = key
    specs = []
    for p in policy.parts:
        specs += p.multi_spec()
    return (["RL.MULTI", len(keys), *keys, *specs, *opts],
            ("multi", keys, [*specs, *opts]))


def to_decision(reply, policy, cost, partial, source, refund=False):
    if isinstance(policy, Policy):
        a, lim, rem, retry, reset = (int(x) for x in reply)
        granted = a if (partial or refund) else (cost if a == 1 else 0)
        return Decision(refund or granted == cost, granted, lim, rem, retry, reset,
                        policy.name, policy.name, source, (), policy)
    a, lim, rem, retry, reset, b, per = reply
    a, lim, rem, retry, reset, b = int(a), int(lim), int(rem), int(retry), int(reset), int(b)
    granted = a if (partial or refund) else (cost if a == 1 else 0)
    parts = tuple(Part(p.name, *(int(x) for x in r)) for p, r in zip(policy.parts, per))
    return Decision(refund or granted == cost, granted, lim, rem, retry, reset,
                    policy.name, policy.parts[b].name, source, parts, policy)


def panic_decision(buckets, policy, keys, cost, partial, dry_run):
    """A decision from the local panic buckets (source "panic")."""
    res = buckets.decide(keys, cost, [p.weight for p in policy.parts], partial, dry_run)
    if isinstance(policy, Policy):
        u, cap, rem, retry, reset = res[0]
        return Decision(u == cost, u, cap, rem, retry, reset, policy.name, policy.name,
                        PANIC, (), policy)
    g = res[0][0] // policy.parts[0].weight
    parts = tuple(Part(p.name, *r) for p, r in zip(policy.parts, res))
    if g == cost:   # granted: the part with the fewest whole requests left
        b = min(range(len(res)), key=lambda i: (res[i][2] // policy.parts[i].weight, i))
    else:           # denied: the longest wait, -1 counting as longest
        b = max(range(len(res)), key=lambda i: (res[i][3] < 0, res[i][3], -i))
    _, cap, rem, _, reset = res[b]
    retry = 0 if g == cost else (-1 if any(r[3] < 0 for r in res)
                                 else max(1, max(r[3] for r in res)))
    return Decision(g == cost, g, cap, rem, retry, reset, policy.name, policy.parts[b].name,
                    PANIC, parts, policy)


def keys_for(policy, key):
    if isinstance(policy, AllOf):
        return policy.keys(key)
    if not isinstance(key, (str, bytes)):
        raise ValueError(f"key must be a string, not {type(key).__name__}")
    return [key]
