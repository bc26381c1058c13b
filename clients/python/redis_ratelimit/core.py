"""What the sync and asyncio clients share, without I/O: the calls they
send, how replies become Decisions, which errors count as Redis being
unavailable, the Lua scripts shipped in the package, and the shared halves
of RateLimit / Limiter / LeasedLimiter (client.py and aio.py add only the
calls, one awaiting them; lease.py is the leased limiters' shared half)."""
from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from importlib import resources
from time import monotonic
from typing import (Any, Callable, ClassVar, Dict, Generator, Generic, List, Literal, Optional, Sequence,
                    Tuple, Type, TypedDict, TypeVar, Union, cast)

from . import families
from .breaker import NO, PROBE, Breaker, BreakerState, Metrics, Panic, PanicBuckets
from .decision import Decision, Part, Source, _decision
from .policies import MAX, AllOf, Key, Keys, Policy, not_a_rate

SCRIPTS = ("tokenbucket", "slidinglog", "slidingcounter", "fixedwindow", "multi", "concurrency")

#: What RateLimit(backend=...) takes: "auto" (the module when the server
#: has its commands, else the Lua twins) or one forced.
Backend = Literal["auto", "module", "lua"]
#: The backend a client chose (RateLimit.backend once detected).
Chosen = Literal["module", "lua"]
MODULE: Chosen = "module"
LUA: Chosen = "lua"
LOCAL: Source = "local"
PANIC: Source = "panic"
CALL, WAIT = "call", "wait"     # the I/O a leased limiter's call path yields
CMD, PIPE = "cmd", "pipe"       # the I/O a client's send path yields

#: Background errors (a leased limiter's worker, its sweeps) are logged here.
log = logging.getLogger("redis_ratelimit")

_T = TypeVar("_T")
#: A call path written once as a generator: it yields its I/O (a tuple
#: naming it) and is sent that I/O's result, or thrown its error.
Steps = Generator[Tuple[Any, ...], Any, _T]
#: A command's arguments, as redis-py's execute_command takes them.
Args = Sequence[Union[str, bytes, int, float]]
#: The Lua twin of a call: (script name, keys, argv).
LuaCall = Tuple[str, Sequence[str], Args]


class MetricsSnapshot(TypedDict):
    """What RateLimit.metrics() returns: the counters and the breaker's state."""

    decisions_module: int
    decisions_lua: int
    decisions_local: int
    decisions_panic: int
    denied: int
    calls: int
    failures: int
    leases: int
    lease_tokens: int
    lease_waits: int
    refunds: int
    refund_tokens: int
    trips: int
    trips_failures: int
    trips_latency: int
    probes_ok: int
    probes_failed: int
    unreplicated: int
    redetects: int
    state: BreakerState


class RateLimitError(Exception):
    """Redis refused a call for a reason that is not an outage (a key of
    another type, bad arguments): a bug to fix, not a reason to panic."""


class UnsupportedError(RateLimitError):
    """The backend lacks what this call needs (RL.MULTI, REFUND)."""


def script_text(name: str) -> Optional[str]:
    try:
        return (resources.files("redis_ratelimit") / "lua" / f"{name}.lua").read_text()
    except FileNotFoundError:
        return None


class Scripts:
    """Script texts and their SHA1s, read once from the package."""

    def __init__(self) -> None:
        self.text: Dict[str, str] = {}
        self.sha: Dict[str, str] = {}
        for n in SCRIPTS:
            t = script_text(n)
            if t is not None:
                self.text[n] = t
                self.sha[n] = hashlib.sha1(t.encode()).hexdigest()


_SCRIPTS: Optional[Scripts] = None


def scripts() -> Scripts:
    global _SCRIPTS
    if _SCRIPTS is None:
        _SCRIPTS = Scripts()
    return _SCRIPTS


_FAILURE_PREFIXES = ("BUSY", "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN",
                     "NOREPLICAS", "READONLY", "MISCONF")


