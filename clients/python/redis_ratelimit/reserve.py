"""Reserve then settle: take an estimate before the work, then give back
what it did not use (REFUND) or take what it used beyond the estimate
(COST n FORCE, a debit past the limit), exactly once. The sync and asyncio
handles share everything but the call. See clients/DESIGN.md,
"Reservations: reserve and settle"."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from .core import LOCAL, PANIC, check_cost
from .decision import Decision
from .policies import Keys


class _ReservationState:
    __slots__ = ("limiter", "key", "estimate", "decision", "settled")

    def __init__(self, limiter: Any, key: Keys, estimate: int, decision: Decision) -> None:
        self.limiter = limiter
        self.key = key
        self.estimate = estimate
        #: the decision on limit(key, cost=estimate)
        self.decision = decision
        #: settle() was called (whatever its call's outcome)
        self.settled = False

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    def _plan(self, actual: int) -> Optional[Tuple[str, int]]:
        """Marks the reservation settled; what to send: ("refund", n),
        ("debit", n) or None (nothing)."""
        check_cost(actual)
        if self.settled:
            raise RuntimeError("this reservation is settled already (settle sends once)")
        self.settled = True
        d = self.decision
        if not d.allowed or d.source in (PANIC, LOCAL):    # nothing was taken on Redis
            return None
        diff = actual - self.estimate
        if diff < 0:
            return "refund", -diff
        if diff > 0:
            return "debit", diff
        return None

    def __repr__(self) -> str:
        return (f"<reservation {self.estimate} on {self.key!r}: "
                f"{'allowed' if self.allowed else 'denied'}{', settled' if self.settled else ''}>")


class Reservation(_ReservationState):
    """What Limiter.reserve returns; settle(actual) once."""

    def settle(self, actual: int) -> Optional[Decision]:
        """REFUND (estimate - actual), or COST (actual - estimate) FORCE, or
        nothing; that call's Decision (None when nothing was sent)."""
        plan = self._plan(actual)
        if plan is None:
            return None
        what, n = plan
        lim = self.limiter
        d: Decision = lim.refund(self.key, n) if what == "refund" else lim._debit(self.key, n)
        return d


class AsyncReservation(_ReservationState):
    """What AsyncLimiter.reserve returns; await settle(actual) once."""

    async def settle(self, actual: int) -> Optional[Decision]:
        plan = self._plan(actual)
        if plan is None:
            return None
        what, n = plan
        lim = self.limiter
        if what == "refund":
            d: Decision = await lim.refund(self.key, n)
        else:
            d = await lim._debit(self.key, n)
        return d
