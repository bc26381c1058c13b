"""What the sync and asyncio clients share, without I/O: the calls they
send, how replies become Decisions, which errors count as Redis being
unavailable, the Lua scripts shipped in the package, and the shared halves
of RateLimit / Limiter / LeasedLimiter (client.py and aio.py add only the
calls, one awaiting them)."""
import hashlib
import threading
from collections import OrderedDict
from importlib import resources
from time import monotonic

from . import families
from .breaker import CLOSED, NO, PROBE, YES, Breaker, Metrics, Panic, PanicBuckets
from .decision import Decision, Part
from .policies import MAX, AllOf, Policy

SCRIPTS = ("tokenbucket", "slidinglog", "slidingcounter", "multi")
MODULE, LUA, LOCAL, PANIC = "module", "lua", "local", "panic"
CALL, WAIT = "call", "wait"     # the I/O a leased limiter's call path yields


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

    def __init__(self, replicas=1, timeout_ms=None):
        if type(replicas) is not int or replicas < 1:
            raise ValueError("Strict(replicas=...) must be an integer >= 1")
        if timeout_ms is not None and (type(timeout_ms) is not int or timeout_ms < 1):
            raise ValueError("Strict(timeout_ms=...) must be an integer >= 1 (WAIT's "
                             "timeout in ms; 0 would wait without end)")
        self.replicas = replicas
        self.timeout_ms = timeout_ms

    def __repr__(self):
        return f"Strict(replicas={self.replicas}, timeout_ms={self.timeout_ms})"


def strict_wait(strict, call_timeout_s):
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


def is_unknown_command(exc):
    return isinstance(exc, families.RESPONSE_ERROR) and \
        str(exc).lower().startswith(("unknown command", "err unknown command"))


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


def _detect_reply(reply):
    """COMMAND INFO RL.TOKENBUCKET RL.MULTI -> (has module, has RL.MULTI)."""
    if isinstance(reply, dict):          # redis-py's parse_command
        names = {(k.decode() if isinstance(k, bytes) else k).lower() for k in reply}
        return "rl.tokenbucket" in names, "rl.multi" in names
    if not isinstance(reply, (list, tuple)) or len(reply) != 2:
        raise RateLimitError(f"unexpected COMMAND INFO reply: {reply!r}")
    return reply[0] is not None, reply[1] is not None


