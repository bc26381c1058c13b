"""The synchronous client: RateLimit, Limiter and LeasedLimiter."""
import queue
import threading
from collections import OrderedDict
from time import monotonic

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from .breaker import CLOSED, NO, PROBE, Breaker, Metrics, Panic, PanicBuckets
from .core import (LOCAL, LUA, MODULE, RateLimitError, UnsupportedError, call_for,
                   check_cost, is_outage, keys_for, options, panic_decision, scripts,
                   to_decision)
from .decision import Decision
from .policies import AllOf, Policy

__all__ = ["RateLimit", "Limiter", "LeasedLimiter"]

_REDIS_MAJOR = int(redis.__version__.split(".")[0])


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

    def _setup(self, client, backend, breaker):
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

    def _set_backend(self, reply):
        """From COMMAND INFO's reply; None when backend="lua" asked nothing; a
        ResponseError when COMMAND is refused (managed services): then Lua,
        unless backend="module" was asked for."""
        if reply is None:
            module = multi = False
        elif isinstance(reply, redis.exceptions.ResponseError):
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

    def _check_policy(self, policy):
        if isinstance(policy, AllOf) and self.backend is not None and not self.has_multi:
            raise UnsupportedError(f"all_of needs RL.MULTI, which this {self.backend} "
                                   "backend does not have")

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


def _timeout_of(client):
    return _kwargs_of(client).get("socket_timeout")


def _kwargs_of(client):
    if isinstance(client, RedisCluster):
        return client.nodes_manager.connection_kwargs
    return client.connection_pool.connection_kwargs


def _retries(retry):
    """How often a redis-py Retry tries again (-1: without end)."""
    if retry is None:
        return 0
    n = retry.get_retries() if hasattr(retry, "get_retries") else retry._retries
    return -1 if n < 0 else n


def _connection_retries(kw):
    """The retries of the connections a pool with these kwargs makes: redis-py
    5 to 8 all build a connection's Retry this way (a `retry`, or
    `retry_on_timeout` / `retry_on_error` with one retry by default; else
    none). Every call on the connection, and its connect and handshake,
    goes through it."""
    retry = kw.get("retry")
    if retry or kw.get("retry_on_timeout") or kw.get("retry_on_error"):
        return 1 if retry is None else _retries(retry)
    return 0


def _unbounded(client):
    """Why one call on this sync client could wait longer than its
    socket_timeout (every reason, each naming its setting), or None."""
    kw = _kwargs_of(client)
    why = []
    timeout = kw.get("socket_timeout")
    if timeout is None:
        why.append("it has no socket_timeout (every call must be bounded)")
    connect = kw.get("socket_connect_timeout")
    if timeout is not None and connect is not None and connect > timeout:
        why.append(f"its socket_connect_timeout ({connect} s; redis-py 8 defaults it to 5 s) "
                   f"is longer than its socket_timeout ({timeout} s), so a call that "
                   "reconnects could wait that long: set socket_connect_timeout <= "
                   "socket_timeout")
    if isinstance(client, RedisCluster):
        # redis-py 6+: client.retry (made from cluster_error_retry_attempts
        # unless given); redis-py 5: cluster_error_retry_attempts, and a
        # `retry` given goes to every node's connections.
        if hasattr(client, "cluster_error_retry_attempts"):      # redis-py 5
            n = client.cluster_error_retry_attempts or _connection_retries(kw)
        else:
            n = _retries(client.retry)
        if n:
            what = "without end" if n < 0 else f"{n} times"
            why.append(f"it retries a timed-out call ({what}: cluster_error_retry_attempts / "
                       "retry), so one call could take several timeouts: create it with "
                       "retry=Retry(NoBackoff(), 0) (redis-py 5: and "
                       "cluster_error_retry_attempts=0)")
    else:
        n = _connection_retries(kw)
        if n:
            what = "without end" if n < 0 else f"{n} times, with backoff"
            why.append(f"it retries a timed-out or failed call ({what}: its retry setting, "
                       "redis-py's default since 6.0), so one decision could take several "
                       "timeouts instead of one: create it with retry=Retry(NoBackoff(), 0) "
                       "(from redis.retry import Retry; from redis.backoff import NoBackoff) "
                       "and without retry_on_timeout / retry_on_error")
    if not why:
        return None
    kind = "RedisCluster" if isinstance(client, RedisCluster) else "redis"
    return (f"RateLimit refuses this {kind} client: " + "; ".join(why)
            + f"; or use RateLimit.from_url(url, timeout_ms=5{', cluster=True' if kind != 'redis' else ''}),"
            " which builds a client bounded by timeout_ms")


