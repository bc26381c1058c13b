#!/usr/bin/env python3
"""What strict mode costs: a decision alone vs a decision followed by
`WAIT 1 <timeout>` in the same pipeline (issue 25; docs/operations.md,
"What a failover costs").

A primary with the module and one replica (the module on it too), both on
127.0.0.1, no persistence.

1. Instructions (`--instructions`): the primary runs under
   `valgrind --tool=callgrind`; one connection sends decisions one at a
   time (each waits for its reply, as a strict client must), either
   `RL.TOKENBUCKET` alone or `RL.TOKENBUCKET` + `WAIT 1 1000` written in
   one go. The counters are zeroed before a window and dumped after it;
   per decision: the primary's whole process (every instruction it ran in
   the window: the request, the replication stream, the replica's
   REPLCONF ACK, the event loop; not the kernel), and inside
   `processInputBuffer` (every request it parsed and ran, the replica's
   ACKs included). The median of the windows.
2. Latency and decisions/s (`--latency`): the primary runs natively; the
   Python library's sync client (`RateLimit`, module backend) makes
   sequential decisions with `strict=None` and with
   `strict=Strict(replicas=1, timeout_ms=...)`, in alternating rounds (the
   machine may be shared: a load change hits both). Per mode: decisions/s
   and p50/p99 latency of each round; the medians over rounds.

Usage: bench/strict_cost.py [--server PATH] [--instructions] [--latency]
       [--requests N] [--windows W] [--rounds R] [--decisions D] [--json FILE]
"""

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# bench/profile.py's server start, connection and callgrind reader (loaded by path:
# the standard library has a `profile` module too)
_spec = importlib.util.spec_from_file_location("rl_profile", os.path.join(HERE, "profile.py"))
_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_profile)
MODULE, free_port, inclusive, resp, start_server = (
    _profile.MODULE, _profile.free_port, _profile.inclusive, _profile.resp, _profile.start_server)

HUGE = str((1 << 53) - 1)
CAP = "1000000000"


def start(binary, port, tmp, name, extra=(), valgrind=None):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--dir", d, "--loadmodule", MODULE, "--repl-diskless-sync", "yes",
           "--repl-diskless-sync-delay", "0", *extra]
    return start_server(cmd, port, d, valgrind=valgrind, what=f"strict_cost: {name}")


def pair(binary, tmp, valgrind=None):
    """(primary process, its Conn, port, replica process): the replica linked
    and acknowledging (its first REPLCONF ACK seen, so WAIT counts it)."""
    pport, rport = free_port(), free_port()
    primary, pc = start(binary, pport, tmp, "primary", valgrind=valgrind)
    replica, rc = start(binary, rport, tmp, "replica", ["--replicaof", "127.0.0.1", str(pport)])
    deadline = time.time() + 120
    while True:
        if time.time() > deadline:
            sys.exit("strict_cost: the replica did not link")
        if "master_link_status:up" in rc.call("INFO", "replication") and \
                pc.call("SET", "settle", "1") == "OK" and pc.call("WAIT", "1", "1000") == 1:
            break
        time.sleep(0.2)
    pc.call("DEL", "settle")
    return primary, pc, pport, replica


