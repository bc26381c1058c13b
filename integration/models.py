"""Reference models of the three limiters and of RL.MULTI, in exact Python
integers (no server, no floating point). One model per algorithm, for every
Python test layer: the Lua twins' tests check the scripts against them, and
any suite may use them for the module.

Each model reads a state at an instant into a view; a view answers how many
units it can take now (`avail`), takes units (`take`) or gives them back
(`give`), then replies for a request of `want` units (`answer`) and says
what state to store (`state`). `single` and `multi` compose the views into
the commands' replies (docs/contract.md: "Reply", "RL.MULTI").

States are kept in the form the Lua twins store them (and that the tests
can read back from the twins' keys):

* token bucket: (tokens, frac, ts, scale) -- tokens + frac/scale whole
  tokens at time ts (us), scale = period_ms * 1000 -- or None (full);
* sliding log: [(t_us, units), ...] ascending, one entry per grant time;
* sliding counter: (win, cur, prev) -- cur units in the window starting at
  win (us), prev in the one before -- or None;
* fixed window: (start, count) -- count units in the window starting at
  start (ms) -- or None. Its clock is the ms (now // 1000), as the module's.

Durations are measured from the instant a limiter is evaluated at: the
clock reading, or later when the clock stepped back behind the state (the
counter then counts the gap into its durations, as the module does).
"""