def is_outage(exc: BaseException) -> bool:
    """True when the error means Redis cannot answer now (down, slow,
    busy, failing over): the breaker counts it and panic limits decide.
    redis-py's and valkey-py's exception types alike (families.py)."""
    if isinstance(exc, families.OUTAGE + (OSError, TimeoutError)):
        return True
    if isinstance(exc, families.RESPONSE_ERROR):
        return str(exc).startswith(_FAILURE_PREFIXES)
    return False


class Strict:
    """Strict mode: every grant is followed, in the same pipeline on the same
    connection, by `WAIT replicas timeout_ms`, and counts only when that
    many replicas acknowledged it; otherwise the decision is a failure the
    breaker counts (panic limits decide), never a grant. `timeout_ms`
    (WAIT's, whole milliseconds >= 1) must be shorter than the call's
    timeout; None: 80% of the call's timeout, rounded down (4 ms of 5), so
    that WAIT's own answer comes back before the call times out."""

    __slots__ = ("replicas", "timeout_ms")

    def __init__(self, replicas: int = 1, timeout_ms: Optional[int] = None) -> None:
        if type(replicas) is not int or replicas < 1:
            raise ValueError("Strict(replicas=...) must be an integer >= 1")
        if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms < 1):
            raise ValueError("Strict(timeout_ms=...) must be an integer >= 1 (WAIT's "
                             "timeout in ms; 0 would wait without end)")
        self.replicas = replicas
        self.timeout_ms = timeout_ms

    def __repr__(self) -> str:
        return f"Strict(replicas={self.replicas}, timeout_ms={self.timeout_ms})"


#: What RateLimit(strict=...) takes.
StrictArg = Union[bool, Strict, None]


def strict_wait(strict: StrictArg, call_timeout_s: float) -> Optional[Tuple[int, int]]:
    """(replicas, WAIT ms) for RateLimit's `strict` argument, or None."""
    if strict is None or strict is False:
        return None
    if strict is True:
        strict = Strict()
    if not isinstance(strict, Strict):
        raise ValueError("strict must be True, False, None or Strict(replicas, timeout_ms)")
    limit_ms = call_timeout_s * 1000
    ms = strict.timeout_ms
    if ms is None:
        ms = int(limit_ms * 0.8)
    if not 1 <= ms < limit_ms:
        raise ValueError(f"strict mode's WAIT timeout ({ms} ms: Strict(timeout_ms=...)) must be "
                         f"at least 1 ms and shorter than the call's timeout ({limit_ms:g} ms: "
                         "timeout_ms / socket_timeout), so that the decision stays bounded")
    return strict.replicas, ms


def is_unknown_command(exc: BaseException) -> bool:
    return isinstance(exc, families.RESPONSE_ERROR) and \
        str(exc).lower().startswith(("unknown command", "err unknown command"))


def is_no_script(exc: object) -> bool:
    """NOSCRIPT: EVALSHA on a node that does not have the script (cached
    again by one EVAL). With is_outage and is_unknown_command, the whole
    classification of a driver's errors."""
    return isinstance(exc, families.NOSCRIPT)


def check_cost(cost: object, lo: int = 0) -> None:
    if type(cost) is not int or not lo <= cost <= MAX:
        raise ValueError(f"cost must be an integer from {lo} to 2^53-1, not {cost!r}")


def options(cost: int, partial: bool, dry_run: bool) -> List[Union[str, int]]:
    opts: List[Union[str, int]] = [] if cost == 1 else ["COST", cost]
    if partial:
        opts.append("PARTIAL")
    if dry_run:
        opts.append("DRYRUN")
    return opts


def call_for(policy: Policy | AllOf, key: Union[Key, Sequence[str]],
             opts: Sequence[Union[str, int]]) -> Tuple[Args, LuaCall]:
    """(module command args, (script, keys, argv)) for one call."""
    if isinstance(policy, Policy):
        one = cast(str, key)        # a single policy's call has one key (str or bytes)
        args = policy.args()
        return ([policy.command, one, *args, *opts],
                (policy.script, [one], [*args, *opts]))
    keys = cast(Sequence[str], key)
    specs: List[Union[str, int]] = []
    for p in policy.parts:
        specs += p.multi_spec()
    return (["RL.MULTI", len(keys), *keys, *specs, *opts],
            ("multi", keys, [*specs, *opts]))


