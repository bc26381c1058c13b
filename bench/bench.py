#!/usr/bin/env python3
"""Benchmarks: the three RL commands against INCR and against their Lua twins.

    bench/bench.py [--server S]        full run (~7-10 min) on one server build:
                                       writes bench/results-TAG.json, the full
                                       report docs/bench/TAG.md with its chart
                                       docs/bench/TAG.svg, and BENCHMARKS.md
    bench/bench.py --quick --out DIR   tiny counts, same code paths (< 60 s):
                                       proves the script works, no timing checks
    bench/bench.py --render-only bench/results-TAG.json
                                       rewrite the reports from a saved run (no
                                       server)

S is a server binary or a name of integration/servers.py (redis7.0,
valkey8.1, valkey9.1); the default is $REDIS_SERVER or redis-server. TAG
names the build (redis7.0, valkey9.1, ...). BENCHMARKS.md holds one summary
table per server, from every bench/results-*.json there is, with the date of
each run.

One server (module loaded) on 127.0.0.1; redis-benchmark with 50
clients, pipeline 16 and 1, over random keys in 10,000 and 1,000,000 and over
one hot key. For every keyspace and algorithm the script warms the keys the
"denied" and "mix" regimes need, then runs, for each pipeline depth:
INCR, the RL command in its three regimes, INCR again, the Lua twin in its
three regimes. Every ratio compares runs made back to back in the same
block, because the machine (2 cores, shared with redis-benchmark and other
work) drifts. Then a replica is attached and the same block is run again.
Any error from the server, any missing figure or a regime that does not do
what it says (e.g. "denied" granting) makes the script exit non-zero.
"""
import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "integration"))

import harness  # noqa: E402  (the integration suite's server helper)

REDIS_BENCHMARK = shutil.which("redis-benchmark") or "redis-benchmark"
CLIENTS = 50
HOUR = 3600000
DAY = 86400000


class BenchError(RuntimeError):
    """Something the benchmark relies on failed: never hidden."""


# --------------------------------------------------------------------------
# What is measured
# --------------------------------------------------------------------------

class Alg:
    def __init__(self, tag, cmd, name, lua, lua_write, regimes, hot_granted, mix_cost, mem_args):
        self.tag = tag              # key prefix of the module's keys
        self.cmd = cmd              # module command
        self.name = name            # INFO ratelimit field stem
        self.lua = lua              # file under lua/
        self.lua_write = lua_write  # the command the script calls only when it grants
        self.regimes = regimes      # regime -> limit arguments
        self.hot_granted = hot_granted
        self.mix_cost = mix_cost    # COST that drains a "mix" key
        self.mem_args = mem_args    # arguments for the memory measurement

    def args(self, regime, hot):
        if regime == "granted" and hot and self.hot_granted is not None:
            return self.hot_granted
        return self.regimes[regime]


ALGS = [
    Alg("tb", "RL.TOKENBUCKET", "tokenbucket", "tokenbucket.lua", "hset",
        {"granted": [1000000000, 1, 1000],
         "denied": [1, 1, HOUR],
         "mix": [2000000, 1, HOUR]},
        None, 2000000, [100, 1, HOUR]),
    Alg("sc", "RL.SLIDINGCOUNTER", "slidingcounter", "slidingcounter.lua", "hset",
        {"granted": [1000000000, 60000],
         "denied": [1, HOUR],
         "mix": [2000000, DAY]},
        None, 2000000, [100, HOUR]),
    Alg("sl", "RL.SLIDINGLOG", "slidinglog", "slidinglog.lua", "zadd",
        {"granted": [100, 60000],
         "denied": [1, HOUR],
         "mix": [1000000, HOUR]},
        [1000000000, 60000], 1000000, [100, HOUR]),
]
ALG_BY_TAG = {a.tag: a for a in ALGS}
REGIMES = ["granted", "denied", "mix"]

# What each regime's grant fraction must be for the run to mean what it says.
REGIME_BOUNDS = {"granted": (0.95, 1.0), "denied": (0.0, 0.05), "mix": (0.35, 0.65)}

FULL = dict(
    keyspaces=[("10k", 10000), ("1M", 1000000), ("hot", 1)],
    pipelines=[16, 1],
    seconds=0.7,            # aim for this long per redis-benchmark run
    nmin={16: 20000, 1: 4000},
    nmax=1500000,
    mem_keys=100000,
    mem_sample=1000,
    log_grants=[(100, 1000), (1000, 200)],   # (grants per key, keys)
)
QUICK = dict(
    keyspaces=[("1k", 1000), ("10k", 10000), ("hot", 1)],
    pipelines=[16, 1],
    seconds=0.0,
    nmin={16: 1600, 1: 400},
    nmax=1600,
    mem_keys=2000,
    mem_sample=100,
    log_grants=[(100, 50), (1000, 10)],
)
# First guesses of requests/s, refined by every run (only sizes -n).
GUESS = {("PING", 16): 500000, ("INCR", 16): 400000, ("RL", 16): 200000, ("LUA", 16): 25000,
         ("PING", 1): 40000, ("INCR", 1): 40000, ("RL", 1): 35000, ("LUA", 1): 15000}


def ks_label(ks):
    return "one hot key" if ks == "hot" else "%s keys" % ks


def keyname(prefix, i):
    """The name redis-benchmark gives __rand_int__ = i (12 digits)."""
    return "%s%012d" % (prefix, i)


def module_prefix(alg, regime, rid=None):
    if regime == "granted":
        return "%s:g:%s:" % (alg.tag, rid)   # fresh keys for every run
    return "%s:%s:" % (alg.tag, regime[0])


def lua_prefix(alg, regime, rid=None):
    return "l" + module_prefix(alg, regime, rid)


# --------------------------------------------------------------------------
# Server helpers
# --------------------------------------------------------------------------

def resp(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def pipe(port, chunks, count):
    """Send raw RESP through `redis-cli --pipe`; every reply must be a success."""
    data = b"".join(chunks)
    p = subprocess.run([harness.REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), "--pipe"],
                       input=data, capture_output=True)
    text = (p.stdout + p.stderr).decode(errors="replace")
    m = re.search(r"errors:\s*(\d+),\s*replies:\s*(\d+)", text)
    if p.returncode != 0 or not m or int(m.group(1)) != 0 or int(m.group(2)) != count:
        raise BenchError("redis-cli --pipe failed (%d commands): %s" % (count, text[-2000:]))


def keyed_commands(head, prefix, indices, tail):
    """RESP for `head... <prefix><i> tail...` for every i, built fast."""
    n = 1 + len(head) + len(tail)
    pre = b"*%d\r\n" % n + b"".join(resp([h])[4:] for h in head)
    post = b"".join(resp([t])[4:] for t in tail)
    pfx = prefix.encode()
    klen = len(pfx) + 12
    kh = b"$%d\r\n" % klen
    return [pre + kh + pfx + b"%012d" % i + b"\r\n" + post for i in indices]


def cmdstat(stats, name):
    want = "cmdstat_" + name.lower()
    for k, v in stats.items():
        if k.lower() == want:
            return v
    return None


def rl_counters(c, alg):
    i = c.info("ratelimit")
    g = int(i.get("ratelimit_%s_granted" % alg.name, 0))
    p = int(i.get("ratelimit_%s_partial" % alg.name, 0))
    d = int(i.get("ratelimit_%s_denied" % alg.name, 0))
    return g + p, d


