"""The synchronous client: RateLimit, Limiter and LeasedLimiter."""
from __future__ import annotations

import queue
import threading
from time import monotonic
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import families, glide
from .breaker import Breaker, Panic
from .core import (CMD, LUA, WAIT, Args, Backend, StrictArg, Steps, _Base, _LimiterCore,
                   check_cost, drive, is_outage, log, options)
from .decision import Decision
from .inflight import InFlight
from .lease import _LeasedCore
from .policies import AllOf, Key, Keys, Policy
from .reserve import Reservation

__all__ = ["RateLimit", "Limiter", "LeasedLimiter"]

_REDIS_MAJOR = int(redis.__version__.split(".")[0])


def _timeout_of(client: Any) -> Optional[float]:
    if isinstance(client, glide.SyncGlide):
        return client.timeout_s
    return _kwargs_of(client).get("socket_timeout")


def _kwargs_of(client: Any) -> Dict[str, Any]:
    if isinstance(client, families.SYNC_CLUSTER):
        kw: Dict[str, Any] = client.nodes_manager.connection_kwargs
    else:
        kw = client.connection_pool.connection_kwargs
    return kw


def _retries(retry: Any) -> int:
    """How often a redis-py Retry tries again (-1: without end)."""
    if retry is None:
        return 0
    n = retry.get_retries() if hasattr(retry, "get_retries") else retry._retries
    return -1 if n < 0 else n


def _connection_retries(kw: Dict[str, Any]) -> int:
    """The retries of the connections a pool with these kwargs makes: redis-py
    5 to 8 all build a connection's Retry this way (a `retry`, or
    `retry_on_timeout` / `retry_on_error` with one retry by default; else
    none). Every call on the connection, and its connect and handshake,
    goes through it."""
    retry = kw.get("retry")
    if retry or kw.get("retry_on_timeout") or kw.get("retry_on_error"):
        return 1 if retry is None else _retries(retry)
    return 0


def _sentinel_of(client: Any) -> Any:
    """The redis.sentinel.Sentinel behind a master_for() client, or None."""
    if isinstance(client, families.SYNC_CLUSTER):
        return None
    return getattr(client.connection_pool, "sentinel_manager", None)


def _unbounded(client: Any) -> Optional[str]:
    """Why one call on this sync client could wait longer than its
    socket_timeout (every reason, each naming its setting), or None."""
    if isinstance(client, glide.SyncGlide):     # glide.adapt_sync checked it
        return None
    why = _unbounded_reasons(client)
    sentinel = _sentinel_of(client)
    if sentinel is not None:
        # A connection to the primary first asks the sentinels, in turn,
        # where it is (after a failover, on every reconnect): each of their
        # clients must be bounded too.
        timeout = _kwargs_of(client).get("socket_timeout")
        for s in sentinel.sentinels:
            kw = s.connection_pool.connection_kwargs
            host = f"{kw.get('host')}:{kw.get('port')}"
            w = _unbounded_reasons(s)
            t = kw.get("socket_timeout")
            if timeout is not None and t is not None and t > timeout:
                w.append(f"its socket_timeout ({t} s) is longer than the primary's ({timeout} s)")
            if w:
                why.append(f"the sentinel client for {host} (Sentinel(..., sentinel_kwargs=...)) "
                           "is not bounded: " + "; ".join(w).replace(
                               "create it with", "give sentinel_kwargs"))
    if not why:
        return None
    kind = "RedisCluster" if isinstance(client, families.SYNC_CLUSTER) else \
        "Sentinel master_for()" if sentinel is not None else "redis"
    how = {"RedisCluster": "RateLimit.from_url(url, timeout_ms=5, cluster=True)",
           "redis": "RateLimit.from_url(url, timeout_ms=5)",
           "Sentinel master_for()": "RateLimit.from_sentinel(sentinels, service_name, "
                                    "timeout_ms=5)"}[kind]
    msg = (f"RateLimit refuses this {kind} client: " + "; ".join(why)
           + f"; or use {how}, which builds a client bounded by timeout_ms")
    if families.family_of(client) == "valkey":      # valkey-py: its own modules
        msg = msg.replace("RedisCluster", "ValkeyCluster").replace("from redis.", "from valkey.")
    return msg


def _unbounded_reasons(client: Any) -> List[str]:
    kw = _kwargs_of(client)
    why: List[str] = []
    timeout = kw.get("socket_timeout")
    if timeout is None:
        why.append("it has no socket_timeout (every call must be bounded)")
    connect = kw.get("socket_connect_timeout")
    if timeout is not None and connect is not None and connect > timeout:
        why.append(f"its socket_connect_timeout ({connect} s; redis-py 8 defaults it to 5 s) "
                   f"is longer than its socket_timeout ({timeout} s), so a call that "
                   "reconnects could wait that long: set socket_connect_timeout <= "
                   "socket_timeout")
    if isinstance(client, families.SYNC_CLUSTER):
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
    return why


