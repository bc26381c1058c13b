"""The local tier of a leased limiter, without I/O: the reservoirs, their
leases and refunds, and the call path written once as generators that
yield their I/O (client.LeasedLimiter runs it with calls and
threading.Event waits, aio.AsyncLeasedLimiter awaits them)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from time import monotonic
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Protocol, Tuple

from .breaker import CLOSED, NO, PROBE, YES, Panic, PanicBuckets
from .core import (CALL, LOCAL, WAIT, Args, LuaCall, Steps, call_for, check_cost, decision_on,
                   panic_decision)
from .decision import Decision
from .policies import AllOf, Key, Policy, not_a_rate

if TYPE_CHECKING:
    from .core import _Base


class _Event(Protocol):
    """threading.Event or asyncio.Event: what a lease in flight sets when it lands."""

    def set(self) -> None: ...


class _Entry:
    """One key's reservoir in a leased limiter's table."""

    __slots__ = ("tokens", "used", "inflight", "next_try", "remaining", "retry", "reset",
                 "at", "limit", "event", "failed")

    def __init__(self, now: float) -> None:
        self.tokens = 0
        self.used = now
        self.inflight = False
        self.next_try = 0.0
        self.remaining = 0
        self.retry = 0
        self.reset = 0
        self.at = now
        self.limit = 0
        self.event: Optional[_Event] = None     # set when the lease in flight has landed
        self.failed = False   # the last lease found Redis unavailable


class _LeasedCore:
    """The local tier, shared by the sync and asyncio leased limiters."""

    _event: Callable[[], _Event]

    def _init(self, rl: _Base[Any, Any], policy: Policy | AllOf, batch: int, low_water: float,
              max_keys: int, idle_ms: float, recheck_ms: float, panic: Optional[Panic]) -> None:
        if not isinstance(policy, Policy):
            raise ValueError("leased() takes a single policy (all_of is not leased)")
        not_a_rate(policy, "leased()")
        if type(batch) is not int or batch < 1:
            raise ValueError("batch must be an integer >= 1")
        if not 0 <= low_water < 1:
            raise ValueError("low_water must be in [0, 1)")
        if type(max_keys) is not int or max_keys < 1:
            raise ValueError("max_keys must be an integer >= 1")
        self.rl = rl
        self.policy: Policy = policy
        self.batch = min(batch, policy.limit)
        self.low = low_water * self.batch
        self.max_keys = max_keys
        self.idle_s = idle_ms / 1000
        self.recheck_s = recheck_ms / 1000
        self.panic = PanicBuckets(panic or Panic(), policy)
        self.entries: OrderedDict[Key, _Entry] = OrderedDict()
        self.lock = threading.Lock()
        self.closed = False

    def _local(self, e: _Entry, key: Key, cost: int, now: float) -> Decision:
        """A local grant from e's reservoir (caller holds the lock)."""
        t = e.tokens - cost
        e.tokens = t
        self.rl._metrics.decisions_local += 1
        p = self.policy
        reset = e.reset - int((now - e.at) * 1000)
        return decision_on(p, LOCAL, allowed=True, granted=cost, limit=p.limit,
                           remaining=t + e.remaining, retry_after_ms=0,
                           reset_after_ms=reset if reset > 0 else 0)

    def _local_denial(self, e: _Entry, now: float) -> Decision:
        m = self.rl._metrics
        m.decisions_local += 1
        m.denied += 1
        p = self.policy
        el = int((now - e.at) * 1000)
        retry = e.retry if e.retry < 0 else max(1, e.retry - el)
        reset = e.reset - el
        return decision_on(p, LOCAL, allowed=False, granted=0, limit=p.limit,
                           remaining=e.tokens + e.remaining, retry_after_ms=retry,
                           reset_after_ms=reset if reset > 0 else 0)

    def _after_wait(self, e: _Entry, key: Key, cost: int, landed: bool,
                    now: float) -> Optional[Decision]:
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

    def _panic_decision(self, key: Key, cost: int) -> Decision:
        return self.rl._count(panic_decision(self.panic, self.policy, [key], cost, False, False))

    def _leased_decision(self, e: _Entry, cost: int) -> Decision:
        """The decision of the caller whose own lease just landed on e
        (caller holds the lock): from the reservoir it refilled, else a
        denial from the reply (source: the backend that answered)."""
        rl = self.rl
        p = self.policy
        source = rl._source()
        if e.tokens >= cost:
            e.tokens -= cost
            return rl._count(decision_on(p, source, allowed=True, granted=cost, limit=e.limit,
                                         remaining=e.tokens + e.remaining, retry_after_ms=0,
                                         reset_after_ms=e.reset))
        return rl._count(decision_on(p, source, allowed=False, granted=0, limit=e.limit,
                                     remaining=e.tokens + e.remaining,
                                     retry_after_ms=e.retry if e.retry != 0 else 1,
                                     reset_after_ms=e.reset))

    def _lease_call(self, key: Key, n: int) -> Tuple[Args, LuaCall]:
        p = self.policy
        return call_for(p, key, ["COST", n, "PARTIAL"])

    def _apply(self, e: _Entry, reply: Any, n: int, now: float) -> None:
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

    def _new_entry(self, key: Key, now: float, evicted: List[Tuple[Key, int]]) -> _Entry:
        e = _Entry(now)
        self.entries[key] = e
        while len(self.entries) > self.max_keys:
            k, old = self.entries.popitem(last=False)
            if old.tokens > 0 and not old.inflight:
                evicted.append((k, old.tokens))
                old.tokens = 0
        return e

    def _sweep(self, now: float) -> List[Tuple[Key, int]]:
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

    def _orphan(self, key: Key, e: _Entry) -> int:
        """A lease landed on an entry no longer in the table: its tokens go back."""
        if self.entries.get(key) is not e and e.tokens > 0:
            n, e.tokens = e.tokens, 0
            return n
        return 0

    def stranded(self) -> int:
        """Units leased to this instance and not yet used (all keys)."""
        with self.lock:
            return sum(e.tokens for e in self.entries.values())

    def _tick(self) -> float:
        """How often idle keys are swept."""
        return max(0.01, min(self.idle_s / 4, 1.0))

    def _drain(self) -> List[Tuple[Key, int]]:
        """close(): every key leaves the table; (key, units) to give back."""
        with self.lock:
            items = [(k, e.tokens) for k, e in self.entries.items() if e.tokens > 0]
            for e in self.entries.values():
                e.tokens = 0
            self.entries.clear()
        return items

    def _refund(self, key: Key, n: int) -> Decision:
        """A request that was granted locally was not served: its units go
        back into this key's reservoir (no I/O)."""
        check_cost(n, 1)
        with self.lock:
            e = self.entries.get(key)
            if e is not None:
                e.tokens += n
        p = self.policy
        return decision_on(p, LOCAL, allowed=True, granted=n if e is not None else 0,
                           limit=p.limit, remaining=e.tokens if e is not None else 0,
                           retry_after_ms=0, reset_after_ms=0)

    # The call path, written once. limit() is _take (no I/O), else the
    # steps of _slow. _slow, _refill and _give_back are generators that
    # yield their I/O, (CALL, args of rl.call) or (WAIT, event), and are
    # sent its result (or thrown its error): LeasedLimiter._run makes the
    # call or waits on a threading.Event, AsyncLeasedLimiter._run awaits.
    # Work for later goes to _later (the worker's queue, or a task), and
    # events come from _event (threading.Event or asyncio.Event).

    def _later(self, steps: Steps[Any]) -> None:
        """Run steps in the background (the worker's queue, or a task)."""
        raise NotImplementedError

    def _take(self, key: Key, cost: int, now: float) -> Optional[Decision]:
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

    def _slow(self, key: Key, cost: int, now: float) -> Steps[Decision]:
        """limit() when the reservoir is short: wait for the lease in flight,
        or send one on the caller's path, or decide from the panic limits.
        While the breaker is not closed no caller waits on Redis: the
        half-open probe is a lease the background worker sends (_later),
        and the caller is answered from the panic limits at once."""
        breaker = self.rl.breaker
        evicted: List[Tuple[Key, int]] = []
        d: Optional[Decision] = None
        wait: Optional[_Event] = None
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

    def _lease(self, key: Key, e: _Entry, n: int, probe: bool,
               now: Optional[float] = None) -> Steps[Tuple[Any, int]]:
        """Send e's lease of n units (e is marked in flight) and fold its
        reply in: (reply or None, units to give back as e left the table)."""
        reply = None
        try:
            mod, lua = self._lease_call(key, n)
            reply = yield CALL, mod, lua, probe, self.policy
        finally:
            back = self._landed(key, e, reply, n, now)
        return reply, back

    def _landed(self, key: Key, e: _Entry, reply: Any, n: int,
                now: Optional[float] = None) -> int:
        """e's lease is no longer in flight (reply None: it brought none)."""
        with self.lock:
            e.inflight = False
            e.failed = reply is None
            back = 0
            if reply is not None:
                self._apply(e, reply, n, monotonic() if now is None else now)
                back = self._orphan(key, e)
            assert e.event is not None      # set when the lease was marked in flight
            e.event.set()
        return back

    def _refill(self, key: Key, e: _Entry, n: Optional[int] = None,
                allow: Optional[int] = None) -> Steps[None]:
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

    def _give_back(self, key: Key, n: int) -> Steps[bool]:
        """REFUND n units of key's (swept, evicted or closed): True when done."""
        if self.rl.breaker.allow() == NO:
            return False
        mod, lua = call_for(self.policy, key, ["REFUND", n])
        reply = yield CALL, mod, lua, False, self.policy, False     # (a refund: no WAIT)
        if reply is None:
            return False
        m = self.rl._metrics
        m.refunds += 1
        m.refund_tokens += int(reply[0])
        return True

