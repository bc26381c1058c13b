#!/usr/bin/env python3
"""The leased limiter's decision latency through a Redis outage, measured in
the library, without the gateway and HTTP around it (their noise on a shared
machine is larger than what this looks for: a few decisions per second
that wait the Redis timeout).

    .venv/bin/python bench/edge/outage_decisions.py [--rate 150] [--asyncio]

The edge bench's settings for the Python gateway in leased mode (timeout
5 ms, breaker open 500 ms after 1 failure, batch 50, panic limits of half
the limit), 10,000 tenants drawn from Zipf(s=1), decisions at a fixed rate
in one thread (open loop: each decision's latency counts from when it was
due, so a slow one delays the next and both count). 1 s with Redis up, 3 s
SIGSTOP, then SIGCONT and 1 s more; prints the outage's decisions: count,
p50, p99, max, how many took over 1 ms and over 4 ms, and where the Redis
calls of the outage were made (the caller's thread or task, or the
limiter's worker)."""
import argparse
import asyncio
import bisect
import json
import random
import signal
import threading
import time

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry
from rltesting.proc import Server

import redis_ratelimit as rrl

TENANTS = 10_000


def zipf_keys(n, seed=1):
    w = [1 / (i + 1) for i in range(TENANTS)]
    cum, t = [], 0.0
    for x in w:
        t += x
        cum.append(t)
    rnd = random.Random(seed)
    return [f"rl:{{t{bisect.bisect(cum, rnd.random() * t)}}}:api" for _ in range(n)]


def summary(lat, where):
    lat = sorted(lat)
    n = len(lat)
    return {"decisions": n, "p50_ms": round(lat[n // 2] * 1000, 3),
            "p99_ms": round(lat[min(n - 1, (99 * n) // 100)] * 1000, 3),
            "max_ms": round(lat[-1] * 1000, 3),
            "over_1ms": sum(1 for v in lat if v > 0.001),
            "over_4ms": sum(1 for v in lat if v > 0.004),
            "redis_calls_in_outage": where}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=150, help="decisions/s")
    ap.add_argument("--asyncio", action="store_true", help="AsyncRateLimit, not RateLimit")
    args = ap.parse_args()
    policy = rrl.token_bucket("api", 100, 2, 1000)
    breaker = rrl.Breaker(failures=1, open_ms=500)
    panic = rrl.Panic(instances=2)
    server = Server()
    try:
        url_kw = dict(host="127.0.0.1", port=server.port)
        if args.asyncio:
            out = asyncio.run(run_async(server, url_kw, policy, breaker, panic, args.rate))
        else:
            out = run_sync(server, url_kw, policy, breaker, panic, args.rate)
    finally:
        server.proc.send_signal(signal.SIGCONT)
        server.close()
    print(json.dumps(out))


def schedule(rate):
    """(due offsets in s, keys, the outage's first and last offset)."""
    total = 5.0
    n = int(total * rate)
    return [i / rate for i in range(n)], zipf_keys(n), 1.0, 4.0


def run_sync(server, kw, policy, breaker, panic, rate):
    c = redis.Redis(**kw, socket_timeout=0.005, socket_connect_timeout=0.005,
                    retry=Retry(NoBackoff(), 0))
    rl = rrl.RateLimit(c, breaker=breaker)
    lim = rl.leased(policy, batch=50, panic=panic)
    main_thread = threading.current_thread()
    return drive_sync(server, rl, lim, rate, lambda: threading.current_thread() is main_thread)


def count_calls(rl, on_caller, outage):
    where = {"caller": 0, "worker": 0}
    real = rl.call

    def counted(*a, **k):
        if outage[0]:
            where["caller" if on_caller() else "worker"] += 1
        return real(*a, **k)

    rl.call = counted
    return where


def drive_sync(server, rl, lim, rate, on_caller):
    due, keys, t_stop, t_cont = schedule(rate)
    outage = [False]
    where = count_calls(rl, on_caller, outage)
    lat = []
    t0 = time.monotonic()
    stopped = resumed = False
    for d, k in zip(due, keys):
        wait = t0 + d - time.monotonic()
        if wait > 0:
            time.sleep(wait)    # not a spin: the worker thread needs the GIL
        if not stopped and d >= t_stop:
            server.proc.send_signal(signal.SIGSTOP)
            stopped = outage[0] = True
        if not resumed and d >= t_cont:
            server.proc.send_signal(signal.SIGCONT)
            resumed, outage[0] = True, False
        lim.limit(k)
        if stopped and not resumed:
            lat.append(time.monotonic() - (t0 + d))
    lim.close()
    return summary(lat, where)


async def run_async(server, kw, policy, breaker, panic, rate):
    rl = rrl.AsyncRateLimit(redis.asyncio.Redis(**kw), timeout_ms=5, breaker=breaker)
    lim = rl.leased(policy, batch=50, panic=panic)
    due, keys, t_stop, t_cont = schedule(rate)
    me = asyncio.current_task()
    outage = [False]
    where = count_calls(rl, lambda: asyncio.current_task() is me, outage)
    lat = []
    t0 = time.monotonic()
    stopped = resumed = False
    for d, k in zip(due, keys):
        wait = t0 + d - time.monotonic()
        await asyncio.sleep(wait if wait > 0 else 0)
        if not stopped and d >= t_stop:
            server.proc.send_signal(signal.SIGSTOP)
            stopped = outage[0] = True
        if not resumed and d >= t_cont:
            server.proc.send_signal(signal.SIGCONT)
            resumed, outage[0] = True, False
        await lim.limit(k)
        if stopped and not resumed:
            lat.append(time.monotonic() - (t0 + d))
    await lim.close()
    await rl.client.aclose()
    return summary(lat, where)


if __name__ == "__main__":
    main()
