"""One gateway-like process for the exactness test: two leased limiters on
one shared key. Limiter B takes a lease before the start, uses a few
units and goes idle, so its unused units come back only by the idle
refund; limiter A hammers the key for the whole run. Prints one JSON line:
grants counted here and the limiters' lease/refund counters.

    python lease_worker.py PORT BACKEND KEY GO_FILE RUN_S"""
import json
import os
import sys
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_ratelimit import Breaker, RateLimit, sliding_log

port, backend, key, go_file, run_s = sys.argv[1:6]
run_s = float(run_s)
POLICY = sliding_log("shared", 1000, 3_600_000)  # as in test_exactness.py

rl = RateLimit(redis.Redis(host="127.0.0.1", port=int(port), socket_timeout=2,
                           socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)),
               backend=backend,
               # exactness, not latency: on a loaded machine the default
               # latency rule (p95 over 50 ms for 1 s) could open the breaker,
               # and panic grants are local by design
               breaker=Breaker(latency_budget_ms=10_000))
rl.detect()
a = rl.leased(POLICY, batch=50, idle_ms=300, recheck_ms=50)
b = rl.leased(POLICY, batch=50, idle_ms=300, recheck_ms=50)
counts = {"a": 0, "b": 0, "calls_a": 0, "first": None, "last": None}
# B: a few requests before the start, then idle: its lease (45 units) is
# stranded until idle_ms passes and the idle refund gives it back
for _ in range(5):
    d = b.limit(key)
    if d.allowed:
        counts["b"] += 1
        now = time.time()
        counts["first"] = min(counts["first"] or now, now)
        counts["last"] = max(counts["last"] or now, now)
held_b = b.stranded()
print("ready", flush=True)
while not os.path.exists(go_file):
    time.sleep(0.005)
start = time.monotonic()


def hammer():
    while time.monotonic() - start < run_s:
        d = a.limit(key)
        counts["calls_a"] += 1
        if d.allowed:
            counts["a"] += 1
            now = time.time()
            counts["first"] = counts["first"] or now
            counts["last"] = now
        else:
            time.sleep(0.0002)


t = threading.Thread(target=hammer)
t.start()
t.join()
a.close()
b.close()
m = rl.metrics()
print(json.dumps({"granted": counts["a"] + counts["b"], "a": counts["a"], "b": counts["b"],
                  "held_b": held_b, "calls_a": counts["calls_a"],
                  "lease_tokens": m["lease_tokens"], "refund_tokens": m["refund_tokens"],
                  "leases": m["leases"], "refunds": m["refunds"], "failures": m["failures"],
                  "trips": m["trips"],
                  "first": counts["first"], "last": counts["last"]}), flush=True)
