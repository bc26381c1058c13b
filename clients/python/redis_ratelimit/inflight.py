"""In-flight limits (RL.CONCURRENCY, twin concurrency.lua): a guard that
holds units while its body runs, renews its lease in the background and
releases on every exit path; under the breaker, a local in-flight limit.
What the sync and asyncio guards share is here; InFlight / Hold are the
sync ones (a renewer thread per InFlight), aio.py's AsyncInFlight /
AsyncHold await the same calls (a renewal task per hold). See
clients/DESIGN.md, "In-flight limits: the guard"."""
from __future__ import annotations

import asyncio
import secrets
import threading
import weakref
from time import monotonic
from typing import Any, Dict, List, Optional, Tuple, Union, cast

from .breaker import CLOSED, NO, PROBE, Panic
from .core import PANIC, Args, LuaCall, _Base, check_cost, log
from .decision import Decision, _decision
from .policies import Key, Policy

ACQUIRE, RELEASE, RENEW = "ACQUIRE", "RELEASE", "RENEW"
# a hold's life: not entered, held (on the server or locally), released
NEW, HELD, DONE = 0, 1, 2


class _HoldState:
    """What a hold knows: its id, key, cost, the acquire's decision, and
    whether it is held on the server (renewed, released by RELEASE) or
    locally (the panic limit)."""

    __slots__ = ("inflight", "key", "cost", "id", "decision", "lost", "renewals", "_state",
                 "_local", "__weakref__")

    def __init__(self, inflight: _InFlightCore, key: Key, cost: int) -> None:
        check_cost(cost, 1)
        if not isinstance(key, (str, bytes)):
            raise ValueError(f"key must be a string, not {type(key).__name__}")
        self.inflight = inflight
        self.key = key
        self.cost = cost
        #: the id the lease is held under: 128 random bits, one per hold
        self.id = secrets.token_hex(16)
        self.decision: Optional[Decision] = None
        #: a renewal found the lease lapsed: the work is no longer counted
        self.lost = False
        #: renewals the server answered 1
        self.renewals = 0
        self._state = NEW
        self._local = False

    @property
    def allowed(self) -> bool:
        """The units are held (False before entering and after a denial)."""
        return self.decision is not None and self.decision.allowed

    @property
    def held(self) -> bool:
        """Held now: entered, granted, not yet released."""
        return self._state == HELD