def decision_on(policy: Policy, source: Source, *, allowed: bool, granted: int, limit: int,
                remaining: int, retry_after_ms: int, reset_after_ms: int) -> Decision:
    """A decision on one policy (no parts: the policy is the binding one)."""
    return _decision(allowed=allowed, granted=granted, limit=limit, remaining=remaining,
                     retry_after_ms=retry_after_ms, reset_after_ms=reset_after_ms,
                     policy=policy.name, binding=policy.name, source=source, parts=(),
                     rule=policy)


def to_decision(reply: Any, policy: Policy | AllOf, cost: int, partial: bool, source: Source,
                refund: bool = False) -> Decision:
    if isinstance(policy, Policy):
        a, lim, rem, retry, reset = (int(x) for x in reply)
        granted = a if (partial or refund) else (cost if a == 1 else 0)
        return decision_on(policy, source, allowed=refund or granted == cost, granted=granted,
                           limit=lim, remaining=rem, retry_after_ms=retry, reset_after_ms=reset)
    a, lim, rem, retry, reset, b, per = reply
    a, lim, rem, retry, reset, b = int(a), int(lim), int(rem), int(retry), int(reset), int(b)
    granted = a if (partial or refund) else (cost if a == 1 else 0)
    parts = tuple(Part(p.name, *(int(x) for x in r)) for p, r in zip(policy.parts, per))
    return _decision(allowed=refund or granted == cost, granted=granted, limit=lim,
                     remaining=rem, retry_after_ms=retry, reset_after_ms=reset,
                     policy=policy.name, binding=policy.parts[b].name, source=source,
                     parts=parts, rule=policy)