class RateLimit(_Base["Limiter", "LeasedLimiter"]):
    """One per Redis client (redis.Redis or redis.cluster.RedisCluster).

    The client's socket_timeout bounds every call. A client that could wait
    longer is refused with a ValueError naming the setting: one without a
    socket_timeout, one whose socket_connect_timeout is longer, and one that
    retries a failed call (redis-py's default since 6.0: each retry is
    another timeout plus backoff). from_url() builds a client with
    `timeout_ms` and no retries."""

    def __init__(self, client: Union[redis.Redis, RedisCluster], *, backend: Backend = "auto",
                 breaker: Optional[Breaker] = None, strict: StrictArg = None) -> None:
        client = glide.adapt_sync(client)       # GLIDE's sync clients (glide.py)
        why = _unbounded(client)
        if why is not None:
            raise ValueError(why)
        if strict and (isinstance(client, families.SYNC_CLUSTER) or glide.is_cluster(client)):
            raise ValueError("strict mode is not supported on a RedisCluster client (WAIT "
                             "must follow the grant on the same node's connection)")
        timeout = _timeout_of(client)
        assert timeout is not None      # _unbounded refuses a client without one
        self._setup(client, backend, breaker, strict, timeout)
        self._lock = threading.Lock()
        self._cluster = isinstance(client, families.SYNC_CLUSTER)
        self._refreshing = False

    @classmethod
    def _url_client(cls, url: str, t: float, cluster: bool) -> Any:
        no_retry = Retry(NoBackoff(), 0)
        if cluster:
            # redis-py 6+ takes the cluster's retries from `retry` (and warns
            # that cluster_error_retry_attempts is deprecated); 5 from both
            old = {"cluster_error_retry_attempts": 0} if _REDIS_MAJOR < 6 else {}
            cluster_cls: Any = RedisCluster        # redis-py 5 leaves from_url untyped
            return cluster_cls.from_url(url, socket_timeout=t, socket_connect_timeout=t,
                                         retry=no_retry, **old)
        return redis.Redis.from_url(url, socket_timeout=t, socket_connect_timeout=t,
                                    retry=no_retry)

    @classmethod
    def _sentinel_class(cls) -> Any:
        from redis.sentinel import Sentinel
        return Sentinel

    @classmethod
    def _bounded(cls, t: float) -> Dict[str, Any]:
        return {"socket_timeout": t, "socket_connect_timeout": t, "retry": Retry(NoBackoff(), 0)}

    @classmethod
    def _made(cls, client: Any, timeout_ms: float, **kw: Any) -> RateLimit:
        return cls(client, **kw)     # the client's own socket_timeout bounds it

    def detect(self) -> Optional[str]:
        """Choose the backend (once): the module when its commands exist, else Lua."""
        if self.backend is None:
            with self._lock:
                if self.backend is None:
                    if self.forced == LUA:       # nothing to ask the server
                        return self._set_backend(None)
                    # on a cluster, one node's own client (redis-py 8
                    # routes COMMAND INFO by a key when given the RANDOM
                    # flag, and has none)
                    c = self.client
                    if self._cluster:
                        c = families.random_node_client(c)
                    try:
                        reply = c.execute_command(*self._DETECT)
                    except families.RESPONSE_ERROR as e:
                        reply = self._detect_refused(e)
                    self._set_backend(reply)
        return self.backend

    def _send(self, mod_args: Args, lua: Any, grant: bool = False) -> Any:
        return drive(self._sends(mod_args, lua, grant), self._send_io)

    def _send_io(self, op: Tuple[Any, ...]) -> Any:
        """One I/O of _sends: a command, or strict mode's pipeline."""
        if op[0] == CMD:
            return self._execute(op[1], op[2])
        _, args, replicas, ms = op
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command(*args)
        pipe.execute_command("WAIT", replicas, ms)
        return pipe.execute(raise_on_error=False)

    def _execute(self, key: Any, args: Args) -> Any:
        """One command on `key`. On a RedisCluster it goes straight to the
        client of the node that holds the key's slot: after a timeout or a
        connection error the cluster client itself would re-read the slot
        map inside the failed call, asking each node in turn with the same
        timeout (a 30 ms timeout took 124 ms with every node stopped, here),
        so here that re-read runs on a thread of its own instead. A MOVED or
        ASK reply (resharding, a failover the map has not caught up with)
        goes through the cluster client, which follows it and learns the
        new map."""
        if not self._cluster:
            return self.client.execute_command(*args)
        c = self.client
        try:
            # the redis.Redis the cluster client keeps for the node (its
            # pool, its connection settings, no retries)
            return families.node_client(c, key).execute_command(*args)
        except families.REDIRECT:
            return c.execute_command(*args)
        except Exception as e:
            if is_outage(e):
                self._refresh_map()
            raise

    def _refresh_map(self) -> None:
        """Re-read the cluster's slot map on a background thread, one at a
        time: the node a key maps to may be gone for good (a failover)."""
        with self._lock:
            if self._refreshing:
                return
            self._refreshing = True

        def refresh() -> None:
            try:
                self.client.nodes_manager.initialize()
            except Exception:   # noqa: BLE001 - the next failed call tries again
                pass
            finally:
                self._refreshing = False
        threading.Thread(target=refresh, daemon=True, name="rl-cluster-map").start()

    def call(self, mod_args: Args, lua: Any, probe: bool = False,
             policy: Optional[Policy | AllOf] = None, grant: bool = True) -> Any:
        """One Redis call (after choosing the backend, the first time): its
        reply, or None when Redis is unavailable (the breaker has counted
        it). Other errors are raised. As AsyncRateLimit.call, not awaited.
        `grant`: the call can grant (strict mode follows it with WAIT)."""
        t0 = monotonic()
        try:
            if self.backend is None:
                self.detect()
            self._sending(policy)
            return self._answered(self._send(mod_args, lua, grant), probe, grant, t0)
        except Exception as e:
            return self._failed(e, probe)


    def inflight(self, policy: Policy, renew_ms: Optional[int] = None,
                 panic: Optional[Panic] = None) -> InFlight:
        """An in-flight limit (a concurrency policy): holds that renew their
        lease and release on every exit (clients/DESIGN.md, "In-flight limits")."""
        return InFlight(self, policy, renew_ms, panic)


