"""The circuit breaker, panic limits and the counters exposed as metrics."""
from __future__ import annotations

import threading
from collections import OrderedDict, deque
from time import monotonic
from typing import TYPE_CHECKING, Deque, Dict, List, Literal, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from .policies import AllOf, Key, Policy

__all__ = ["Breaker", "Panic", "Metrics", "BreakerState"]

#: The breaker's state (RateLimit.metrics()["state"]).
BreakerState = Literal["closed", "open", "half_open"]
CLOSED: BreakerState = "closed"
OPEN: BreakerState = "open"
HALF_OPEN: BreakerState = "half_open"
NO, YES, PROBE = 0, 1, 2


class Metrics:
    """Counters; `snapshot()` is what RateLimit.metrics() returns."""

    FIELDS = ("decisions_module", "decisions_lua", "decisions_local", "decisions_panic",
              "denied", "calls", "failures", "leases", "lease_tokens", "lease_waits", "refunds",
              "refund_tokens", "trips", "trips_failures", "trips_latency", "probes_ok",
              "probes_failed", "unreplicated", "redetects")
    __slots__ = FIELDS
    decisions_module: int
    decisions_lua: int
    decisions_local: int
    decisions_panic: int
    denied: int
    calls: int
    failures: int
    leases: int
    lease_tokens: int
    lease_waits: int
    refunds: int
    refund_tokens: int
    trips: int
    trips_failures: int
    trips_latency: int
    probes_ok: int
    probes_failed: int
    unreplicated: int
    redetects: int

    def __init__(self) -> None:
        for f in self.FIELDS:
            setattr(self, f, 0)

    def snapshot(self) -> Dict[str, int]:
        return {f: getattr(self, f) for f in self.FIELDS}


