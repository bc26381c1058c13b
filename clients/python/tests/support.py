"""Helpers shared by the client tests."""
import random
import time

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from redis_ratelimit import (all_of, make_key, sliding_counter, sliding_log,
                             token_bucket)

# Long periods and windows: nothing refills, slides or expires while a
# sequence runs, so two backends called one after the other agree exactly on
# units; their times differ by at most the time between the two calls.
LONG = 10**12
POLICIES = [
    token_bucket("tb", 7, 1, LONG),
    sliding_log("log", 6, LONG),
    sliding_counter("cnt", 9, LONG),
]
# (the bucket refills 3x faster than the windows slide, so a denial's
# longest wait, which names the binding limit, is never a near tie)
MULTI = all_of(token_bucket("tb", 7, 1, LONG // 3), sliding_log("log", 12, LONG).weighted(2),
               sliding_counter("cnt", 20, LONG), name="combo")


def client(port, timeout=5.0):
    """A sync client as RateLimit takes it: bounded, no retries (redis-py
    6+ retries by default)."""
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))


def cluster_client(port, timeout=5.0):
    # redis-py 6+ warns that cluster_error_retry_attempts is deprecated (retry rules)
    old = {"cluster_error_retry_attempts": 0} if int(redis.__version__.split(".")[0]) < 6 else {}
    return RedisCluster(host="127.0.0.1", port=port, socket_timeout=timeout,
                        socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0), **old)


def sequence(seed, n, with_multi, with_refund):
    """(policy, key tag, method, kwargs) operations, reproducible from `seed`."""
    rnd = random.Random(seed)
    pols = POLICIES + ([MULTI] if with_multi else [])
    ops = []
    for _ in range(n):
        p = rnd.choice(pols)
        tag = f"t{rnd.randrange(3)}"
        if with_refund and rnd.random() < 0.15:
            ops.append((p, tag, "refund", {"n": rnd.randint(1, 3)}))
        else:
            ops.append((p, tag, "limit", {"cost": rnd.choice([0, 1, 1, 1, 2, 3, 8]),
                                          "partial": rnd.random() < 0.3,
                                          "dry_run": rnd.random() < 0.15}))
    return ops


def key_of(prefix, policy, tag):
    return make_key(prefix + tag, policy.name)


def assert_same(a, b, slack_ms):
    """Identical Decisions but for the source, with times within slack_ms."""
    va, vb = a.values(), b.values()
    assert va[:4] == vb[:4] and va[6:8] == vb[6:8], (a, b)
    for x, y in ((a.retry_after_ms, b.retry_after_ms), (a.reset_after_ms, b.reset_after_ms)):
        assert (x <= 0) == (y <= 0) and (x < 0) == (y < 0), (a, b)
        assert abs(x - y) <= slack_ms, (a, b, slack_ms)
    assert len(a.parts) == len(b.parts)
    for p, q in zip(a.parts, b.parts):
        assert p.as_tuple()[:4] == q.as_tuple()[:4], (a, b)
        assert abs(p.retry_after_ms - q.retry_after_ms) <= slack_ms, (a, b)
        assert abs(p.reset_after_ms - q.reset_after_ms) <= slack_ms, (a, b)


class Stopwatch:
    def __init__(self):
        self.worst = 0.0

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.worst = max(self.worst, time.monotonic() - self.t0)
