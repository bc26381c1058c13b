"""Measuring: the cells of a benchmark run (redis-benchmark against one
server with the module, its Lua twins, INCR and PING), the memory runs and
the RL.MULTI cells, and what a run records (`run`: the results dict that
bench/results-TAG.json holds). Reporting is report.py; the command line is
bench.py.
"""

import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time

from rltesting import proc  # the tests' server processes (testing/, installed by make venv)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

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
    p = subprocess.run([proc.REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), "--pipe"],
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
        self.master = proc.Server()
        self.c = self.master.client()
        # A replica must never be cut off for lagging (it shares the CPUs).
        self.c.config_set("client-output-buffer-limit", "replica 0 0 0")
        self.c.config_set("repl-diskless-sync-delay", "0")
        # After a replica half, free the backlog within seconds, so that the
        # next "no replica" half runs on a standalone server again.
        self.c.config_set("repl-backlog-ttl", "1")
        self.replica = proc.Server()
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
            elif x == proc.MODULE:
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
        proc.wait_until(synced, timeout=300, interval=0.05, what="replica full sync")
        self.with_replica = True
        self.log("  replica attached (%.1f s)" % (time.monotonic() - t))

    def detach(self):
        self.rc.replicaof("NO", "ONE")
        proc.wait_until(lambda: int(self.c.info("replication").get("connected_slaves", 0)) == 0,
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
        proc.wait_until(alone, timeout=60, interval=0.05, what="a standalone master")

    def caught_up(self, timeout=120):
        if not self.with_replica:
            return
        def ok():
            mo = self.c.info("replication").get("master_repl_offset")
            ro = self.rc.info("replication").get("slave_repl_offset")
            return mo == ro
        proc.wait_until(ok, timeout=timeout, interval=0.01, what="replica caught up")
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
                rec = self.cell(label, stat, argv, P, calls_per_req, K, rnd)
                info = self.c.info("ratelimit")
                rec["multi_granted"] = int(info.get("ratelimit_multi_granted", 0))
                out.append(rec)
                self.log("    MULTI %-13s P%d n=%-7d %10.0f req/s  %6.2f us/request" % (
                    label, P, rec["n"], rec["requests_per_s"], rec["usec_per_request"]))
            self.c.flushall()
        # Every RL.MULTI call was granted (the limits are far away).
        granted = [r for r in out if r["cell"].startswith("multi") and r["multi_granted"] < r["calls"]]
        if granted:
            raise BenchError("RL.MULTI calls were not all granted: %r" % granted[:2])
        return out

    def cell(self, label, stat, argv, P, calls_per_req, K, rnd):
        """One redis-benchmark run of `argv` over K random keys, from zeroed
        commandstats: requests/s and the server's µs per call of `stat`
        (an error, a failed call or a short count raises)."""
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
        self.est[("MC", label)] = rps / calls_per_req
        shown = ["redis-benchmark"] + cmd[1:]
        shown[shown.index("-p") + 1] = "<port>"
        return dict(round=rnd, cell=label, P=P, n=n, rps=rps, requests_per_s=rps / calls_per_req,
                    usec_per_call=cs["usec_per_call"], usec_per_request=cs["usec_per_call"] * calls_per_req,
                    calls=cs["calls"], cmdline=" ".join(shown))

    # -- RL.FIXEDWINDOW against envoyproxy/ratelimit's pipeline ---------------
    def envoy(self, rounds):
        """Server time per decision of RL.FIXEDWINDOW against the pipeline
        envoyproxy/ratelimit sends to Redis for one descriptor, INCRBY key 1
        then EXPIRE key 60 (a limit per minute), on a standalone master,
        10,000 random keys, pipeline 16: the three cells run back to back,
        `rounds` times; the pipeline's time per decision is INCRBY's µs per
        call plus EXPIRE's (each measured alone over the same keys, all of
        which exist first). Every RL.FIXEDWINDOW call is granted. (A run
        that crosses a minute boundary sees both sides' keys expire and be
        created again, alike.)"""
        K, P = 10000, 16
        cells = [
            ("fixedwindow", "RL.FIXEDWINDOW", ["RL.FIXEDWINDOW", "ev:f:__rand_int__", 1000000000, 60000]),
            ("incrby", "INCRBY", ["INCRBY", "ev:e:__rand_int__", 1]),
            ("expire", "EXPIRE", ["EXPIRE", "ev:e:__rand_int__", 60]),
        ]
        out = []
        self.standalone()
        for rnd in range(rounds):
            # Every key exists first (a window a minute long, already
            # counting), so EXPIRE never meets a missing key and neither
            # side pays for creating keys.
            chunks = keyed_commands(["RL.FIXEDWINDOW"], "ev:f:", range(K), [1000000000, 60000])
            chunks += keyed_commands(["INCRBY"], "ev:e:", range(K), [1])
            chunks += keyed_commands(["EXPIRE"], "ev:e:", range(K), [60])
            pipe(self.master.port, chunks, len(chunks))
            for label, stat, argv in cells:
                before = int(self.c.info("ratelimit").get("ratelimit_fixedwindow_granted", 0))
                rec = self.cell("ev-" + label, stat, argv, P, 1, K, rnd)
                rec["cell"] = label
                if label == "fixedwindow":
                    after = int(self.c.info("ratelimit").get("ratelimit_fixedwindow_granted", 0))
                    rec["granted"] = after - before
                    if rec["granted"] < rec["calls"]:
                        raise BenchError("RL.FIXEDWINDOW calls were not all granted: %r" % rec)
                out.append(rec)
                self.log("    ENVOY %-12s P%d n=%-7d %10.0f req/s  %6.2f us/call" % (
                    label, P, rec["n"], rec["requests_per_s"], rec["usec_per_call"]))
            self.c.flushall()
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
        redis_server=sh([proc.REDIS_SERVER, "--version"]),
        redis_benchmark=sh([REDIS_BENCHMARK, "--version"]),
        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        loadavg=open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else "?",
        commit=sh(["git", "-C", ROOT, "describe", "--always", "--dirty", "--abbrev=12"]),
        module=os.path.relpath(proc.MODULE, ROOT) if proc.MODULE.startswith(ROOT) else proc.MODULE,
        module_built=datetime.datetime.fromtimestamp(os.path.getmtime(proc.MODULE), datetime.timezone.utc)
        .strftime("%Y-%m-%d %H:%M UTC") if os.path.exists(proc.MODULE) else "?",
    )