class Breaker:
    """Closed -> open after `failures` consecutive failures, or when the p95
    of the last `latency_window` call latencies stays above
    `latency_budget_ms` for `latency_period_ms`. Open: no calls for
    `open_ms`, then half-open: one probe; its success closes the breaker,
    its failure opens it again."""

    def __init__(self, failures: int = 5, latency_budget_ms: float = 50,
                 latency_period_ms: float = 1000, latency_window: int = 64,
                 open_ms: float = 1000) -> None:
        if failures < 1 or latency_window < 1 or open_ms < 0:
            raise ValueError("failures and latency_window must be >= 1, open_ms >= 0")
        self.failures = failures
        self.latency_budget = latency_budget_ms / 1000
        self.latency_period = latency_period_ms / 1000
        self.latency_window = latency_window
        self.open_s = open_ms / 1000
        self.state: BreakerState = CLOSED
        self.metrics: Optional[Metrics] = None            # set by the RateLimit that owns it
        self._lock = threading.Lock()
        self._consecutive = 0
        self._lat: Deque[float] = deque(maxlen=latency_window)
        self._over_since: Optional[float] = None
        self._open_until = 0.0
        self._probe_at = 0.0
        self.last_trip: Optional[str] = None          # "failures" or "latency"

    def allow(self, now: Optional[float] = None) -> int:
        """NO (use panic limits), YES, or PROBE (this call is the half-open probe)."""
        if self.state == CLOSED:
            return YES
        now = monotonic() if now is None else now
        with self._lock:
            if self.state == CLOSED:
                return YES
            if self.state == OPEN:
                if now < self._open_until:
                    return NO
            elif now - self._probe_at < max(self.open_s, 0.05):
                return NO               # a probe is out; a lost one is replaced later
            self.state = HALF_OPEN
            self._probe_at = now
            return PROBE

    def success(self, latency_s: float, probe: bool = False) -> None:
        self._consecutive = 0
        if probe or self.state != CLOSED:
            with self._lock:
                if self.state != CLOSED:
                    self.state = CLOSED
                    self._lat.clear()
                    self._over_since = None
                    if self.metrics:
                        self.metrics.probes_ok += 1
            return
        lat = self._lat
        lat.append(latency_s)
        if latency_s <= self.latency_budget and self._over_since is None:
            return                      # fast path: a fast call while nothing is slow
        n = len(lat)
        if n < min(5, self.latency_window):
            return
        p95 = sorted(lat)[(95 * n - 1) // 100]
        now = monotonic()
        if p95 <= self.latency_budget:
            self._over_since = None
        elif self._over_since is None:
            self._over_since = now
        elif now - self._over_since >= self.latency_period:
            self._trip(now, "latency")

    def failure(self, probe: bool = False) -> None:
        now = monotonic()
        if probe or self.state == HALF_OPEN:
            with self._lock:
                self.state = OPEN
                self._open_until = now + self.open_s
                if self.metrics and probe:
                    # a late failure of a call sent before the trip reopens a
                    # half-open breaker too, but it is no probe's result
                    self.metrics.probes_failed += 1
            return
        self._consecutive += 1
        if self._consecutive >= self.failures and self.state == CLOSED:
            self._trip(now, "failures")

    def _trip(self, now: float, why: str) -> None:
        with self._lock:
            if self.state != CLOSED:
                return
            self.state = OPEN
            self._open_until = now + self.open_s
            self._consecutive = 0
            self._lat.clear()
            self._over_since = None
            self.last_trip = why
            if self.metrics:
                self.metrics.trips += 1
                if why == "failures":
                    self.metrics.trips_failures += 1
                else:
                    self.metrics.trips_latency += 1


class Panic:
    """Static local limits used while Redis is unreachable: per key, a local
    token bucket of `limit` units refilled over `window_ms` — by default the
    policy's limit divided by `instances`, over the policy's window."""

    def __init__(self, instances: Optional[int] = None, limit: Optional[int] = None,
                 window_ms: Optional[int] = None) -> None:
        if limit is None and instances is None:
            instances = 1
        if instances is not None and (type(instances) is not int or instances < 1):
            raise ValueError("instances must be an integer >= 1")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError("limit must be an integer >= 1")
        if window_ms is not None and (type(window_ms) is not int or window_ms < 1):
            raise ValueError("window_ms must be an integer >= 1")
        self.instances = instances
        self.fixed = limit
        self.window_ms = window_ms

    def capacity(self, policy: Policy) -> int:
        if self.fixed is not None:
            return self.fixed
        assert self.instances is not None       # __init__: one of limit and instances
        return max(1, policy.limit // self.instances)

    def window(self, policy: Policy) -> int:
        return self.window_ms or policy.window_ms


class PanicBuckets:
    """The local buckets of one limiter's panic limits (bounded LRU)."""

    MAX_KEYS = 100_000

    def __init__(self, panic: Panic, policy: Policy | AllOf) -> None:
        self.panic = panic
        self.lock = threading.Lock()
        self.buckets: OrderedDict[Tuple[Key, int], List[float]] = OrderedDict()   # (key, part index) -> [tokens, t]
        # per part: (capacity, ms per token)
        self.shape = [(panic.capacity(p), panic.window(p) / panic.capacity(p))
                      for p in policy.parts]

    def _bucket(self, k: Tuple[Key, int], cap: int, ms_per: float, now: float) -> List[float]:
        b = self.buckets.get(k)
        if b is None:
            b = [float(cap), now]
            self.buckets[k] = b
            if len(self.buckets) > self.MAX_KEYS:
                self.buckets.popitem(last=False)
        else:
            self.buckets.move_to_end(k)
            b[0] = min(float(cap), b[0] + (now - b[1]) * 1000.0 / ms_per)
            b[1] = now
        return b

    def decide(self, keys: Sequence[Key], cost: int, weights: Sequence[int], partial: bool,
               dry_run: bool = False) -> List[Tuple[int, int, int, int, int]]:
        """[(units taken, cap, remaining, retry_ms, reset_ms)] per part: the
        largest g <= cost (all or nothing unless partial) that every part can
        take g * weight of."""
        now = monotonic()
        with self.lock:
            bs = [self._bucket((k, i), cap, ms, now)
                  for i, (k, (cap, ms)) in enumerate(zip(keys, self.shape))]
            g = cost
            for b, w in zip(bs, weights):
                g = min(g, int(b[0] // w))
            if g < cost and not partial:
                g = 0
            out = []
            for b, (cap, ms), w in zip(bs, self.shape, weights):
                u = g * w
                c = cost * w
                alone = b[0] >= c        # this part alone could take its units
                tokens = b[0] - u
                if not dry_run:
                    b[0] = tokens
                if g == cost or alone:
                    retry = 0
                elif c > cap:
                    retry = -1
                else:
                    retry = max(1, _ceil((c - tokens) * ms))
                reset = max(0, _ceil((cap - tokens) * ms))
                out.append((u, cap, int(tokens), retry, reset))
            return out


def _ceil(x: float) -> int:
    return -int(-x // 1)
