"""Models for RL.FIXEDWINDOW, in plain Python integers (no server):

* `FixedWindow`: the module's command as docs/contract.md states it, with
  the key's expiry (the window's end, PEXPIREAT semantics: the key is gone
  once the clock in ms is past it);
* `Envoy`: envoyproxy/ratelimit's fixed windows, from its documented
  behaviour: the cache key of a descriptor carries the window start
  `now_s - now_s % unit`; each request sends INCRBY hits_addend (and
  EXPIRE unit); the request is over the limit when the count after the
  increment exceeds the limit; `limit_remaining = max(limit - count, 0)`
  (0 when over); `duration_until_reset = unit - now_s % unit` seconds. Units
  in seconds: SECOND 1, MINUTE 60, HOUR 3600, DAY 86400, WEEK 604800, MONTH
  30 days, YEAR 365 days (src/utils/utilities.go, UnitToDivider);
* `IncrPexpireNx`: INCR key, then PEXPIRE key window_ms NX: the window
  starts at the first INCR on a missing key and the key lives through the
  millisecond `start + window_ms` (Redis expires a key once now > expiry).

Times are the server's clock in ms (the tests read it with TIME).
"""


class FixedWindow:
    """The module's fixed window. A state is (start_ms, count, expire_at_ms)
    or None (no key)."""

    def __init__(self, limit, window_ms, from_first=False):
        self.limit, self.w, self.from_first = limit, window_ms, from_first

    def read(self, state, now):
        """(units counted, window start, window end) at `now`; the key has
        expired when now is past its expiry."""
        w = self.w
        if state is not None and now > state[2]:
            state = None
        if state is not None:
            start, count, _ = state
            t = max(now, start)
            if self.from_first:
                if start <= t < start + w:
                    return count, start, start + w
                return 0, t, t + w
            ws = t - t % w
            if start == ws:
                return count, ws, ws + w
            return 0, ws, ws + w
        if self.from_first:
            return 0, now, now + w
        ws = now - now % w
        return 0, ws, ws + w

    def call(self, state, now, cost=1, partial=False, dryrun=False, refund=None):
        """(reply, state after): the five integers, and what the key holds."""
        L = self.limit
        count, start, end = self.read(state, now)
        if refund is not None:
            given = min(refund, count)
            after = count - given
            remaining = max(L - after, 0)
            retry = 0 if remaining >= 1 else end - now
            reply = [given, L, remaining, retry, end - now if after > 0 else 0]
            if given == 0:
                return reply, state
            return reply, ((start, after, end) if after > 0 else None)
        avail = max(L - count, 0)
        g = cost if cost <= avail else (avail if partial else 0)
        after = count + g
        if g == cost:
            retry = 0
        elif cost > L:
            retry = -1
        else:
            retry = end - now
        first = g if partial else int(g == cost)
        reply = [first, L, max(L - after, 0), retry, end - now if after > 0 else 0]
        if g == 0 or dryrun:
            return reply, state
        return reply, (start, after, end)


UNITS = {"SECOND": 1, "MINUTE": 60, "HOUR": 3600, "DAY": 86400, "WEEK": 7 * 86400,
         "MONTH": 30 * 86400, "YEAR": 365 * 86400}


class Envoy:
    """envoyproxy/ratelimit's Redis fixed window for one descriptor."""

    def __init__(self, limit, unit):
        self.limit, self.unit = limit, UNITS[unit]
        self.counts = {}  # window start (s) -> count

    def hit(self, now_ms, hits=1):
        """(over_limit, limit_remaining, duration_until_reset_s)."""
        now_s = now_ms // 1000
        key = now_s - now_s % self.unit
        self.counts[key] = self.counts.get(key, 0) + hits  # INCRBY
        count = self.counts[key]
        over = count > self.limit
        remaining = 0 if over else self.limit - count
        return over, remaining, self.unit - now_s % self.unit


class IncrPexpireNx:
    """INCR + PEXPIRE window_ms NX, read as a limit of `limit` per window."""

    def __init__(self, limit, window_ms):
        self.limit, self.w = limit, window_ms
        self.count, self.expire_at = 0, None

    def hit(self, now_ms):
        """(allowed, remaining, pttl after the call)."""
        if self.expire_at is not None and now_ms > self.expire_at:
            self.count, self.expire_at = 0, None  # the key expired
        self.count += 1  # INCR
        if self.expire_at is None:  # PEXPIRE ... NX: only a key without a TTL
            self.expire_at = now_ms + self.w
        allowed = self.count <= self.limit
        return allowed, max(self.limit - self.count, 0), self.expire_at - now_ms
