"""The workload fuzz/valgrind.sh runs against redis-server under memcheck:
every module code path (commands and options, runtime rule changes, log
growth and shrinking, RL.STATE, DUMP/RESTORE valid and hostile, COPY,
DIGEST, MEMORY USAGE, RDB save/load, AOF rewrite and load, expiry,
eviction, lazy free). Usage: valgrind_workload.py PORT"""
import random
import sys
import time

import redis

from rltesting.payloads import (
    MAX_ARG, Dump, mutate, payload, random_log, random_payloads, sl_body, with_trailer,
)

COMMANDS = ("RL.TOKENBUCKET", "RL.SLIDINGLOG", "RL.SLIDINGCOUNTER")


def params(cmd, limit, ms):
    return [limit, 1, ms] if cmd == "RL.TOKENBUCKET" else [limit, ms]


def call(c, *args):
    try:
        return c.execute_command(*args)
    except redis.ResponseError as e:
        return e


def wait(pred, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise SystemExit("valgrind workload: timed out")


def main(port):
    c = redis.Redis(port=port, socket_timeout=600)
    rng = random.Random(42)
    c.config_set("rdbcompression", "no")
    step = lambda name: print(f"workload: {name}", flush=True)  # noqa: E731

    step("commands, options, rule changes")
    for i in range(1500):
        cmd = COMMANDS[i % 3]
        key = f"k{i % 60}"
        limit = rng.choice([1, 5, 50, MAX_ARG])
        ms = rng.choice([1, 50, 1000, MAX_ARG])
        opts = ["COST", rng.choice([0, 1, 3, MAX_ARG])]
        opts += ["PARTIAL"] if rng.random() < 0.3 else []
        opts += ["DRYRUN"] if rng.random() < 0.2 else []
        call(c, cmd, f"{cmd}:{key}", *params(cmd, limit, ms), *opts)
        call(c, COMMANDS[(i + 1) % 3], f"{cmd}:{key}", *params(cmd, limit, ms))  # WRONGTYPE
    for bad in [["x"], ["x", "0", "1", "1"], ["x", "1", "1", "1", "COST"], ["x", "1", "1", "1", "FOO"]]:
        for cmd in COMMANDS:
            call(c, cmd, *bad)

    step("sliding logs: growth, trimming, wide formats")
    for i in range(1500):
        call(c, "RL.SLIDINGLOG", "grow", 100_000, 200, "COST", 1 + i % 7)
        call(c, "RL.SLIDINGLOG", "wide", MAX_ARG, MAX_ARG, "COST", rng.choice([1, 1 << 40]))
    t = int(time.time() * 1e6)
    for name, entries in [("sl1", random_log(rng, t, 300, 50_000_000, 9)),
                          ("sl2", random_log(rng, t, 300, 1 << 40, 1 << 20)),
                          ("sl4", [(t - (1 << 40), MAX_ARG - 7), (t, 3)])]:
        call(c, "RL.STATE", name, payload("sl", 0, sl_body(entries)))
        for _ in range(50):
            call(c, "RL.SLIDINGLOG", name, MAX_ARG, 60_000, "COST", rng.randint(1, 1 << 20))

    step("RL.STATE random and mutated")
    seeds = list(random_payloads(rng, t))
    for i in range(1500):
        p = mutate(rng, rng.choice(seeds), field_base=10) if i % 5 else \
            bytes(rng.randrange(256) for _ in range(rng.randint(0, 60)))
        call(c, "RL.STATE", f"st{i % 10}", p)
        if rng.random() < 0.2:
            call(c, "RL.TOKENBUCKET", f"st{i % 10}", 5, 1, 1000)

    step("DUMP/RESTORE, COPY, DIGEST, MEMORY USAGE")
    keys = [k for k in c.scan_iter(count=1000) if c.type(k) in (b"rl-tokbkt", b"rl-slilog", b"rl-slicnt")]
    dumps = []
    for k in keys[:200]:
        d = c.dump(k)
        if d is None:
            continue
        dumps.append(Dump(d))
        call(c, "RESTORE", k + b":r", 0, d, "REPLACE")
        call(c, "COPY", k, k + b":c", "REPLACE")
        call(c, "DEBUG", "DIGEST-VALUE", k)
        call(c, "MEMORY", "USAGE", k)
    for i in range(1500):
        d = rng.choice(dumps)
        how = i % 3
        if how == 0:
            p = d.build(body=mutate(rng, d.body))
        elif how == 1:
            p = with_trailer(d.value[:rng.randrange(1, len(d.value))], d.version)
        else:
            p = with_trailer(d.value[:1] + mutate(rng, d.value[1:], field_base=16), d.version)
        call(c, "RESTORE", "hostile", 0, p, "REPLACE")
    call(c, "DEBUG", "DIGEST")

    step("RDB save and load (DEBUG RELOAD)")
    call(c, "DEBUG", "RELOAD")
    step("AOF rewrite (forked child) and AOF load")
    c.bgrewriteaof()
    wait(lambda: c.info("persistence")["aof_rewrite_in_progress"] == 0
         and c.info("persistence")["aof_rewrite_scheduled"] == 0)
    call(c, "DEBUG", "LOADAOF")

    step("expiry")
    for i in range(600):
        cmd = COMMANDS[i % 3]
        call(c, cmd, f"exp{i}", *params(cmd, 10, 100), "COST", 2)
    wait(lambda: c.execute_command("EXISTS", *[f"exp{i}" for i in range(600)]) == 0)

    step("eviction (allkeys-lru)")
    c.config_set("maxmemory-policy", "allkeys-lru")
    c.config_set("maxmemory", c.info("memory")["used_memory"] + 200_000)
    for i in range(3000):
        cmd = COMMANDS[i % 3]
        call(c, cmd, f"ev{i}", *params(cmd, 10, MAX_ARG), "COST", 1)
    assert c.info("stats")["evicted_keys"] > 0, "nothing was evicted"
    c.config_set("maxmemory", 0)

    step("lazy free (UNLINK, FLUSHALL ASYNC)")
    keys = list(c.scan_iter(count=1000))
    if keys:
        c.unlink(*keys[: len(keys) // 2])
    c.flushall(asynchronous=True)
    wait(lambda: c.dbsize() == 0 and c.info("memory").get("lazyfree_pending_objects", 0) == 0)
    assert c.ping()
    print("workload: done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
