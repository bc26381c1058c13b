"""RL.MULTI (several limits decided in one atomic call) and REFUND (on every
command), against real servers: exact all-or-nothing grants under
concurrency, PARTIAL with WEIGHT, refunds per algorithm, a one-limit
RL.MULTI answering exactly what the single command answers, the fast path
answering like the generic one, errors that change nothing, COMMAND
GETKEYS and INFO. Replication and Cluster routing: test_multi_replication.py."""
import random
import threading

import pytest
import redis

from rltesting.clock import room, wait_past
from rltesting.proc import wait_until
from rltesting.replication import ReplicationTap
from rltesting.replies import HUGE, ClockSlack, rl

from multicalls import ALGOS, NEVER_ALGO, SEED, SINGLE, _s, check_multi, dump_all, error_text, multi, multi_args, raw, server_us


# ---------------------------------------------------------------------------
# Two limits on one request.
# ---------------------------------------------------------------------------

def test_per_second_and_per_minute(r):
    """Per-second 5 and per-minute 20 on two keys: each burst grants exactly
    5, every denial leaves both keys byte-identical with their expiries
    untouched and names the per-second limit, and after four seconds at
    that pace the per-minute limit binds and `binding` says so."""
    keys = ["rl:{u1}:s", "rl:{u1}:m"]
    limits = [("SLIDINGLOG", [5, 1000], None), ("SLIDINGLOG", [20, 60000], None)]
    call = multi_args(keys, limits)
    for burst in range(5):
        if burst:
            # Poll until the per-second window is empty again (DRYRUN
            # writes nothing).
            wait_until(lambda: r.execute_command("RL.SLIDINGLOG", keys[0], 5, 1000, "COST", 0)[2] == 5,
                       timeout=10, what="per-second window empty")
        # One instant (a transaction runs back to back): five calls, the
        # state of both keys, three more calls, the state again.
        ngrant = 5 if burst < 4 else 0
        pipe = r.pipeline(transaction=True)
        for _ in range(ngrant):
            pipe.execute_command(*call)
        for k in keys:
            pipe.dump(k)
            pipe.execute_command("PEXPIRETIME", k)
        for _ in range(8 - ngrant):
            pipe.execute_command(*call)
        for k in keys:
            pipe.dump(k)
            pipe.execute_command("PEXPIRETIME", k)
        out = pipe.execute()
        granted, before, denied, after = out[:ngrant], out[ngrant:ngrant + 4], out[ngrant + 4:-4], out[-4:]
        assert before == after, burst
        if burst < 4:
            assert before[1] > 0 and before[3] > 0
        for rep in granted + denied:
            check_multi(rep, limits)
        assert [rep[0] for rep in granted] == [1] * ngrant, granted
        assert [rep[6][1][2] for rep in granted] == [19 - 5 * burst - i for i in range(ngrant)], granted
        assert [rep[0] for rep in denied] == [0] * len(denied), denied
        for rep in denied:
            assert rep[6][1][2] == max(15 - 5 * burst, 0), rep     # nothing taken from the minute
            if burst < 3:
                assert rep[5] == 0, rep                            # the per-second limit binds
                assert 0 < rep[3] <= 1000 and rep[6][1][3] == 0, rep
                assert rep[1:3] == [5, 0], rep
            else:
                # The minute is used up (after the 20th grant): it binds,
                # with the longer wait.
                assert rep[5] == 1, rep
                assert rep[6][1][3] > 1000 and rep[3] == rep[6][1][3] and rep[1:3] == [20, 0], rep
                assert (rep[6][0][3] > 0) == (burst == 3), rep
    assert r.execute_command("RL.SLIDINGLOG", keys[1], 20, 60000, "COST", 0)[2] == 0