class Bench:
    def __init__(self, cfg, quick, log):
        self.cfg = cfg
        self.quick = quick
        self.log = log
        self.results = []
        self.problems = []
        self.est = dict(GUESS)
        self.rid = 0
        self.master = None
        self.replica = None
        self.sha = {}
        self.with_replica = False
        self.algs = list(ALGS)

    # -- servers ----------------------------------------------------------
    def start(self):
        self.master = harness.Server()
        self.c = self.master.client()
        # A replica must never be cut off for lagging (it shares the CPUs).
        self.c.config_set("client-output-buffer-limit", "replica 0 0 0")
        self.c.config_set("repl-diskless-sync-delay", "0")
        # After a replica half, free the backlog within seconds, so that the
        # next "no replica" half runs on a standalone server again.
        self.c.config_set("repl-backlog-ttl", "1")
        self.replica = harness.Server()
        self.rc = self.replica.client()
        names = [m.get(b"name") or m.get("name") for m in self.c.module_list()]
        if not any(n in (b"ratelimit", "ratelimit") for n in names):
            raise BenchError("module ratelimit is not loaded: %r" % names)
        for alg in self.algs:
            path = os.path.join(ROOT, "lua", alg.lua)
            if not os.path.exists(path):
                raise BenchError("missing Lua twin %s" % path)
            with open(path) as f:
                self.sha[alg.tag] = self.c.script_load(f.read())
        self.sanity()

    def server_cmdline(self):
        line = []
        for x in self.master.command_line():
            if x == str(self.master.port):
                x = "<port>"
            elif x == self.master.dir:
                x = "<tmpdir>"
            elif x == harness.MODULE:
                x = self.module_shown
            elif x == "":
                x = '""'
            line.append(x)
        line[0] = os.path.basename(line[0])
        return " ".join(line)

    def stop(self):
        for s in (self.replica, self.master):
            if s is not None:
                s.close()

    def sanity(self):
        """Every command and twin grants on a fresh key and replies 5 integers."""
        c = self.c
        for alg in self.algs:
            for lua in (False, True):
                key = "sanity:%s:%d" % (alg.tag, lua)
                args = [alg.cmd, key, 10, 1000] if alg.tag != "tb" else [alg.cmd, key, 10, 10, 1000]
                if lua:
                    args = ["EVALSHA", self.sha[alg.tag], 1] + args[1:]
                r = c.execute_command(*args)
                if not (isinstance(r, list) and len(r) == 5 and r[0] == 1 and r[1] == 10):
                    raise BenchError("%s on a fresh key answered %r, expected allowed 1" % (args, r))
        c.flushall()

    # -- replication ------------------------------------------------------
    def attach(self):
        t = time.monotonic()
        self.rc.replicaof("127.0.0.1", self.master.port)

        def synced():
            ri = self.rc.info("replication")
            mi = self.c.info("replication")
            s0 = mi.get("slave0")
            return (ri.get("master_link_status") == "up" and isinstance(s0, dict)
                    and s0.get("state") == "online"
                    and ri.get("slave_repl_offset") == mi.get("master_repl_offset"))
        harness.wait_until(synced, timeout=300, interval=0.05, what="replica full sync")
        self.with_replica = True
        self.log("  replica attached (%.1f s)" % (time.monotonic() - t))

    def detach(self):
        self.rc.replicaof("NO", "ONE")
        harness.wait_until(lambda: int(self.c.info("replication").get("connected_slaves", 0)) == 0,
                           timeout=60, what="replica detached")
        self.with_replica = False

    def standalone(self):
        """Wait until the master has no replica and no backlog and the
        module has seen it (it then skips building effects nobody can read;
        INCR feeds no backlog either)."""
        def alone():
            ri = self.c.info("replication")
            return (int(ri.get("connected_slaves", 0)) == 0 and int(ri.get("repl_backlog_active", 1)) == 0
                    and int(self.c.info("ratelimit").get("ratelimit_effects_replicated", 1)) == 0)
        harness.wait_until(alone, timeout=60, interval=0.05, what="a standalone master")

    def caught_up(self, timeout=120):
        if not self.with_replica:
            return
        def ok():
            mo = self.c.info("replication").get("master_repl_offset")
            ro = self.rc.info("replication").get("slave_repl_offset")
            return mo == ro
        harness.wait_until(ok, timeout=timeout, interval=0.01, what="replica caught up")
        if self.rc.info("replication").get("master_link_status") != "up":
            raise BenchError("replica link is down")

    # -- warm-up ------------------------------------------------------------
    def warm(self, alg, K):
        """Drain every key of the "denied" regime and the even keys of "mix"."""
        port = self.master.port
        n = max(K, 1)
        mix_n = max(K, 2)
        even = range(0, mix_n, 2)
        t = time.monotonic()
        # module: the real command
        chunks = keyed_commands([alg.cmd], module_prefix(alg, "denied"), range(n), alg.regimes["denied"])
        chunks += keyed_commands([alg.cmd], module_prefix(alg, "mix"), even,
                                 alg.regimes["mix"] + ["COST", alg.mix_cost])
        pipe(port, chunks, len(chunks))
        # Lua: the script once on a template key, copied with DUMP/RESTORE
        # (same stored state; the script itself is too slow for 1.5M keys).
        for regime, extra, idx in (("denied", [], range(n)), ("mix", ["COST", alg.mix_cost], even)):
            tmpl = "tmpl:" + lua_prefix(alg, regime)
            r = self.c.evalsha(self.sha[alg.tag], 1, tmpl, *(alg.regimes[regime] + extra))
            if not (isinstance(r, list) and r[0] == 1):
                raise BenchError("Lua warm-up of %s %s answered %r" % (alg.tag, regime, r))
            payload = self.c.dump(tmpl)
            ttl = self.c.pttl(tmpl)
            if payload is None or ttl <= 0:
                raise BenchError("Lua warm-up key %s has no payload/TTL (%r)" % (tmpl, ttl))
            self.c.delete(tmpl)
            chunks = keyed_commands(["RESTORE"], lua_prefix(alg, regime), idx, [ttl, payload, "REPLACE"])
            pipe(port, chunks, len(chunks))
        self.log("  warm-up %s over %d keys: %.1f s" % (alg.tag, n, time.monotonic() - t))

    # -- one redis-benchmark run ------------------------------------------
    def size(self, kind, P, alg, regime, K):
        if self.quick:
            return self.cfg["nmin"][P]
        est = self.est.get((kind, alg, regime, P), self.est[(kind, P)])
        n = int(est * self.cfg["seconds"])
        n = max(self.cfg["nmin"][P], min(self.cfg["nmax"], n))
        if alg == "sl" and regime == "granted" and K > 1:
            n = min(n, 50 * K)     # keep every key far below its limit of 100
        return int(math.ceil(n / 1000.0) * 1000)

    def run(self, phase, ks, K, P, kind, alg=None, regime=None):
        self.rid += 1
        rid = self.rid
        hot = K == 1
        r = K
        a = ALG_BY_TAG.get(alg)
        if kind == "PING":
            argv, r, stat = ["PING"], None, "ping"
        elif kind == "INCR":
            argv, stat = ["INCR", "incr:%d:__rand_int__" % rid], "incr"
        else:
            args = a.args(regime, hot)
            if kind == "RL":
                key = module_prefix(a, regime, rid) + "__rand_int__"
                argv, stat = [a.cmd, key] + args, a.cmd
            else:
                key = lua_prefix(a, regime, rid) + "__rand_int__"
                argv, stat = ["EVALSHA", self.sha[alg], "1", key] + args, "evalsha"
            if regime == "mix" and hot:
                r = 2   # two hot keys: one drained, one full (fresh for each run)
                pfx = module_prefix(a, "mix") if kind == "RL" else lua_prefix(a, "mix")
                self.c.delete(keyname(pfx, 1))
        argv = [str(x) for x in argv]
        n = self.size(kind, P, alg, regime, K)
        cmd = [REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(self.master.port),
               "-c", str(CLIENTS), "-n", str(n), "-P", str(P)]
        if r is not None:
            cmd += ["-r", str(r)]
        cmd += ["--csv"] + argv
        self.caught_up()
        self.c.config_resetstat()
        before = rl_counters(self.c, a) if kind == "RL" else None
        t = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wall = time.monotonic() - t
        rows = [ln for ln in p.stdout.splitlines() if ln.startswith('"') and not ln.startswith('"test"')]
        if p.returncode != 0 or len(rows) != 1 or "Error" in p.stderr or "Error" in p.stdout:
            raise BenchError("redis-benchmark failed (%d): %s\n%s\n%s"
                             % (p.returncode, " ".join(cmd), p.stdout[-1500:], p.stderr[-1500:]))
        f = next(iter(__import__("csv").reader([rows[0]])))
        rps, avg, mn, p50, p95, p99, mx = (float(x) for x in f[1:8])
        stats = self.c.info("commandstats")
        errs = self.c.info("errorstats")
        cs = cmdstat(stats, stat)
        if errs or cs is None or cs["failed_calls"] or cs["rejected_calls"] or cs["calls"] < n:
            raise BenchError("server errors during %s: %r %r" % (" ".join(cmd), errs, cs))
        granted = None
        if kind == "RL":
            g1, d1 = rl_counters(self.c, a)
            g, d = g1 - before[0], d1 - before[1]
            if g + d != cs["calls"]:
                raise BenchError("INFO ratelimit counted %d+%d calls, commandstats %d"
                                 % (g, d, cs["calls"]))
            granted = g / float(cs["calls"])
        elif kind == "LUA":
            w = cmdstat(stats, a.lua_write)
            granted = (w["calls"] if w else 0) / float(cs["calls"])
        shown = ["redis-benchmark"] + cmd[1:]
        shown[shown.index("-p") + 1] = "<port>"
        rec = dict(id=rid, phase=phase, ks=ks, K=K, P=P, kind=kind, alg=alg, regime=regime,
                   n=n, r=r, argv=argv, cmdline=" ".join(shown), rps=rps, avg_ms=avg, p50_ms=p50, p95_ms=p95,
                   p99_ms=p99, max_ms=mx, usec_per_call=cs["usec_per_call"], calls=cs["calls"],
                   granted=granted, incr_ref=None, wall_s=round(wall, 3))
        if regime is not None:
            lo, hi = REGIME_BOUNDS[regime]
            if not (lo <= granted <= hi):
                self.problems.append("%s %s %s %s P%d: granted fraction %.3f outside [%g, %g]"
                                     % (phase, ks, kind, alg, P, granted, lo, hi))
        self.results.append(rec)
        key = (kind, alg, regime, P)
        self.est[key] = rps
        self.log("    %-4s %-3s %-7s P%-2d n=%-7d %10.0f rps  %6.2f us  p50 %.3f  p99 %.3f%s"
                 % (kind, alg or "", regime or "", P, n, rps, cs["usec_per_call"], p50, p99,
                    "" if granted is None else "  granted %.0f%%" % (100 * granted)))
        return rec

    # -- the throughput matrix ---------------------------------------------
    def throughput(self, phases):
        for ks, K in self.cfg["keyspaces"]:
            for alg in self.algs:
                self.log("block %s, %s" % (ks_label(ks), alg.cmd))
                self.c.flushall()
                self.warm(alg, K)
                for phase in phases:
                    if phase == "replica":
                        self.attach()
                    else:
                        self.standalone()
                    for P in self.cfg["pipelines"]:
                        if alg is self.algs[0]:
                            self.run(phase, ks, K, P, "PING")
                        # INCR before and after every RL run, and around
                        # the Lua group: ratios use the two neighbours.
                        before = self.run(phase, ks, K, P, "INCR")["id"]
                        for regime in REGIMES:
                            r = self.run(phase, ks, K, P, "RL", alg.tag, regime)
                            after = self.run(phase, ks, K, P, "INCR")["id"]
                            r["incr_ref"] = [before, after]
                            before = after
                        lua = [self.run(phase, ks, K, P, "LUA", alg.tag, regime) for regime in REGIMES]
                        after = self.run(phase, ks, K, P, "INCR")["id"]
                        for r in lua:
                            r["incr_ref"] = [before, after]
                    if phase == "replica":
                        self.detach()
        self.c.flushall()

    # -- RL.MULTI: two limits in one call ------------------------------------
    def composition(self, rounds):
        """Server time and requests/s of RL.MULTI on a standalone master,
        10,000 random keys, every call granted: a single RL.TOKENBUCKET, a
        one-limit RL.MULTI, a two-limit RL.MULTI (two token buckets, and a
        token bucket + a sliding counter), and two single calls pipelined
        per request (redis-benchmark -P 2: a request is two calls). The
        cells run back to back, `rounds` times; ratios use the same round."""
        K = 10000
        tb = ["TOKENBUCKET", 1000000000, 1, 1000]
        sc = ["SLIDINGCOUNTER", 1000000000, 60000]
        cells = [
            ("single", "RL.TOKENBUCKET", ["RL.TOKENBUCKET", "mc:s:__rand_int__", 1000000000, 1, 1000], 1, 1),
            ("multi1", "RL.MULTI", ["RL.MULTI", 1, "mc:m1:__rand_int__"] + tb, 1, 1),
            ("multi2", "RL.MULTI", ["RL.MULTI", 2, "mc:a:__rand_int__", "mc:b:__rand_int__"] + tb + tb, 1, 1),
            ("multi2_mixed", "RL.MULTI", ["RL.MULTI", 2, "mc:c:__rand_int__", "mc:d:__rand_int__"] + tb + sc, 1, 1),
            ("pair", "RL.TOKENBUCKET", ["RL.TOKENBUCKET", "mc:p:__rand_int__", 1000000000, 1, 1000], 2, 2),
        ]
        out = []
        self.standalone()
        for rnd in range(rounds):
            for label, stat, argv, P, calls_per_req in cells:
                est = self.est.get(("MC", label), 30000)
                n = self.cfg["nmin"][1] * 2 if self.quick else max(20000, int(est * self.cfg["seconds"] * 2))
                n = int(math.ceil(n / 1000.0) * 1000)
                cmd = [REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(self.master.port), "-c", str(CLIENTS),
                       "-n", str(n), "-P", str(P), "-r", str(K), "--csv"] + [str(x) for x in argv]
                self.c.config_resetstat()
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                rows = [ln for ln in p.stdout.splitlines() if ln.startswith('"') and not ln.startswith('"test"')]
                if p.returncode != 0 or len(rows) != 1 or "Error" in p.stderr or "Error" in p.stdout:
                    raise BenchError("redis-benchmark failed (%d): %s\n%s\n%s"
                                     % (p.returncode, " ".join(cmd), p.stdout[-1500:], p.stderr[-1500:]))
                f = next(iter(__import__("csv").reader([rows[0]])))
                rps = float(f[1])
                cs = cmdstat(self.c.info("commandstats"), stat)
                errs = self.c.info("errorstats")
                if errs or cs is None or cs["failed_calls"] or cs["rejected_calls"] or cs["calls"] < n:
                    raise BenchError("server errors during %s: %r %r" % (" ".join(cmd), errs, cs))
                info = self.c.info("ratelimit")
                self.est[("MC", label)] = rps / calls_per_req
                shown = ["redis-benchmark"] + cmd[1:]
                shown[shown.index("-p") + 1] = "<port>"
                rec = dict(round=rnd, cell=label, P=P, n=n, rps=rps, requests_per_s=rps / calls_per_req,
                           usec_per_call=cs["usec_per_call"], usec_per_request=cs["usec_per_call"] * calls_per_req,
                           calls=cs["calls"], cmdline=" ".join(shown),
                           multi_granted=int(info.get("ratelimit_multi_granted", 0)))
                out.append(rec)
                self.log("    MULTI %-13s P%d n=%-7d %10.0f req/s  %6.2f us/request" % (
                    label, P, n, rec["requests_per_s"], rec["usec_per_request"]))
            self.c.flushall()
        # Every RL.MULTI call was granted (the limits are far away).
        granted = [r for r in out if r["cell"].startswith("multi") and r["multi_granted"] < r["calls"]]
        if granted:
            raise BenchError("RL.MULTI calls were not all granted: %r" % granted[:2])
        return out

    # -- memory --------------------------------------------------------------
    def flush_sync(self):
        """FLUSHALL SYNC: the memory runs measure from an empty keyspace, and
        Valkey 8+ frees a plain FLUSHALL in the background
        (lazyfree-lazy-user-flush yes), which could still be freeing the last
        run's keys while used_memory is read: once it made a token bucket
        key look like 28 bytes."""
        self.c.execute_command("FLUSHALL", "SYNC")

    def used_memory(self):
        """used_memory once it has settled (incremental rehash, lazy frees)."""
        last = None
        for _ in range(40):
            v = int(self.c.info("memory")["used_memory"])
            if v == last:
                return v
            last = v
            time.sleep(0.1)
        return last

    def memory(self):
        # Redis 7 allocates a latency histogram per command on first use:
        # keep that out of the used_memory deltas.
        self.c.config_set("latency-tracking", "no")
        N = self.cfg["mem_keys"]
        sample = min(self.cfg["mem_sample"], N)
        kinds = [("INCR + PEXPIRE", "incr_ttl", None), ("INCR (no TTL)", "incr", None),
                 ("INCRBY 10000 + PEXPIRE", "incrby_ttl", None)]
        for alg in self.algs:
            kinds.append((alg.cmd, "rl", alg))
            kinds.append(("Lua " + alg.lua, "lua", alg))
        out = []
        for label, kind, alg in kinds:
            self.flush_sync()
            before = self.used_memory()
            pfx = "mem:"
            if kind == "incr_ttl":
                chunks = []
                for a, b in zip(keyed_commands(["INCR"], pfx, range(N), []),
                                keyed_commands(["PEXPIRE"], pfx, range(N), [HOUR])):
                    chunks += [a, b]
            elif kind == "incrby_ttl":
                # a counter past Redis's shared integers (0..9999) owns its object
                chunks = []
                for a, b in zip(keyed_commands(["INCRBY"], pfx, range(N), [10000]),
                                keyed_commands(["PEXPIRE"], pfx, range(N), [HOUR])):
                    chunks += [a, b]
            elif kind == "incr":
                chunks = keyed_commands(["INCR"], pfx, range(N), [])
            elif kind == "rl":
                chunks = keyed_commands([alg.cmd], pfx, range(N), alg.mem_args)
            else:
                chunks = keyed_commands(["EVALSHA", self.sha[alg.tag], 1], pfx, range(N), alg.mem_args)
            pipe(self.master.port, chunks, len(chunks))
            after = self.used_memory()
            if self.c.dbsize() != N:
                raise BenchError("memory test %s: %d keys, expected %d" % (label, self.c.dbsize(), N))
            step = max(1, N // sample)
            usage = [self.c.memory_usage(keyname(pfx, i), samples=0) for i in range(0, N, step)]
            if any(u is None for u in usage):
                raise BenchError("MEMORY USAGE failed for %s" % label)
            rec = dict(label=label, kind=kind, alg=alg.tag if alg else None, keys=N,
                       used_memory_delta=after - before,
                       bytes_per_key=(after - before) / float(N),
                       memory_usage=statistics.mean(usage),
                       args=alg.mem_args if alg else None)
            out.append(rec)
            self.log("  memory %-28s %7.1f B/key (used_memory)  %7.1f B (MEMORY USAGE)"
                     % (label, rec["bytes_per_key"], rec["memory_usage"]))
        self.flush_sync()
        return out

    def log_memory(self):
        """Sliding log bytes per grant: module vs the sorted-set twin."""
        out = []
        if "sl" not in self.sha:
            return out
        alg = ALG_BY_TAG["sl"]
        for grants, nkeys in self.cfg["log_grants"]:
            for lua in (False, True):
                self.flush_sync()
                before = self.used_memory()
                pfx = "lg:%d:" % lua
                head = ["EVALSHA", self.sha["sl"], 1] if lua else [alg.cmd]
                # Round robin over the keys: successive grants on one key are
                # a whole round apart, so every grant has its own microsecond.
                one_round = keyed_commands(head, pfx, range(nkeys), [1000000, HOUR])
                g0, d0 = rl_counters(self.c, alg)
                pipe(self.master.port, one_round * grants, nkeys * grants)
                after = self.used_memory()
                keys = [keyname(pfx, i) for i in range(nkeys)]
                distinct = None
                if lua:
                    # one sorted-set entry per distinct grant time, plus "#"
                    # whose score is minus the units in the window
                    if any(self.c.zscore(k, "#") != -grants for k in keys):
                        raise BenchError("sliding log memory test: a Lua call was not granted")
                    distinct = statistics.mean(self.c.zcard(k) - 1 for k in keys)
                else:
                    g1, d1 = rl_counters(self.c, alg)
                    if g1 - g0 != nkeys * grants or d1 != d0:
                        raise BenchError("sliding log memory test: %d granted, %d denied, expected %d granted"
                                         % (g1 - g0, d1 - d0, nkeys * grants))
                usage = [self.c.memory_usage(k, samples=0) for k in keys]
                rec = dict(twin="lua" if lua else "module", grants=grants, keys=nkeys,
                           used_memory_delta=after - before,
                           bytes_per_key=(after - before) / float(nkeys),
                           memory_usage=statistics.mean(usage), distinct_entries=distinct)
                out.append(rec)
                self.log("  log %-6s %5d grants/key: %8.1f B/key (used_memory) %8.1f B (MEMORY USAGE)"
                         % (rec["twin"], grants, rec["bytes_per_key"], rec["memory_usage"]))
        self.flush_sync()
        return out


# --------------------------------------------------------------------------
# Machine
# --------------------------------------------------------------------------

def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def machine():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = "%.1f GiB" % (kb / 1048576.0)
    except (OSError, ValueError, IndexError):
        pass
    return dict(
        nproc=sh(["nproc"]), cpu=cpu, memory=mem, kernel=platform.release(),
        redis_server=sh([harness.REDIS_SERVER, "--version"]),
        redis_benchmark=sh([REDIS_BENCHMARK, "--version"]),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loadavg=open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?",
        commit=sh(["git", "-C", ROOT, "describe", "--always", "--dirty", "--abbrev=12"]),
        module=os.path.relpath(harness.MODULE, ROOT) if harness.MODULE.startswith(ROOT) else harness.MODULE,
        module_built=datetime.datetime.fromtimestamp(os.path.getmtime(harness.MODULE), datetime.timezone.utc)
        .strftime("%Y-%m-%d %H:%M UTC") if os.path.exists(harness.MODULE) else "?",
    )


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------

TARGETS = [
    # id, text, threshold
    ("tb_incr", "RL.TOKENBUCKET ≥ 0.7× INCR", 0.7),
    ("sc_incr", "RL.SLIDINGCOUNTER ≥ 0.7× INCR", 0.7),
    ("sl_incr", "RL.SLIDINGLOG (limit 100, 60 s window) ≥ 0.6× INCR", 0.6),
    ("lua", "every RL command ≥ 7× its Lua twin with pipelining (P16)", 7.0),
    ("lua_ceiling", "↳ supporting figure, not the target: INCR ÷ Lua twin at P16 "
     "(the highest ratio any command could show here)", 7.0),
    ("lua_server", "↳ supporting figure, not the target: server µs per call, Lua twin ÷ RL command, "
     "P16 runs", 7.0),
    ("replica", "with a replica attached, every RL command ≥ 0.6× INCR", 0.6),
    ("mem_tb", "token bucket key ≤ 1.5× an INCR counter key with a TTL", 1.5),
    ("mem_sc", "sliding counter key ≤ 1.5× an INCR counter key with a TTL", 1.5),
    ("mem_sl", "sliding log ≤ 8 bytes per grant", 8.0),
]


class Report:
    def __init__(self, data):
        self.d = data
        self.res = data["results"]
        self.by_id = {r["id"]: r for r in self.res}
        self.cfg = data["config"]
        self.missing = []

    def cell(self, phase, ks, P, kind, alg=None, regime=None):
        for r in self.res:
            if (r["phase"], r["ks"], r["P"], r["kind"], r["alg"], r["regime"]) == (phase, ks, P, kind, alg, regime):
                return r
        self.missing.append("%s %s P%d %s %s %s" % (phase, ks, P, kind, alg, regime))
        return None

    def phases(self):
        return [p for p in ("primary", "replica") if any(r["phase"] == p for r in self.res)]

    def incr_of(self, r):
        """Geometric mean of the INCR runs made just before and just after."""
        refs = [self.by_id.get(i) for i in (r or {}).get("incr_ref") or []]
        if len(refs) != 2 or not all(x and x["rps"] for x in refs):
            return None
        return math.sqrt(refs[0]["rps"] * refs[1]["rps"])

    def ratio_incr(self, r):
        ref = self.incr_of(r)
        if not r or not ref:
            return None
        return r["rps"] / ref

    def ratio_lua(self, phase, ks, P, alg, regime):
        m = self.cell(phase, ks, P, "RL", alg, regime)
        lua = self.cell(phase, ks, P, "LUA", alg, regime)
        if not m or not lua or not lua["rps"]:
            return None
        return m["rps"] / lua["rps"]

    def keyspaces(self):
        return [k for k, _ in self.cfg["keyspaces"]]

    # -- targets ---------------------------------------------------------
    def targets(self):
        out = []
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]

        def worst(values, thr, what):
            vals = [(v, w) for v, w in values if v is not None]
            if len(vals) != len(values) or not vals:
                self.missing.append("target figures for " + what)
                return None
            v, w = min(vals)
            bad = sum(1 for x, _ in vals if x < thr)
            med = statistics.median(x for x, _ in vals)
            return v, w, bad, len(vals), med

        for alg in ALGS:
            tid = alg.tag + "_incr"
            vals = [(self.ratio_incr(self.cell("primary", ks, P, "RL", alg.tag, rg)),
                     "%s, %s, P%d" % (rg, ks_label(ks), P)) for ks, P in cols for rg in REGIMES]
            out.append((tid, worst(vals, dict((t[0], t[2]) for t in TARGETS)[tid], tid)))
        vals = [(self.ratio_lua("primary", ks, 16, alg.tag, rg), "%s %s, %s" % (alg.cmd, rg, ks_label(ks)))
                for alg in ALGS for ks in self.keyspaces() for rg in REGIMES]
        out.append(("lua", worst(vals, 7.0, "lua")))
        # What limits that ratio here: INCR itself vs the twin, and server time.
        ceil_vals, srv_vals = [], []
        for alg in ALGS:
            for ks in self.keyspaces():
                for rg in REGIMES:
                    m = self.cell("primary", ks, 16, "RL", alg.tag, rg)
                    lua = self.cell("primary", ks, 16, "LUA", alg.tag, rg)
                    inc = self.incr_of(lua)
                    where = "%s %s, %s" % (alg.cmd, rg, ks_label(ks))
                    ceil_vals.append((inc / lua["rps"] if inc and lua and lua["rps"] else None, where))
                    srv_vals.append((lua["usec_per_call"] / m["usec_per_call"]
                                     if m and lua and m["usec_per_call"] else None, where))
        out.append(("lua_ceiling", worst(ceil_vals, 7.0, "lua ceiling")))
        out.append(("lua_server", worst(srv_vals, 7.0, "lua server time")))
        if "replica" in self.phases():
            vals = [(self.ratio_incr(self.cell("replica", ks, P, "RL", alg.tag, rg)),
                     "%s %s, %s, P%d" % (alg.cmd, rg, ks_label(ks), P))
                    for alg in ALGS for ks, P in cols for rg in REGIMES]
            out.append(("replica", worst(vals, 0.6, "replica")))
        else:
            self.missing.append("replica phase")
        mem = {m["label"]: m for m in self.d["memory"]}
        base = mem.get("INCR + PEXPIRE")
        for alg, tid in ((ALGS[0], "mem_tb"), (ALGS[1], "mem_sc")):
            m = mem.get(alg.cmd)
            if not base or not m:
                self.missing.append("memory " + alg.cmd)
                out.append((tid, None))
                continue
            r1 = m["bytes_per_key"] / base["bytes_per_key"]
            r2 = m["memory_usage"] / base["memory_usage"]
            # Judged on used_memory, what a key really costs. MEMORY USAGE is
            # shown beside it: the module's is that real cost, while an INCR
            # counter's leaves out what Redis does not count for strings.
            out.append((tid, (r1, "used_memory %.2f×; MEMORY USAGE %.2f×" % (r1, r2), int(r1 > 1.5), 1, None)))
        per = [(self.log_marginal(g), "%d grants/key" % g) for g, _ in self.cfg["log_grants"]]
        vals = []
        for v, w in per:
            if v:
                vals.append((v["marg_um"], w + ", used_memory"))
                vals.append((v["marg_mu"], w + ", MEMORY USAGE"))
        if not all(v for v, _ in per):
            self.missing.append("sliding log bytes per grant")
            out.append(("mem_sl", None))
        else:
            v, w = max(vals)
            out.append(("mem_sl", (v, w, sum(1 for x, _ in vals if x > 8.0), len(vals), None)))
        return out

    def log_one(self, twin):
        """(used_memory, MEMORY USAGE) bytes of a key holding one grant."""
        label = "RL.SLIDINGLOG" if twin == "module" else "Lua slidinglog.lua"
        for m in self.d["memory"]:
            if m["label"] == label:
                return m["bytes_per_key"], m["memory_usage"]
        return None

    def log_marginal(self, grants, twin="module"):
        """Bytes per grant at `grants` grants per key: marginal over a key
        with one grant, and total / grants, by used_memory and MEMORY USAGE."""
        one = self.log_one(twin)
        for m in self.d["log_memory"]:
            if m["twin"] == twin and m["grants"] == grants and one is not None:
                return dict(
                    marg_um=(m["bytes_per_key"] - one[0]) / float(grants - 1),
                    marg_mu=(m["memory_usage"] - one[1]) / float(grants - 1),
                    total_um=m["bytes_per_key"] / float(grants),
                    total_mu=m["memory_usage"] / float(grants))
        return None

    # -- markdown --------------------------------------------------------
    def markdown(self):
        d = self.d
        mc = d["machine"]
        L = []
        w = L.append
        w("# Benchmarks: %s" % server_title(mc))
        w("")
        tag = d.get("server_tag", "redis7.0")
        w("Generated by `make bench` (`bench/bench.py`) in one run on %s on %s; raw numbers in "
          "[bench/results-%s.json](../../bench/results-%s.json), chart in [%s.svg](%s.svg). "
          "Do not edit by hand." % (mc["date"], server_title(mc), tag, tag, tag, tag))
        w("")
        if d.get("quick"):
            w("**Quick mode (`--quick`): tiny counts to prove the script works; these numbers mean nothing.**")
            w("")
        w("## Machine")
        w("")
        w("| | |")
        w("|---|---|")
        w("| `nproc` | %s (shared by redis-server, redis-benchmark, the replica and other work) |" % mc["nproc"])
        w("| CPU | %s |" % mc["cpu"])
        w("| memory | %s |" % mc["memory"])
        w("| kernel | %s |" % mc["kernel"])
        w("| server | %s |" % mc["redis_server"])
        w("| redis-benchmark | %s |" % mc["redis_benchmark"])
        w("| module | `%s` built %s; repository at `%s` |" % (mc["module"], mc.get("module_built", "?"), mc["commit"]))
        w("| date | %s (load average at start %s) |" % (mc["date"], " ".join(mc["loadavg"])))
        w("| run time | %.0f s |" % d["elapsed_s"])
        w("")
        w("The machine has %s cores shared by the server, the benchmark client and other work, so "
          "absolute requests/s drift from second to second. Every ratio compares runs made back to back: "
          "\"× INCR\" divides by the geometric mean of the INCR runs made immediately before and after "
          "(same keyspace, same pipeline, same replica state); \"× Lua\" divides by the Lua twin's run "
          "in the same block, same regime." % mc["nproc"])
        w("")
        self.md_targets(w)
        self.md_summary(w)
        self.md_usec(w)
        self.md_memory(w)
        self.md_composition(w)
        self.md_method(w)
        self.md_details(w)
        self.md_commands(w)
        return "\n".join(L) + "\n"

    def md_targets(self, w):
        w("## Targets")
        w("")
        w("| target | result | status |")
        w("|---|---|---|")
        texts = dict((t[0], t[1]) for t in TARGETS)
        for tid, v in self.targets():
            if v is None:
                w("| %s | figure missing | **missing** |" % texts[tid])
                continue
            val, where, bad, total, med = v
            if tid.startswith("mem_sl"):
                res = "worst %.2f B per grant (%s, marginal)" % (val, where)
            elif tid.startswith("mem_"):
                res = "%.2f× (%s)" % (val, where)
            else:
                res = "worst %.2f× (%s); median %.2f× over %d cells" % (val, where, med, total)
            status = "met" if bad == 0 else "**missed** (%d of %d)" % (bad, total)
            if tid in ("lua_ceiling", "lua_server"):
                status = "(≥ 7 in %d of %d)" % (total - bad, total)
            w("| %s | %s | %s |" % (texts[tid], res, status))
        w("")
        w("The Lua target is judged, as written, on requests/s. With pipelining, redis-benchmark (on "
          "the same 2 cores) sets the pace: INCR itself is only the \"ceiling\" figure above times "
          "faster than a Lua twin, so no command can show more than that here. The server-time ratio "
          "(INFO commandstats) is what the module itself changes.")
        w("")
        w("Where the pipelined granted and mixed cells fall short of 0.7×: "
          "[docs/PROFILE.md](docs/PROFILE.md) (`make profile`) counts the instructions of one "
          "request under callgrind. A granted call costs about 2.2–2.3× INCR's instructions, with "
          "or without a replica; the module's own code (parsing, clock, decision) is 10–17% of "
          "that, the rest is Redis: reading a 5-argument request instead of 2, the key lookup with "
          "its expiry check, the expiry update, the five-integer reply and, when a replica, "
          "backlog or AOF can read it, `RedisModule_Replicate`, which on Redis 7.0 looks the "
          "effect command's name up on every call (on a standalone server the module skips it: "
          "src/listeners.rs). Creating a key (the \"mix\" regime's fresh half over 1M keys) adds "
          "Redis's own key and expiry insertion. A denied call costs about 85% of a granted one.")
        w("")
        w("Single cells are noisy on a shared machine (the same cell can move by tens of percent from "
          "one run to the next); the medians are the steadier figures.")
        w("")
        w("Throughput targets are checked in every cell: 3 regimes × %d keyspaces × pipeline %s "
          "(the Lua target at pipeline 16 only). Memory: used_memory growth over %s keys (MEMORY "
          "USAGE beside it for the keys; for the log the worse of the two). The sliding log figure is the marginal "
          "cost of a grant: (bytes of a key with N grants − bytes of a key with 1 grant) / (N − 1)."
          % (len(self.keyspaces()), " and ".join(str(p) for p in self.cfg["pipelines"]),
             "{:,}".format(self.cfg["mem_keys"])))
        w("")

    def md_summary(self, w):
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]
        head = "| command | regime | " + " | ".join("%s P%d" % (ks, P) for ks, P in cols) + " |"
        sep = "|---|---|" + "---:|" * len(cols)
        for phase, title in (("primary", "RL command ÷ INCR (no replica)"),
                             ("lua", "RL command ÷ its Lua twin (no replica)"),
                             ("replica", "RL command ÷ INCR, one replica attached"),
                             ("replica-lua", "RL command ÷ its Lua twin, one replica attached")):
            ph = "replica" if phase.startswith("replica") else "primary"
            if ph not in self.phases():
                continue
            w("## " + title)
            w("")
            w(head)
            w(sep)
            for alg in ALGS:
                for rg in REGIMES:
                    vals = []
                    for ks, P in cols:
                        if phase.endswith("lua"):
                            v = self.ratio_lua(ph, ks, P, alg.tag, rg)
                        else:
                            v = self.ratio_incr(self.cell(ph, ks, P, "RL", alg.tag, rg))
                        vals.append("–" if v is None else "%.2f" % v)
                    w("| %s | %s | %s |" % (alg.cmd, rg, " | ".join(vals)))
            w("")
            if phase == "primary":
                # the INCR and PING baselines themselves
                w("Baselines (requests/s): " + "; ".join(
                    "%s P%d: PING %s, INCR %s" % (
                        ks, P, self.fmt_rps(self.cell(ph, ks, P, "PING")),
                        self.fmt_rps(self.first_incr(ph, ks, P)))
                    for ks, P in cols) + ".")
                w("")

    def composition_ratios(self):
        """Per round: server time of a 2-limit RL.MULTI ÷ a single call and
        ÷ a 1-limit RL.MULTI, and requests/s of a 2-limit call ÷ two
        pipelined single calls."""
        rows = self.d.get("composition") or []
        out = []
        for rnd in sorted({r["round"] for r in rows}):
            c = {r["cell"]: r for r in rows if r["round"] == rnd}
            if not all(k in c for k in ("single", "multi1", "multi2", "multi2_mixed", "pair")):
                continue
            out.append(dict(
                round=rnd,
                usec_multi2_vs_single=c["multi2"]["usec_per_request"] / c["single"]["usec_per_request"],
                usec_multi2_vs_multi1=c["multi2"]["usec_per_request"] / c["multi1"]["usec_per_request"],
                usec_mixed_vs_single=c["multi2_mixed"]["usec_per_request"] / c["single"]["usec_per_request"],
                usec_multi2_vs_two_calls=c["multi2"]["usec_per_request"] / c["pair"]["usec_per_request"],
                rps_multi2_vs_pair=c["multi2"]["requests_per_s"] / c["pair"]["requests_per_s"],
            ))
        return out

    def md_composition(self, w):
        rows = self.d.get("composition")
        if not rows:
            return
        w("## RL.MULTI: two limits in one call (no replica)")
        w("")
        w("10,000 random keys, every call granted, 50 clients. Per request: `single` is one "
          "RL.TOKENBUCKET; `multi1` a one-limit RL.MULTI (TOKENBUCKET); `multi2` a two-limit RL.MULTI "
          "(two token buckets); `multi2_mixed` a token bucket and a sliding counter; `pair` two "
          "RL.TOKENBUCKET calls pipelined per request (`-P 2`). Server µs per request is INFO "
          "commandstats `usec_per_call` × calls per request; the cells of a round run back to back.")
        w("")
        w("| round | cell | requests/s | server µs per request |")
        w("|---:|---|---:|---:|")
        for r in rows:
            w("| %d | %s | %s | %.2f |" % (r["round"], r["cell"], "{:,.0f}".format(r["requests_per_s"]),
                                           r["usec_per_request"]))
        w("")
        w("| round | 2-limit ÷ single (server time; target ≤ 1.6) | 2-limit ÷ 1-limit RL.MULTI | "
          "mixed 2-limit ÷ single | 2-limit ÷ two single calls (server time) | "
          "2-limit ÷ two pipelined calls (requests/s; target > 1) |")
        w("|---:|---:|---:|---:|---:|---:|")
        for q in self.composition_ratios():
            w("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |" % (
                q["round"], q["usec_multi2_vs_single"], q["usec_multi2_vs_multi1"], q["usec_mixed_vs_single"],
                q["usec_multi2_vs_two_calls"], q["rps_multi2_vs_pair"]))
        w("")

    def md_usec(self, w):
        cols = [(ks, P) for P in self.cfg["pipelines"] for ks in self.keyspaces()]
        w("## Server µs per call (INFO commandstats, no replica)")
        w("")
        w("The server's own time per call, `usec_per_call` after `CONFIG RESETSTAT`; INCR is the mean "
          "of the INCR runs in the same column; for the Lua twin it is EVALSHA's time, which includes "
          "the commands the script calls.")
        w("")
        w("| command | regime | " + " | ".join("%s P%d" % (ks, P) for ks, P in cols) + " |")
        w("|---|---|" + "---:|" * len(cols))
        incr = []
        for ks, P in cols:
            xs = [r["usec_per_call"] for r in self.res
                  if (r["phase"], r["ks"], r["P"], r["kind"]) == ("primary", ks, P, "INCR")]
            incr.append("%.2f" % statistics.mean(xs) if xs else "–")
        w("| INCR | | " + " | ".join(incr) + " |")
        for kind in ("RL", "LUA"):
            for alg in ALGS:
                for rg in REGIMES:
                    vals = []
                    for ks, P in cols:
                        r = self.cell("primary", ks, P, kind, alg.tag, rg)
                        vals.append("–" if r is None else "%.2f" % r["usec_per_call"])
                    w("| %s | %s | %s |" % (alg.cmd if kind == "RL" else "Lua " + alg.lua, rg, " | ".join(vals)))
        w("")

    def first_incr(self, phase, ks, P):
        for r in self.res:
            if (r["phase"], r["ks"], r["P"], r["kind"]) == (phase, ks, P, "INCR"):
                return r
        self.missing.append("INCR %s %s P%d" % (phase, ks, P))
        return None

    @staticmethod
    def fmt_rps(r):
        return "–" if not r else "{:,.0f}".format(r["rps"])

    def md_memory(self, w):
        w("## Memory")
        w("")
        N = self.cfg["mem_keys"]
        w("%s keys, each created by one call (one grant); FLUSHALL before each kind. "
          "\"used_memory\" is the growth of INFO used_memory divided by the number of keys (it "
          "includes the key, the expiry entry and the hash tables); \"MEMORY USAGE\" is the mean "
          "of `MEMORY USAGE key SAMPLES 0` over a sample of the keys (Redis leaves the expiry entry "
          "out of it)." % "{:,}".format(N))
        w("")
        w("| kind | arguments | bytes/key (used_memory) | × INCR+TTL | bytes/key (MEMORY USAGE) | × INCR+TTL |")
        w("|---|---|---:|---:|---:|---:|")
        mem = self.d["memory"]
        base = next((m for m in mem if m["label"] == "INCR + PEXPIRE"), None)
        for m in mem:
            args = "`%s`" % " ".join(str(a) for a in m["args"]) if m["args"] else {
                "incr_ttl": "`INCR k` + `PEXPIRE k %d` (the target's baseline)" % HOUR,
                "incrby_ttl": "`INCRBY k 10000` + `PEXPIRE k %d` (a counter ≥ 10,000: not a shared integer)" % HOUR,
                "incr": "`INCR k`"}[m["kind"]]
            r1 = m["bytes_per_key"] / base["bytes_per_key"] if base else float("nan")
            r2 = m["memory_usage"] / base["memory_usage"] if base else float("nan")
            w("| %s | %s | %.1f | %.2f | %.1f | %.2f |" % (m["label"], args, m["bytes_per_key"], r1,
                                                         m["memory_usage"], r2))
        w("")
        w("### Sliding log: bytes per grant")
        w("")
        w("Each key gets N grants (`RL.SLIDINGLOG key 1000000 %d`, and the same through the Lua "
          "twin), round robin over the keys so that every grant has its own microsecond "
          "(a sliding log stores one entry per distinct grant time). \"marginal\" = (bytes of a key "
          "with N grants − bytes of a key with 1 grant) / (N − 1); \"total\" = bytes of the key / N." % HOUR)
        w("")
        w("| grants/key | keys | | bytes/key | marginal B/grant | total B/grant | distinct entries |")
        w("|---:|---:|---|---:|---:|---:|---:|")
        lm = self.d["log_memory"]
        for g, nkeys in self.cfg["log_grants"]:
            for twin, name in (("module", "RL.SLIDINGLOG"), ("lua", "Lua sorted set")):
                m = next((x for x in lm if x["twin"] == twin and x["grants"] == g), None)
                v = self.log_marginal(g, twin)
                if not (m and v):
                    self.missing.append("log memory %s %d" % (twin, g))
                    continue
                w("| %d | %d | %s | %.0f / %.0f | %.2f / %.2f | %.2f / %.2f | %s |"
                  % (g, nkeys, name, m["bytes_per_key"], m["memory_usage"], v["marg_um"], v["marg_mu"],
                     v["total_um"], v["total_mu"],
                     "%.0f" % m["distinct_entries"] if m["distinct_entries"] is not None else "(not visible)"))
        w("")
        w("Each pair is used_memory / MEMORY USAGE. Distinct entries: the twin's sorted-set size minus "
          "its running-total member, i.e. how many grant times it stores per key.")
        w("")

    def md_method(self, w):
        w("## How it is measured")
        w("")
        w("Server: one `redis-server` on 127.0.0.1 started as the integration tests start it "
          "(`integration/harness.py`: `--save \"\" --appendonly no`, the module loaded), plus "
          "`CONFIG SET client-output-buffer-limit \"replica 0 0 0\"`, `repl-diskless-sync-delay 0` "
          "and `repl-backlog-ttl 1`. "
          "The replica is a second such server; `REPLICAOF` attaches it (full sync) for the "
          "\"replica\" half of each block, and before every run the script waits until the replica "
          "has applied everything the master sent. Before each \"no replica\" half the script waits "
          "until the master is standalone again: no replica, no backlog (freed after "
          "`repl-backlog-ttl`), and the module reporting `ratelimit_effects_replicated:0` — it then "
          "skips building the effect of a grant, which nothing could read (src/listeners.rs); INCR "
          "likewise feeds no backlog.")
        w("")
        w("```")
        w(self.d.get("server_cmdline", "?"))
        w("```")
        w("")
        w("Every run is one redis-benchmark process:")
        w("")
        w("```")
        w("redis-benchmark -h 127.0.0.1 -p <port> -c %d -n <n> -P <16|1> -r <keys> --csv <command...>"
          % CLIENTS)
        w("```")
        w("")
        w("`-r 10000` / `-r 1000000` give random keys over 10,000 / 1,000,000; the hot key is `-r 1` "
          "(every call on one key); PING has no `-r`. `<n>` is sized from the previous run of the "
          "same command to take about %.1f s (between %s and %s; the per-run n is in the tables below). "
          "`CONFIG RESETSTAT` before each run; server µs per call is `usec_per_call` from INFO "
          "commandstats (for the Lua twin, EVALSHA's, which includes the commands the script calls); "
          "p50/p99 are redis-benchmark's (`--csv`), in ms, per request (with -P 16 a request waits for "
          "its whole pipeline). \"granted\" is measured, not assumed: INFO ratelimit counters for the "
          "module, the script's HSET/ZADD calls (made only when it grants) for the Lua twin; a run "
          "whose regime does not hold fails the benchmark."
          % (self.cfg["seconds"], self.cfg["nmin"], "{:,}".format(self.cfg["nmax"])))
        w("")
        w("Order within each block (keyspace × algorithm): FLUSHALL, warm-up, then for pipeline 16 and "
          "then 1: [PING,] INCR, RL granted, INCR, RL denied, INCR, RL mix, INCR, Lua granted, Lua denied, "
          "Lua mix, INCR; then the replica is attached and the same sequence runs again.")
        w("")
        w("### Regimes")
        w("")
        w("`<rid>` is a number unique to each run, so \"granted\" runs and INCR start on fresh keys. "
          "The Lua twin gets the same arguments: `EVALSHA <sha> 1 <key> <arguments>` (keys prefixed "
          "with `l`).")
        w("")
        w("| command | regime | command line | warm-up |")
        w("|---|---|---|---|")
        for alg in ALGS:
            for rg in REGIMES:
                key = module_prefix(alg, rg, "<rid>") + "__rand_int__"
                line = "`%s %s %s`" % (alg.cmd, key, " ".join(str(a) for a in alg.regimes[rg]))
                if rg == "granted" and alg.hot_granted:
                    line += "; hot key: `%s`" % " ".join(str(a) for a in alg.hot_granted)
                if rg == "granted":
                    warm = "none (fresh keys)"
                elif rg == "denied":
                    warm = "every key: one call with the same arguments (drains it)"
                else:
                    warm = ("even keys: one call with `COST %d` (drained); odd keys fresh. "
                            "Hot key: `-r 2`, key 0 drained, key 1 deleted before each run"
                            % alg.mix_cost)
                w("| %s | %s | %s | %s |" % (alg.cmd, rg, line, warm))
        w("")
        w("The granted keys hold far more than the run takes, so every call writes the key in place, "
          "as INCR does. (A bucket that refills faster than it is drained, e.g. capacity 1,000,000 at "
          "1,000,000 per second, becomes fresh again within a millisecond: its key then expires between "
          "calls, and each call also pays Redis's deletion of the expired key and the DEL it propagates, "
          "which the INCR baseline never does.)")
        w("")
        w("The denied keys stay denied for an hour or more (capacity/limit 1, 1-hour period/window); "
          "the mix keys are drained with a COST equal to the limit and refill at 1 token per hour "
          "(token bucket), or until the next UTC midnight (sliding counter: 1-day fixed windows), or "
          "for an hour (sliding log). The module keys are warmed with the command itself; the Lua keys "
          "by running the script once on a template key and copying it with DUMP/RESTORE (the same "
          "stored state; running the script 1.5 million times would take minutes). Memory commands: "
          "see the Memory section.")
        w("")

    def md_commands(self, w):
        w("## Every command line, in order")
        w("")
        w("<details><summary>%d redis-benchmark runs (click)</summary>" % len(self.res))
        w("")
        w("```")
        for r in self.res:
            w(r.get("cmdline", "?"))
        w("```")
        w("")
        w("</details>")
        w("")

    def md_details(self, w):
        w("## All runs")
        w("")
        w("rps = requests/s; µs = server µs per call; p50/p99 in ms; granted = fraction of calls that "
          "were granted.")
        w("")
        for phase in self.phases():
            for ks in self.keyspaces():
                for P in self.cfg["pipelines"]:
                    w("### %s, %s, pipeline %d" % (
                        "no replica" if phase == "primary" else "one replica attached", ks_label(ks), P))
                    w("")
                    w("| command | regime | n | rps | × INCR | × Lua | µs | p50 | p99 | granted |")
                    w("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
                    for r in self.res:
                        if (r["phase"], r["ks"], r["P"]) != (phase, ks, P):
                            continue
                        if r["kind"] in ("PING", "INCR"):
                            name = r["kind"]
                        elif r["kind"] == "RL":
                            name = ALG_BY_TAG[r["alg"]].cmd
                        else:
                            name = "Lua " + ALG_BY_TAG[r["alg"]].lua
                        ri = self.ratio_incr(r) if r["kind"] in ("RL", "LUA") else None
                        rl = self.ratio_lua(phase, ks, P, r["alg"], r["regime"]) if r["kind"] == "RL" else None
                        w("| %s | %s | %s | %s | %s | %s | %.2f | %.3f | %.3f | %s |" % (
                            name, r["regime"] or "", "{:,}".format(r["n"]), self.fmt_rps(r),
                            "" if ri is None else "%.2f" % ri, "" if rl is None else "%.2f" % rl,
                            r["usec_per_call"], r["p50_ms"], r["p99_ms"],
                            "" if r["granted"] is None else "%.1f%%" % (100 * r["granted"])))
                    w("")

    # -- chart -------------------------------------------------------------
    def svg(self):
        """Small multiples: rows = (replica?, pipeline), columns = keyspace;
        in each panel, RL and Lua throughput as a multiple of INCR."""
        kss = self.keyspaces()
        rows = [(ph, P) for ph in self.phases() for P in self.cfg["pipelines"]]
        pw, ph_, gap = 330, 190, 20
        left, top = 50, 90
        W = left + len(kss) * (pw + gap) + 10
        mem_top = top + len(rows) * (ph_ + 45) + 10
        H = mem_top + 260
        groups = [(a, rg) for a in ALGS for rg in REGIMES]
        vmax = 1.2
        for ph, P in rows:
            for ks in kss:
                for a, rg in groups:
                    for kind in ("RL", "LUA"):
                        r = self.ratio_incr(self.cell(ph, ks, P, kind, a.tag, rg))
                        if r:
                            vmax = max(vmax, r)
        vmax = math.ceil(vmax * 1.12 * 5) / 5.0   # room for the value labels
        o = []
        o.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
                 'font-family="Helvetica,Arial,sans-serif" font-size="11">' % (W, H, W, H))
        o.append('<rect width="100%" height="100%" fill="#ffffff"/>')
        o.append('<text x="%d" y="24" font-size="16" font-weight="bold">Requests/s as a multiple of INCR '
                 '(same run, same settings)</text>' % left)
        o.append('<text x="%d" y="44" fill="#444">redis-benchmark -c %d; bars: RL command (dark) and its '
                 'Lua twin (light) in three regimes: g = mostly granted, d = mostly denied, m = mix. '
                 '%s, %s</text>' % (left, CLIENTS, self.d["machine"]["cpu"], self.d["machine"]["date"]))
        colors = {"tb": ("#1f5fa8", "#9cc0ea"), "sc": ("#2e8b57", "#a6dcb9"), "sl": ("#b8562b", "#f0bfa4")}
        lx = left
        for a in ALGS:
            o.append('<rect x="%d" y="56" width="12" height="12" fill="%s"/>' % (lx, colors[a.tag][0]))
            o.append('<rect x="%d" y="56" width="12" height="12" fill="%s"/>' % (lx + 14, colors[a.tag][1]))
            o.append('<text x="%d" y="66">%s / Lua twin</text>' % (lx + 30, a.cmd))
            lx += 215
        o.append('<line x1="%d" y1="62" x2="%d" y2="62" stroke="#000" stroke-dasharray="4,3"/>' % (lx, lx + 20))
        o.append('<text x="%d" y="66">INCR = 1</text>' % (lx + 24))
        o.append('<line x1="%d" y1="62" x2="%d" y2="62" stroke="#c00" stroke-dasharray="2,2"/>' % (lx + 90, lx + 110))
        o.append('<text x="%d" y="66">target 0.7 (0.6 log, replica)</text>' % (lx + 114))
        for ri, (ph, P) in enumerate(rows):
            y0 = top + ri * (ph_ + 45)
            for ci, ks in enumerate(kss):
                x0 = left + ci * (pw + gap)
                title = "%s, pipeline %d%s" % (ks_label(ks), P, ", 1 replica" if ph == "replica" else "")
                o.append('<text x="%d" y="%d" font-weight="bold">%s</text>' % (x0, y0 + 12, title))
                py0, py1 = y0 + 20, y0 + 20 + ph_ - 30
                o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>'
                         % (x0, py0, pw, py1 - py0))

                def yv(v):
                    return py1 - (py1 - py0) * min(v, vmax) / vmax
                step = 0.5 if vmax <= 3 else 1.0
                t = 0.0
                while t <= vmax + 1e-9:
                    o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e4e4e4"/>' % (x0, yv(t), x0 + pw, yv(t)))
                    if ci == 0:
                        o.append('<text x="%d" y="%.1f" text-anchor="end" fill="#555">%.1f</text>' % (x0 - 4, yv(t) + 4, t))
                    t += step
                o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#000" stroke-dasharray="4,3"/>' % (x0, yv(1), x0 + pw, yv(1)))  # noqa: E501 (one SVG element per line)
                gw = pw / float(len(groups))
                for gi, (a, rg) in enumerate(groups):
                    gx = x0 + gi * gw
                    thr = 0.6 if (a.tag == "sl" or ph == "replica") else 0.7
                    o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="2,2"/>'
                             % (gx + 2, yv(thr), gx + gw - 2, yv(thr)))
                    for bi, kind in enumerate(("RL", "LUA")):
                        r = self.ratio_incr(self.cell(ph, ks, P, kind, a.tag, rg))
                        if r is None:
                            continue
                        bw = (gw - 8) / 2.0
                        bx = gx + 4 + bi * bw
                        o.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s %s: %.2f× INCR</title></rect>'  # noqa: E501 (one SVG element per line)
                                 % (bx, yv(r), bw - 1, py1 - yv(r), colors[a.tag][bi],
                                    a.cmd if kind == "RL" else "Lua " + a.lua, rg, title, r))
                        if kind == "RL":
                            o.append('<text x="%.1f" y="%.1f" font-size="8" text-anchor="middle">%.2f</text>'
                                     % (bx + bw / 2.0, yv(r) - 2, r))
                    o.append('<text x="%.1f" y="%d" text-anchor="middle" fill="#333">%s</text>'
                             % (gx + gw / 2.0, py1 + 12, rg[0]))
        self.svg_memory(o, left, mem_top, W - left - 10)
        o.append('</svg>')
        return "\n".join(o) + "\n"

    def svg_memory(self, o, x, y, width):
        """Bottom row: bytes per key, and sliding-log bytes per grant."""
        mem = self.d["memory"]
        half = (width - 40) / 2.0
        o.append('<text x="%d" y="%d" font-weight="bold">Memory: bytes per key (used_memory growth over %s keys, one grant each)</text>'  # noqa: E501 (one SVG element per line)
                 % (x, y + 12, "{:,}".format(self.cfg["mem_keys"])))
        bars = [(m["label"], m["bytes_per_key"], "#777" if m["alg"] is None else
                 ("#1f5fa8", "#2e8b57", "#b8562b")[["tb", "sc", "sl"].index(m["alg"])] if m["kind"] == "rl" else
                 ("#9cc0ea", "#a6dcb9", "#f0bfa4")[["tb", "sc", "sl"].index(m["alg"])]) for m in mem]
        self.svg_hbars(o, x, y + 22, half, bars, "B")
        x2 = x + half + 40
        o.append('<text x="%d" y="%d" font-weight="bold">Sliding log: bytes per grant (key bytes / grants; distinct grant times)</text>'  # noqa: E501 (one SVG element per line)
                 % (x2, y + 12))
        lb = []
        for m in self.d["log_memory"]:
            lb.append(("%s, %d grants/key" % ("RL.SLIDINGLOG" if m["twin"] == "module" else "Lua sorted set", m["grants"]),
                       m["bytes_per_key"] / float(m["grants"]), "#b8562b" if m["twin"] == "module" else "#f0bfa4"))
        self.svg_hbars(o, x2, y + 22, half, lb, "B/grant", mark=8.0)

    @staticmethod
    def svg_hbars(o, x, y, width, bars, unit, mark=None):
        if not bars:
            return
        label_w = 170
        bh = 200.0 / max(len(bars), 1)
        vmax = max(v for _, v, _ in bars) * 1.15
        if mark:
            vmax = max(vmax, mark * 1.15)
        span = width - label_w - 90   # room for the value label
        for i, (label, v, color) in enumerate(bars):
            by = y + i * bh
            o.append('<text x="%.1f" y="%.1f" text-anchor="end" fill="#333">%s</text>' % (x + label_w - 6, by + bh * 0.65, label))
            wv = span * v / vmax
            o.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>' % (x + label_w, by + 2, wv, bh - 4, color))
            o.append('<text x="%.1f" y="%.1f" fill="#000">%.1f %s</text>' % (x + label_w + wv + 4, by + bh * 0.65, v, unit))
        if mark:
            mx = x + label_w + span * mark / vmax
            o.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="2,2"/>' % (mx, y, mx, y + bh * len(bars)))  # noqa: E501 (one SVG element per line)
            o.append('<text x="%.1f" y="%.1f" fill="#c00" font-size="9">target %g</text>' % (mx + 3, y + bh * len(bars) + 10, mark))  # noqa: E501 (one SVG element per line)


