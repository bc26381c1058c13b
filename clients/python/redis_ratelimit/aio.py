"""The asyncio client: AsyncRateLimit, AsyncLimiter and AsyncLeasedLimiter
(redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster). Every Redis
call is bounded by `timeout_ms` here (asyncio.wait_for)."""
import asyncio
from time import monotonic

import redis
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from . import families, glide
from .core import (LUA, MODULE, WAIT, _Base, _LeasedCore, _LimiterCore, _resume, check_cost,
                   options)

__all__ = ["AsyncRateLimit", "AsyncLimiter", "AsyncLeasedLimiter"]


class AsyncRateLimit(_Base):
    """One per asyncio Redis client; see RateLimit."""

    def __init__(self, client, *, timeout_ms=5, backend="auto", breaker=None, strict=None):
        if type(timeout_ms) not in (int, float) or timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")
        client = glide.adapt_async(client)      # GLIDE's asyncio clients (glide.py)
        if strict and (isinstance(client, families.ASYNC_CLUSTER) or glide.is_cluster(client)):
            raise ValueError("strict mode is not supported on a RedisCluster client (WAIT "
                             "must follow the grant on the same node's connection)")
        self._setup(client, backend, breaker, strict, timeout_ms / 1000)
        self.timeout = timeout_ms / 1000

    @classmethod
    def from_url(cls, url, timeout_ms=5, cluster=False, **kw):
        if cluster:
            client = AsyncCluster.from_url(url)
        else:
            client = redis.asyncio.Redis.from_url(url)
        return cls(client, timeout_ms=timeout_ms, **kw)

    @classmethod
    def from_sentinel(cls, sentinels, service_name, timeout_ms=5, password=None,
                      sentinel_password=None, **kw):
        """An AsyncRateLimit on the primary the sentinels name
        (redis.asyncio.sentinel); every call, the sentinels' answers
        included, is bounded by timeout_ms."""
        from redis.asyncio.sentinel import Sentinel
        t = timeout_ms / 1000
        skw = {"socket_timeout": t, "socket_connect_timeout": t}
        if sentinel_password is not None:
            skw["password"] = sentinel_password
        s = Sentinel(sentinels, sentinel_kwargs=skw, socket_timeout=t, socket_connect_timeout=t)
        return cls(s.master_for(service_name, password=password), timeout_ms=timeout_ms, **kw)

    async def detect(self):
        if self.backend is None:
            if self.forced == LUA:               # nothing to ask the server
                return self._set_backend(None)
            kw = {}
            if isinstance(self.client, families.ASYNC_CLUSTER):
                # one node, named (redis-py 8 routes COMMAND INFO by a key
                # when given the RANDOM flag); the client maps the cluster first
                await asyncio.wait_for(self.client.initialize(), self.timeout)
                kw = {"target_nodes": self.client.get_random_node()}
            try:
                reply = await asyncio.wait_for(self.client.execute_command(*self._DETECT, **kw),
                                               self.timeout)
            except families.RESPONSE_ERROR as e:
                reply = self._detect_refused(e)
            if self.backend is None:
                self._set_backend(reply)
        return self.backend

    async def _send_strict(self, mod_args, lua):
        """The call and `WAIT replicas ms` in one pipeline on one connection:
        (reply, replicas that acknowledged it)."""
        replicas, ms = self.wait
        for args in self._strict_cmds(mod_args, lua):
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command(*args)
            pipe.execute_command("WAIT", replicas, ms)
            reply, acked = await pipe.execute(raise_on_error=False)
            out = self._strict_reply(reply, acked)
            if out is not None:
                return out
        raise reply

    async def _send(self, mod_args, lua, grant=False):
        if grant and self.wait is not None:
            return await self._send_strict(mod_args, lua)
        if self.backend == MODULE:
            return await self.client.execute_command(*mod_args)
        sha, name, keys, argv = self._lua_args(lua)
        try:
            return await self.client.execute_command("EVALSHA", sha, len(keys), *keys, *argv)
        except families.NOSCRIPT:
            return await self.client.execute_command("EVAL", self._scripts.text[name],
                                                     len(keys), *keys, *argv)

    async def call(self, mod_args, lua, probe=False, policy=None, grant=True):
        """The reply, or None when Redis is unavailable (counted by the breaker)."""
        t0 = monotonic()
        try:
            if self.backend is None:
                await self.detect()
            self._sending(policy)
            reply = await asyncio.wait_for(self._send(mod_args, lua, grant), self.timeout)
            return self._answered(reply, probe, grant, t0)
        except Exception as e:
            return self._failed(e, probe)


class AsyncLimiter(_LimiterCore):
    """As Limiter; the call is awaited."""

    async def limit(self, key, cost=1, partial=False, dry_run=False):
        check_cost(cost)
        keys, call = self._begin(key, options(cost, partial, dry_run))
        reply = None if call is None else await self.rl.call(*call)
        return self._decided(reply, keys, cost, partial, dry_run)

    async def refund(self, key, n):
        check_cost(n, 1)
        keys, call = self._begin(key, ["REFUND", n])
        reply = None if call is None else await self.rl.call(*call)
        return self._refunded(reply, keys, n)


class AsyncLeasedLimiter(_LeasedCore):
    """As LeasedLimiter; refills and refunds run as tasks on the loop. The
    call path is _LeasedCore's; this class awaits its calls and waits."""

    _event = asyncio.Event

    def __init__(self, rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic):
        self._init(rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic)
        self.tasks = set()
        self.sweeper = None

    async def limit(self, key, cost=1):
        if type(cost) is not int or cost < 0:
            check_cost(cost)
        if self.sweeper is None and not self.closed:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        now = monotonic()
        d = self._take(key, cost, now)
        return d if d is not None else await self._run(self._slow(key, cost, now))

    async def refund(self, key, n):
        """Units granted locally but not used go back into the reservoir (no I/O)."""
        return self._refund(key, n)

    async def _run(self, steps):
        """As LeasedLimiter._run, each I/O awaited."""
        reply = exc = None
        while True:
            more, op = _resume(steps, reply, exc)
            if not more:
                return op
            try:
                reply, exc = await self._io(op), None
            except BaseException as e:  # noqa: BLE001 - thrown into the call path
                reply, exc = None, e

    async def _io(self, op):
        if op[0] == WAIT:
            try:
                await asyncio.wait_for(op[1].wait(), self.rl.timeout)
            except asyncio.TimeoutError:
                return False
            return True
        return await self.rl.call(*op[1:])

    def _later(self, steps):
        t = asyncio.get_running_loop().create_task(self._run(steps))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    async def _sweep_loop(self):
        tick = self._tick()
        while not self.closed:
            await asyncio.sleep(tick)
            for k, n in self._sweep(monotonic()):
                try:
                    await self._run(self._give_back(k, n))
                except Exception:   # noqa: BLE001 - keep sweeping
                    import traceback
                    traceback.print_exc()

    async def close(self):
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

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


AsyncRateLimit._limiter, AsyncRateLimit._leased = AsyncLimiter, AsyncLeasedLimiter