class Limiter(_LimiterCore):
    """limit()/refund() on one policy, one shared call each."""

    rl: RateLimit

    def limit(self, key: Keys, cost: int = 1, partial: bool = False,
              dry_run: bool = False) -> Decision:
        check_cost(cost)
        keys, call = self._begin(key, options(cost, partial, dry_run))
        reply = None if call is None else self.rl.call(*call)
        return self._decided(reply, keys, cost, partial, dry_run)

    def refund(self, key: Keys, n: int) -> Decision:
        """Give n units back (the request was not served after all). Returns
        a Decision whose `granted` is the units given back (0 when Redis is
        unavailable: then nothing was given back)."""
        check_cost(n, 1)
        keys, call = self._begin(key, ["REFUND", n])
        reply = None if call is None else self.rl.call(*call)
        return self._refunded(reply, keys, n)

    def reserve(self, key: Keys, estimate: int) -> Reservation:
        """limit(key, cost=estimate), as a handle to settle(actual) once the
        real cost is known (clients/DESIGN.md, "Reservations")."""
        check_cost(estimate, 1)
        return Reservation(self, key, estimate, self.limit(key, cost=estimate))

    def _debit(self, key: Keys, n: int) -> Decision:
        keys, call = self._begin(key, ["COST", n, "FORCE"])
        reply = None if call is None else self.rl.call(*call)
        return self._debited(reply, keys, n)


class LeasedLimiter(_LeasedCore):
    """Decides from local reservoirs; one background thread refills them
    (single flight per key), refunds idle and evicted keys' tokens. The
    call path is _LeasedCore's; this class makes its calls and waits."""

    _event = threading.Event
    rl: RateLimit

    def __init__(self, rl: RateLimit, policy: Policy, batch: int, low_water: float,
                 max_keys: int, idle_ms: float, recheck_ms: float,
                 panic: Optional[Panic]) -> None:
        self._init(rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic)
        self.q: queue.SimpleQueue[Optional[Steps[Any]]] = queue.SimpleQueue()
        self.worker = threading.Thread(target=self._work, daemon=True,
                                       name=f"rl-leases-{policy.name}")
        self.worker.start()

    def limit(self, key: Key, cost: int = 1) -> Decision:
        if type(cost) is not int or cost < 0:
            check_cost(cost)
        now = monotonic()
        d = self._take(key, cost, now)
        return d if d is not None else self._run(self._slow(key, cost, now))

    def refund(self, key: Key, n: int) -> Decision:
        """A request that was granted locally was not served: its units go
        back into this key's reservoir (no I/O)."""
        return self._refund(key, n)

    def _run(self, steps: Steps[Any]) -> Any:
        """Run one of the core's call paths: each CALL made, each WAIT waited."""
        return drive(steps, self._io)

    def _io(self, op: Tuple[Any, ...]) -> Any:
        if op[0] == WAIT:
            return op[1].wait(self.rl.timeout_s)
        return self.rl.call(*op[1:])

    def _later(self, steps: Steps[Any]) -> None:
        self.q.put(steps)

    def _work(self) -> None:
        tick = self._tick()
        next_sweep = monotonic() + tick
        while True:
            timeout = max(0.0, next_sweep - monotonic())
            job: Union[Steps[Any], None, Literal[False]]
            try:
                job = self.q.get(timeout=timeout)
            except queue.Empty:
                job = False
            if job is None:
                return
            try:
                if job is not False:
                    self._run(job)
                now = monotonic()
                if now >= next_sweep:
                    next_sweep = now + tick
                    for k, n in self._sweep(now):
                        self._run(self._give_back(k, n))
            except Exception:   # noqa: BLE001 - the worker must outlive a bad reply
                log.exception("leased limiter %r: a background lease or refund failed",
                              self.policy.name)

    def close(self) -> None:
        """Stop the worker and give every reservoir back (REFUND)."""
        if self.closed:
            return
        self.closed = True
        self.q.put(None)
        self.worker.join()
        for k, n in self._drain():
            self._run(self._give_back(k, n))

    def __enter__(self) -> LeasedLimiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RateLimit._limiter, RateLimit._leased = Limiter, LeasedLimiter
