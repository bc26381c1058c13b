"""redis-ratelimit: rate limits shared through Redis (the ratelimit module or
its Lua twins), with leased local decisions, a circuit breaker and panic
limits. See clients/DESIGN.md and the package README."""
from typing import TYPE_CHECKING, Any

from .breaker import Breaker, BreakerState, Panic
from .client import LeasedLimiter, Limiter, RateLimit
from .core import Backend, MetricsSnapshot, RateLimitError, Strict, UnsupportedError
from .decision import Decision, Part, Source, headers, problem
from .inflight import AsyncHold, AsyncInFlight, Hold, InFlight
from .policies import (AllOf, CrossSlotError, Key, Keys, Kind, Policy, all_of, concurrency, fixed_window,
                       key_slot, make_key, sliding_counter, sliding_log, token_bucket)
from .reserve import AsyncReservation, Reservation

__version__ = "0.2.0"

__all__ = ["RateLimit", "AsyncRateLimit", "Limiter", "LeasedLimiter", "Breaker", "Panic",
           "Decision", "Part", "headers", "problem", "token_bucket", "sliding_log",
           "sliding_counter", "fixed_window", "all_of", "make_key", "key_slot", "CrossSlotError",
           "RateLimitError", "UnsupportedError", "Strict", "Policy", "AllOf", "Backend", "Source",
           "Kind", "Key", "Keys", "BreakerState", "MetricsSnapshot", "concurrency", "InFlight", "Hold",
           "AsyncInFlight", "AsyncHold", "Reservation", "AsyncReservation"]


if TYPE_CHECKING:
    from .aio import AsyncRateLimit


def __getattr__(name: str) -> Any:
    if name == "AsyncRateLimit":
        from .aio import AsyncRateLimit
        return AsyncRateLimit
    raise AttributeError(name)
