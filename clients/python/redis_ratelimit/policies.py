"""Policies (what a limit is) and keys (where its state lives)."""
from __future__ import annotations

import re
from typing import List, Literal, Optional, Sequence, Tuple, Union, cast

from redis.crc import key_slot as _crc_slot

MAX = (1 << 53) - 1
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

__all__ = ["Policy", "AllOf", "Kind", "token_bucket", "sliding_log", "sliding_counter", "fixed_window",
           "concurrency", "all_of", "make_key", "key_slot", "CrossSlotError"]

#: A single policy's algorithm (its module command is "RL." + kind.upper()).
Kind = Literal["tokenbucket", "slidinglog", "slidingcounter", "fixedwindow", "concurrency"]
#: One key (a leased limiter's, a single policy's).
Key = Union[str, bytes]
#: What limit() and refund() take: one key, or (all_of) one key per policy
#: (a string k stands for the keys "k:<policy name>").
Keys = Union[str, bytes, Sequence[str]]


class CrossSlotError(ValueError):
    """The keys of an all_of call cannot share a cluster slot."""


def _int(what: str, v: object, lo: int = 1) -> int:
    if type(v) is not int or not lo <= v <= MAX:
        raise ValueError(f"{what} must be an integer from {lo} to 2^53-1, not {v!r}")
    return v


def _name(v: object) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError(f"policy name {v!r}: 1-64 of A-Z a-z 0-9 . _ -")
    return v


class Policy:
    """One limit: its algorithm, parameters and name.

    `command` is the module command, `script` the Lua twin's name, `params`
    the arguments after the key, `limit` the capacity or limit and
    `window_ms` the window headers report. `from_first` (fixed windows
    only): each window starts at its first grant (FROMFIRST), not on the
    epoch's multiples of window_ms."""

    __slots__ = ("kind", "name", "limit", "window_ms", "params", "weight", "command",
                 "script", "rate", "period_ms", "parts", "from_first", "fixed")

    kind: Kind
    name: str
    limit: int
    window_ms: int
    params: Tuple[int, ...]
    weight: int
    command: str
    script: str
    rate: int
    period_ms: int
    parts: Tuple[Policy]
    from_first: bool
    fixed: bool     # a fixed window (the backend must have RL.FIXEDWINDOW)

    def __init__(self, kind: Kind, name: str, limit: int, params: Tuple[int, ...], window_ms: int,
                 rate: int, period_ms: int, weight: int = 1, from_first: bool = False) -> None:
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
        self.from_first = from_first
        self.fixed = kind == "fixedwindow"

    def weighted(self, weight: int) -> Policy:
        """The same policy counting WEIGHT w units per unit of cost in all_of."""
        return Policy(self.kind, self.name, self.limit, self.params, self.window_ms,
                      self.rate, self.period_ms, weight, self.from_first)

    def args(self) -> List[Union[str, int]]:
        """The arguments after the key of its own command (and Lua twin)."""
        return [*self.params, "FROMFIRST"] if self.from_first else list(self.params)

    def multi_spec(self) -> List[Union[str, int]]:
        spec: List[Union[str, int]] = [self.kind.upper(), *self.params]
        if self.weight != 1:
            spec += ["WEIGHT", self.weight]
        if self.from_first:
            spec.append("FROMFIRST")
        return spec

    def __repr__(self) -> str:
        return f"<{self.kind} {self.name!r} {self.params}>"