def test_binding_when_granted_counts_requests_by_weight(r):
    """Granted: the binding limit is the one with the fewest whole requests
    left (remaining / WEIGHT), ties to the lowest index; elements 2, 3 and 5
    are that limit's."""
    keys = ["rl:{b}:a", "rl:{b}:b", "rl:{b}:c"]
    limits = [("TOKENBUCKET", [100, 1, HUGE], None), ("SLIDINGLOG", [60, HUGE], 3),
              ("SLIDINGCOUNTER", [30, HUGE], None)]
    rep = multi(r, keys, limits, cost=2)
    # remaining 98/1, 54/3 = 18, 28/1: the log binds although it has more units left.
    assert [p[2] for p in rep[6]] == [98, 54, 28]
    assert rep[:6] == [1, 60, 54, 0, rep[6][1][4], 1]
    rep = multi(r, keys, limits, cost=5)   # 93, 39/3 = 13, 23: still the log
    assert rep[5] == 1
    rep = multi(r, keys, limits, cost=10)  # 83, 9/3 = 3, 13
    assert rep[5] == 1 and rep[2] == 9
    rep = multi(r, keys, limits, cost=3, partial=True)  # the log can take 3 requests: 0/3 vs 10
    assert rep[0] == 3 and rep[5] == 1 and rep[2] == 0
    rep = multi(r, keys, limits, cost=0)
    assert rep[0] == 1 and rep[3] == 0
    # Ties: equal whole requests left go to the lowest index.
    rep = multi(r, ["rl:{t}:x", "rl:{t}:y"], [("TOKENBUCKET", [4, 1, HUGE], None),
                                              ("SLIDINGLOG", [8, HUGE], 2)])
    assert [p[2] for p in rep[6]] == [3, 6] and rep[5] == 0


def test_concurrent_calls_grant_exactly(server):
    """50 connections x 200 concurrent RL.MULTI calls on (capacity 100,
    limit 150) grant exactly 100, and the 150-limit key shows exactly 100
    taken: no call consumed from one limit while the other denied."""
    keys = ["rl:{c}:log", "rl:{c}:bucket"]
    # The looser limit first: a call that let the first limit decide alone
    # would grant 150.
    limits = [("SLIDINGLOG", [150, HUGE], None), ("TOKENBUCKET", [100, 1, HUGE], None)]
    args = multi_args(keys, limits)
    results = [0] * 50
    errors = []
    start = threading.Barrier(50)

    def worker(i):
        try:
            c = server.client()
            start.wait()
            granted = 0
            for _ in range(4):
                pipe = c.pipeline(transaction=False)
                for _ in range(50):
                    pipe.execute_command(*args)
                for rep in pipe.execute():
                    assert rep[0] in (0, 1)
                    granted += rep[0]
            results[i] = granted
            c.close()
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[0]
    assert sum(results) == 100, results
    c = server.client()
    assert rl(c, "RL.TOKENBUCKET", keys[1], [100, 1, HUGE], cost=0)[:3] == [1, 100, 0]
    assert rl(c, "RL.SLIDINGLOG", keys[0], [150, HUGE], cost=0)[:3] == [1, 150, 50]