def resolve_server(spec):
    """A server binary: a path, a name of rltesting.servers, or (None)
    the one the tests' Server would start."""
    if spec is None:
        return proc.REDIS_SERVER
    if os.sep in spec or os.path.exists(spec):
        return os.path.abspath(spec)
    try:
        from rltesting import servers
    except ImportError:
        raise BenchError("server %r: give a path (rltesting.servers, which knows the names, is not installed: make venv)" % spec)
    try:
        return servers.server_path(spec)
    except LookupError as e:
        raise BenchError(str(e))


def server_version(version_line):
    """('Redis 7.0.15', 'jemalloc-5.3.0') from a server's `--version` output."""
    product = "Valkey" if version_line.lower().startswith("valkey") else "Redis"
    v = re.search(r"v=(\d+(?:\.\d+)*)", version_line)
    m = re.search(r"malloc=(\S+)", version_line)
    return "%s %s" % (product, v.group(1) if v else "?"), m.group(1) if m else "?"


def server_tag(version_line):
    """'redis7.0' / 'valkey9.1': the names rltesting.servers uses."""
    name, _ = server_version(version_line)
    product, ver = name.split(" ", 1)
    return product.lower() + ".".join(ver.split(".")[:2])


def run(quick, server=None, no_replica=False, algs="tb,sc,sl", only_multi=False, log=print, only_envoy=False):
    """One benchmark run on one server build: the results dict (what
    bench/results-TAG.json holds), or with `only_multi` the RL.MULTI cells
    only. Raises BenchError when anything it relies on fails."""
    cfg = QUICK if quick else FULL
    t0 = time.monotonic()
    if not os.path.exists(proc.MODULE):
        raise BenchError("module not built: %s (make build)" % proc.MODULE)
    proc.REDIS_SERVER = resolve_server(server)
    # ServerBuild probes proc.REDIS_SERVER on first use.
    proc.SERVER = proc.ServerBuild()
    mc = machine()
    tag = server_tag(mc["redis_server"])
    log("server %s: %s" % (tag, proc.REDIS_SERVER))
    b = Bench(cfg, quick, log)
    # Load a private copy: a rebuild of the original during the run must not
    # change the code under a running server.
    tmpd = tempfile.mkdtemp(prefix="rl-bench-")
    b.module_shown = mc["module"]
    copy = os.path.join(tmpd, os.path.basename(proc.MODULE))
    shutil.copy2(proc.MODULE, copy)
    proc.MODULE = copy
    b.algs = [ALG_BY_TAG[t] for t in algs.split(",")]
    if only_multi or only_envoy:
        try:
            b.start()
            if only_envoy:
                return dict(envoy=b.envoy(1 if quick else 3))
            return dict(composition=b.composition(1 if quick else 3))
        finally:
            b.stop()
            shutil.rmtree(tmpd, ignore_errors=True)
    try:
        b.start()
        server_cmdline = b.server_cmdline()
        b.throughput(["primary"] if no_replica else ["primary", "replica"])
        log("memory")
        mem = b.memory()
        lmem = b.log_memory()
        log("RL.MULTI")
        comp = b.composition(1 if quick else 3)
        log("RL.FIXEDWINDOW vs INCRBY + EXPIRE")
        env = b.envoy(1 if quick else 3)
    finally:
        b.stop()
        shutil.rmtree(tmpd, ignore_errors=True)
    return dict(quick=quick, machine=mc, elapsed_s=time.monotonic() - t0,
                config=dict(keyspaces=cfg["keyspaces"], pipelines=cfg["pipelines"],
                            seconds=cfg["seconds"], nmin={str(k): v for k, v in cfg["nmin"].items()},
                            nmax=cfg["nmax"], mem_keys=cfg["mem_keys"], log_grants=cfg["log_grants"],
                            clients=CLIENTS),
                server_cmdline=server_cmdline, results=b.results, memory=mem, log_memory=lmem, problems=b.problems,
                lua_sha=b.sha, server_tag=tag, composition=comp, envoy=env)


def save(data, out):
    """bench/results-TAG.json under `out`."""
    os.makedirs(os.path.join(out, "bench"), exist_ok=True)
    with open(os.path.join(out, "bench", "results-%s.json" % data["server_tag"]), "w") as f:
        json.dump(data, f, indent=1)