class _Base:
    """Backend choice, the breaker and the counters (shared by sync and async)."""

    def _setup(self, client, backend, breaker, strict=None, timeout_s=None):
        if backend not in ("auto", MODULE, LUA):
            raise ValueError('backend must be "auto", "module" or "lua"')
        self.client = client
        self.forced = None if backend == "auto" else backend
        self.backend = None
        self.has_multi = False
        self.breaker = breaker or Breaker()
        self._metrics = Metrics()
        self.breaker.metrics = self._metrics
        self._scripts = scripts()
        self.wait = strict_wait(strict, timeout_s)

    def _acked(self, reply, acked):
        """Strict mode: a grant counts only when WAIT saw enough replicas
        acknowledge it (a call that granted nothing needs no copy)."""
        if int(reply[0]) == 0 or int(acked) >= self.wait[0]:
            return True
        self._metrics.unreplicated += 1
        return False

    def _lost_backend(self):
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

    _DETECT = ("COMMAND INFO", "RL.TOKENBUCKET", "RL.MULTI")

    def _sending(self, policy):
        """The backend is known: the policy must fit it; the call counts."""
        if policy is not None:
            self._check_policy(policy)
        self._metrics.calls += 1

    def _answered(self, reply, probe, grant, t0):
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

    def _failed(self, exc, probe):
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
    def _detect_refused(exc):
        """COMMAND INFO raised exc (a ResponseError): re-raised when it is an
        outage, else the reply _set_backend takes (COMMAND renamed or not
        permitted)."""
        if is_outage(exc):
            raise exc
        return exc

    def _set_backend(self, reply):
        """From COMMAND INFO's reply; None when backend="lua" asked nothing; a
        ResponseError when COMMAND is refused (managed services): then Lua,
        unless backend="module" was asked for."""
        if reply is None:
            module = multi = False
        elif isinstance(reply, families.RESPONSE_ERROR):
            if self.forced == MODULE:
                raise UnsupportedError(f"backend='module' but COMMAND INFO failed: {reply}")
            module = multi = False
        else:
            module, multi = _detect_reply(reply)
        if self.forced == MODULE and not module:
            raise UnsupportedError("backend='module' but the server has no RL.* commands")
        self.backend = self.forced or (MODULE if module else LUA)
        self.has_multi = multi if self.backend == MODULE else "multi" in self._scripts.sha
        return self.backend

    def _lua_args(self, lua):
        name, keys, argv = lua
        sha = self._scripts.sha.get(name)
        if sha is None:
            raise UnsupportedError(f"the package ships no {name}.lua")
        return sha, name, keys, argv

    def _strict_cmds(self, mod_args, lua):
        """What strict mode sends, each followed by `WAIT replicas ms` in one
        pipeline: the module call, or EVALSHA then (on NOSCRIPT) EVAL."""
        if self.backend == MODULE:
            return [mod_args]
        sha, name, keys, argv = self._lua_args(lua)
        return [["EVALSHA", sha, len(keys), *keys, *argv],
                ["EVAL", self._scripts.text[name], len(keys), *keys, *argv]]

    @staticmethod
    def _strict_reply(reply, acked):
        """(reply, replicas that acknowledged it) from a strict pipeline's
        two replies; None after NOSCRIPT (send the next command)."""
        if isinstance(reply, families.NOSCRIPT):
            return None         # first use on this node: EVAL caches it
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception):
            raise acked
        return reply, acked

    def _check_policy(self, policy):
        if isinstance(policy, AllOf) and self.backend is not None and not self.has_multi:
            raise UnsupportedError(f"all_of needs RL.MULTI, which this {self.backend} "
                                   "backend does not have")

    def limiter(self, policy, panic=None):
        """One shared call per decision (or panic limits while Redis is away)."""
        return self._limiter(self, policy, panic)

    def leased(self, policy, batch=50, low_water=0.2, max_keys=10_000, idle_ms=5_000,
               recheck_ms=250, panic=None):
        """Two-tier: decisions from local reservoirs leased in batches."""
        return self._leased(self, policy, batch, low_water, max_keys, idle_ms, recheck_ms,
                            panic)

    def metrics(self):
        m = self._metrics.snapshot()
        m["state"] = self.breaker.state
        return m

    def _count(self, d):
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


class _Entry:
    __slots__ = ("tokens", "used", "inflight", "next_try", "remaining", "retry", "reset",
                 "at", "limit", "event", "failed")

    def __init__(self, now):
        self.tokens = 0
        self.used = now
        self.inflight = False
        self.next_try = 0.0
        self.remaining = 0
        self.retry = 0
        self.reset = 0
        self.at = now
        self.limit = 0
        self.event = None     # set when the lease in flight has landed
        self.failed = False   # the last lease found Redis unavailable


