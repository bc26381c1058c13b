"""Time in tests: every window a test relies on is placed against the
server's clock (`TIME`, the clock the module and the Lua twins read), never
against where the wall clock happens to fall (docs/testing.md, "Time in
tests").

A fixed window of `window_ms` not started FROMFIRST is aligned to the epoch:
it ends at the next multiple of `window_ms` of the server's clock, wherever
the test is. So is a sliding counter's current window. Three helpers place
a test's calls against those boundaries by polling the server's TIME:

- `room(r, window_ms, need_ms)`: returns once the current aligned window has
  at least `need_ms` left (waiting for the next one if it has less). Calls
  that must share a window then cannot straddle a boundary unless the test
  stalls for `need_ms`.
- `before_boundary(r, window_ms, lead_ms)`: returns the next boundary once it
  is between `lead_ms - POLL_SLACK_MS` and `lead_ms` ahead (for the boundary
  burst: calls just before a boundary, then just after it).
- `wait_past(r, t_ms)`: returns once the server's clock reads `t_ms` or later.

`Span` brackets calls with the server's clock so a test can check, instead
of assuming, that they fell inside one window (`crossed`) and rerun them on
fresh keys if not (`one_window`).

Nothing here changes the module: it only reads the server's clock.
"""
import time

# A wait for a spot in a window polls at most this often and accepts a spot
# this wide (the client's round trip to TIME is far below it).
POLL_MS = 20
POLL_SLACK_MS = 60


def time_ms(t):
    """A TIME reply `(seconds, microseconds)` in ms (a pipeline's, say)."""
    s, us = t
    return s * 1000 + us // 1000


def server_ms(r):
    """The server's clock in ms (TIME), as the module reads it."""
    return time_ms(r.time())


def boundary_after(t_ms, window_ms):
    """The first multiple of window_ms after t_ms: where the epoch-aligned
    window holding t_ms ends."""
    return t_ms - t_ms % window_ms + window_ms


def wait_past(r, t_ms, timeout=None):
    """Poll the server's clock until it reads t_ms or later; return it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        now = server_ms(r)
        if now >= t_ms:
            return now
        if deadline is not None and time.monotonic() > deadline:
            raise AssertionError(f"the server's clock did not reach {t_ms} in {timeout} s (at {now})")
        time.sleep(min(t_ms - now, POLL_MS) / 1000)


def room(r, window_ms, need_ms):
    """Return the server's time once the epoch-aligned window of window_ms
    has at least need_ms left, waiting (by polling TIME) for the next window
    if the current one has less. need_ms is at most half the window, so the
    wait is at most need_ms."""
    if not 0 < need_ms <= window_ms // 2:
        raise ValueError(f"need_ms {need_ms} must be in 1..{window_ms // 2} for a window of {window_ms}")
    now = server_ms(r)
    if boundary_after(now, window_ms) - now >= need_ms:
        return now
    return wait_past(r, boundary_after(now, window_ms))


def before_boundary(r, window_ms, lead_ms):
    """Return the next epoch-aligned boundary of window_ms once it is at
    most lead_ms and at least lead_ms - POLL_SLACK_MS ahead of the server's
    clock (polling TIME; at most one window's wait plus a poll)."""
    if not POLL_SLACK_MS < lead_ms < window_ms:
        raise ValueError(f"lead_ms {lead_ms} must be in {POLL_SLACK_MS + 1}..{window_ms - 1}")
    while True:
        now = server_ms(r)
        end = boundary_after(now, window_ms)
        left = end - now
        if lead_ms - POLL_SLACK_MS <= left <= lead_ms:
            return end
        # too early: sleep towards the spot; too late: towards the next window's
        ahead = left - lead_ms if left > lead_ms else left + window_ms - lead_ms
        time.sleep(max(1, min(ahead, POLL_MS)) / 1000)


class Span:
    """The server's clock read before and after a block of calls: every
    call in the block ran at a server time in [start, end]."""

    def __init__(self, r):
        self.r = r
        self.start = self.end = None

    def __enter__(self):
        self.start = server_ms(self.r)
        return self

    def __exit__(self, *exc):
        self.end = server_ms(self.r)
        return False

    def crossed(self, window_ms):
        """Whether an epoch-aligned boundary of window_ms fell inside."""
        return self.start // window_ms != self.end // window_ms

    @property
    def ms(self):
        return self.end - self.start


def one_window(r, window_ms, need_ms, run, attempts=3):
    """Run `run(attempt)` (calls on fresh keys named by the attempt) inside
    one epoch-aligned window of window_ms: start it with need_ms of the
    window left (room) and check with the server's clock that it ended in
    the same window; a run that straddled a boundary (it stalled for
    need_ms or more) runs again, up to `attempts` times. Returns run's
    result. A run that never fits fails, saying so."""
    for attempt in range(attempts):
        room(r, window_ms, need_ms)
        with Span(r) as span:
            out = run(attempt)
        if not span.crossed(window_ms):
            return out
    raise AssertionError(f"no run fitted in one window of {window_ms} ms in {attempts} tries "
                         f"(the last took {span.ms} ms)")
