"""Policies (what a limit is) and keys (where its state lives)."""
import re

from redis.crc import key_slot as _crc_slot

MAX = (1 << 53) - 1
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

__all__ = ["Policy", "AllOf", "token_bucket", "sliding_log", "sliding_counter", "all_of",
           "make_key", "key_slot", "CrossSlotError"]


class CrossSlotError(ValueError):
    """The keys of an all_of call cannot share a cluster slot."""


def _int(what, v, lo=1):
    if type(v) is not int or not lo <= v <= MAX:
        raise ValueError(f"{what} must be an integer from {lo} to 2^53-1, not {v!r}")
    return v


def _name(v):
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError(f"policy name {v!r}: 1-64 of A-Z a-z 0-9 . _ -")
    return v


class Policy:
    """One limit: its algorithm, parameters and name.

    `command` is the module command, `script` the Lua twin's name, `params`
    the arguments after the key, `limit` the capacity or limit and
    `window_ms` the window headers report."""

    __slots__ = ("kind", "name", "limit", "window_ms", "params", "weight", "command",
                 "script", "rate", "period_ms", "parts")

    def __init__(self, kind, name, limit, params, window_ms, rate, period_ms, weight=1):
        self.kind = kind
        self.name = name
        self.limit = limit
        self.params = params
        self.window_ms = window_ms
        self.rate = rate              # units regained per period_ms (for panic buckets)
        self.period_ms = period_ms
        self.weight = _int("weight", weight)
        self.command = "RL." + kind.upper()
        self.script = kind
        self.parts = (self,)

    def weighted(self, weight):
        """The same policy counting WEIGHT w units per unit of cost in all_of."""
        return Policy(self.kind, self.name, self.limit, self.params, self.window_ms,
                      self.rate, self.period_ms, weight)

    def multi_spec(self):
        spec = [self.kind.upper(), *self.params]
        if self.weight != 1:
            spec += ["WEIGHT", self.weight]
        return spec

    def __repr__(self):
        return f"<{self.kind} {self.name!r} {self.params}>"


def token_bucket(name, capacity, rate, period_ms):
    """At most `capacity` tokens; `rate` come back every `period_ms`."""
    _name(name)
    _int("capacity", capacity), _int("rate", rate), _int("period_ms", period_ms)
    window = -(-capacity * period_ms // rate)        # an empty bucket fills in this time
    return Policy("tokenbucket", name, capacity, (capacity, rate, period_ms), window,
                  rate, period_ms)


def sliding_log(name, limit, window_ms):
    """Exact: at most `limit` units in any `window_ms`."""
    _name(name)
    _int("limit", limit), _int("window_ms", window_ms)
    return Policy("slidinglog", name, limit, (limit, window_ms), window_ms, limit, window_ms)


def sliding_counter(name, limit, window_ms):
    """Approximate sliding window (two fixed windows, weighted)."""
    _name(name)
    _int("limit", limit), _int("window_ms", window_ms)
    return Policy("slidingcounter", name, limit, (limit, window_ms), window_ms, limit, window_ms)


class AllOf:
    """Several policies on several keys, all or nothing (RL.MULTI)."""

    __slots__ = ("name", "parts", "limit", "window_ms")
    kind = "multi"

    def __init__(self, parts, name):
        self.parts = parts
        self.name = name
        self.limit = min(p.limit for p in parts)
        self.window_ms = max(p.window_ms for p in parts)

    def keys(self, key):
        """The key of each part: `key:name` for a string, else one key per part."""
        if isinstance(key, str):
            keys = [f"{key}:{p.name}" for p in self.parts]
        else:
            keys = list(key)
            if len(keys) != len(self.parts):
                raise ValueError(f"all_of {self.name!r} has {len(self.parts)} policies "
                                 f"but {len(keys)} keys were given")
            if len(set(keys)) != len(keys):
                raise ValueError("the keys of an all_of call must be distinct")
        slots = {key_slot(k) for k in keys}
        if len(slots) != 1:
            raise CrossSlotError(
                f"all_of {self.name!r}: keys {keys} map to different cluster slots; "
                "put the shared part in a hash tag (make_key)")
        return keys

    def __repr__(self):
        return f"<all_of {self.name!r} {list(self.parts)}>"


def all_of(*policies, name=None):
    """All the policies must grant, or none takes anything."""
    if len(policies) == 1 and isinstance(policies[0], (list, tuple)):
        policies = tuple(policies[0])
    if not 1 <= len(policies) <= 16:
        raise ValueError("all_of takes 1 to 16 policies")
    if not all(isinstance(p, Policy) for p in policies):
        raise ValueError("all_of takes single policies (token_bucket, sliding_log, "
                         "sliding_counter)")
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise ValueError(f"all_of: policy names must be distinct, got {names}")
    if name is None:
        # the default name must be a valid name too (it goes into headers and
        # the 429 body): the part names joined by ".", at most 64 characters
        name = ".".join(names)
        if len(name) > 64:
            raise ValueError(f"all_of: the default name {name!r} is longer than 64 "
                             "characters; give all_of a name=")
    return AllOf(tuple(policies), _name(name))


def key_slot(key):
    """The cluster slot of `key` (CRC16 of its hash tag, as Redis computes it)."""
    return _crc_slot(key.encode() if isinstance(key, str) else key)


def make_key(tag, *parts, prefix="rl"):
    """`rl:{tag}:part1:part2`: the tag is what must share a cluster slot."""
    if not isinstance(tag, str) or not tag or "{" in tag or "}" in tag:
        raise ValueError(f"key tag {tag!r}: a non-empty string without braces")
    for p in (prefix, *parts):
        if not isinstance(p, str) or "{" in p or "}" in p:
            raise ValueError(f"key part {p!r}: a string without braces")
    return ":".join([prefix, "{" + tag + "}", *parts]) if prefix else \
        ":".join(["{" + tag + "}", *parts])