class RateLimit(_Base):
    """One per Redis client (redis.Redis or redis.cluster.RedisCluster).

    The client's socket_timeout bounds every call. A client that could wait
    longer is refused with a ValueError naming the setting: one without a
    socket_timeout, one whose socket_connect_timeout is longer, and one that
    retries a failed call (redis-py's default since 6.0: each retry is
    another timeout plus backoff). from_url() builds a client with
    `timeout_ms` and no retries."""

    def __init__(self, client, *, backend="auto", breaker=None):
        why = _unbounded(client)
        if why is not None:
            raise ValueError(why)
        self._setup(client, backend, breaker)
        self.timeout_s = _timeout_of(client)
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url, timeout_ms=5, cluster=False, **kw):
        t = timeout_ms / 1000
        no_retry = Retry(NoBackoff(), 0)
        if cluster:
            # redis-py 6+ takes the cluster's retries from `retry` (and warns
            # that cluster_error_retry_attempts is deprecated); 5 from both
            old = {"cluster_error_retry_attempts": 0} if _REDIS_MAJOR < 6 else {}
            client = RedisCluster.from_url(url, socket_timeout=t, socket_connect_timeout=t,
                                           retry=no_retry, **old)
        else:
            client = redis.Redis.from_url(url, socket_timeout=t, socket_connect_timeout=t,
                                          retry=no_retry)
        return cls(client, **kw)

    def detect(self):
        """Choose the backend (once): the module when its commands exist, else Lua."""
        if self.backend is None:
            with self._lock:
                if self.backend is None:
                    if self.forced == LUA:       # nothing to ask the server
                        return self._set_backend(None)
                    # one node, named (redis-py 8 routes COMMAND INFO by
                    # a key when given the RANDOM flag, and has none)
                    kw = {"target_nodes": self.client.get_random_node()} \
                        if isinstance(self.client, RedisCluster) else {}
                    try:
                        reply = self.client.execute_command("COMMAND INFO", "RL.TOKENBUCKET",
                                                            "RL.MULTI", **kw)
                    except redis.exceptions.ResponseError as e:
                        if is_outage(e):
                            raise
                        reply = e                # COMMAND renamed or not permitted
                    self._set_backend(reply)
        return self.backend

    def _send(self, mod_args, lua):
        if self.backend is None:
            self.detect()
        if self.backend == MODULE:
            return self.client.execute_command(*mod_args)
        sha, name, keys, argv = self._lua_args(lua)
        try:
            return self.client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
        except redis.exceptions.NoScriptError:
            # First use on this node (or after SCRIPT FLUSH / a restart):
            # EVAL runs it and caches it there.
            return self.client.execute_command("EVAL", self._scripts.text[name], len(keys),
                                               *keys, *argv)

    def call(self, mod_args, lua, probe=False):
        """One Redis call: its reply, or None when Redis is unavailable (the
        breaker has counted it). Other errors are raised."""
        m = self._metrics
        m.calls += 1
        t0 = monotonic()
        try:
            reply = self._send(mod_args, lua)
        except (RateLimitError, ValueError):
            if probe:
                self.breaker.success(0.0, True)
            raise
        except Exception as e:
            if is_outage(e):
                m.failures += 1
                self.breaker.failure(probe)
                return None
            if probe:
                self.breaker.success(0.0, True)
            raise RateLimitError(str(e)) from e
        self.breaker.success(monotonic() - t0, probe)
        return reply

    def limiter(self, policy, panic=None):
        """One shared call per decision (or panic limits while Redis is away)."""
        return Limiter(self, policy, panic)

    def leased(self, policy, batch=50, low_water=0.2, max_keys=10_000, idle_ms=5_000,
               recheck_ms=250, panic=None):
        """Two-tier: decisions from local reservoirs leased in batches."""
        return LeasedLimiter(self, policy, batch, low_water, max_keys, idle_ms, recheck_ms,
                             panic)


