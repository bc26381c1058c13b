#!/usr/bin/env python3
"""RL.CONCURRENCY against the usual Redis recipe for an in-flight limit: a
sorted set of request ids scored by their lease's end, in Lua (ZREMRANGE-
BYSCORE the lapsed, ZSCORE / ZCARD, ZADD, PEXPIRE; ZREM to release).

One server (the module loaded, persistence off), redis-benchmark for the
load (50 connections, pipeline 16): requests/s, and the server's own
µs per call from INFO commandstats (usec_per_call: the command's
execution, without the network). On one key with `held` leases live:

- `acquire`: ACQUIRE of an id drawn from `held` ids (each already holds
  its lease: the retried ACQUIRE, which renews; every call writes: the
  module's lease buffer, the set's score).

Then bytes per held lease: MEMORY USAGE of a key with 100 and with 1,100
leases of UUID-like ids (36 bytes), for both.

    python3 bench/concurrency.py [--server valkey9.1] [--requests 400000] [--out bench/concurrency.json]
"""
import argparse
import json
import os
import re
import subprocess
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "testing"))

# The recipe, as it is usually written (one script per action).
ACQUIRE_LUA = """
local key, limit, lease, id = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZSCORE', key, id) or redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now + lease, id)
  redis.call('PEXPIRE', key, lease)
  return 1
end
return 0
"""
RELEASE_LUA = """
return redis.call('ZREM', KEYS[1], ARGV[1])
"""


def bench(port, args, requests, clients=50, pipeline=16):
    """requests/s of redis-benchmark running `args` (a list of commands
    separated by ';' is not supported: one command)."""
    out = subprocess.run(["redis-benchmark", "-p", str(port), "-n", str(requests), "-c", str(clients),
                          "-P", str(pipeline), "-r", str(args["r"]), "-q", *args["cmd"]],
                         capture_output=True, text=True, check=True).stdout
    m = re.findall(r"([\d.]+) requests per second", out)
    return float(m[-1]) if m else None


def usec_per_call(c, name):
    stats = c.info("commandstats")
    return stats.get(f"cmdstat_{name}", {}).get("usec_per_call")


def run(server, requests, held):
    from rltesting import proc  # testing/ (make venv installs it)
    proc.REDIS_SERVER = server
    s = proc.Server()
    c = s.client()
    out = {"server": c.info("server").get("valkey_version") or c.info("server").get("redis_version"),
           "held": held, "requests": requests}
    try:
        acq = c.script_load(ACQUIRE_LUA)
        c.script_load(RELEASE_LUA)
        lease = "3600000"
        ids = "id-__rand_int__-0000-0000-0000-000000000000"
        # Fill both keys with `held` leases first.
        p = c.pipeline(transaction=False)
        for i in range(held):
            rid = f"id-{i:012d}-0000-0000-0000-000000000000"
            p.execute_command("RL.CONCURRENCY", "m", 10**9, lease, "ACQUIRE", rid)
            p.evalsha(acq, 1, "z", 10**9, lease, rid)
        p.execute()
        cases = {
            "module acquire": ["RL.CONCURRENCY", "m", str(10**9), lease, "ACQUIRE", ids],
            "recipe acquire": ["EVALSHA", acq, "1", "z", str(10**9), lease, ids],
        }
        for name, cmd in cases.items():
            c.config_resetstat()
            rps = bench(s.port, {"cmd": cmd, "r": held}, requests)
            stat = "RL.CONCURRENCY" if name.startswith("module") else "evalsha"
            out[name] = {"requests_per_s": rps, "usec_per_call": usec_per_call(c, stat)}
            print(f"{name:16s} {rps:>10,.0f} req/s  {out[name]['usec_per_call']} us per call (server)", flush=True)
        # Bytes per held lease.
        mem = {}
        for n in (100, 1100):
            c.delete("mm", "zz")
            p = c.pipeline(transaction=False)
            for i in range(n):
                rid = f"{i:08x}-5b1d-4e8f-a6c0-2d9b8e4f1a3c"
                p.execute_command("RL.CONCURRENCY", "mm", 10**9, lease, "ACQUIRE", rid)
                p.evalsha(acq, 1, "zz", 10**9, lease, rid)
            p.execute()
            mem[n] = (c.memory_usage("mm", samples=0), c.memory_usage("zz", samples=0))
        out["bytes_per_lease"] = {"module": (mem[1100][0] - mem[100][0]) / 1000,
                                  "recipe": (mem[1100][1] - mem[100][1]) / 1000,
                                  "module_1100": mem[1100][0], "recipe_1100": mem[1100][1]}
        print("bytes per held lease: module %.1f, sorted set %.1f (MEMORY USAGE at 1,100 leases: %d and %d)"
              % (out["bytes_per_lease"]["module"], out["bytes_per_lease"]["recipe"], mem[1100][0], mem[1100][1]))
    finally:
        s.close()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="valkey9.1", help="a name of rltesting.servers or a path")
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--held", type=int, action="append", help="leases held on the key (repeatable; default 10, 100)")
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args()
    server = a.server
    if os.sep not in server:
        from rltesting import servers
        server = servers.server_path(server)
    results = [run(server, a.requests, h) for h in (a.held or [10, 100])]
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
