#!/usr/bin/env python3
"""Benchmarks of the Python client (make bench; make test runs --quick).

Starts its own redis-server with the module (rltesting.proc) and
measures, in one run:

1. Local decision cost: one leased decision answered from the reservoir
   (no I/O), per call: median and p99 of individually timed calls (timer
   overhead subtracted), next to one shared call (a round trip) timed the
   same way; the ratio is the figure that carries across machines.
2. Shared calls per decision at steady load, batch 10 / 50 / 200.
3. Redis CPU per decision (INFO used_cpu_*) with one call per decision and
   with leases: how many more decisions one Redis core sustains (ratio).
4. Stranded units at idle: units leased to instances and not used, right
   after the traffic stops and after the idle refunds.

    python3 clients/python/bench.py [--quick] [--out FILE]
"""
import argparse
import os
import random
import sys
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rltesting.proc import Server

from redis_ratelimit import RateLimit, sliding_log

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

HUGE = 10**12
pc = time.perf_counter_ns


def bounded(port):
    """A client RateLimit takes: a socket timeout and no retries."""
    return redis.Redis(port=port, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def timer_overhead(n):
    e = []
    for _ in range(n):
        t0 = pc()
        e.append(pc() - t0)
    return pct(e, 0.5)


def local_cost(port, n):
    """Per-call cost of a local decision. The reservoir is filled with one
    big lease first so no refill runs while calls are timed."""
    rl = RateLimit(bounded(port))
    pol = sliding_log("local", 10**15, HUGE)
    lim = rl.leased(pol, batch=n * 2 + 10, low_water=0.0)
    f = lim.limit
    f("k")
    for _ in range(1000):
        f("k")
    over = timer_overhead(n)
    ts = []
    for _ in range(n):
        t0 = pc()
        f("k")
        ts.append(pc() - t0)
    assert rl.metrics()["leases"] == 1
    shared = rl.limiter(pol)
    rt = []
    for _ in range(max(200, n // 100)):
        t0 = pc()
        shared.limit("s")
        rt.append(pc() - t0)
    return {"median_ns": pct(ts, 0.5) - over, "p99_ns": pct(ts, 0.99) - over,
            "shared_median_ns": pct(rt, 0.5) - over, "timer_ns": over}


def steady(port, batch, n, keys=20):
    """Decisions over `keys` keys in a tight loop: calls per decision."""
    rl = RateLimit(bounded(port))
    lim = rl.leased(sliding_log(f"steady{batch}", 10**15, HUGE), batch=batch)
    rnd = random.Random(1)
    ks = [f"rl:{{k{i}}}:s" for i in range(keys)]
    t0 = time.monotonic()
    for _ in range(n):
        lim.limit(ks[rnd.randrange(keys)])
    wall = time.monotonic() - t0
    m = rl.metrics()
    return {"batch": batch, "decisions": n, "calls": m["calls"], "waits": m["lease_waits"],
            "calls_per_decision": m["calls"] / n, "local": m["decisions_local"],
            "wall_s": wall}


def cpu(c):
    i = c.info("cpu")
    return i["used_cpu_user"] + i["used_cpu_sys"]


def redis_cpu(port, n, batch, rounds=5):
    """Redis CPU seconds per decision: one call each vs leases, measured in
    alternating rounds (the machine is shared: the median round is reported)."""
    c = redis.Redis(port=port)
    rl = RateLimit(bounded(port))
    pol = sliding_log("cpu", 10**15, HUGE)
    per_call = rl.limiter(pol)
    lim = rl.leased(pol, batch=batch)
    m = n * 10   # the leased run makes m/batch calls: more decisions, measurable CPU
    pers, leaseds = [], []
    for _ in range(rounds):
        c0 = cpu(c)
        for i in range(n):
            per_call.limit(f"rl:{{c{i % 20}}}:x")
        c1 = cpu(c)
        for i in range(m):
            lim.limit(f"rl:{{l{i % 20}}}:x")
        c2 = cpu(c)
        pers.append((c1 - c0) / n)
        leaseds.append((c2 - c1) / m)
    ratios = sorted(p / q for p, q in zip(pers, leaseds) if q > 0)
    per, leased = sorted(pers)[rounds // 2], sorted(leaseds)[rounds // 2]
    return {"n_per_call": n, "n_leased": m, "cpu_per_call_us": per * 1e6,
            "cpu_leased_us": leased * 1e6, "ratio": ratios[len(ratios) // 2],
            "ratio_lo": ratios[0], "ratio_hi": ratios[-1], "rounds": rounds,
            "per_call_decisions_per_core_s": 1 / per if per else 0,
            "leased_decisions_per_core_s": 1 / leased if leased else 0}


def stranded(port, batch, backend, instances=8, keys=20, n=20000):
    """Units leased but unused once traffic stops, before and after refunds."""
    rls = [RateLimit(bounded(port), backend=backend)
           for _ in range(instances)]
    pol = sliding_log(f"strand{batch}", 10**12, HUGE)
    lims = [rl.leased(pol, batch=batch, idle_ms=300) for rl in rls]
    rnd = random.Random(2)
    ks = [f"rl:{{st{batch}-{i}}}:s" for i in range(keys)]
    granted = 0
    for _ in range(n):
        granted += lims[rnd.randrange(instances)].limit(ks[rnd.randrange(keys)]).allowed
    probe = rls[0].limiter(pol)

    def used():
        return sum(pol.limit - probe.limit(k, cost=0).remaining for k in ks)

    time.sleep(0.05)   # let the refills in flight land
    before_local = sum(lm.stranded() for lm in lims)
    before_server = used() - granted
    refunds_ok = True
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if sum(lm.stranded() for lm in lims) == 0 and used() == granted:
            break
        if any(rl.metrics()["failures"] for rl in rls):
            refunds_ok = False
            break
        time.sleep(0.05)
    after_local = sum(lm.stranded() for lm in lims)
    after_server = used() - granted
    return {"batch": batch, "instances": instances, "keys": keys, "granted": granted,
            "before": before_server, "before_local": before_local,
            "after": after_server, "after_local": after_local, "refunds": refunds_ok}


def refund_backend(port):
    """The backend that has REFUND: the module's, else the Lua twins'."""
    for b in ("module", "lua"):
        rl = RateLimit(bounded(port), backend=b)
        try:
            rl.limiter(sliding_log("probe", 10, HUGE)).refund("rl:{probe}:x", 1)
            return b
        except Exception:   # noqa: BLE001
            pass
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny counts: proves it runs")
    ap.add_argument("--out", default=os.path.join(HERE, "BENCHMARKS.md"))
    a = ap.parse_args()
    q = a.quick
    s = Server()
    try:
        lc = local_cost(s.port, 2000 if q else 200_000)
        st = [steady(s.port, b, 2000 if q else 200_000) for b in (10, 50, 200)]
        cp = redis_cpu(s.port, 200 if q else 5_000, 50, rounds=2 if q else 5)
        refund = refund_backend(s.port)
        sd = [stranded(s.port, b, refund, n=1000 if q else 20_000) for b in (10, 50, 200)] \
            if refund else []
    finally:
        s.close()
    lines = [
        "# Python client benchmarks",
        "",
        f"`python3 clients/python/bench.py{' --quick' if q else ''}` (one run, one redis-server "
        "7 with the module on this machine, Python "
        f"{sys.version.split()[0]}).",
        "",
        "## Local decision cost (leased, answered from the reservoir)",
        "",
        "| | median | p99 |",
        "|---|---|---|",
        f"| local decision | {lc['median_ns'] / 1000:.2f} µs | {lc['p99_ns'] / 1000:.2f} µs |",
        f"| one shared call (round trip) | {lc['shared_median_ns'] / 1000:.1f} µs | |",
        "",
        f"A local decision costs 1/{lc['shared_median_ns'] / max(1, lc['median_ns']):.0f} "
        f"of a shared call (timer overhead {lc['timer_ns']} ns subtracted).",
        "",
        "## Shared calls per decision at steady load (20 keys, low_water 0.2)",
        "",
        "| batch | decisions | shared calls | calls per decision | callers that waited for a "
        "refill |",
        "|---|---|---|---|---|",
    ]
    for r in st:
        lines.append(f"| {r['batch']} | {r['decisions']} | {r['calls']} | "
                     f"1/{1 / r['calls_per_decision']:.0f} | {r['waits']} |")
    lines += [
        "",
        "## Redis CPU per decision (batch 50)",
        "",
        "| | Redis CPU per decision | decisions/s one Redis core sustains |",
        "|---|---|---|",
        f"| one call per decision | {cp['cpu_per_call_us']:.2f} µs | "
        f"{cp['per_call_decisions_per_core_s']:,.0f} |",
        f"| leased (batch 50) | {cp['cpu_leased_us']:.3f} µs | "
        f"{cp['leased_decisions_per_core_s']:,.0f} |",
        "",
        f"Ratio: one Redis core sustains **{cp['ratio']:.0f}×** as many decisions with leases "
        f"(median of {cp['rounds']} alternating rounds; range {cp['ratio_lo']:.0f}–"
        f"{cp['ratio_hi']:.0f}×; the medians per column are shown above).",
        "",
        "## Stranded units at idle (8 instances, 20 keys, idle_ms 300)",
        "",
    ]
    if sd:
        lines += [f"Backend: {refund}" + (" (this module build has no REFUND yet; the Lua twins "
                                          "have it)" if refund == "lua" else "") + ".", ""]
    if sd:
        lines += ["| batch | granted | stranded when traffic stops | after idle refunds |",
                  "|---|---|---|---|"]
        for r in sd:
            lines.append(f"| {r['batch']} | {r['granted']} | {r['before']} | {r['after']} |")
    else:
        lines.append("Not measured: this server has no REFUND yet.")
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