class Limiter:
    """limit()/refund() on one policy, one shared call each."""

    def __init__(self, rl, policy, panic=None):
        if not isinstance(policy, (Policy, AllOf)):
            raise ValueError("policy must come from token_bucket, sliding_log, "
                             "sliding_counter or all_of")
        self.rl = rl
        self.policy = policy
        self.panic = PanicBuckets(panic or Panic(), policy)

    def limit(self, key, cost=1, partial=False, dry_run=False):
        check_cost(cost)
        policy = self.policy
        rl = self.rl
        keys = keys_for(policy, key)
        allow = rl.breaker.allow()
        if allow != NO:
            opts = options(cost, partial, dry_run)
            reply = self._call(policy, keys, opts, allow == PROBE)
            if reply is not None:
                return rl._count(to_decision(reply, policy, cost, partial, rl.backend))
        return rl._count(panic_decision(self.panic, policy, keys, cost, partial, dry_run))

    def _call(self, policy, keys, opts, probe):
        rl = self.rl
        if rl.backend is None:
            try:
                rl.detect()
            except Exception as e:
                if not is_outage(e):
                    raise
                rl._metrics.failures += 1
                rl.breaker.failure(probe)
                return None
        rl._check_policy(policy)
        mod, lua = call_for(policy, keys[0] if isinstance(policy, Policy) else keys, opts)
        return rl.call(mod, lua, probe)

    def refund(self, key, n):
        """Give n units back (the request was not served after all). Returns
        a Decision whose `granted` is the units given back (0 when Redis is
        unavailable: then nothing was given back)."""
        check_cost(n, 1)
        policy = self.policy
        rl = self.rl
        keys = keys_for(policy, key)
        allow = rl.breaker.allow()
        if allow != NO:
            reply = self._call(policy, keys, ["REFUND", n], allow == PROBE)
            if reply is not None:
                rl._metrics.refunds += 1
                d = to_decision(reply, policy, n, False, rl.backend, refund=True)
                rl._metrics.refund_tokens += d.granted
                return d
        d = panic_decision(self.panic, policy, keys, 0, False, True)
        d.granted = 0
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