def test_partial_with_weight(r):
    """Limits with 7 and 10 units remaining and weights 1 and 2: PARTIAL
    COST 8 grants 5 (5 x 1 <= 7, 5 x 2 <= 10); without PARTIAL nothing is
    granted and nothing changes."""
    keys = ["rl:{p}:a", "rl:{p}:b"]
    pa, pb = [10, 1, HUGE], [20, HUGE]
    rl(r, "RL.TOKENBUCKET", keys[0], pa, cost=3)
    rl(r, "RL.SLIDINGLOG", keys[1], pb, cost=10)
    limits = [("TOKENBUCKET", pa, None), ("SLIDINGLOG", pb, 2)]
    before = dump_all(r, keys)
    rep = multi(r, keys, limits, cost=8)
    assert rep[0] == 0 and [p[0] for p in rep[6]] == [0, 0]
    assert [p[2] for p in rep[6]] == [7, 10]
    assert dump_all(r, keys) == before
    dry = multi(r, keys, limits, cost=8, partial=True, dryrun=True)
    assert dump_all(r, keys) == before
    rep = multi(r, keys, limits, cost=8, partial=True)
    assert rep[:3] == dry[:3] and rep[5] == dry[5]
    assert rep[0] == 5
    assert [p[0] for p in rep[6]] == [5, 10]
    assert [p[2] for p in rep[6]] == [2, 0]
    assert rep[3] > 0 and rep[3] == max(p[3] for p in rep[6])
    assert rl(r, "RL.TOKENBUCKET", keys[0], pa, cost=0)[2] == 2
    assert rl(r, "RL.SLIDINGLOG", keys[1], pb, cost=0)[2] == 0
    # A limit whose own units can never fit: -1, and it binds.
    rep = multi(r, ["rl:{p}:c", "rl:{p}:d"], [("TOKENBUCKET", [10, 1, HUGE], None),
                                             ("SLIDINGCOUNTER", [10, HUGE], 4)], cost=3)
    assert rep[0] == 0 and rep[3] == -1 and rep[5] == 1 and rep[6][1][3] == -1
    assert r.exists("rl:{p}:c", "rl:{p}:d") == 0


def test_one_limit_multi_answers_like_the_single_command(r):
    """A one-limit RL.MULTI answers elements 1-5 exactly as the single
    command does, over a random sequence of costs, PARTIAL, DRYRUN, COST 0,
    parameter changes and refunds (time-independent parameters, so both
    keys see the same history)."""
    rnd = random.Random(SEED)
    slack = ClockSlack(r)
    for algo in ALGOS:
        single_key, multi_key = f"rl:one:{algo}:s", f"rl:one:{algo}:m"
        for i in range(300):
            limit = rnd.choice([5, 8, 13])
            params = NEVER_ALGO[algo](limit)
            opts = []
            refund = None
            cost, partial, dryrun = None, False, False
            if rnd.random() < 0.15:
                refund = rnd.randint(1, 6)
                opts = ["REFUND", refund]
            else:
                cost = rnd.choice([0, 1, 1, 2, 3, limit, limit + 1])
                partial = rnd.random() < 0.3
                dryrun = rnd.random() < 0.15
                opts = ["COST", cost] + ["PARTIAL"] * partial + ["DRYRUN"] * dryrun
            # Back to back in one transaction: a wait that shrinks with
            # time may differ by the rounding, and on Redis 7.0 by the time
            # between the two calls (ClockSlack).
            pipe = r.pipeline(transaction=True)
            pipe.execute_command(SINGLE[algo], single_key, *params, *opts)
            pipe.execute_command(*multi_args([multi_key], [(algo, params, None)], cost=cost,
                                             partial=partial, dryrun=dryrun, refund=refund))
            a, b = slack.execute(pipe)
            check_multi(b, [(algo, params, None)], cost=cost, partial=partial, dryrun=dryrun, refund=refund)

            def same(x, y):
                assert x[1:3] == y[1:3], (algo, i, params, opts, a, b)
                for u, v in zip(x[3:5], y[3:5]):
                    assert slack.close(u, v), (algo, i, params, opts, a, b, slack.longest_ms)
            if refund is None:
                assert a[0] == b[0], (algo, i, params, opts, a, b)
                took = a[0] if partial else a[0] * cost
                assert b[6][0][0] == took, (a, b)
            else:
                # A refund's own element 1 is what it gave back; the whole
                # reply's is n when anything was given back.
                assert b[6][0][0] == a[0] and b[0] == (refund if a[0] else 0), (a, b)
            same(a, b[:5])
            same(a, b[6][0])
            assert b[5] == 0
            assert r.exists(single_key) == r.exists(multi_key), (algo, i)