def stop(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(30)


def instructions(binary, a, tmp):
    out = os.path.join(tmp, "cg.out")
    primary, conn, _, replica = pair(binary, tmp, valgrind=out)
    keys = [str(i) for i in range(1000)]
    tb = [resp(["RL.TOKENBUCKET", "tb:" + k, CAP, "1", HUGE]) for k in keys]
    wait = resp(["WAIT", "1", "1000"])
    results = {}
    try:
        for k in tb * 2:  # every key exists, the keyspace is sized
            conn.s.sendall(k)
            conn.reply()
        dumps = 0
        for label, extra in (("RL.TOKENBUCKET", b""), ("RL.TOKENBUCKET + WAIT 1", wait)):
            per = []
            for _ in range(a.windows):
                for i in range(50):  # steady buffers
                    conn.s.sendall(tb[i] + extra)
                    conn.reply()
                    if extra:
                        conn.reply()
                subprocess.run(["callgrind_control", "-z", str(primary.pid)], capture_output=True,
                               check=True)
                for i in range(a.requests):
                    conn.s.sendall(tb[i % len(tb)] + extra)
                    r = conn.reply()
                    if not isinstance(r, list) or r[0] != 1:
                        sys.exit(f"strict_cost: not granted: {r!r}")
                    if extra and conn.reply() != 1:
                        sys.exit("strict_cost: WAIT did not see the replica")
                subprocess.run(["callgrind_control", "-d", str(primary.pid)], capture_output=True,
                               check=True)
                dumps += 1
                path = f"{out}.{dumps}"
                funcs = inclusive(path)
                total = _total(path)
                per.append({"process": total / a.requests,
                            "processInputBuffer": funcs.get("processInputBuffer", 0) / a.requests,
                            "call": funcs.get("call", 0) / a.requests})
                os.remove(path)
            results[label] = {k: round(statistics.median(w[k] for w in per)) for k in per[0]}
            print(label, results[label], flush=True)
    finally:
        stop(replica, primary)
    return results


def _total(path):
    """The total instruction count of a callgrind dump (its `summary:` or
    `totals:` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    sys.exit(f"strict_cost: no totals in {path}")


def latency(binary, a, tmp):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from redis_ratelimit import Breaker, RateLimit, Strict, token_bucket
    primary, _, port, replica = pair(binary, tmp)
    out = {"plain": [], "strict": []}
    try:
        def limiter(strict):
            c = redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5,
                            retry=Retry(NoBackoff(), 0))
            rl = RateLimit(c, backend="module", strict=strict,
                           breaker=Breaker(failures=10**6, latency_budget_ms=10**6))
            return rl.limiter(token_bucket("cost", 10**9, 1, (1 << 53) - 1))
        lims = {"plain": limiter(None), "strict": limiter(Strict(replicas=1, timeout_ms=100))}
        for lim in lims.values():
            for i in range(200):
                assert lim.limit(f"k{i % 100}").source == "module"
        for _ in range(a.rounds):
            for mode, lim in lims.items():
                lat = []
                t0 = time.perf_counter()
                for i in range(a.decisions):
                    t = time.perf_counter()
                    d = lim.limit(f"k{i % 100}")
                    lat.append(time.perf_counter() - t)
                    if not (d.allowed and d.source == "module"):
                        sys.exit(f"strict_cost: {mode} decision not granted by the module: {d.source}")
                secs = time.perf_counter() - t0
                lat.sort()
                out[mode].append({"per_s": a.decisions / secs, "p50_us": lat[len(lat) // 2] * 1e6,
                                  "p99_us": lat[len(lat) * 99 // 100] * 1e6})
    finally:
        stop(replica, primary)
    summary = {}
    for mode, rounds in out.items():
        summary[mode] = {k: round(statistics.median(r[k] for r in rounds)) for k in rounds[0]}
        summary[mode]["rounds"] = [{k: round(v) for k, v in r.items()} for r in rounds]
        print(mode, summary[mode], flush=True)
    return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=shutil.which("redis-server") or "redis-server")
    ap.add_argument("--instructions", action="store_true")
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--requests", type=int, default=2000, help="decisions per callgrind window")
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="latency rounds per mode")
    ap.add_argument("--decisions", type=int, default=3000, help="decisions per latency round")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not (a.instructions or a.latency):
        a.instructions = a.latency = True
    ver = subprocess.run([a.server, "--version"], capture_output=True, text=True).stdout.strip()
    report = {"server": ver, "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load": os.getloadavg()}
    tmp = tempfile.mkdtemp(prefix="rl-strict-cost-")
    try:
        if a.instructions:
            report["instructions"] = instructions(a.server, a, os.path.join(tmp, "cg"))
        if a.latency:
            report["latency"] = latency(a.server, a, os.path.join(tmp, "lat"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
