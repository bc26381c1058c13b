"""The asyncio client: AsyncRateLimit, AsyncLimiter and AsyncLeasedLimiter
(redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster). Every Redis
call is bounded by `timeout_ms` here (asyncio.wait_for)."""
from __future__ import annotations

import asyncio
from time import monotonic
from typing import Any, Awaitable, Callable, Dict, Optional, Set, Tuple, Union, cast

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from . import families, glide
from .breaker import Breaker, Panic
from .core import (CMD, LUA, WAIT, Args, Backend, StrictArg, Steps, _Base, _LimiterCore, _resume,
                   _T, check_cost, log, options)
from .decision import Decision
from .inflight import AsyncInFlight
from .lease import _LeasedCore
from .policies import AllOf, Key, Keys, Policy
from .reserve import AsyncReservation

__all__ = ["AsyncRateLimit", "AsyncLimiter", "AsyncLeasedLimiter"]


async def adrive(steps: Steps[_T], io: Callable[[Tuple[Any, ...]], Awaitable[Any]]) -> _T:
    """As core.drive, each I/O awaited."""
    reply: Any = None
    exc: Optional[BaseException] = None
    while True:
        more, op = _resume(steps, reply, exc)
        if not more:
            return cast(_T, op)
        try:
            reply, exc = await io(op), None
        except BaseException as e:  # noqa: BLE001 - thrown into the call path
            reply, exc = None, e


class AsyncRateLimit(_Base["AsyncLimiter", "AsyncLeasedLimiter"]):
    """One per asyncio Redis client; see RateLimit."""

    def __init__(self, client: Union[redis.asyncio.Redis, AsyncCluster], *,
                 timeout_ms: float = 5, backend: Backend = "auto",
                 breaker: Optional[Breaker] = None, strict: StrictArg = None) -> None:
        if type(timeout_ms) not in (int, float) or timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")
        client = glide.adapt_async(client)      # GLIDE's asyncio clients (glide.py)
        if strict and (isinstance(client, families.ASYNC_CLUSTER) or glide.is_cluster(client)):
            raise ValueError("strict mode is not supported on a RedisCluster client (WAIT "
                             "must follow the grant on the same node's connection)")
        self._setup(client, backend, breaker, strict, timeout_ms / 1000)

    @classmethod
    def _url_client(cls, url: str, t: float, cluster: bool) -> Any:
        # no client timeouts: asyncio.wait_for bounds every call
        if cluster:
            return AsyncCluster.from_url(url)
        return redis.asyncio.Redis.from_url(url)

    @classmethod
    def _sentinel_class(cls) -> Any:
        from redis.asyncio.sentinel import Sentinel
        return Sentinel

    @classmethod
    def _bounded(cls, t: float) -> Dict[str, Any]:
        return {"socket_timeout": t, "socket_connect_timeout": t}

    @classmethod
    def _made(cls, client: Any, timeout_ms: float, **kw: Any) -> AsyncRateLimit:
        return cls(client, timeout_ms=timeout_ms, **kw)

    async def detect(self) -> Optional[str]:
        if self.backend is None:
            if self.forced == LUA:               # nothing to ask the server
                return self._set_backend(None)
            kw = {}
            if isinstance(self.client, families.ASYNC_CLUSTER):
                # one node, named (redis-py 8 routes COMMAND INFO by a key
                # when given the RANDOM flag); the client maps the cluster first
                await asyncio.wait_for(self.client.initialize(), self.timeout_s)
                kw = {"target_nodes": self.client.get_random_node()}
            try:
                reply = await asyncio.wait_for(self.client.execute_command(*self._DETECT, **kw),
                                               self.timeout_s)
            except families.RESPONSE_ERROR as e:
                reply = self._detect_refused(e)
            if self.backend is None:
                self._set_backend(reply)
        return self.backend

    async def _send(self, mod_args: Args, lua: Any, grant: bool = False) -> Any:
        return await adrive(self._sends(mod_args, lua, grant), self._send_io)

    async def _send_io(self, op: Tuple[Any, ...]) -> Any:
        """One I/O of _sends: a command, or strict mode's pipeline."""
        if op[0] == CMD:
            return await self.client.execute_command(*op[2])
        _, args, replicas, ms = op
        pipe = self.client.pipeline(transaction=False)
        pipe.execute_command(*args)
        pipe.execute_command("WAIT", replicas, ms)
        return await pipe.execute(raise_on_error=False)

    async def call(self, mod_args: Args, lua: Any, probe: bool = False,
                   policy: Optional[Policy | AllOf] = None, grant: bool = True) -> Any:
        """The reply, or None when Redis is unavailable (counted by the breaker)."""
        t0 = monotonic()
        try:
            if self.backend is None:
                await self.detect()
            self._sending(policy)
            reply = await asyncio.wait_for(self._send(mod_args, lua, grant), self.timeout_s)
            return self._answered(reply, probe, grant, t0)
        except Exception as e:
            return self._failed(e, probe)


    def inflight(self, policy: Policy, renew_ms: Optional[int] = None,
                 panic: Optional[Panic] = None) -> AsyncInFlight:
        """An in-flight limit (a concurrency policy): holds that renew their
        lease and release on every exit (clients/DESIGN.md, "In-flight limits")."""
        return AsyncInFlight(self, policy, renew_ms, panic)