def token_bucket(name: str, capacity: int, rate: int, period_ms: int) -> Policy:
    """At most `capacity` tokens; `rate` come back every `period_ms`."""
    _name(name)
    _int("capacity", capacity), _int("rate", rate), _int("period_ms", period_ms)
    window = -(-capacity * period_ms // rate)        # an empty bucket fills in this time
    return Policy("tokenbucket", name, capacity, (capacity, rate, period_ms), window,
                  rate, period_ms)


def sliding_log(name: str, limit: int, window_ms: int) -> Policy:
    """Exact: at most `limit` units in any `window_ms`."""
    _name(name)
    _int("limit", limit), _int("window_ms", window_ms)
    return Policy("slidinglog", name, limit, (limit, window_ms), window_ms, limit, window_ms)


def sliding_counter(name: str, limit: int, window_ms: int) -> Policy:
    """Approximate sliding window (two fixed windows, weighted)."""
    _name(name)
    _int("limit", limit), _int("window_ms", window_ms)
    return Policy("slidingcounter", name, limit, (limit, window_ms), window_ms, limit, window_ms)


def fixed_window(name: str, limit: int, window_ms: int, *, from_first: bool = False) -> Policy:
    """At most `limit` units per fixed window of `window_ms`: windows on the
    epoch's multiples of window_ms (envoyproxy/ratelimit's), or with
    from_first=True each starting at its first grant (INCR + PEXPIRE NX).
    Up to 2 x limit can pass across one boundary."""
    _name(name)
    _int("limit", limit), _int("window_ms", window_ms)
    if type(from_first) is not bool:
        raise ValueError(f"from_first must be True or False, not {from_first!r}")
    return Policy("fixedwindow", name, limit, (limit, window_ms), window_ms, limit, window_ms,
                  from_first=from_first)


def concurrency(name: str, limit: int, lease_ms: int) -> Policy:
    """At most `limit` units in flight at once, each hold a lease of
    `lease_ms` on the server's clock (RL.CONCURRENCY). Not a rate: use it
    with RateLimit.inflight(), not limiter(), leased() or all_of."""
    _name(name)
    _int("limit", limit), _int("lease_ms", lease_ms)
    return Policy("concurrency", name, limit, (limit, lease_ms), lease_ms, limit, lease_ms)


def not_a_rate(policy: object, what: str) -> None:
    """A concurrency policy given where a rate is expected: ValueError."""
    for p in getattr(policy, "parts", ()):
        if p.kind == "concurrency":
            raise ValueError(f"{what} takes rates; concurrency {p.name!r} is an in-flight "
                             "limit: use RateLimit.inflight()")


class AllOf:
    """Several policies on several keys, all or nothing (RL.MULTI)."""

    __slots__ = ("name", "parts", "limit", "window_ms", "fixed")
    kind = "multi"
    name: str
    parts: Tuple[Policy, ...]
    limit: int
    window_ms: int
    fixed: bool     # a part is a fixed window

    def __init__(self, parts: Tuple[Policy, ...], name: str) -> None:
        self.parts = parts
        self.name = name
        self.limit = min(p.limit for p in parts)
        self.window_ms = max(p.window_ms for p in parts)
        self.fixed = any(p.fixed for p in parts)

    def keys(self, key: Keys) -> List[str]:
        """The key of each part: `key:name` for a string, else one key per part."""
        if isinstance(key, str):
            keys = [f"{key}:{p.name}" for p in self.parts]
        else:
            keys = list(cast(Sequence[str], key))
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

    def __repr__(self) -> str:
        return f"<all_of {self.name!r} {list(self.parts)}>"


def all_of(*policies: Union[Policy, Sequence[Policy]], name: Optional[str] = None) -> AllOf:
    """All the policies must grant, or none takes anything."""
    given: Sequence[object] = policies
    if len(policies) == 1 and isinstance(policies[0], (list, tuple)):
        given = tuple(policies[0])
    if not 1 <= len(given) <= 16:
        raise ValueError("all_of takes 1 to 16 policies")
    if not all(isinstance(p, Policy) for p in given):
        raise ValueError("all_of takes single policies (token_bucket, sliding_log, "
                         "sliding_counter, fixed_window)")
    parts = cast(Tuple[Policy, ...], tuple(given))
    for p in parts:
        not_a_rate(p, "all_of")
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"all_of: policy names must be distinct, got {names}")
    if name is None:
        # the default name must be a valid name too (it goes into headers and
        # the 429 body): the part names joined by ".", at most 64 characters
        name = ".".join(names)
        if len(name) > 64:
            raise ValueError(f"all_of: the default name {name!r} is longer than 64 "
                             "characters; give all_of a name=")
    return AllOf(parts, _name(name))


def key_slot(key: Union[str, bytes]) -> int:
    """The cluster slot of `key` (CRC16 of its hash tag, as Redis computes it)."""
    return _crc_slot(key.encode() if isinstance(key, str) else key)


def make_key(tag: str, *parts: str, prefix: str = "rl") -> str:
    """`rl:{tag}:part1:part2`: the tag is what must share a cluster slot."""
    if not isinstance(tag, str) or not tag or "{" in tag or "}" in tag:
        raise ValueError(f"key tag {tag!r}: a non-empty string without braces")
    for p in (prefix, *parts):
        if not isinstance(p, str) or "{" in p or "}" in p:
            raise ValueError(f"key part {p!r}: a string without braces")
    return ":".join([prefix, "{" + tag + "}", *parts]) if prefix else \
        ":".join(["{" + tag + "}", *parts])