# --------------------------------------------------------------------------

def server_title(mc):
    """'Redis 7.0.15 (malloc=jemalloc-5.3.0)' from a run's `--version` line."""
    return "%s (malloc=%s)" % server_version(mc.get("redis_server", ""))


def server_version(version_line):
    """('Redis 7.0.15', 'jemalloc-5.3.0') from a server's `--version` output."""
    product = "Valkey" if version_line.lower().startswith("valkey") else "Redis"
    v = re.search(r"v=(\d+(?:\.\d+)*)", version_line)
    m = re.search(r"malloc=(\S+)", version_line)
    return "%s %s" % (product, v.group(1) if v else "?"), m.group(1) if m else "?"


def server_tag(version_line):
    """'redis7.0' / 'valkey9.1': the names integration/servers.py uses."""
    name, _ = server_version(version_line)
    product, ver = name.split(" ", 1)
    return product.lower() + ".".join(ver.split(".")[:2])


def resolve_server(spec):
    """A server binary: a path, a name of integration/servers.py, or (None)
    the one the integration harness would start."""
    if spec is None:
        return harness.REDIS_SERVER
    if os.sep in spec or os.path.exists(spec):
        return os.path.abspath(spec)
    try:
        import servers  # integration/servers.py
    except ImportError:
        raise BenchError("server %r: give a path (integration/servers.py, which knows the names, is missing)" % spec)
    try:
        return servers.server_path(spec)
    except LookupError as e:
        raise BenchError(str(e))