class _LeasedCore:
    """The local tier, shared by the sync and asyncio leased limiters."""

    def _init(self, rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic):
        if not isinstance(policy, Policy):
            raise ValueError("leased() takes a single policy (all_of is not leased)")
        if type(batch) is not int or batch < 1:
            raise ValueError("batch must be an integer >= 1")
        if not 0 <= low_water < 1:
            raise ValueError("low_water must be in [0, 1)")
        if type(max_keys) is not int or max_keys < 1:
            raise ValueError("max_keys must be an integer >= 1")
        self.rl = rl
        self.policy = policy
        self.batch = min(batch, policy.limit)
        self.low = low_water * self.batch
        self.max_keys = max_keys
        self.idle_s = idle_ms / 1000
        self.recheck_s = recheck_ms / 1000
        self.panic = PanicBuckets(panic or Panic(), policy)
        self.entries = OrderedDict()
        self.lock = threading.Lock()
        self.closed = False

    def _local(self, e, key, cost, now):
        """A local grant from e's reservoir (caller holds the lock)."""
        t = e.tokens - cost
        e.tokens = t
        self.rl._metrics.decisions_local += 1
        p = self.policy
        reset = e.reset - int((now - e.at) * 1000)
        return Decision(True, cost, p.limit, t + e.remaining, 0, reset if reset > 0 else 0,
                        p.name, p.name, LOCAL, (), p)

    def _local_denial(self, e, now):
        m = self.rl._metrics
        m.decisions_local += 1
        m.denied += 1
        p = self.policy
        el = int((now - e.at) * 1000)
        retry = e.retry if e.retry < 0 else max(1, e.retry - el)
        reset = e.reset - el
        return Decision(False, 0, p.limit, e.tokens + e.remaining, retry,
                        reset if reset > 0 else 0, p.name, p.name, LOCAL, (), p)

    def _after_wait(self, e, key, cost, landed, now):
        """The decision of a caller that waited for the lease in flight
        (landed: it came back within the timeout, with or without a reply).
        It takes no lease of its own: the reservoir grants; else, when that
        lease brought no reply in time (Redis unavailable or slow, the breaker
        open), the panic limits (None: the caller asks them); else a local
        denial from the shared reply it brought."""
        if e.tokens >= cost:
            return self._local(e, key, cost, now)
        if not landed or e.failed or e.limit == 0:
            return None
        return self._local_denial(e, now)

    def _panic_decision(self, key, cost):
        return self.rl._count(panic_decision(self.panic, self.policy, [key], cost, False, False))

    def _leased_decision(self, e, cost):
        """The decision of the caller whose own lease just landed on e
        (caller holds the lock): from the reservoir it refilled, else a
        denial from the reply (source: the backend that answered)."""
        rl = self.rl
        p = self.policy
        if e.tokens >= cost:
            e.tokens -= cost
            return rl._count(Decision(True, cost, e.limit, e.tokens + e.remaining, 0, e.reset,
                                      p.name, p.name, rl.backend, (), p))
        return rl._count(Decision(False, 0, e.limit, e.tokens + e.remaining,
                                  e.retry if e.retry != 0 else 1, e.reset, p.name, p.name,
                                  rl.backend, (), p))

    def _lease_call(self, key, n):
        p = self.policy
        return call_for(p, key, ["COST", n, "PARTIAL"])

    def _apply(self, e, reply, n, now):
        """Fold a lease reply into the entry (caller holds the lock)."""
        g, lim, rem, retry, reset = (int(x) for x in reply)
        m = self.rl._metrics
        m.leases += 1
        m.lease_tokens += g
        e.tokens += g
        e.remaining = rem
        e.retry = retry
        e.reset = reset
        e.at = now
        e.limit = lim
        e.failed = False
        if g < n:
            wait = retry / 1000 if retry > 0 else self.recheck_s
            e.next_try = now + min(wait, self.recheck_s)
        else:
            e.next_try = 0.0

    def _new_entry(self, key, now, evicted):
        e = _Entry(now)
        self.entries[key] = e
        while len(self.entries) > self.max_keys:
            k, old = self.entries.popitem(last=False)
            if old.tokens > 0 and not old.inflight:
                evicted.append((k, old.tokens))
                old.tokens = 0
        return e

    def _sweep(self, now):
        """Keys idle for idle_ms leave; their tokens go back (returned list)."""
        out = []
        cutoff = now - self.idle_s
        with self.lock:
            ents = self.entries
            while ents:
                k = next(iter(ents))
                e = ents[k]
                if e.used > cutoff:
                    break
                del ents[k]
                if e.tokens > 0 and not e.inflight:
                    out.append((k, e.tokens))
                    e.tokens = 0
        return out

    def _orphan(self, key, e):
        """A lease landed on an entry no longer in the table: its tokens go back."""
        if self.entries.get(key) is not e and e.tokens > 0:
            n, e.tokens = e.tokens, 0
            return n
        return 0

    def stranded(self):
        """Units leased to this instance and not yet used (all keys)."""
        with self.lock:
            return sum(e.tokens for e in self.entries.values())

    def _tick(self):
        """How often idle keys are swept."""
        return max(0.01, min(self.idle_s / 4, 1.0))

    def _drain(self):
        """close(): every key leaves the table; (key, units) to give back."""
        with self.lock:
            items = [(k, e.tokens) for k, e in self.entries.items() if e.tokens > 0]
            for e in self.entries.values():
                e.tokens = 0
            self.entries.clear()
        return items

    def _refund(self, key, n):
        """A request that was granted locally was not served: its units go
        back into this key's reservoir (no I/O)."""
        check_cost(n, 1)
        with self.lock:
            e = self.entries.get(key)
            if e is not None:
                e.tokens += n
        p = self.policy
        return Decision(True, n if e is not None else 0, p.limit,
                        e.tokens if e is not None else 0, 0, 0, p.name, p.name, LOCAL, (), p)

    # The call path, written once. limit() is _take (no I/O), else the
    # steps of _slow. _slow, _refill and _give_back are generators that
    # yield their I/O, (CALL, args of rl.call) or (WAIT, event), and are
    # sent its result (or thrown its error): LeasedLimiter._run makes the
    # call or waits on a threading.Event, AsyncLeasedLimiter._run awaits.
    # Work for later goes to _later (the worker's queue, or a task), and
    # events come from _event (threading.Event or asyncio.Event).

    def _take(self, key, cost, now):
        """A local grant from key's reservoir (starting its refill when it
        runs low), or None: the caller goes on with _slow."""
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                return None
            self.entries.move_to_end(key)
            e.used = now
            if e.tokens < cost:
                return None
            d = self._local(e, key, cost, now)
            if e.tokens >= self.low or e.inflight or now < e.next_try \
                    or self.rl.breaker.state != CLOSED:
                return d
            e.inflight = True
            e.event = self._event()
        self._later(self._refill(key, e))
        return d

    def _slow(self, key, cost, now):
        """limit() when the reservoir is short: wait for the lease in flight,
        or send one on the caller's path, or decide from the panic limits.
        While the breaker is not closed no caller waits on Redis: the
        half-open probe is a lease the background worker sends (_later),
        and the caller is answered from the panic limits at once."""
        breaker = self.rl.breaker
        evicted = []
        d = wait = None
        allow = NO
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                e = self._new_entry(key, now, evicted)
            elif e.tokens >= cost:      # a refill landed meanwhile
                return self._local(e, key, cost, now)
            if e.inflight:
                # the breaker closed: wait for it; else (a probe or a lease
                # that will fail) the panic limits, at once
                if breaker.state == CLOSED:
                    wait = e.event
            else:
                allow = breaker.allow(now)
                if allow == YES and now < e.next_try:
                    d = self._local_denial(e, now)
                elif allow != NO:
                    e.inflight = True
                    e.event = self._event()
        for k, n in evicted:
            self._later(self._give_back(k, n))
        if allow == PROBE:
            # the worker sends the probe (a lease for this key); a success
            # closes the breaker and fills the reservoir
            self._later(self._refill(key, e, max(self.batch, cost - e.tokens), PROBE))
            return self._panic_decision(key, cost)
        if d is not None:
            return d
        if wait is None and allow == NO:
            return self._panic_decision(key, cost)
        if wait is not None:
            # a lease for this key is in flight: wait for it (at most the timeout)
            self.rl._metrics.lease_waits += 1
            landed = yield WAIT, wait
            with self.lock:
                d = self._after_wait(e, key, cost, landed, monotonic())
            return d if d is not None else self._panic_decision(key, cost)
        n = max(self.batch, cost - e.tokens)
        reply, back = yield from self._lease(key, e, n, False, now)
        if back:
            self._later(self._give_back(key, back))
        if reply is None:
            return self._panic_decision(key, cost)
        with self.lock:
            return self._leased_decision(e, cost)

    def _lease(self, key, e, n, probe, now=None):
        """Send e's lease of n units (e is marked in flight) and fold its
        reply in: (reply or None, units to give back as e left the table)."""
        reply = None
        try:
            mod, lua = self._lease_call(key, n)
            reply = yield CALL, mod, lua, probe
        finally:
            back = self._landed(key, e, reply, n, now)
        return reply, back

    def _landed(self, key, e, reply, n, now=None):
        """e's lease is no longer in flight (reply None: it brought none)."""
        with self.lock:
            e.inflight = False
            e.failed = reply is None
            back = 0
            if reply is not None:
                self._apply(e, reply, n, monotonic() if now is None else now)
                back = self._orphan(key, e)
            e.event.set()
        return back

    def _refill(self, key, e, n=None, allow=None):
        """The background lease _take started, or (allow=PROBE) the breaker's
        half-open probe _slow handed over: n units (default the batch)."""
        if allow is None:
            allow = self.rl.breaker.allow()
        if allow == NO:
            self._landed(key, e, None, 0)
            return
        _, back = yield from self._lease(key, e, n or self.batch, allow == PROBE)
        if back:
            yield from self._give_back(key, back)

    def _give_back(self, key, n):
        """REFUND n units of key's (swept, evicted or closed): True when done."""
        if self.rl.breaker.allow() == NO:
            return False
        mod, lua = call_for(self.policy, key, ["REFUND", n])
        reply = yield CALL, mod, lua, False, False
        if reply is None:
            return False
        m = self.rl._metrics
        m.refunds += 1
        m.refund_tokens += int(reply[0])
        return True