def panic_decision(buckets: PanicBuckets, policy: Policy | AllOf, keys: Sequence[Key], cost: int,
                   partial: bool, dry_run: bool) -> Decision:
    """A decision from the local panic buckets (source "panic")."""
    res = buckets.decide(keys, cost, [p.weight for p in policy.parts], partial, dry_run)
    if isinstance(policy, Policy):
        u, cap, rem, retry, reset = res[0]
        return decision_on(policy, PANIC, allowed=u == cost, granted=u, limit=cap, remaining=rem,
                           retry_after_ms=retry, reset_after_ms=reset)
    g = res[0][0] // policy.parts[0].weight
    parts = tuple(Part(p.name, *r) for p, r in zip(policy.parts, res))
    if g == cost:   # granted: the part with the fewest whole requests left
        b = min(range(len(res)), key=lambda i: (res[i][2] // policy.parts[i].weight, i))
    else:           # denied: the longest wait, -1 counting as longest
        b = max(range(len(res)), key=lambda i: (res[i][3] < 0, res[i][3], -i))
    _, cap, rem, _, reset = res[b]
    retry = 0 if g == cost else (-1 if any(r[3] < 0 for r in res)
                                 else max(1, max(r[3] for r in res)))
    return _decision(allowed=g == cost, granted=g, limit=cap, remaining=rem,
                     retry_after_ms=retry, reset_after_ms=reset, policy=policy.name,
                     binding=policy.parts[b].name, source=PANIC, parts=parts, rule=policy)


def keys_for(policy: Policy | AllOf, key: Keys) -> List[Any]:
    if isinstance(policy, AllOf):
        return policy.keys(key)
    if not isinstance(key, (str, bytes)):
        raise ValueError(f"key must be a string, not {type(key).__name__}")
    return [key]


def _detect_reply(reply: Any) -> Tuple[bool, bool, bool]:
    """COMMAND INFO RL.TOKENBUCKET RL.MULTI RL.FIXEDWINDOW -> (has module,
    has RL.MULTI, has RL.FIXEDWINDOW)."""
    if isinstance(reply, dict):          # redis-py's parse_command
        names = {(k.decode() if isinstance(k, bytes) else k).lower() for k in reply}
        return "rl.tokenbucket" in names, "rl.multi" in names, "rl.fixedwindow" in names
    if not isinstance(reply, (list, tuple)) or len(reply) != 3:
        raise RateLimitError(f"unexpected COMMAND INFO reply: {reply!r}")
    return reply[0] is not None, reply[1] is not None, reply[2] is not None


_L = TypeVar("_L")      # the limiter type a client makes (Limiter, AsyncLimiter)
_LL = TypeVar("_LL")    # the leased limiter type (LeasedLimiter, AsyncLeasedLimiter)
_R = TypeVar("_R", bound="_Base[Any, Any]")


class _Base(Generic[_L, _LL]):
    """Backend choice, the breaker, the counters, the constructors and the
    send path (shared by sync and async). A subclass gives the client
    classes (_url_client, _sentinel_class, _bounded), its construction
    (_made) and its I/O (running _sends' steps)."""

    # the limiter classes (set after each subclass: they are defined after it)
    _limiter: ClassVar[Callable[..., Any]]
    _leased: ClassVar[Callable[..., Any]]
    #: the seconds that bound one call (the sync client's socket_timeout,
    #: the asyncio client's timeout_ms / 1000)
    timeout_s: float

    def _setup(self, client: Any, backend: Backend, breaker: Optional[Breaker],
               strict: StrictArg, timeout_s: float) -> None:
        if backend not in ("auto", MODULE, LUA):
            raise ValueError('backend must be "auto", "module" or "lua"')
        self.client = client
        self.forced: Optional[Chosen] = None if backend == "auto" else backend
        self.backend: Optional[Chosen] = None
        self.has_multi = False
        self.has_fixed_window = False
        self.breaker = breaker or Breaker()
        self._metrics = Metrics()
        self.breaker.metrics = self._metrics
        self._scripts = scripts()
        self.timeout_s = timeout_s
        self.wait = strict_wait(strict, timeout_s)

    # The constructors, written once: a subclass names the redis-py classes.

    @classmethod
    def from_url(cls: Type[_R], url: str, timeout_ms: float = 5, cluster: bool = False, *,
                 backend: Backend = "auto", breaker: Optional[Breaker] = None,
                 strict: StrictArg = None) -> _R:
        """A client on `url` (a RedisCluster's when cluster=True), every call
        bounded by timeout_ms."""
        client = cls._url_client(url, timeout_ms / 1000, cluster)
        return cls._made(client, timeout_ms, backend=backend, breaker=breaker, strict=strict)

    @classmethod
    def from_sentinel(cls: Type[_R], sentinels: Sequence[Tuple[str, int]], service_name: str,
                      timeout_ms: float = 5, password: Optional[str] = None,
                      sentinel_password: Optional[str] = None, *, backend: Backend = "auto",
                      breaker: Optional[Breaker] = None, strict: StrictArg = None) -> _R:
        """A client on the primary that the sentinels name: every connection,
        to the primary and to each sentinel, bounded by timeout_ms (the sync
        client's with no retries). After a failover a reconnect asks the
        sentinels in turn (each at most timeout_ms) where the primary is."""
        bounded = cls._bounded(timeout_ms / 1000)
        skw = dict(bounded)
        if sentinel_password is not None:
            skw["password"] = sentinel_password
        s = cls._sentinel_class()(sentinels, sentinel_kwargs=skw, **bounded)
        client = s.master_for(service_name, password=password)
        return cls._made(client, timeout_ms, backend=backend, breaker=breaker, strict=strict)

    @classmethod
    def _url_client(cls, url: str, t: float, cluster: bool) -> Any:
        raise NotImplementedError

    @classmethod
    def _sentinel_class(cls) -> Any:
        raise NotImplementedError

    @classmethod
    def _bounded(cls, t: float) -> Dict[str, Any]:
        """The connection settings of from_sentinel's clients (t seconds)."""
        raise NotImplementedError

    @classmethod
    def _made(cls: Type[_R], client: Any, timeout_ms: float, **kw: Any) -> _R:
        raise NotImplementedError

    def _source(self) -> Source:
        """The source of a decision from a reply: the backend that answered
        (known once a call has come back)."""
        return cast(Source, self.backend)

    # The send path of one call, written once: RateLimit._send runs its
    # steps with calls, AsyncRateLimit._send awaits them.

    def _sends(self, mod_args: Args, lua: LuaCall, grant: bool) -> Steps[Any]:
        """Yields (CMD, key, args): one command on key, sent its reply or
        thrown its error; or, in strict mode, (PIPE, args, replicas, ms):
        args then `WAIT replicas ms` in one pipeline on one connection, sent
        both replies (errors as values). Returns the reply; strict mode's
        is (reply, replicas that acknowledged it)."""
        if grant and self.wait is not None:
            replicas, ms = self.wait
            for args in self._strict_cmds(mod_args, lua):
                reply, acked = yield PIPE, args, replicas, ms
                out = self._strict_reply(reply, acked)
                if out is not None:
                    return out
            raise reply
        key = lua[1][0]
        if self.backend == MODULE:
            return (yield CMD, key, mod_args)
        sha, name, keys, argv = self._lua_args(lua)
        try:
            return (yield CMD, key, ("EVALSHA", sha, len(keys), *keys, *argv))
        except Exception as e:
            if not is_no_script(e):
                raise
            # First use on this node (or after SCRIPT FLUSH / a restart):
            # EVAL runs it and caches it there.
            return (yield CMD, key, ("EVAL", self._scripts.text[name], len(keys), *keys, *argv))

    def _acked(self, reply: Any, acked: Any) -> bool:
        """Strict mode: a grant counts only when WAIT saw enough replicas
        acknowledge it (a call that granted nothing needs no copy)."""
        assert self.wait is not None        # strict mode
        if int(reply[0]) == 0 or int(acked) >= self.wait[0]:
            return True
        self._metrics.unreplicated += 1
        return False

    def _lost_backend(self) -> bool:
        """An RL.* command is unknown where the module was found: the primary
        changed (a failover to a server without the module). The call is a
        failure; the next one detects the backend again (unless a call that
        answered later already did)."""
        if self.forced is not None:
            return False
        if self.backend == MODULE:
            self.backend = None
            self._metrics.redetects += 1
        return True

    # One Redis call, as RateLimit.call makes it and AsyncRateLimit.call
    # awaits it: detect the backend (the first time), _sending, the send,
    # then _answered with its reply or _failed with its error.

    _DETECT = ("COMMAND INFO", "RL.TOKENBUCKET", "RL.MULTI", "RL.FIXEDWINDOW")

    def _sending(self, policy: Optional[Policy | AllOf]) -> None:
        """The backend is known: the policy must fit it; the call counts."""
        if policy is not None:
            self._check_policy(policy)
        self._metrics.calls += 1

    def _answered(self, reply: Any, probe: bool, grant: bool, t0: float) -> Any:
        """The reply of a call that came back; None when strict mode finds
        too few replicas acknowledged its grant (a failure)."""
        if grant and self.wait is not None:
            reply, acked = reply
            if not self._acked(reply, acked):
                self._metrics.failures += 1
                self.breaker.failure(probe)
                return None
        self.breaker.success(monotonic() - t0, probe)
        return reply

    def _failed(self, exc: Exception, probe: bool) -> None:
        """A call that raised exc: None when Redis is unavailable (the breaker
        counts it); other errors are raised (RateLimitError)."""
        ours = isinstance(exc, (RateLimitError, ValueError))
        if not ours and (is_outage(exc) or (is_unknown_command(exc) and self._lost_backend())):
            self._metrics.failures += 1
            self.breaker.failure(probe)
            return None
        if probe:
            self.breaker.success(0.0, True)
        if ours:
            raise exc
        raise RateLimitError(str(exc)) from exc

    @staticmethod
    def _detect_refused(exc: Exception) -> Any:
        """COMMAND INFO raised exc (a ResponseError): re-raised when it is an
        outage, else the reply _set_backend takes (COMMAND renamed or not
        permitted)."""
        if is_outage(exc):
            raise exc
        return exc

    def _set_backend(self, reply: Any) -> Optional[Chosen]:
        """From COMMAND INFO's reply; None when backend="lua" asked nothing; a
        ResponseError when COMMAND is refused (managed services): then Lua,
        unless backend="module" was asked for."""
        if reply is None:
            module = multi = fixed = False
        elif isinstance(reply, families.RESPONSE_ERROR):
            if self.forced == MODULE:
                raise UnsupportedError(f"backend='module' but COMMAND INFO failed: {reply}")
            module = multi = fixed = False
        else:
            module, multi, fixed = _detect_reply(reply)
        if self.forced == MODULE and not module:
            raise UnsupportedError("backend='module' but the server has no RL.* commands")
        self.backend = self.forced or (MODULE if module else LUA)
        self.has_multi = multi if self.backend == MODULE else "multi" in self._scripts.sha
        self.has_fixed_window = fixed if self.backend == MODULE else "fixedwindow" in self._scripts.sha
        return self.backend

    def _lua_args(self, lua: LuaCall) -> Tuple[str, str, Sequence[str], Args]:
        name, keys, argv = lua
        sha = self._scripts.sha.get(name)
        if sha is None:
            raise UnsupportedError(f"the package ships no {name}.lua")
        return sha, name, keys, argv

    def _strict_cmds(self, mod_args: Args, lua: LuaCall) -> List[Args]:
        """What strict mode sends, each followed by `WAIT replicas ms` in one
        pipeline: the module call, or EVALSHA then (on NOSCRIPT) EVAL."""
        if self.backend == MODULE:
            return [mod_args]
        sha, name, keys, argv = self._lua_args(lua)
        return [["EVALSHA", sha, len(keys), *keys, *argv],
                ["EVAL", self._scripts.text[name], len(keys), *keys, *argv]]

    @staticmethod
    def _strict_reply(reply: Any, acked: Any) -> Optional[Tuple[Any, Any]]:
        """(reply, replicas that acknowledged it) from a strict pipeline's
        two replies; None after NOSCRIPT (send the next command)."""
        if is_no_script(reply):
            return None         # first use on this node: EVAL caches it
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception):
            raise acked
        return reply, acked

    def _check_policy(self, policy: Policy | AllOf) -> None:
        if isinstance(policy, AllOf) and self.backend is not None and not self.has_multi:
            raise UnsupportedError(f"all_of needs RL.MULTI, which this {self.backend} "
                                   "backend does not have")
        if policy.fixed and self.backend is not None and not self.has_fixed_window:
            # (a module older than RL.FIXEDWINDOW: refused before any call,
            # not an unknown command taken for a lost backend)
            raise UnsupportedError(f"fixed_window needs RL.FIXEDWINDOW, which this {self.backend} "
                                   "backend does not have (upgrade the module, or backend='lua')")

    def limiter(self, policy: Policy | AllOf, panic: Optional[Panic] = None) -> _L:
        """One shared call per decision (or panic limits while Redis is away)."""
        return cast(_L, self._limiter(self, policy, panic))

    def leased(self, policy: Policy, batch: int = 50, low_water: float = 0.2,
               max_keys: int = 10_000, idle_ms: float = 5_000, recheck_ms: float = 250,
               panic: Optional[Panic] = None) -> _LL:
        """Two-tier: decisions from local reservoirs leased in batches."""
        return cast(_LL, self._leased(self, policy, batch, low_water, max_keys, idle_ms,
                                      recheck_ms, panic))

    def metrics(self) -> MetricsSnapshot:
        """The counters (decisions by source, calls, failures, leases, refunds,
        trips, probes...) and the breaker's state."""
        m: Dict[str, Any] = dict(self._metrics.snapshot())
        m["state"] = self.breaker.state
        return cast(MetricsSnapshot, m)

    def _count(self, d: Decision) -> Decision:
        m = self._metrics
        s = d.source
        if s == MODULE:
            m.decisions_module += 1
        elif s == LUA:
            m.decisions_lua += 1
        elif s == LOCAL:
            m.decisions_local += 1
        else:
            m.decisions_panic += 1
        if not d.allowed:
            m.denied += 1
        return d



def _resume(steps: Steps[_T], reply: Any,
            exc: Optional[BaseException]) -> Tuple[bool, Any]:
    """One step of a call path's generator: (True, its next I/O) or (False,
    its result), after sending it the last I/O's reply or throwing its error."""
    try:
        return True, (steps.send(reply) if exc is None else steps.throw(exc))
    except StopIteration as done:
        return False, done.value


def drive(steps: Steps[_T], io: Callable[[Tuple[Any, ...]], Any]) -> _T:
    """Run a call path's steps to their result, each I/O done by io(op)
    (the sync clients; aio.py's adrive awaits it)."""
    reply: Any = None
    exc: Optional[BaseException] = None
    while True:
        more, op = _resume(steps, reply, exc)
        if not more:
            return cast(_T, op)
        try:
            reply, exc = io(op), None
        except BaseException as e:  # noqa: BLE001 - thrown into the call path
            reply, exc = None, e


class _LimiterCore:
    """limit()/refund() on one policy, one shared call each: all but the
    call itself, which Limiter makes and AsyncLimiter awaits."""

    rl: _Base[Any, Any]

    def __init__(self, rl: _Base[Any, Any], policy: Policy | AllOf,
                 panic: Optional[Panic] = None) -> None:
        if not isinstance(policy, (Policy, AllOf)):
            raise ValueError("policy must come from token_bucket, sliding_log, "
                             "sliding_counter or all_of")
        not_a_rate(policy, "limiter()")
        self.rl = rl
        self.policy = policy
        self.panic = PanicBuckets(panic or Panic(), policy)

    def _begin(self, key: Keys, opts: Sequence[Union[str, int]]
               ) -> Tuple[List[Any], Optional[Tuple[Args, LuaCall, bool, Policy | AllOf, bool]]]:
        """(keys, the arguments of rl.call, or None while the breaker is open)."""
        policy = self.policy
        keys = keys_for(policy, key)
        allow = self.rl.breaker.allow()
        if allow == NO:
            return keys, None
        mod, lua = call_for(policy, keys[0] if isinstance(policy, Policy) else keys, opts)
        grant = "DRYRUN" not in opts and "REFUND" not in opts
        return keys, (mod, lua, allow == PROBE, policy, grant)

    def _decided(self, reply: Any, keys: Sequence[str], cost: int, partial: bool,
                 dry_run: bool) -> Decision:
        """The decision from the reply, or from the panic limits (no reply)."""
        rl = self.rl
        if reply is not None:
            return rl._count(to_decision(reply, self.policy, cost, partial, rl._source()))
        return rl._count(panic_decision(self.panic, self.policy, keys, cost, partial, dry_run))

    def _debited(self, reply: Any, keys: Sequence[str], n: int) -> Decision:
        """After COST n FORCE (a reservation's settle): the reply's decision,
        or granted 0 when Redis was unavailable (nothing was debited)."""
        if reply is not None:
            return to_decision(reply, self.policy, n, False, self.rl._source())
        return replace(panic_decision(self.panic, self.policy, keys, n, False, True),
                       allowed=False, granted=0)

    def _refunded(self, reply: Any, keys: Sequence[str], n: int) -> Decision:
        rl = self.rl
        if reply is not None:
            rl._metrics.refunds += 1
            d = to_decision(reply, self.policy, n, False, rl._source(), refund=True)
            rl._metrics.refund_tokens += d.granted
            return d
        d = panic_decision(self.panic, self.policy, keys, 0, False, True)
        return replace(d, granted=0)