def test_fast_path_answers_like_the_generic_path(r):
    """RL.MULTI of token buckets, sliding counters and fixed windows without
    WEIGHT or options (the module's fast path, parsed once) answers, writes and
    expires exactly what the same call with `COST 1` (the same meaning,
    through the generic path) does: a random sequence of one to six limits,
    small limits (denials), parameter changes, a key of another type, a
    repeated key and calls the fast path declines (a sliding log, a WEIGHT),
    each run back to back on two key sets in one transaction."""
    rnd = random.Random(SEED)
    slack = ClockSlack(r)
    names = ["k%d" % i for i in range(6)]
    for i in range(400):
        n = rnd.choice([1, 1, 2, 2, 2, 3, 4, 5, 6])
        keys = rnd.sample(names, n)
        # A repeated key (the generic path's error), also with a key of
        # another type (the repeat is answered first).
        if n > 1 and (rnd.random() < 0.05 or i % 40 == 1):
            keys[-1] = keys[0]
        limits = []
        for _ in range(n):
            algo = rnd.choice(["TOKENBUCKET", "SLIDINGCOUNTER", "FIXEDWINDOW"] * 6 + ["SLIDINGLOG"])
            weight = 2 if rnd.random() < 0.04 else None
            limits.append((algo, NEVER_ALGO[algo](rnd.choice([1, 3, 5, 40])), weight))
        wrong = rnd.random() < 0.03 or i % 40 in (1, 2)
        if wrong:
            r.set("fast:" + keys[-1], "x")
            r.set("slow:" + keys[-1], "x")
        fast = multi_args(["fast:" + k for k in keys], limits)
        slow = multi_args(["slow:" + k for k in keys], limits, cost=1)
        pipe = r.pipeline(transaction=True)
        pipe.execute_command(*fast)
        pipe.execute_command(*slow)
        a, b = slack.execute(pipe, raise_on_error=False)
        if wrong:
            r.delete("fast:" + keys[-1], "slow:" + keys[-1])
        if isinstance(a, Exception) or isinstance(b, Exception):
            assert str(a) == str(b), (i, fast, a, b)
            continue
        check_multi(a, limits)

        def same(x, y):
            # A wait that shrinks with time may differ by the rounding, and
            # on Redis 7.0 by the time between the two calls (ClockSlack).
            assert x[:3] == y[:3], (i, fast, a, b)
            for u, v in zip(x[3:5], y[3:5]):
                assert slack.close(u, v), (i, fast, a, b, slack.longest_ms)
        same(a[:5], b[:5])
        assert a[5] == b[5], (i, fast, a, b)
        for x, y in zip(a[6], b[6]):
            same(x, y)
        for k in keys:
            assert r.type("fast:" + k) == r.type("slow:" + k), (i, k, fast, a, b)
            ta = r.execute_command("PEXPIRETIME", "fast:" + k)
            tb = r.execute_command("PEXPIRETIME", "slow:" + k)
            assert slack.close(ta, tb), (i, k, ta, tb, slack.longest_ms)


# ---------------------------------------------------------------------------
# REFUND.
# ---------------------------------------------------------------------------

def test_refund_token_bucket(r):
    """Tokens become min(capacity, tokens + n); element 1 is what was given
    back; a bucket refunded to full is fresh again: the key is deleted."""
    k, p = "rl:ref:tb", [10, 1, HUGE]
    assert rl(r, "RL.TOKENBUCKET", k, p, cost=7)[:3] == [1, 10, 3]
    rep = r.execute_command("RL.TOKENBUCKET", k, *p, "REFUND", 2)
    assert rep[:4] == [2, 10, 5, 0] and rep[4] > 0
    ttl = r.pttl(k)
    assert 0 < ttl and abs(ttl - rep[4]) < 5000
    rep = r.execute_command("RL.TOKENBUCKET", k, *p, "refund", 100)
    assert rep == [5, 10, 10, 0, 0]
    assert r.exists(k) == 0
    # A lower capacity caps the refund.
    rl(r, "RL.TOKENBUCKET", k, p, cost=6)
    rep = r.execute_command("RL.TOKENBUCKET", k, 5, 1, HUGE, "REFUND", 3)
    assert rep[:3] == [1, 5, 5] and rep[4] == 0 and r.exists(k) == 0