def ceil_div(a, b):
    return -(-a // b)


class TokenBucket:
    """`capacity` tokens, `rate` more every `period_ms`, continuously."""

    def __init__(self, capacity, rate, period_ms):
        self.limit = capacity
        self.rate = rate
        self.P = period_ms * 1000  # 1/P token is the unit of the content S

    def at(self, state, now):
        return _BucketView(self, state, now)


class _BucketView:
    def __init__(self, m, state, now):
        C, P = m.limit, m.P
        if state is None:
            S, t = C * P, now
        else:
            n, f, ts, sp = state
            if sp != P:
                f = f * P // sp  # a new period: the fraction recounted, rounded down
            S, t = min(n * P + f, C * P), ts
            if now > t:
                S, t = min(C * P, S + m.rate * (now - t)), now
        self.m, self.S, self.t, self.taken = m, S, t, 0

    def avail(self):
        return self.S // self.m.P

    def take(self, g):
        self.S -= g * self.m.P
        self.taken += g

    def give(self, k):
        """min(capacity, tokens + k); the whole tokens given back."""
        C, P = self.m.limit, self.m.P
        given = min(k, C - self.S // P)
        self.S = min(C * P, self.S + k * P)
        return given

    def _wait_ms(self, target):
        return ceil_div(ceil_div(target - self.S, self.m.rate), 1000)

    def answer(self, want):
        C, P = self.m.limit, self.m.P
        if self.taken == want:
            retry = 0
        elif want > C:
            retry = -1
        elif want * P <= self.S:
            retry = 0
        else:
            retry = self._wait_ms(want * P)
        reset = 0 if self.S == C * P else self._wait_ms(C * P)
        return self.S // P, retry, reset

    def state(self):
        if self.S == self.m.limit * self.m.P:
            return None
        return (self.S // self.m.P, self.S % self.m.P, self.t, self.m.P)


class SlidingLog:
    """Exact: at most `limit` units granted in any `window_ms`."""

    def __init__(self, limit, window_ms):
        self.limit = limit
        self.W = window_ms * 1000

    def at(self, state, now):
        return _LogView(self, state or [], now)


class _LogView:
    def __init__(self, m, entries, now):
        if entries and entries[-1][0] > now:
            now = entries[-1][0]  # the clock stepped back: nothing elapsed
        self.m, self.now, self.taken = m, now, 0
        self.live = [(t, u) for t, u in entries if t > now - m.W]

    def used(self):
        return sum(u for _, u in self.live)

    def avail(self):
        return max(0, self.m.limit - self.used())

    def take(self, g):
        if g:
            if self.live and self.live[-1][0] == self.now:
                self.live[-1] = (self.now, self.live[-1][1] + g)
            else:
                self.live.append((self.now, g))
        self.taken += g

    def give(self, k):
        """The newest k units in the window leave it, the newest grant first."""
        given = k = min(k, self.used())
        while k:
            t, u = self.live.pop()
            if u > k:
                self.live.append((t, u - k))
                k = 0
            else:
                k -= u
        return given

    def answer(self, want):
        limit, W, now = self.m.limit, self.m.W, self.now
        used = self.used()
        need = used + want - limit  # units that must leave the window first
        if self.taken == want:
            retry = 0
        elif want > limit:
            retry = -1
        elif need <= 0:
            retry = 0
        else:
            acc = 0
            for t, u in self.live:
                acc += u
                if acc >= need:
                    break
            retry = ceil_div(t + W - now, 1000)
        reset = ceil_div(self.live[-1][0] + W - now, 1000) if self.live else 0
        return max(0, limit - used), retry, reset

    def state(self):
        return list(self.live) or None


class SlidingCounter:
    """prev * (W - e) / W + cur + COST <= limit, windows aligned on the clock."""

    def __init__(self, limit, window_ms):
        self.limit = limit
        self.W = window_ms * 1000

    def at(self, state, now):
        return _CounterView(self, state, now)


class _CounterView:
    def __init__(self, m, state, now):
        W = m.W
        at, cur, prev = now, 0, 0
        start = now // W * W
        if state is not None:
            win, scur, sprev = state
            at = max(now, win)
            k, ks = at // W, win // W
            start = k * W
            if ks == k:
                cur, prev = scur, sprev
                start = max(k * W, win)
            elif ks == k - 1:
                prev = scur
        self.m, self.cur, self.prev, self.start, self.taken = m, cur, prev, start, 0
        self.e, self.lag = at % W, at - now

    def avail(self):
        W = self.m.W
        return max(0, self.m.limit - self.cur - ceil_div(self.prev * (W - self.e), W))

    def take(self, g):
        self.cur += g
        self.taken += g

    def give(self, k):
        """k units off the current window's count, the rest off the previous."""
        a = min(k, self.cur)
        b = min(k - a, self.prev)
        self.cur -= a
        self.prev -= b
        return a + b

    def answer(self, want):
        limit, W, e = self.m.limit, self.m.W, self.e
        cur, prev = self.cur, self.prev

        def first_fit(p, base, frm):
            # the first x >= frm in [0, W) with p*(W - x) + base <= limit*W
            if base > limit * W:
                return None
            x = max(W - (limit * W - base) // p if p else 0, frm)
            return x if x < W else None

        if self.taken == want:
            retry = 0
        elif want > limit:
            retry = -1
        elif want <= self.avail():
            retry = 0
        else:
            x = first_fit(prev, (cur + want) * W, e)
            if x is not None:
                wait = x - e
            else:
                x2 = first_fit(cur, want * W, 0)
                wait = (W - e) + (W if x2 is None else x2)
            retry = ceil_div(wait + self.lag, 1000)
        if cur > 0:
            reset = ceil_div(2 * W - e + self.lag, 1000)
        elif prev > 0:
            reset = ceil_div(W - e + self.lag, 1000)
        else:
            reset = 0
        return self.avail(), retry, reset

    def state(self):
        if self.cur == 0 and self.prev == 0:
            return None
        return (self.start, self.cur, self.prev)


class FixedWindow:
    """count + COST <= limit per window of window_ms (ms on the clock): epoch
    aligned, or (from_first) starting at the first grant on a fresh key."""

    def __init__(self, limit, window_ms, from_first=False):
        self.limit = limit
        self.window_ms = window_ms
        self.from_first = from_first

    def at(self, state, now):
        return _WindowView(self, state, now)


class _WindowView:
    def __init__(self, m, state, now):
        ms, w = now // 1000, m.window_ms
        # evaluated at max(now, stored start): a clock behind the stored
        # window counts no time (the durations include the gap)
        at = ms if state is None else max(ms, state[0])
        count, start = 0, at
        if m.from_first:
            if state is not None and state[1] > 0 and at < state[0] + w:
                start, count = state
        else:
            start = at - at % w
            if state is not None and state[0] == start:
                count = state[1]
        self.m, self.count, self.start, self.taken = m, count, start, 0
        self.left = start + w - ms  # ms to the window's end, from the real clock

    def avail(self):
        return max(0, self.m.limit - self.count)

    def take(self, g):
        self.count += g
        self.taken += g

    def give(self, k):
        given = min(k, self.count)
        self.count -= given
        return given

    def answer(self, want):
        if self.taken == want:
            retry = 0
        elif want > self.m.limit:
            retry = -1
        elif want <= self.avail():
            retry = 0
        else:
            retry = self.left
        return self.avail(), retry, self.left if self.count else 0

    def state(self):
        return (self.start, self.count) if self.count else None

    def expires_at(self):
        """The key's absolute expiry (ms): the window's end."""
        return self.start + self.m.window_ms


class Concurrency:
    """At most `limit` units held at once by leases of `lease_ms`; the
    view acts for the id `ident` (ACQUIRE sets its lease, give takes units
    off it). A state is (last_us, {id: (units, expiry_us)}): the last
    write's instant and the leases live after it, or None (no key)."""

    def __init__(self, limit, lease_ms, ident):
        self.limit = limit
        self.lease_us = lease_ms * 1000
        self.ident = ident

    def at(self, state, now):
        return _LeaseView(self, state, now)


class _LeaseView:
    def __init__(self, m, state, now):
        last, leases = state if state is not None else (0, {})
        self.m, self.now, self.last = m, now, last
        self.t = max(now, last)  # a clock behind the last write counts no time
        self.leases = {i: (u, e) for i, (u, e) in leases.items() if e > self.t}
        self.taken, self.wrote, self.own_counts = 0, False, False

    def _others(self):
        return sum(u for i, (u, _) in self.leases.items() if i != self.m.ident)

    def avail(self):
        return max(0, self.m.limit - self._others())

    def take(self, g):
        if g:
            self.leases[self.m.ident] = (g, self.t + self.m.lease_us)
            self.taken, self.wrote = g, True

    def give(self, k):
        """k of the id's units back (the lease keeps its expiry); the wait
        that follows is a new id's, which the id's units count against."""
        self.own_counts = True
        u, e = self.leases.get(self.m.ident, (0, 0))
        given = min(k, u)
        if given == u and u:
            del self.leases[self.m.ident]
        elif given:
            self.leases[self.m.ident] = (u - given, e)
        self.wrote = self.wrote or given > 0
        return given

    def renew(self):
        u, _ = self.leases.get(self.m.ident, (0, 0))
        if u:
            self.leases[self.m.ident] = (u, self.t + self.m.lease_us)
            self.wrote = True
        return u > 0

    def answer(self, want):
        held = sum(u for u, _ in self.leases.values())
        counted = {i: lease for i, lease in self.leases.items() if self.own_counts or i != self.m.ident}
        if self.taken == want:
            retry = 0
        elif want > self.m.limit:
            retry = -1
        else:
            # the first lapse (on the real clock) after which want fits
            retry = None
            for e in sorted({self.now} | {e for _, e in counted.values()}):
                if sum(u for u, x in counted.values() if x > max(e, self.t)) + want <= self.m.limit:
                    retry = ceil_div(e - self.now, 1000)
                    break
        reset = ceil_div(max(e for _, e in self.leases.values()) - self.now, 1000) if self.leases else 0
        return max(0, self.m.limit - held), retry, reset

    def state(self):
        if not self.leases:
            return None
        return (self.t if self.wrote else self.last, dict(self.leases))


def cc_renew(model, state, now):
    """RL.CONCURRENCY ... RENEW id: (reply, written, new state)."""
    v = model.at(state, now)
    renewed = v.renew()
    remaining, _, reset = v.answer(0)
    return [int(renewed), model.limit, remaining, 0 if renewed else -1, reset], renewed, v.state() if renewed else state


MODELS = {"TOKENBUCKET": TokenBucket, "SLIDINGLOG": SlidingLog, "SLIDINGCOUNTER": SlidingCounter,
          "FIXEDWINDOW": FixedWindow}


def single(model, state, now, cost=1, partial=False, dryrun=False, refund=None):
    """One command at `now`: (five-integer reply, written, new state).
    `written` says whether the call writes its key (new state None: the
    key is deleted, or not created)."""
    v = model.at(state, now)
    if refund is not None:
        given = v.give(refund)
        remaining, retry, reset = v.answer(1)  # the wait for one more unit
        return [given, model.limit, remaining, retry, reset], given > 0, v.state() if given else state
    g = min(cost, v.avail())
    if g < cost and not partial:
        g = 0
    v.take(g)
    remaining, retry, reset = v.answer(cost)
    allowed = g if partial else int(g == cost)
    written = g > 0 and not dryrun
    return [allowed, model.limit, remaining, retry, reset], written, v.state() if written else state


def combine(per, weights, cost=1, partial=False, refund=None):
    """The whole RL.MULTI reply (elements 1-6 and the per-limit replies) from
    the per-limit replies `per` (each [units taken or given back, limit,
    remaining, retry_after_ms, reset_after_ms]) and the WEIGHTs."""
    n = len(per)
    waits = [p[3] for p in per]
    if refund is not None:
        allowed, granted = (refund if any(p[0] for p in per) else 0), True
    else:
        g = per[0][0] // weights[0]  # every limit took g * WEIGHT
        granted = g == cost
        allowed = g if partial else int(granted)
    if granted:  # the fewest whole requests left, ties to the lowest index
        b = min(range(n), key=lambda i: (per[i][2] // weights[i], i))
    else:  # the longest wait, -1 longest, ties to the lowest index
        b = min(range(n), key=lambda i: (-(waits[i] if waits[i] >= 0 else float("inf")), i))
    if granted and refund is None:
        retry = 0
    else:  # (for a refund: the longest wait for one more request)
        retry = -1 if -1 in waits else max(waits)
    return [allowed, per[b][1], per[b][2], retry, per[b][4], b, per]


def multi(limits, now, cost=1, partial=False, dryrun=False, refund=None):
    """RL.MULTI at `now` over `limits` = [(model, state, weight)]: each
    limit decided independently at the same instant, committed all or
    nothing. Returns (seven-element reply, [written], [new state])."""
    views = [(m.at(s, now), m, w) for m, s, w in limits]
    weights = [w for _, _, w in limits]
    if refund is not None:
        took = [v.give(refund * w) for v, _, w in views]
        per = [[t, m.limit, *v.answer(w)] for t, (v, m, w) in zip(took, views)]
        written = [t > 0 for t in took]
    else:
        g = cost
        for v, _, w in views:
            g = min(g, v.avail() // w)
        if g < cost and not partial:
            g = 0
        for v, _, w in views:
            v.take(g * w)
        per = [[g * w, m.limit, *v.answer(cost * w)] for v, m, w in views]
        written = [g > 0 and not dryrun] * len(views)
    new = [v.state() if wr else s for (v, _, _), wr, (_, s, _) in zip(views, written, limits)]
    return combine(per, weights, cost, partial, refund), written, new


# The single-command models with the signatures the twins' tests use.

def tb_model(state, C, rate, period_ms, cost, partial, now):
    """Token bucket at `now` from `state`: (reply, new state or None when
    nothing is written)."""
    reply, written, new = single(TokenBucket(C, rate, period_ms), state, now, cost, partial)
    return reply, new if written else None


def log_model(entries, limit, window_ms, cost, partial, now):
    """Sliding log at `now`; entries = [(t_us, units)] ascending."""
    return single(SlidingLog(limit, window_ms), entries, now, cost, partial)[0]


def sc_model(state, limit, window_ms, cost, partial, now):
    """Sliding counter at `now`; state = (win, cur, prev) or None."""
    return single(SlidingCounter(limit, window_ms), state, now, cost, partial)[0]


def fw_model(state, limit, window_ms, cost, partial, now, from_first=False):
    """Fixed window at `now` (us); state = (start_ms, count) or None."""
    return single(FixedWindow(limit, window_ms, from_first), state, now, cost, partial)[0]