class AsyncLimiter(_LimiterCore):
    """As Limiter; the call is awaited."""

    rl: AsyncRateLimit

    async def limit(self, key: Keys, cost: int = 1, partial: bool = False,
                    dry_run: bool = False) -> Decision:
        check_cost(cost)
        keys, call = self._begin(key, options(cost, partial, dry_run))
        reply = None if call is None else await self.rl.call(*call)
        return self._decided(reply, keys, cost, partial, dry_run)

    async def refund(self, key: Keys, n: int) -> Decision:
        check_cost(n, 1)
        keys, call = self._begin(key, ["REFUND", n])
        reply = None if call is None else await self.rl.call(*call)
        return self._refunded(reply, keys, n)

    async def reserve(self, key: Keys, estimate: int) -> AsyncReservation:
        check_cost(estimate, 1)
        return AsyncReservation(self, key, estimate, await self.limit(key, cost=estimate))

    async def _debit(self, key: Keys, n: int) -> Decision:
        keys, call = self._begin(key, ["COST", n, "FORCE"])
        reply = None if call is None else await self.rl.call(*call)
        return self._debited(reply, keys, n)


class AsyncLeasedLimiter(_LeasedCore):
    """As LeasedLimiter; refills and refunds run as tasks on the loop. The
    call path is _LeasedCore's; this class awaits its calls and waits."""

    _event = asyncio.Event
    rl: AsyncRateLimit

    def __init__(self, rl: AsyncRateLimit, policy: Policy, batch: int, low_water: float,
                 max_keys: int, idle_ms: float, recheck_ms: float,
                 panic: Optional[Panic]) -> None:
        self._init(rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic)
        self.tasks: Set[asyncio.Task[Any]] = set()
        self.sweeper: Optional[asyncio.Task[None]] = None

    async def limit(self, key: Key, cost: int = 1) -> Decision:
        if type(cost) is not int or cost < 0:
            check_cost(cost)
        if self.sweeper is None and not self.closed:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        now = monotonic()
        d = self._take(key, cost, now)
        return d if d is not None else await self._run(self._slow(key, cost, now))

    async def refund(self, key: Key, n: int) -> Decision:
        """Units granted locally but not used go back into the reservoir (no I/O)."""
        return self._refund(key, n)

    async def _run(self, steps: Steps[_T]) -> _T:
        """As LeasedLimiter._run, each I/O awaited."""
        return await adrive(steps, self._io)

    async def _io(self, op: Tuple[Any, ...]) -> Any:
        if op[0] == WAIT:
            try:
                await asyncio.wait_for(op[1].wait(), self.rl.timeout_s)
            except asyncio.TimeoutError:
                return False
            return True
        return await self.rl.call(*op[1:])

    def _later(self, steps: Steps[Any]) -> None:
        t = asyncio.get_running_loop().create_task(self._run(steps))
        self.tasks.add(t)
        t.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        """A background task ended: its failure, if any, is logged."""
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("leased limiter %r: a background lease or refund failed",
                      self.policy.name, exc_info=task.exception())

    async def _sweep_loop(self) -> None:
        tick = self._tick()
        while not self.closed:
            await asyncio.sleep(tick)
            for k, n in self._sweep(monotonic()):
                try:
                    await self._run(self._give_back(k, n))
                except Exception:   # noqa: BLE001 - keep sweeping
                    log.exception("leased limiter %r: a background refund failed",
                                  self.policy.name)

    async def close(self) -> None:
        """Stop the background work and give every reservoir back (REFUND)."""
        if self.closed:
            return
        self.closed = True
        if self.sweeper is not None:
            self.sweeper.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        for k, n in self._drain():
            await self._run(self._give_back(k, n))

    async def __aenter__(self) -> AsyncLeasedLimiter:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


AsyncRateLimit._limiter, AsyncRateLimit._leased = AsyncLimiter, AsyncLeasedLimiter