def test_refund_sliding_log_removes_the_newest_units(r):
    """Limit 10 filled by grants at distinct times; REFUND 3 removes the
    three newest. Then three grants fit at once, and the fourth waits
    exactly until the oldest grant leaves the window, which its
    retry_after_ms says (server TIME read in the same transaction)."""
    k, window = "rl:ref:log", 60000
    times = []
    for i in range(10):
        if times:
            last = times[-1]
            # Grants at distinct, well separated instants.
            wait_until(lambda: server_us(r) >= last + 20_000, what="20 ms passed")
        pipe = r.pipeline(transaction=True)
        pipe.time()
        pipe.execute_command("RL.SLIDINGLOG", k, 10, window)
        t, rep = pipe.execute()
        assert rep[0] == 1 and rep[2] == 9 - i, rep
        times.append(t[0] * 1_000_000 + t[1])
    rep = r.execute_command("RL.SLIDINGLOG", k, 10, window, "REFUND", 3)
    assert rep[:4] == [3, 10, 3, 0], rep
    # The newest grant left is the 7th: the log is fresh when it leaves.
    expect_reset = (times[6] + window * 1000 - server_us(r)) / 1000
    assert abs(rep[4] - expect_reset) < 50, (rep, expect_reset)
    pipe = r.pipeline(transaction=True)
    for _ in range(3):
        pipe.execute_command("RL.SLIDINGLOG", k, 10, window)
    pipe.time()
    pipe.execute_command("RL.SLIDINGLOG", k, 10, window)
    *three, t, fourth = pipe.execute()
    assert [x[:3] for x in three] == [[1, 10, 2], [1, 10, 1], [1, 10, 0]], three
    now = t[0] * 1_000_000 + t[1]
    expect = -(-(times[0] + window * 1000 - now) // 1000)   # ceil, ms
    assert fourth[0] == 0 and abs(fourth[3] - expect) <= 1, (fourth, expect)
    # Had the oldest grants been removed instead, the wait would be >= 60 ms longer.
    # Refunding more than the log holds empties it: the key is deleted.
    rep = r.execute_command("RL.SLIDINGLOG", k, 10, window, "REFUND", 50)
    assert rep == [10, 10, 10, 0, 0], rep
    assert r.exists(k) == 0


def test_refund_sliding_counter_never_below_zero(r):
    """n units come off the current window's count, what is left of n off
    the previous window's, never below zero."""
    lim, window = 1000, 4000
    w_us = window * 1000
    # The first grant with half of a 4 s window left (rltesting.clock), the
    # second in the next window (waited for on the server's clock): a run
    # whose calls missed their windows (a stall of 2 s) runs again on a
    # fresh key, up to 3 times.
    for attempt in range(3):
        k = f"rl:ref:sc:{attempt}"
        room(r, window, window // 2)
        pipe = r.pipeline(transaction=True)
        pipe.time()
        pipe.execute_command("RL.SLIDINGCOUNTER", k, lim, window, "COST", 600)
        t, rep = pipe.execute()
        assert rep[0] == 1
        k0 = (t[0] * 1_000_000 + t[1]) // w_us
        wait_past(r, (k0 + 1) * window, timeout=30)
        pipe = r.pipeline(transaction=True)
        pipe.execute_command("RL.SLIDINGCOUNTER", k, lim, window, "COST", 200)
        pipe.time()
        pipe.execute_command("RL.SLIDINGCOUNTER", k, lim, window, "REFUND", 500)
        g, t, rep = pipe.execute()
        now = t[0] * 1_000_000 + t[1]
        if now // w_us == k0 + 1:
            break
    else:
        raise AssertionError("no run made its calls in two windows in a row in 3 tries")
    assert g[0] == 1, (g, now)
    e = now % w_us
    # cur 200 - 200 = 0, prev 600 - 300 = 300: estimate 300 (W - e) / W.
    expect_remaining = (lim * w_us - 300 * (w_us - e)) // w_us
    assert rep[0] == 500 and abs(rep[2] - expect_remaining) <= 1, (rep, expect_remaining)
    assert rep[3] == 0
    # Only the previous window counts now: fresh at the end of this window.
    assert abs(rep[4] - (w_us - e) / 1000) <= 2, rep
    # More than is left: the counter empties, the key is deleted.
    rep = r.execute_command("RL.SLIDINGCOUNTER", k, lim, window, "REFUND", 10_000)
    assert rep[0] in (300, 0) and rep[2] == lim and rep[4] == 0, rep
    assert r.exists(k) == 0


def test_refund_on_a_fresh_key_creates_nothing(server):
    """A refund on a missing key (or one already fresh) answers element 1
    = 0, creates no key and replicates nothing."""
    m = server.client()
    with ReplicationTap(server) as tap:
        for algo in ALGOS:
            k = f"rl:ref:fresh:{algo}"
            p = NEVER_ALGO[algo](5)
            assert m.execute_command(SINGLE[algo], k, *p, "REFUND", 3) == [0, 5, 5, 0, 0]
            rep = multi(m, [k, k + ":2"], [(algo, p, None), (algo, p, 2)], refund=4)
            # Binding: 5 // 1 requests left on the first, 5 // 2 on the second.
            assert rep == [0, 5, 5, 0, 0, 1, [[0, 5, 5, 0, 0], [0, 5, 5, 0, 0]]], rep
            assert m.exists(k, k + ":2") == 0
        assert tap.take() == []
    assert m.keys("*") == [b"rl:tap:mark"]


def test_refund_multi_gives_back_n_times_weight(r):
    """In RL.MULTI each limit gets back n x WEIGHT; element 1 is n when any
    limit took units back; each limit's own element 1 is what it took back."""
    keys = ["rl:{rm}:a", "rl:{rm}:b", "rl:{rm}:c"]
    limits = [("TOKENBUCKET", [10, 1, HUGE], None), ("SLIDINGLOG", [30, HUGE], 3),
              ("SLIDINGCOUNTER", [100, HUGE], 10)]
    rep = multi(r, keys, limits, cost=3)
    assert [p[2] for p in rep[6]] == [7, 21, 70]
    rep = multi(r, keys, limits, refund=2)
    assert rep[0] == 2 and [p[0] for p in rep[6]] == [2, 6, 20], rep
    assert [p[2] for p in rep[6]] == [9, 27, 90], rep
    rep = multi(r, keys, limits, refund=2)
    assert rep[0] == 2 and [p[0] for p in rep[6]] == [1, 3, 10], rep
    assert r.exists(*keys) == 0     # all three fresh again: deleted
    rep = multi(r, keys, limits, refund=1)
    assert rep[0] == 0


# ---------------------------------------------------------------------------
# Errors change nothing.
# ---------------------------------------------------------------------------

def error_cases():
    tb, sl = ["TOKENBUCKET", 10, 1, 1000], ["SLIDINGLOG", 10, 1000]
    big = str((1 << 53) - 1)
    return [
        # (args after RL.MULTI, error prefix)
        (["0", *tb], "ERR numkeys"),
        (["x", "k1", *tb], "ERR numkeys"),
        (["-1", "k1", *tb], "ERR numkeys"),
        (["17", *[f"{{e}}k{i}" for i in range(17)], *(tb * 17)], "ERR numkeys"),
        (["2", "{e}k1", "{e}k2", *tb], "ERR"),                        # fewer limits than keys
        (["1", "{e}k1", *tb, *sl], "ERR"),                            # more limits than keys
        (["2", "{e}k1", "{e}k1", *tb, *sl], "ERR"),                    # repeated key
        (["3", "{e}k1", "{e}k2", "{e}k1", *tb, *sl, *sl], "ERR"),
        (["1", "{e}k1", "TOKENBUCKET", 0, 1, 1000], "ERR capacity"),
        (["1", "{e}k1", "TOKENBUCKET", 10, 1, "x"], "ERR period_ms"),
        (["1", "{e}k1", "SLIDINGLOG", 10, 0], "ERR window_ms"),
        (["1", "{e}k1", "SLIDINGCOUNTER", -1, 10], "ERR limit"),
        (["1", "{e}k1", "LEAKYBUCKET", 10, 10], "ERR syntax error"),
        (["1", "{e}k1", *tb, "WEIGHT", 0], "ERR WEIGHT"),
        (["1", "{e}k1", *tb, "WEIGHT", str(1 << 53)], "ERR WEIGHT"),
        (["1", "{e}k1", *tb, "WEIGHT"], "ERR syntax error"),
        (["1", "{e}k1", *tb, "WEIGHT", 2, "WEIGHT", 2], "ERR syntax error"),
        (["1", "{e}k1", *tb, "WEIGHT", 2**27, "COST", 2**27], "ERR"),      # product > 2^53-1
        (["1", "{e}k1", *tb, "WEIGHT", big, "COST", 2], "ERR"),
        (["1", "{e}k1", *tb, "WEIGHT", big, "REFUND", 2], "ERR"),
        (["1", "{e}k1", *tb, "COST", 1, "COST", 1], "ERR syntax error"),
        (["1", "{e}k1", *tb, "COST"], "ERR syntax error"),
        (["1", "{e}k1", *tb, "COST", -1], "ERR COST"),
        (["1", "{e}k1", *tb, "PARTIAL", "PARTIAL"], "ERR syntax error"),
        (["1", "{e}k1", *tb, "REFUND", 1, "COST", 1], "ERR syntax error"),
        (["1", "{e}k1", *tb, "REFUND", 1, "PARTIAL"], "ERR syntax error"),
        (["1", "{e}k1", *tb, "DRYRUN", "REFUND", 1], "ERR syntax error"),
        (["1", "{e}k1", *tb, "REFUND", 0], "ERR REFUND"),
        (["1", "{e}k1", *tb, "REFUND", 1, "REFUND", 1], "ERR syntax error"),
        (["1", "{e}k1", *tb, "FOO"], "ERR syntax error"),
        (["1", "{e}k1", *tb, "COST", 1, "WEIGHT", 2], "ERR syntax error"),
        # Wrong types: a string, and another algorithm's limiter.
        (["2", "{e}k1", "{e}str", *tb, *sl], "WRONGTYPE"),
        (["2", "{e}k1", "{e}log", *tb, *tb], "WRONGTYPE"),
        (["2", "{e}log", "{e}k1", "SLIDINGCOUNTER", 10, 1000, *tb], "WRONGTYPE"),
        (["1", "{e}str", *tb, "REFUND", 1], "WRONGTYPE"),
        (["1", "{e}str", *tb, "DRYRUN"], "WRONGTYPE"),
    ]


def test_errors_change_nothing(server):
    """Every bad call answers its error and leaves every key (value and
    expiry) as it was, creates nothing and replicates nothing."""
    m = server.client()
    m.set("{e}str", "not a limiter")
    m.execute_command("RL.SLIDINGLOG", "{e}log", 10, 100000, "COST", 3)
    m.execute_command("RL.TOKENBUCKET", "{e}k1", 10, 1, 100000, "COST", 4)
    keys = ["{e}str", "{e}log", "{e}k1", "{e}k2"]
    with ReplicationTap(server) as tap:
        before = dump_all(m, keys)
        dbsize = m.dbsize()
        for args, prefix in error_cases():
            with pytest.raises(redis.exceptions.ResponseError) as exc:
                m.execute_command("RL.MULTI", *args)
            assert error_text(exc.value).startswith(prefix), (args, error_text(exc.value))
            assert dump_all(m, keys) == before, args
            assert m.dbsize() == dbsize, args
        # Arity: Redis's standard error.
        for args in (["RL.MULTI"], ["RL.MULTI", 1], ["RL.MULTI", 1, "k", "TOKENBUCKET"]):
            with pytest.raises(redis.exceptions.ResponseError) as exc:
                m.execute_command(*args)
            assert "wrong number of arguments" in str(exc.value), (args, str(exc.value))
        # REFUND on the single commands: the same rules.
        for cmd, p in (("RL.TOKENBUCKET", [10, 1, 1000]), ("RL.SLIDINGLOG", [10, 1000]),
                       ("RL.SLIDINGCOUNTER", [10, 1000])):
            for opts in (["REFUND", 0], ["REFUND"], ["REFUND", 1, "COST", 1], ["PARTIAL", "REFUND", 1],
                         ["REFUND", 1, "DRYRUN"], ["REFUND", 1, "REFUND", 1], ["REFUND", str(1 << 53)]):
                with pytest.raises(redis.exceptions.ResponseError):
                    m.execute_command(cmd, "{e}k2", *p, *opts)
            with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
                m.execute_command(cmd, "{e}str", *p, "REFUND", 1)
        assert dump_all(m, keys) == before
        assert tap.take() == []


def test_command_getkeys_and_info(r):
    """The keys are declared with a numkeys key spec: COMMAND GETKEYS finds
    exactly them, and COMMAND INFO shows the flags and the movable keys."""
    args = multi_args(["a", "b", "c"], [("TOKENBUCKET", [1, 1, 1], None), ("SLIDINGLOG", [1, 1], 2),
                                        ("SLIDINGCOUNTER", [1, 1], None)], cost=1)
    assert [_s(k) for k in raw(r, "COMMAND", "GETKEYS", *args)] == ["a", "b", "c"]
    one = multi_args(["only"], [("TOKENBUCKET", [1, 1, 1], None)])
    assert [_s(k) for k in raw(r, "COMMAND", "GETKEYS", *one)] == ["only"]
    info = raw(r, "COMMAND", "INFO", "RL.MULTI")[0]
    name, arity, flags = _s(info[0]), info[1], {_s(f) for f in info[2]}
    assert name.lower() == "rl.multi" and arity == -6, info
    assert {"write", "denyoom", "fast", "movablekeys"} <= flags, flags


def test_info_counts_multi_calls_and_refunds(r):
    """INFO ratelimit counts RL.MULTI calls (granted, partial, denied) and
    refunds per command."""
    def stats():
        return {k: v for k, v in r.info("ratelimit").items()}
    s0 = stats()
    keys = ["rl:{i}:a", "rl:{i}:b"]
    limits = [("TOKENBUCKET", [5, 1, HUGE], None), ("SLIDINGLOG", [5, HUGE], None)]
    multi(r, keys, limits, cost=3)            # granted
    multi(r, keys, limits, cost=3)            # denied
    multi(r, keys, limits, cost=3, partial=True)  # partial (2)
    multi(r, keys, limits, refund=1)
    r.execute_command("RL.TOKENBUCKET", "rl:i:x", 5, 1, HUGE, "REFUND", 1)
    r.execute_command("RL.SLIDINGLOG", "rl:i:y", 5, HUGE, "REFUND", 1)
    r.execute_command("RL.SLIDINGCOUNTER", "rl:i:z", 5, HUGE, "REFUND", 1)
    s1 = stats()

    def d(f):
        return s1.get(f, 0) - s0.get(f, 0)
    assert (d("ratelimit_multi_granted"), d("ratelimit_multi_partial"), d("ratelimit_multi_denied")) == (1, 1, 1), s1
    for name in ("multi", "tokenbucket", "slidinglog", "slidingcounter"):
        assert d(f"ratelimit_{name}_refunds") == 1, (name, s1)
    assert d("ratelimit_tokenbucket_granted") == 0 and d("ratelimit_tokenbucket_denied") == 0


# ---------------------------------------------------------------------------