class LeasedLimiter(_LeasedCore):
    """Decides from local reservoirs; one background thread refills them
    (single flight per key), refunds idle and evicted keys' tokens."""

    def __init__(self, rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic):
        self._init(rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic)
        self.q = queue.SimpleQueue()
        self.worker = threading.Thread(target=self._work, daemon=True,
                                       name=f"rl-leases-{policy.name}")
        self.worker.start()

    def limit(self, key, cost=1):
        if type(cost) is not int or cost < 0:
            check_cost(cost)
        now = monotonic()
        with self.lock:
            e = self.entries.get(key)
            if e is not None:
                self.entries.move_to_end(key)
                e.used = now
                if e.tokens >= cost:
                    d = self._local(e, key, cost, now)
                    if e.tokens < self.low and not e.inflight and now >= e.next_try \
                            and self.rl.breaker.state == CLOSED:
                        e.inflight = True
                        e.event = threading.Event()
                        self.q.put(("lease", key, e))
                    return d
        return self._slow(key, cost, now)

    def _slow(self, key, cost, now):
        rl = self.rl
        allow = rl.breaker.allow(now)
        evicted = []
        with self.lock:
            e = self.entries.get(key)
            if e is None:
                e = self._new_entry(key, now, evicted)
            elif e.tokens >= cost:      # a refill landed meanwhile
                return self._local(e, key, cost, now)
            wait = None
            if allow != NO:
                if e.inflight:
                    wait = e.event
                elif now < e.next_try:
                    d = self._local_denial(e, now)
                    allow = None
                else:
                    e.inflight = True
                    e.event = threading.Event()
        for k, n in evicted:
            self.q.put(("refund", k, n))
        if allow is None:
            return d
        if wait is not None:
            # a lease for this key is in flight: wait for it (at most the timeout)
            self.rl._metrics.lease_waits += 1
            landed = wait.wait(self.rl.timeout_s)
            with self.lock:
                d = self._after_wait(e, key, cost, landed, monotonic())
            if d is not None:
                return d
        if allow != NO:
            n = max(self.batch, cost - e.tokens)
            mod, lua = self._lease_call(key, n)
            try:
                reply = self._call(mod, lua, allow == PROBE)
            except BaseException:
                with self.lock:
                    e.inflight = False
                    e.failed = True
                    e.event.set()
                raise
            with self.lock:
                e.inflight = False
                e.failed = reply is None
                e.event.set()
                if reply is not None:
                    self._apply(e, reply, n, now)
                    back = self._orphan(key, e)
                    if back:
                        self.q.put(("refund", key, back))
                    if e.tokens >= cost:
                        e.tokens -= cost
                        p = self.policy
                        return rl._count(Decision(True, cost, e.limit, e.tokens + e.remaining,
                                                  0, e.reset, p.name, p.name, rl.backend, (), p))
                    m = rl._metrics
                    m.denied += 1
                    m.decisions_module += rl.backend == MODULE
                    m.decisions_lua += rl.backend == LUA
                    p = self.policy
                    return Decision(False, 0, e.limit, e.tokens + e.remaining,
                                    e.retry if e.retry != 0 else 1, e.reset, p.name, p.name,
                                    rl.backend, (), p)
        return rl._count(panic_decision(self.panic, self.policy, [key], cost, False, False))

    def _call(self, mod, lua, probe):
        rl = self.rl
        if rl.backend is None:
            try:
                rl.detect()
            except Exception as e:
                if not is_outage(e):
                    raise
                rl._metrics.failures += 1
                rl.breaker.failure(probe)
                return None
        return rl.call(mod, lua, probe)

    def refund(self, key, n):
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

    def _give_back(self, key, n):
        mod, lua = call_for(self.policy, key, ["REFUND", n])
        if self.rl.breaker.allow() == NO:
            return False
        reply = self._call(mod, lua, False)
        if reply is not None:
            m = self.rl._metrics
            m.refunds += 1
            m.refund_tokens += int(reply[0])
            return True
        return False

    def _work(self):
        tick = max(0.01, min(self.idle_s / 4, 1.0))
        next_sweep = monotonic() + tick
        while True:
            timeout = max(0.0, next_sweep - monotonic())
            try:
                job = self.q.get(timeout=timeout)
            except queue.Empty:
                job = False
            if job is None:
                return
            try:
                if job:
                    self._job(*job)
                now = monotonic()
                if now >= next_sweep:
                    next_sweep = now + tick
                    for k, n in self._sweep(now):
                        self._give_back(k, n)
            except Exception:   # noqa: BLE001 - the worker must outlive a bad reply
                import traceback
                traceback.print_exc()

    def _job(self, kind, key, arg):
        if kind == "refund":
            self._give_back(key, arg)
            return
        e = arg
        reply = None
        try:
            allow = self.rl.breaker.allow()
            if allow == NO:
                return
            n = self.batch
            mod, lua = self._lease_call(key, n)
            reply = self._call(mod, lua, allow == PROBE)
        finally:
            with self.lock:
                e.inflight = False
                e.failed = reply is None
                back = 0
                if reply is not None:
                    self._apply(e, reply, n, monotonic())
                    back = self._orphan(key, e)
                e.event.set()
        if back:
            self._give_back(key, back)

    def close(self):
        """Stop the worker and give every reservoir back (REFUND)."""
        if self.closed:
            return
        self.closed = True
        self.q.put(None)
        self.worker.join()
        with self.lock:
            items = [(k, e.tokens) for k, e in self.entries.items() if e.tokens > 0]
            for e in self.entries.values():
                e.tokens = 0
            self.entries.clear()
        for k, n in items:
            self._give_back(k, n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