def write_outputs(data, out):
    tag = data.get("server_tag", "redis7.0")
    rep = Report(data)
    md = rep.markdown()
    svg = rep.svg()
    os.makedirs(os.path.join(out, "docs", "bench"), exist_ok=True)
    with open(os.path.join(out, "docs", "bench", tag + ".md"), "w") as f:
        f.write(md)
    with open(os.path.join(out, "docs", "bench", tag + ".svg"), "w") as f:
        f.write(svg)
    if rep.missing:
        raise BenchError("figures missing from the report: " + "; ".join(sorted(set(rep.missing))))
    write_summary(out)
    return rep


SERVER_ORDER = ["redis7.0", "valkey8.1", "valkey9.1"]


def write_summary(out):
    """BENCHMARKS.md: one summary table per server, from every
    bench/results-*.json under `out`."""
    runs = []
    for path in glob.glob(os.path.join(out, "bench", "results-*.json")):
        with open(path) as f:
            data = json.load(f)
        runs.append(data)
    runs.sort(key=lambda d: (SERVER_ORDER.index(d["server_tag"]) if d["server_tag"] in SERVER_ORDER else 99,
                             d["server_tag"]))
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    w("Generated by `make bench` (`bench/bench.py`, one run per server: `make bench SERVER=valkey9.1`); "
      "do not edit by hand. Each table comes from one run on one server build; every ratio in it "
      "compares runs made back to back within that run. The full report of each run (every keyspace "
      "and pipeline depth, the memory method, the command lines) is linked under its table.")
    w("")
    days = sorted({d["machine"]["date"][:10] for d in runs})
    w("Runs: %s. %s" % ("; ".join("%s on %s (load average at start %s)" % (
        server_title(d["machine"]), d["machine"]["date"], " ".join(d["machine"]["loadavg"])) for d in runs),
        "All on the same day." if len(days) == 1 else "**Not all on the same day: %s.**" % ", ".join(days)))
    w("")
    w("The machine has %s cores shared by the server, redis-benchmark and whatever else runs there "
      "(other builds and test suites ran during these runs): absolute requests/s drift, and so do "
      "single cells by ±0.1; the ratios are what carries over." % (runs[0]["machine"]["nproc"] if runs else "?"))
    for d in runs:
        summary_table(w, Report(d), d)
    # The edge bench's section (bench/edge/edge.py writes it) stays.
    path = os.path.join(out, "BENCHMARKS.md")
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        a, b = old.find("<!-- edge-bench:begin -->"), old.find("<!-- edge-bench:end -->")
        if 0 <= a < b:
            w("")
            w(old[a:b + len("<!-- edge-bench:end -->")])
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def summary_table(w, rep, d):
    mc = d["machine"]
    tag = d["server_tag"]
    name, malloc = server_version(mc["redis_server"])
    ks, P = "10k", 16
    w("")
    w("## %s (malloc=%s)" % (name, malloc))
    w("")
    if d.get("quick"):
        w("**Quick mode (`--quick`): tiny counts to prove the script works; these numbers mean nothing.**")
        w("")
    w("Run on %s. 10,000 random keys, 50 clients, pipeline 16. \"× INCR\": requests/s over the INCR "
      "runs just before and after (higher is better); \"× Lua\": over the Lua twin in the same block; "
      "\"µs/call\": the server's own time per call (`INFO commandstats`)." % mc["date"])
    w("")
    w("| command | regime | × INCR | × Lua twin | µs/call | Lua µs/call | × INCR, replica attached |")
    w("|---|---|---:|---:|---:|---:|---:|")
    incr = [r["usec_per_call"] for r in rep.res
            if (r["phase"], r["ks"], r["P"], r["kind"]) == ("primary", ks, P, "INCR")]
    w("| INCR | | 1.00 | | %s | | 1.00 |" % ("%.2f" % statistics.mean(incr) if incr else "–"))

    def f(v, fmt="%.2f"):
        return "–" if v is None else fmt % v

    for alg in ALGS:
        for rg in REGIMES:
            m = rep.cell("primary", ks, P, "RL", alg.tag, rg)
            lua = rep.cell("primary", ks, P, "LUA", alg.tag, rg)
            rep_r = rep.cell("replica", ks, P, "RL", alg.tag, rg) if "replica" in rep.phases() else None
            w("| %s | %s | %s | %s | %s | %s | %s |" % (
                alg.cmd, rg, f(rep.ratio_incr(m)), f(rep.ratio_lua("primary", ks, P, alg.tag, rg)),
                f(m and m["usec_per_call"]), f(lua and lua["usec_per_call"]), f(rep.ratio_incr(rep_r))))
    w("")
    mem = {m["label"]: m for m in d["memory"]}
    base = mem.get("INCR + PEXPIRE")
    w("Bytes per key%s: " % (" (**libc malloc**: this wheel's server is built without jemalloc, so "
                             "allocation sizes and `used_memory` differ from a jemalloc build)" if "libc" in malloc
                             else " (jemalloc)"))
    w("")
    w("| key | used_memory | MEMORY USAGE | × INCR + PEXPIRE (used_memory / MEMORY USAGE) |")
    w("|---|---:|---:|---:|")
    for label in ["INCR + PEXPIRE"] + [a.cmd for a in ALGS] + ["Lua " + a.lua for a in ALGS]:
        m = mem.get(label)
        if not m:
            continue
        w("| %s | %.0f | %.0f | %s |" % (label, m["bytes_per_key"], m["memory_usage"],
                                          "%.2f / %.2f" % (m["bytes_per_key"] / base["bytes_per_key"],
                                                           m["memory_usage"] / base["memory_usage"]) if base else "–"))
    g = max(x for x, _ in d["config"]["log_grants"])
    marg = rep.log_marginal(g)
    lua = rep.log_marginal(g, "lua")
    if marg and lua:
        w("| sliding log, per grant (%d grants/key, marginal) | %.2f | %.2f | Lua sorted set: %.1f / %.1f |"
          % (g, marg["marg_um"], marg["marg_mu"], lua["marg_um"], lua["marg_mu"]))
    w("")
    w("Full report: [docs/bench/%s.md](docs/bench/%s.md); raw numbers: [bench/results-%s.json](bench/results-%s.json)."
      % (tag, tag, tag, tag))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny counts: prove the script works")
    ap.add_argument("--out", default=ROOT, help="where BENCHMARKS.md, docs/bench/ and bench/results-*.json go")
    ap.add_argument("--render-only", metavar="RESULTS_JSON", help="only rewrite the report from saved results")
    ap.add_argument("--server", help="server binary or a name of integration/servers.py (default: the harness's)")
    ap.add_argument("--no-replica", action="store_true", help="skip the replica half of every block")
    ap.add_argument("--only-multi", action="store_true",
                    help="only the RL.MULTI cells (prints their table; writes no report)")
    ap.add_argument("--algs", default="tb,sc,sl",
                    help="development only: a subset of tb,sc,sl (the report then has gaps and fails)")
    a = ap.parse_args()
    out = os.path.abspath(a.out)

    if a.render_only:
        with open(a.render_only) as f:
            data = json.load(f)
        data.setdefault("server_tag", server_tag(data["machine"].get("redis_server", "")))
        write_outputs(data, out)
        print("wrote %s/BENCHMARKS.md and %s/docs/bench/%s.md" % (out, out, data["server_tag"]))
        return 0

    cfg = QUICK if a.quick else FULL
    t0 = time.monotonic()

    def log(msg):
        print("[%6.1f s] %s" % (time.monotonic() - t0, msg), flush=True)

    if not os.path.exists(harness.MODULE):
        raise BenchError("module not built: %s (make build)" % harness.MODULE)
    harness.REDIS_SERVER = resolve_server(a.server)
    if hasattr(harness, "ServerBuild"):
        # The harness's ServerBuild probes harness.REDIS_SERVER on first use.
        harness.SERVER = harness.ServerBuild()
    mc = machine()
    tag = server_tag(mc["redis_server"])
    log("server %s: %s" % (tag, harness.REDIS_SERVER))
    b = Bench(cfg, a.quick, log)
    # Load a private copy: a rebuild of the original during the run must not
    # change the code under a running server.
    tmpd = tempfile.mkdtemp(prefix="rl-bench-")
    b.module_shown = mc["module"]
    copy = os.path.join(tmpd, os.path.basename(harness.MODULE))
    shutil.copy2(harness.MODULE, copy)
    harness.MODULE = copy
    b.algs = [ALG_BY_TAG[t] for t in a.algs.split(",")]
    if a.only_multi:
        try:
            b.start()
            comp = b.composition(1 if a.quick else 3)
        finally:
            b.stop()
            shutil.rmtree(tmpd, ignore_errors=True)
        rep = Report.__new__(Report)
        rep.d = dict(composition=comp)
        lines = []
        rep.md_composition(lines.append)
        print("\n".join(lines))
        return 0
    try:
        b.start()
        server_cmdline = b.server_cmdline()
        b.throughput(["primary"] if a.no_replica else ["primary", "replica"])
        log("memory")
        mem = b.memory()
        lmem = b.log_memory()
        log("RL.MULTI")
        comp = b.composition(1 if a.quick else 3)
    finally:
        b.stop()
        shutil.rmtree(tmpd, ignore_errors=True)
    data = dict(quick=a.quick, machine=mc, elapsed_s=time.monotonic() - t0,
                config=dict(keyspaces=cfg["keyspaces"], pipelines=cfg["pipelines"],
                            seconds=cfg["seconds"], nmin={str(k): v for k, v in cfg["nmin"].items()},
                            nmax=cfg["nmax"], mem_keys=cfg["mem_keys"], log_grants=cfg["log_grants"],
                            clients=CLIENTS),
                server_cmdline=server_cmdline, results=b.results, memory=mem, log_memory=lmem, problems=b.problems,
                lua_sha=b.sha, server_tag=tag, composition=comp)
    os.makedirs(os.path.join(out, "bench"), exist_ok=True)
    with open(os.path.join(out, "bench", "results-%s.json" % tag), "w") as f:
        json.dump(data, f, indent=1)
    write_outputs(data, out)
    log("wrote %s/BENCHMARKS.md, %s/docs/bench/%s.md and .svg, %s/bench/results-%s.json" % (out, out, tag, out, tag))
    if b.problems:
        for p in b.problems:
            print("REGIME CHECK FAILED: " + p, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print("BENCHMARK FAILED: %s" % e, file=sys.stderr)
        sys.exit(1)