def _resume(steps, reply, exc):
    """One step of a call path's generator: (True, its next I/O) or (False,
    its result), after sending it the last I/O's reply or throwing its error."""
    try:
        return True, (steps.send(reply) if exc is None else steps.throw(exc))
    except StopIteration as done:
        return False, done.value


class _LimiterCore:
    """limit()/refund() on one policy, one shared call each: all but the
    call itself, which Limiter makes and AsyncLimiter awaits."""

    def __init__(self, rl, policy, panic=None):
        if not isinstance(policy, (Policy, AllOf)):
            raise ValueError("policy must come from token_bucket, sliding_log, "
                             "sliding_counter or all_of")
        self.rl = rl
        self.policy = policy
        self.panic = PanicBuckets(panic or Panic(), policy)

    def _begin(self, key, opts):
        """(keys, the arguments of rl.call, or None while the breaker is open)."""
        policy = self.policy
        keys = keys_for(policy, key)
        allow = self.rl.breaker.allow()
        if allow == NO:
            return keys, None
        mod, lua = call_for(policy, keys[0] if isinstance(policy, Policy) else keys, opts)
        grant = "DRYRUN" not in opts and "REFUND" not in opts
        return keys, (mod, lua, allow == PROBE, policy, grant)

    def _decided(self, reply, keys, cost, partial, dry_run):
        """The decision from the reply, or from the panic limits (no reply)."""
        rl = self.rl
        if reply is not None:
            return rl._count(to_decision(reply, self.policy, cost, partial, rl.backend))
        return rl._count(panic_decision(self.panic, self.policy, keys, cost, partial, dry_run))

    def _refunded(self, reply, keys, n):
        rl = self.rl
        if reply is not None:
            rl._metrics.refunds += 1
            d = to_decision(reply, self.policy, n, False, rl.backend, refund=True)
            rl._metrics.refund_tokens += d.granted
            return d
        d = panic_decision(self.panic, self.policy, keys, 0, False, True)
        d.granted = 0
        return d
