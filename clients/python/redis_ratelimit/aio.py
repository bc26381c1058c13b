"""The asyncio client: AsyncRateLimit, AsyncLimiter and AsyncLeasedLimiter
(redis.asyncio.Redis or redis.asyncio.cluster.RedisCluster). Every Redis
call is bounded by `timeout_ms` here (asyncio.wait_for)."""
import asyncio
from time import monotonic

import redis
from redis.asyncio.cluster import RedisCluster as AsyncCluster

from .breaker import CLOSED, NO, PROBE
from .core import (LOCAL, LUA, MODULE, RateLimitError, _Base, _LeasedCore, _LimiterCore,
                   call_for, check_cost, is_outage, is_unknown_command, options,
                   panic_decision)
from .decision import Decision

__all__ = ["AsyncRateLimit", "AsyncLimiter", "AsyncLeasedLimiter"]


class AsyncRateLimit(_Base):
    """One per asyncio Redis client; see RateLimit."""

    def __init__(self, client, *, timeout_ms=5, backend="auto", breaker=None, strict=None):
        if type(timeout_ms) not in (int, float) or timeout_ms <= 0:
            raise ValueError("timeout_ms must be > 0")
        if strict and isinstance(client, AsyncCluster):
            raise ValueError("strict mode is not supported on a RedisCluster client (WAIT "
                             "must follow the grant on the same node's connection)")
        self._setup(client, backend, breaker, strict, timeout_ms / 1000)
        self.timeout = timeout_ms / 1000
        self._detecting = None

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
            if isinstance(self.client, AsyncCluster):
                # one node, named (redis-py 8 routes COMMAND INFO by a key
                # when given the RANDOM flag); the client maps the cluster first
                await asyncio.wait_for(self.client.initialize(), self.timeout)
                kw = {"target_nodes": self.client.get_random_node()}
            try:
                reply = await asyncio.wait_for(
                    self.client.execute_command("COMMAND INFO", "RL.TOKENBUCKET", "RL.MULTI",
                                                **kw),
                    self.timeout)
            except redis.exceptions.ResponseError as e:
                if is_outage(e):
                    raise
                reply = e                        # COMMAND renamed or not permitted
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
        except redis.exceptions.NoScriptError:
            return await self.client.execute_command("EVAL", self._scripts.text[name],
                                                     len(keys), *keys, *argv)

    async def call(self, mod_args, lua, probe=False, policy=None, grant=True):
        """The reply, or None when Redis is unavailable (counted by the breaker)."""
        m = self._metrics
        t0 = monotonic()
        try:
            if self.backend is None:
                await self.detect()
            if policy is not None:
                self._check_policy(policy)
            m.calls += 1
            reply = await asyncio.wait_for(self._send(mod_args, lua, grant), self.timeout)
            if grant and self.wait is not None:
                reply, acked = reply
                if not self._acked(reply, acked):
                    m.failures += 1
                    self.breaker.failure(probe)
                    return None
        except (RateLimitError, ValueError):
            if probe:
                self.breaker.success(0.0, True)
            raise
        except Exception as e:
            if is_outage(e) or (is_unknown_command(e) and self._lost_backend()):
                m.failures += 1
                self.breaker.failure(probe)
                return None
            if probe:
                self.breaker.success(0.0, True)
            raise RateLimitError(str(e)) from e
        self.breaker.success(monotonic() - t0, probe)
        return reply

    def limiter(self, policy, panic=None):
        return AsyncLimiter(self, policy, panic)

    def leased(self, policy, batch=50, low_water=0.2, max_keys=10_000, idle_ms=5_000,
               recheck_ms=250, panic=None):
        return AsyncLeasedLimiter(self, policy, batch, low_water, max_keys, idle_ms,
                                  recheck_ms, panic)


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
    """As LeasedLimiter; refills and refunds run as tasks on the loop."""

    def __init__(self, rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic):
        self._init(rl, policy, batch, low_water, max_keys, idle_ms, recheck_ms, panic)
        self.tasks = set()
        self.sweeper = None

    def _spawn(self, coro):
        t = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)

    def _ensure_sweeper(self):
        if self.sweeper is None and not self.closed:
            self.sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def limit(self, key, cost=1):
        if type(cost) is not int or cost < 0:
            check_cost(cost)
        if self.sweeper is None:
            self._ensure_sweeper()
        now = monotonic()
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
            e.used = now
            if e.tokens >= cost:
                d = self._local(e, key, cost, now)
                if e.tokens < self.low and not e.inflight and now >= e.next_try \
                        and self.rl.breaker.state == CLOSED:
                    e.inflight = True
                    e.event = asyncio.Event()
                    self._spawn(self._refill(key, e))
                return d
        return await self._slow(key, cost, now)

    async def _slow(self, key, cost, now):
        rl = self.rl
        allow = rl.breaker.allow(now)
        evicted = []
        e = self.entries.get(key)
        if e is None:
            e = self._new_entry(key, now, evicted)
        for k, n in evicted:
            self._spawn(self._give_back(k, n))
        if allow != NO:
            if e.inflight:
                # a lease for this key is in flight: wait for it (at most the timeout)
                rl._metrics.lease_waits += 1
                landed = True
                try:
                    await asyncio.wait_for(e.event.wait(), rl.timeout)
                except asyncio.TimeoutError:
                    landed = False
                d = self._after_wait(e, key, cost, landed, monotonic())
                if d is not None:
                    return d
                return rl._count(panic_decision(self.panic, self.policy, [key], cost, False, False))
            if now < e.next_try:
                return self._local_denial(e, now)
            e.inflight = True
            e.event = ev = asyncio.Event()
            n = max(self.batch, cost - e.tokens)
            mod, lua = self._lease_call(key, n)
            reply = None
            try:
                reply = await rl.call(mod, lua, allow == PROBE)
            finally:
                e.inflight = False
                e.failed = reply is None
                if reply is None:
                    ev.set()
            if reply is not None:
                self._apply(e, reply, n, now)
                ev.set()
                back = self._orphan(key, e)
                if back:
                    self._spawn(self._give_back(key, back))
                p = self.policy
                if e.tokens >= cost:
                    e.tokens -= cost
                    return rl._count(Decision(True, cost, e.limit, e.tokens + e.remaining, 0,
                                              e.reset, p.name, p.name, rl.backend, (), p))
                return rl._count(Decision(False, 0, e.limit, e.tokens + e.remaining,
                                          e.retry if e.retry != 0 else 1, e.reset, p.name,
                                          p.name, rl.backend, (), p))
        return rl._count(panic_decision(self.panic, self.policy, [key], cost, False, False))

    async def _refill(self, key, e):
        reply = None
        back = 0
        try:
            allow = self.rl.breaker.allow()
            if allow == NO:
                return
            n = self.batch
            mod, lua = self._lease_call(key, n)
            reply = await self.rl.call(mod, lua, allow == PROBE)
        finally:
            e.inflight = False
            e.failed = reply is None
            if reply is not None:
                self._apply(e, reply, n, monotonic())
                back = self._orphan(key, e)
            e.event.set()
        if back:
            await self._give_back(key, back)

    async def refund(self, key, n):
        """Units granted locally but not used go back into the reservoir (no I/O)."""
        check_cost(n, 1)
        e = self.entries.get(key)
        if e is not None:
            e.tokens += n
        p = self.policy
        return Decision(True, n if e is not None else 0, p.limit,
                        e.tokens if e is not None else 0, 0, 0, p.name, p.name, LOCAL, (), p)

    async def _give_back(self, key, n):
        if self.rl.breaker.allow() == NO:
            return False
        mod, lua = call_for(self.policy, key, ["REFUND", n])
        reply = await self.rl.call(mod, lua, False, grant=False)
        if reply is not None:
            m = self.rl._metrics
            m.refunds += 1
            m.refund_tokens += int(reply[0])
            return True
        return False

    async def _sweep_loop(self):
        tick = max(0.01, min(self.idle_s / 4, 1.0))
        while not self.closed:
            await asyncio.sleep(tick)
            for k, n in self._sweep(monotonic()):
                try:
                    await self._give_back(k, n)
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
        items = [(k, e.tokens) for k, e in self.entries.items() if e.tokens > 0]
        for e in self.entries.values():
            e.tokens = 0
        self.entries.clear()
        for k, n in items:
            await self._give_back(k, n)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()