class _InFlightCore:
    """The calls and decisions of one concurrency policy, without I/O."""

    def __init__(self, rl: _Base[Any, Any], policy: Policy, renew_ms: Optional[int],
                 panic: Optional[Panic]) -> None:
        if not isinstance(policy, Policy) or policy.kind != "concurrency":
            raise ValueError("inflight() takes a concurrency policy (concurrency(name, limit, lease_ms))")
        lease_ms = policy.params[1]
        if renew_ms is None:
            renew_ms = max(1, lease_ms // 3)
        elif type(renew_ms) is not int or not 1 <= renew_ms < max(2, lease_ms):
            raise ValueError(f"renew_ms must be an integer from 1 to lease_ms - 1, not {renew_ms!r}")
        self.rl = rl
        self.policy = policy
        self.lease_ms = lease_ms
        self.renew_s = renew_ms / 1000.0
        #: the local in-flight limit under the breaker (per key, this process)
        self.local_cap = (panic or Panic()).capacity(policy)
        self._local: Dict[Key, int] = {}
        self._local_lock = threading.Lock()
        # ACQUIREs that failed after they were sent (a timeout: a stalled
        # server may still apply them): id -> (key, until when its lease
        # could hold). A RELEASE of each id is sent once Redis answers
        # again (the breaker closed), so what the server took is freed
        # then rather than when the lease lapses.
        self._late: Dict[str, Tuple[Key, float]] = {}

    def _call(self, key: Key, action: str, id_: str, cost: int = 1) -> Tuple[Args, LuaCall]:
        p = self.policy
        argv: List[Union[str, int]] = [p.limit, self.lease_ms, action, id_]
        if cost != 1:
            argv += ["COST", cost]
        return ["RL.CONCURRENCY", key, *argv], ("concurrency", [cast(str, key)], argv)

    def _begin(self, h: _HoldState) -> Optional[Tuple[Args, LuaCall, bool, None, bool]]:
        """rl.call's arguments for the ACQUIRE, or None while the breaker is open."""
        if h._state != NEW:
            raise RuntimeError("a hold is entered once")
        allow = self.rl.breaker.allow()
        if allow == NO:
            return None
        mod, lua = self._call(h.key, ACQUIRE, h.id, h.cost)
        return mod, lua, allow == PROBE, None, True

    def _acquired(self, h: _HoldState, reply: Any) -> bool:
        """Records the decision; True when the hold is held on the server
        (renew it, release it with RELEASE)."""
        if reply is None:
            d = self._local_acquire(h)
        else:
            a, lim, rem, retry, reset = (int(x) for x in reply)
            p = self.policy
            d = _decision(allowed=a == 1, granted=h.cost if a == 1 else 0, limit=lim, remaining=rem,
                          retry_after_ms=retry, reset_after_ms=reset, policy=p.name, binding=p.name,
                          source=self.rl._source(), parts=(), rule=p)
        h.decision = self.rl._count(d)
        if not d.allowed:
            h._state = DONE
            return False
        h._state = HELD
        return not h._local

    def _unanswered(self, h: _HoldState) -> None:
        """The ACQUIRE of `h` was sent and not answered: release its id later."""
        with self._local_lock:
            self._late[h.id] = (h.key, monotonic() + self.lease_ms / 1000.0)

    def _late_due(self) -> List[Tuple[Args, LuaCall, bool, None, bool, str]]:
        """The RELEASEs of unanswered ACQUIREs to send now: none while the
        breaker is not closed; an id whose lease has lapsed is forgotten."""
        with self._local_lock:
            if not self._late:
                return []
            now = monotonic()
            for i in [i for i, (_, until) in self._late.items() if until <= now]:
                del self._late[i]
            if self.rl.breaker.state != CLOSED:
                return []
            return [(*self._call(k, RELEASE, i), False, None, False, i) for i, (k, _) in self._late.items()]

    def _late_sent(self, id_: str, reply: Any) -> None:
        if reply is not None:
            with self._local_lock:
                self._late.pop(id_, None)

    def late_releases(self) -> int:
        """ACQUIREs sent but not answered whose RELEASE is still to be sent."""
        with self._local_lock:
            return len(self._late)

    def _local_acquire(self, h: _HoldState) -> Decision:
        """The local in-flight limit: at most local_cap units per key in this process."""
        cap, cost, p = self.local_cap, h.cost, self.policy
        with self._local_lock:
            held = self._local.get(h.key, 0)
            ok = held + cost <= cap
            if ok:
                held += cost
                self._local[h.key] = held
                h._local = True
        retry = 0 if ok else (-1 if cost > cap else 1)
        return _decision(allowed=ok, granted=cost if ok else 0, limit=cap, remaining=max(0, cap - held),
                         retry_after_ms=retry, reset_after_ms=0, policy=p.name, binding=p.name,
                         source=PANIC, parts=(), rule=p)

    def _local_release(self, h: _HoldState) -> None:
        with self._local_lock:
            left = self._local.get(h.key, 0) - h.cost
            if left > 0:
                self._local[h.key] = left
            else:
                self._local.pop(h.key, None)

    def _ending(self, h: _HoldState) -> Optional[Tuple[Args, LuaCall, bool, None, bool]]:
        """Marks the hold released (once); rl.call's arguments for its
        RELEASE when it was held on the server, else None."""
        if h._state != HELD:
            h._state = DONE
            return None
        h._state = DONE
        if h._local:
            self._local_release(h)
            return None
        mod, lua = self._call(h.key, RELEASE, h.id)
        return mod, lua, False, None, False

    def _renew_call(self, h: _HoldState) -> Tuple[Args, LuaCall, bool, None, bool]:
        mod, lua = self._call(h.key, RENEW, h.id)
        return mod, lua, False, None, False

    @staticmethod
    def _renewed(h: _HoldState, reply: Any) -> bool:
        """After a RENEW: False when the renewals of this hold are over
        (lapsed, or released meanwhile)."""
        if h._state != HELD:
            return False
        if reply is None:           # Redis away: try again at the next tick
            return True
        if int(reply[0]) == 1:
            h.renewals += 1
            return True
        h.lost = True
        log.warning("in-flight lease %s on %r lapsed before it was renewed", h.id, h.key)
        return False

    def held_locally(self, key: Key) -> int:
        """Units held on `key` by the local in-flight limit (breaker open)."""
        with self._local_lock:
            return self._local.get(key, 0)


class Hold(_HoldState):
    """One sync hold: `with inflight.hold(key) as h:` acquires on entry and
    releases on every exit."""

    inflight: InFlight

    def __enter__(self) -> Hold:
        self.inflight._enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Release now (once; the exit does it otherwise)."""
        self.inflight._release(self)


class InFlight(_InFlightCore):
    """An in-flight limit on a sync RateLimit. One renewer thread (started
    at the first hold held on the server) renews every live hold."""

    rl: Any

    def __init__(self, rl: _Base[Any, Any], policy: Policy, renew_ms: Optional[int] = None,
                 panic: Optional[Panic] = None) -> None:
        super().__init__(rl, policy, renew_ms, panic)
        self._cond = threading.Condition()
        # id -> (when the next RENEW is due, the hold, held weakly: a hold
        # dropped without its exit stops being renewed)
        self._due: Dict[str, Tuple[float, weakref.ref[Hold]]] = {}
        self._thread: Optional[threading.Thread] = None
        self._closed = False

    def hold(self, key: Key, cost: int = 1) -> Hold:
        """A guard holding `cost` units on `key` while its `with` body runs."""
        return Hold(self, key, cost)

    def _enter(self, h: Hold) -> None:
        call = self._begin(h)
        reply = None if call is None else self.rl.call(*call)
        if call is not None and reply is None:
            self._unanswered(h)
        if self._acquired(h, reply):
            with self._cond:
                self._due[h.id] = (monotonic() + self.renew_s, weakref.ref(h))
                self._start()
        elif call is not None and reply is None:
            with self._cond:
                self._start()

    def _start(self) -> None:
        """(Under _cond.) The renewer thread started, and woken."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                            name="rl-inflight-renew")
            self._thread.start()
        self._cond.notify()

    def _release(self, h: Hold) -> None:
        with self._cond:
            self._due.pop(h.id, None)       # renewals stop before the release is sent
            call = self._ending(h)
        if call is not None:
            self.rl.call(*call)

    def _renew_loop(self) -> None:
        late_at = 0.0
        while True:
            with self._cond:
                while not self._closed:
                    now = monotonic()
                    due = [i for i, (t, _) in self._due.items() if t <= now]
                    late = self.late_releases() > 0
                    if due or (late and late_at <= now):
                        break
                    nxt = min((t for t, _ in self._due.values()), default=None)
                    if late:        # unanswered ACQUIREs: look again at the next tick
                        nxt = late_at if nxt is None else min(nxt, late_at)
                    self._cond.wait(None if nxt is None else nxt - now)
                if self._closed:
                    return
                refs = [self._due.pop(i)[1] for i in due]
            if late_at <= monotonic():
                late_at = monotonic() + self.renew_s
                for *call, id_ in self._late_due():
                    self._late_sent(id_, self.rl.call(*call))
            for ref in refs:
                h = ref()
                if h is None or h._state != HELD:   # dropped without its exit: its lease lapses
                    continue
                try:
                    again = self._renewed(h, self.rl.call(*self._renew_call(h)))
                except Exception:   # noqa: BLE001 - a bug to log, not to stop every renewal
                    log.exception("renewing in-flight lease %s", h.id)
                    again = True
                if again:
                    with self._cond:
                        if h._state == HELD:
                            self._due[h.id] = (monotonic() + self.renew_s, ref)
                del h

    def close(self) -> None:
        """Stop the renewer thread (holds still held are no longer renewed)."""
        with self._cond:
            self._closed = True
            self._cond.notify()


class AsyncHold(_HoldState):
    """One asyncio hold: `async with inflight.hold(key) as h:` acquires on
    entry and releases on every exit, cancellation included."""

    inflight: AsyncInFlight
    _task: Optional[asyncio.Task[None]]

    async def __aenter__(self) -> AsyncHold:
        await self.inflight._enter(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    async def release(self) -> None:
        """Release now (once; the exit does it otherwise)."""
        await self.inflight._release(self)


class AsyncInFlight(_InFlightCore):
    """An in-flight limit on an AsyncRateLimit: a renewal task per hold."""

    rl: Any

    def __init__(self, rl: _Base[Any, Any], policy: Policy, renew_ms: Optional[int] = None,
                 panic: Optional[Panic] = None) -> None:
        super().__init__(rl, policy, renew_ms, panic)
        self._tasks: Dict[str, asyncio.Task[None]] = {}
        self._late_task: Optional[asyncio.Task[None]] = None

    def hold(self, key: Key, cost: int = 1) -> AsyncHold:
        """A guard holding `cost` units on `key` while its `async with` body runs."""
        return AsyncHold(self, key, cost)

    async def _enter(self, h: AsyncHold) -> None:
        call = self._begin(h)
        reply = None if call is None else await self.rl.call(*call)
        if call is not None and reply is None:
            self._unanswered(h)
            if self._late_task is None or self._late_task.done():
                self._late_task = asyncio.get_running_loop().create_task(
                    self._late_releases(), name="rl-inflight-late-releases")
        if self._acquired(h, reply):
            self._tasks[h.id] = asyncio.get_running_loop().create_task(
                self._renew_task(weakref.ref(h), h.id), name=f"rl-inflight-renew-{h.id}")

    async def _release(self, h: AsyncHold) -> None:
        task = self._tasks.pop(h.id, None)
        if task is not None:
            task.cancel()       # renewals stop before the release is sent
        call = self._ending(h)
        if call is not None:
            await self.rl.call(*call)

    async def _late_releases(self) -> None:
        """Sends the RELEASEs of unanswered ACQUIREs once Redis answers again."""
        while self.late_releases():
            await asyncio.sleep(self.renew_s)
            for *call, id_ in self._late_due():
                self._late_sent(id_, await self.rl.call(*call))

    async def _renew_task(self, ref: weakref.ref[AsyncHold], id_: str) -> None:
        """Renews the hold every renew_s while it is held; holds it weakly,
        so a hold dropped without its exit stops being renewed."""
        try:
            while True:
                await asyncio.sleep(self.renew_s)
                h = ref()
                if h is None or h._state != HELD:
                    return
                reply = await self.rl.call(*self._renew_call(h))
                again = self._renewed(h, reply)
                del h
                if not again:
                    return
        finally:
            if self._tasks.get(id_) is asyncio.current_task():
                del self._tasks[id_]
