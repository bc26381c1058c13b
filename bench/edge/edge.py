#!/usr/bin/env python3
"""The edge bench: HTTP load in front of each example gateway, Redis faults
injected mid-run, latency and errors as a gateway's users see them.

    bench/edge/edge.py                 full run (~10 min): writes
                                       bench/edge/results-TAG.json, the
                                       BENCHMARKS.md section, docs/edge.md
                                       and its chart docs/edge.svg / .png
    bench/edge/edge.py --quick --out DIR
                                       short run (< 2 min), same code paths;
                                       asserts the run worked (every mode made
                                       decisions, nothing crashed), not speed
    bench/edge/edge.py --render-only bench/edge/results-TAG.json

For each gateway (examples/node, examples/python), in front of its own
trivial upstream, one Redis server with the module (--server, default
redis7.0 of integration/servers.py) and three runs with the same load and
the same fault schedule:

    lua       one EVALSHA of the Lua twin per request (--backend lua)
    module    one RL.TOKENBUCKET per request (--backend module)
    leased    the client library's leased limiter, batch 50 (--lease-batch 50)

The no-limit baseline runs alongside, in every run: a quarter of the mix
goes to a path no rule limits (the control requests), through the same
gateway at the same moments, so the machine's noise (2 cores, shared) falls
on both; "added" latency is a limited percentile minus the control's.

All with the gateways' Redis timeout at 5 ms and their breaker (1 failure
opens it for 500 ms, then one probe) and panic limits: the rules say
"instances": 2, so each gateway's panic limit is half the limit, which
also tells the panic decisions apart in the X-RateLimit-Limit header.

Load: bench/edge/load.js, open loop at a fixed rate (each request due at
its time, latency counted from then: no coordinated omission), 10,000
tenants drawn from Zipf(s=1) plus one abusive tenant sending 20x its
sustained rate. The rate is FRACTION of the capacity measured first
(closed loop, per-request Lua mode, per gateway). Every run starts with an
unrecorded warm-up load (JIT, connections, leases) and then a recorded
warm-up phase left out of the figures.

Faults, on a fixed schedule during every run: DEBUG SLEEP 0.015 once a
second for 10 s; BGSAVE of a dataset of a few GB (DEBUG POPULATE, --data-gb)
for a real fork stall; SIGSTOP for 3 s, then SIGCONT; SIGKILL and an
immediate restart (empty: no persistence, the limiter state is lost).
"""
import argparse
import datetime
import glob
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

import redis  # noqa: E402
from rltesting import servers  # noqa: E402  (testing/: server builds by name)

MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "release",
                                                  "libredis_ratelimit.so"))
MODES = ("lua", "module", "leased")
CONTROL_EVERY = 4       # every 4th request of the mix goes to an unlimited path
GATEWAYS = ("node", "python")
TIMEOUT_MS = 5          # the gateways' Redis timeout: the incident's budget
RETRY_MS = 500          # breaker open time before one probe
LEASE_BATCH = 50
FRACTION = 0.2          # of the measured capacity
TENANTS = 10000
SLEEP_S = 0.015         # DEBUG SLEEP of the stall phase


class BenchError(RuntimeError):
    pass


def log(msg):
    print(f"[edge {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(0.02)
    raise BenchError(f"timed out waiting for {what}")


# --------------------------------------------------------------- schedule

def schedule(quick):
    """Phases (name, start_s, end_s) and fault events (t_s, action)."""
    if quick:
        d = dict(warmup=1, steady=1.5, stall=2, rec1=0.5, fork=1, outage=1, rec2=0.5,
                 restart=1, rec3=1.5)
    else:
        d = dict(warmup=3, steady=10, stall=10, rec1=5, fork=8, outage=3, rec2=5,
                 restart=3, rec3=8)
    phases, t = [], 0.0
    for key in ("warmup", "steady", "stall", "rec1", "fork", "outage", "rec2", "restart",
                "rec3"):
        name = "recovery" if key.startswith("rec") else key
        phases.append((name, t, t + d[key]))
        t += d[key]
    start = {p[0]: p[1] for p in phases if p[0] != "recovery"}
    events = [(start["stall"] + i, "sleep") for i in range(int(d["stall"]))]
    events += [(start["fork"], "bgsave"), (start["outage"], "stop"),
               (start["outage"] + d["outage"], "cont"), (start["restart"], "kill")]
    return phases, sorted(events), t


# ------------------------------------------------------------------ Redis

class Redis:
    def __init__(self, binary, workdir):
        self.binary = binary
        self.dir = workdir
        self.port = free_port()
        self.proc = None
        self.gen = 0

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--loadmodule", MODULE, "--enable-debug-command", "local",
             "--save", "", "--appendonly", "no", "--dir", self.dir,
             "--rdbcompression", "no", "--rdbchecksum", "no", "--logfile", "redis.log"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.gen += 1
        wait_for(lambda: self.client().ping(), 10, "redis to answer")

    def client(self, timeout=2.0):
        return redis.Redis(port=self.port, socket_timeout=timeout, socket_connect_timeout=timeout)

    def kill(self):
        """SIGKILL, with any BGSAVE child (it would outlive the server, finish
        the dump, and the restarted server would load it)."""
        if self.proc and self.proc.poll() is None:
            pid = self.proc.pid
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                children = []
            self.proc.kill()
            self.proc.wait()
            for c in children:
                try:
                    os.kill(c, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name in os.listdir(self.dir):
            if name.endswith(".rdb"):
                os.unlink(os.path.join(self.dir, name))

    def cpu(self):
        i = self.client(0.5).info("cpu")
        return (self.gen, float(i["used_cpu_sys"]) + float(i["used_cpu_user"]))


# --------------------------------------------------------------- gateways

def gateway_cmd(gw, port, up_port, redis_port, rules, mode):
    if gw == "node":   # EDGE_NODE_OPTIONS: e.g. --cpu-prof, to profile a gateway
        head = ["node", *os.environ.get("EDGE_NODE_OPTIONS", "").split(),
                os.path.join(ROOT, "examples", "node", "gateway.js")]
    else:
        head = [sys.executable, os.path.join(ROOT, "examples", "python", "gateway.py")]
    cmd = head + ["--port", str(port), "--upstream", f"http://127.0.0.1:{up_port}",
                  "--redis", f"redis://127.0.0.1:{redis_port}/0", "--rules", rules,
                  "--redis-timeout-ms", str(TIMEOUT_MS), "--redis-retry-ms", str(RETRY_MS)]
    if mode == "lua":
        cmd += ["--backend", "lua"]
    elif mode == "module":
        cmd += ["--backend", "module"]
    elif mode == "leased":
        cmd += ["--backend", "module", "--lease-batch", str(LEASE_BATCH)]
    return cmd


def upstream_cmd(gw, port):
    if gw == "node":
        return ["node", os.path.join(ROOT, "examples", "node", "upstream.js"), "--port", str(port)]
    return [sys.executable, os.path.join(ROOT, "examples", "python", "upstream.py"),
            "--port", str(port)]


def http_ok(url):
    with urllib.request.urlopen(url, timeout=1) as r:
        return r.status == 200


def stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_gateway/stats", timeout=2) as r:
        return json.load(r)


INSTANCES = 2   # the rules' "instances": each gateway's panic limit is half the limit


def capacity_of(r):
    """The tenants' bucket: r per second, bursts of at least 100 (so that a
    lease of 50 is a lease of 50)."""
    return max(100, 10 * r)


def write_rules(path, r):
    """Token bucket 'api' on /api/: capacity_of(r), refilled at r per second."""
    doc = {"instances": INSTANCES,
           "routes": [{"name": "api", "match": "/api/", "algorithm": "tokenbucket",
                       "capacity": capacity_of(r), "rate": r, "period_ms": 1000}]}
    with open(path, "w") as f:
        json.dump(doc, f)


class Procs:
    """Every process the bench starts, stopped in reverse on the way out."""

    def __init__(self):
        self.procs = []

    def start(self, cmd, log_path):
        f = open(log_path, "ab")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        f.close()
        self.procs.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def stop_all(self):
        for p in reversed(self.procs):
            self.stop(p)
        self.procs = []


def load_cmd(port, path, rate, duration, abuse_rate, out=None, closed=0):
    cmd = ["node", os.path.join(HERE, "load.js"), "--url", f"http://127.0.0.1:{port}",
           "--path", path, "--rate", str(rate), "--duration", str(duration),
           "--tenants", str(TENANTS), "--abuse-rate", str(abuse_rate)]
    if out:
        cmd += ["--out", out]
    if closed:
        cmd += ["--closed", str(closed)]
    return cmd


# ------------------------------------------------------------------- runs

class Bench:
    def __init__(self, args):
        self.args = args
        self.quick = args.quick
        self.binary = servers.server_path(args.server) if args.server in servers.SERVERS \
            else args.server
        self.tmp = tempfile.mkdtemp(prefix="rl-edge-")
        self.procs = Procs()
        self.phases, self.events, self.total = schedule(self.quick)

    def close(self):
        self.procs.stop_all()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def setup(self, gw, mode, r, tag):
        """Redis (fresh), the upstream and the gateway in `mode`."""
        d = os.path.join(self.tmp, f"{gw}-{mode}-{tag}")
        os.makedirs(d)
        rs = Redis(self.binary, d)
        rs.start()
        up_port, gw_port = free_port(), free_port()
        rules = os.path.join(d, "rules.json")
        write_rules(rules, r)
        up = self.procs.start(upstream_cmd(gw, up_port), os.path.join(d, "upstream.log"))
        g = self.procs.start(gateway_cmd(gw, gw_port, up_port, rs.port, rules, mode),
                             os.path.join(d, "gateway.log"))
        wait_for(lambda: http_ok(f"http://127.0.0.1:{gw_port}/_gateway/stats"), 15,
                 f"the {gw} gateway")
        return d, rs, up, g, gw_port

    def teardown(self, rs, up, g):
        self.procs.stop(g)
        self.procs.stop(up)
        self.procs.procs = [p for p in self.procs.procs if p not in (g, up)]
        rs.kill()
        for name in os.listdir(rs.dir):      # the run's files (records, logs) stay in memory
            if name.endswith(".csv"):
                os.unlink(os.path.join(rs.dir, name))

    def capacity(self, gw):
        """Closed-loop requests/s of the gateway in per-request Lua mode."""
        d, rs, up, g, port = self.setup(gw, "lua", 1000, "capacity")
        try:
            secs = 1 if self.quick else 5
            conns = 8 if self.quick else 32
            out = subprocess.run(load_cmd(port, "/api/items", 0, 1, 0, closed=conns),
                                 capture_output=True, text=True, check=True)  # warm
            out = subprocess.run(load_cmd(port, "/api/items", 0, secs, 0, closed=conns),
                                 capture_output=True, text=True, check=True)
            res = json.loads(out.stdout)
            if res["done"] == 0 or res["s5xx"] or res["errors"]:
                raise BenchError(f"capacity run of {gw} failed: {res}")
            log(f"{gw}: capacity {res['rps']:.0f} req/s (closed loop, {conns} connections, "
                f"lua mode)")
            return res["rps"]
        finally:
            self.teardown(rs, up, g)

    def faults(self, rs, started, marks, errors, populate_keys):
        """Fires the schedule's events relative to the load's start; samples
        Redis CPU at every phase boundary."""
        bounds = sorted({p[1] for p in self.phases} | {p[2] for p in self.phases})
        first = {"cont": 0, "cpu": 1}    # at one instant: resume, sample, then the fault
        todo = sorted([(t, "cpu") for t in bounds] + self.events,
                      key=lambda e: (e[0], first.get(e[1], 2)))
        c = rs.client()
        for t, what in todo:
            delay = started + t - time.time()
            if delay > 0:
                time.sleep(delay)
            try:
                if what == "cpu":
                    try:
                        marks.append((t, "cpu", rs.cpu()))
                    except redis.RedisError:
                        marks.append((t, "cpu", None))
                elif what == "sleep":
                    c.execute_command("DEBUG", "SLEEP", SLEEP_S)
                    marks.append((t, what, None))
                elif what == "bgsave":
                    c.bgsave()
                    marks.append((t, what, None))
                elif what == "stop":
                    rs.proc.send_signal(signal.SIGSTOP)
                    marks.append((t, what, None))
                elif what == "cont":
                    rs.proc.send_signal(signal.SIGCONT)
                    marks.append((t, what, None))
                    try:
                        fi = rs.client(5).info("persistence")
                        marks.append((t, "fork_info", {
                            "latest_fork_usec": rs.client(5).info("stats")["latest_fork_usec"],
                            "bgsave_in_progress": fi["rdb_bgsave_in_progress"],
                            "last_bgsave_status": fi["rdb_last_bgsave_status"],
                            "last_bgsave_time_sec": fi["rdb_last_bgsave_time_sec"]}))
                    except redis.RedisError as e:
                        errors.append(f"info after SIGCONT: {e}")
                elif what == "kill":
                    try:
                        marks.append((t, "cpu", rs.cpu()))
                    except redis.RedisError:
                        pass
                    rs.kill()
                    t_kill = time.time()
                    rs.start()
                    c = rs.client()
                    marks.append((t, "kill", {"restart_ms": (time.time() - t_kill) * 1000}))
            except Exception as e:   # a fault that did not happen is an error of the run
                errors.append(f"{what} at {t}s: {type(e).__name__}: {e}")

    def run(self, gw, mode, rate, r):
        d, rs, up, g, port = self.setup(gw, mode, r, "run")
        try:
            keys = 10000 if self.quick else int(self.args.data_gb * 1e9 / 1000)
            if keys:
                t0 = time.monotonic()
                rs.client(600).execute_command("DEBUG", "POPULATE", keys, "pop", 1000)
                mem = rs.client().info("memory")["used_memory"]
                log(f"{gw}/{mode}: populated {keys} keys of 1000 bytes, used_memory "
                    f"{mem / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s")
            out = os.path.join(d, "records.csv")
            path = "/api/items"
            ctl = ["--control-path", "/free/items", "--control-every", str(CONTROL_EVERY)]
            warm = load_cmd(port, path, rate, 0.5 if self.quick else 5, 20 * r)
            subprocess.run(warm + ctl + ["--seed", "2"], capture_output=True, check=True)
            lp = subprocess.Popen(load_cmd(port, path, rate, self.total, 20 * r, out) + ctl,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = lp.stderr.readline()
            if not line.startswith("started "):
                raise BenchError(f"load generator: {line}{lp.stderr.read()}")
            started = float(line.split()[1]) / 1000
            marks, errors = [], []
            ft = threading.Thread(target=self.faults, args=(rs, started, marks, errors, keys))
            ft.start()
            so, se = lp.communicate()
            ft.join()
            if lp.returncode != 0:
                raise BenchError(f"load generator failed: {se}")
            summary = json.loads(so)
            gst = stats(port)
            alive = {"gateway": g.poll() is None, "upstream": up.poll() is None}
            recs = read_records(out)
        finally:
            self.teardown(rs, up, g)
        return {"gateway": gw, "mode": mode, "rate": rate, "r": r, "summary": summary,
                "gateway_stats": gst, "alive": alive, "marks": marks, "errors": errors,
                "data_keys": keys, "records": recs}


def read_records(path):
    """[(due_ms, latency_ms, status, kind, limit, lag_ms)] of the load generator's
    file (kind 0: the mix, 1: the abusive tenant, 2: control; limit:
    X-RateLimit-Limit; lag: how late the generator sent it)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            a, b, c, e, lim, lag = line.rstrip("\n").split(",")
            out.append((float(a), float(b), int(c), int(e), int(lim) if lim else 0, float(lag)))
    out.sort()
    return out


# --------------------------------------------------------------- analysis

def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, math.ceil(p / 100 * len(sorted_vals)) - 1))
    return sorted_vals[i]


def cpu_between(marks, t0, t1):
    """Redis CPU seconds between two phase boundaries (across a restart: the
    new process's own CPU since it started)."""
    cpu = [(t, v) for t, w, v in marks if w == "cpu" and v is not None]
    a = [v for t, v in cpu if abs(t - t0) < 1e-6]
    b = [v for t, v in cpu if abs(t - t1) < 1e-6]
    if not a or not b:
        return None
    a, b = a[0], b[-1]
    return b[1] - a[1] if a[0] == b[0] else b[1]


def analyse(run, phases):
    """Per phase: the limited requests' figures, the control requests'
    latency, and the limited ones' latency above the control's."""
    r = run["r"]
    cap = capacity_of(r)
    out = {}
    recs = run["records"]
    for name in dict.fromkeys(p[0] for p in phases):
        if name == "warmup":
            continue
        spans = [(a, b) for n, a, b in phases if n == name]
        sel = [x for x in recs if any(a * 1000 <= x[0] < b * 1000 for a, b in spans)]
        lim = [x for x in sel if x[3] != 2]
        ctl = sorted(x[1] for x in sel if x[3] == 2)
        length = sum(b - a for a, b in spans)
        lat = sorted(x[1] for x in lim)
        cpu = sum(c for c in (cpu_between(run["marks"], a, b) for a, b in spans)
                  if c is not None)
        ab = [x for x in lim if x[3] == 1]
        ab_ok = [x for x in ab if x[2] == 200]
        decided = [x for x in lim if x[4]]
        st = {"n": len(lim), "n_control": len(ctl), "seconds": length,
              "gen_lag_p99": pct(sorted(x[5] for x in sel), 99),
              "rps": sum(1 for x in sel if x[2] > 0) / length if length else 0,
              "s5xx": sum(1 for x in sel if x[2] >= 500),
              "timeouts": sum(1 for x in sel if x[2] == 0),
              "errors": sum(1 for x in sel if x[2] == -1),
              "denied": sum(1 for x in lim if x[2] == 429),
              "panic_share": (sum(1 for x in decided if x[4] == cap // INSTANCES) / len(decided)
                              if decided else 0.0),
              "abuse_sent": len(ab), "abuse_granted": len(ab_ok),
              "abuse_panic": sum(1 for x in ab_ok if x[4] == cap // INSTANCES),
              "redis_cpu_s": cpu,
              "cpu_ms_per_1k": cpu * 1000 / (len(lim) / 1000) if lim and cpu else 0.0}
        for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9), ("max", 100)):
            st[k] = pct(lat, q)
            st["control_" + k] = pct(ctl, q)
            st["added_" + k] = st[k] - st["control_" + k]
        base = st["control_p50"]
        st["over3"] = sum(1 for v in lat if v - base > 3)
        st["over5"] = sum(1 for v in lat if v - base > 5)
        st["over3_control"] = sum(1 for v in ctl if v - base > 3)
        out[name] = st
    # The abusive tenant over the whole run, against its bucket (cap + r x T),
    # what the panic buckets may add while Redis is away (cap / INSTANCES +
    # r / INSTANCES x T) and the bucket the kill's lost state gives (cap).
    first = next((x[0] for x in recs if x[3] == 1), None)
    if first is not None:
        t_end = recs[-1][0]
        ok = [x for x in recs if x[3] == 1 and x[2] == 200]
        pan = sum(1 for x in ok if x[4] == cap // INSTANCES)
        span = (t_end - first) / 1000
        allowed = cap + r * span
        out["_abuse_total"] = {
            "granted": len(ok), "shared": len(ok) - pan, "panic": pan, "allowed": allowed,
            "shared_beyond": max(0, len(ok) - pan - allowed - cap),
            "panic_allowed": cap // INSTANCES + r / INSTANCES * span,
            "restart_allows": cap, "seconds": span}
    return out


def series(run, bin_s):
    """(t, p99 of the limited requests, p99 of the control ones) per bin of due time."""
    bins = {}
    for due, lat, _, kind, *_ in run["records"]:
        bins.setdefault(int(due / 1000 / bin_s), ([], []))[kind == 2].append(lat)
    return [((k + 0.5) * bin_s, pct(sorted(a), 99), pct(sorted(c), 99))
            for k, (a, c) in sorted(bins.items()) if a and c]


# ---------------------------------------------------------------- reports

COLORS = {"control": "#888888", "lua": "#d62728", "module": "#1f77b4", "leased": "#2ca02c"}
FAULT_PHASES = {"stall": "#f4b400", "fork": "#9c27b0", "outage": "#d62728", "restart": "#555555"}
PHASE_ORDER = ("steady", "stall", "fork", "outage", "restart", "recovery")


def fmt(v, nd=2, sign=False):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"


def table(res):
    """The Markdown tables (one per gateway)."""
    out = []
    for gw in GATEWAYS:
        runs = res["runs"].get(gw)
        if not runs:
            continue
        m = res["meta"]["gateways"][gw]
        out.append(f"**{gw} gateway**: capacity {m['capacity']:.0f} req/s (closed loop, Lua "
                   f"mode), offered {m['rate']} req/s (a quarter of the mix on the unlimited "
                   f"control path); abusive tenant {20 * m['r']} req/s against its "
                   f"{m['r']}/s (bucket {capacity_of(m['r'])}).\n")
        out.append("| mode | phase | req/s | generator lag p99 | control p50 / p99 | added p50 | "
                   "p99 | p99.9 | max | >3 ms | >5 ms | 5xx | timeouts | panic | abuser granted "
                   "(panic) / rate x t | Redis CPU ms / 1k |")
        out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
                   "---:|")
        for mode in MODES:
            run = runs.get(mode)
            if not run:
                continue
            for ph in PHASE_ORDER:
                s = run["phases"].get(ph)
                if not s:
                    continue
                lat = [fmt(s["added_" + k], sign=True) for k in ("p50", "p99", "p999", "max")]
                out.append(
                    f"| {mode} | {ph} | {s['rps']:.0f} | {fmt(s['gen_lag_p99'])} | "
                    f"{fmt(s['control_p50'])} / "
                    f"{fmt(s['control_p99'])} | " + " | ".join(lat) +
                    f" | {100 * s['over3'] / s['n']:.1f}% | {100 * s['over5'] / s['n']:.1f}% | "
                    f"{s['s5xx']} | {s['timeouts']} | {100 * s['panic_share']:.0f}% | "
                    f"{s['abuse_granted']} ({s['abuse_panic']}) / {m['r'] * s['seconds']:.0f} | "
                    f"{fmt(s['cpu_ms_per_1k'], 1)} |")
        out.append("\nThe client library's counters over the whole run, warm-up included "
                   "(`rl.metrics()`):\n")
        out.append("| mode | decisions module / lua / local / panic | Redis calls | failures | "
                   "breaker trips (latency / failures) | leases | lease waits | refunds |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for mode in MODES:
            c = metrics_of(runs.get(mode, {}).get("gateway_stats", {}))
            if c:
                out.append(
                    f"| {mode} | {c.get('decisions_module', 0)} / {c.get('decisions_lua', 0)} / "
                    f"{c.get('decisions_local', 0)} / {c.get('decisions_panic', 0)} | "
                    f"{c.get('calls', 0)} | {c.get('failures', 0)} | {c.get('trips', 0)} "
                    f"({c.get('trips_latency', 0)} / {c.get('trips_failures', 0)}) | "
                    f"{c.get('leases', 0)} | {c.get('lease_waits', 0)} | {c.get('refunds', 0)} |")
        out.append("\nThe abusive tenant over the whole run (from its first request):\n")
        for mode in MODES:
            a = runs.get(mode, {}).get("phases", {}).get("_abuse_total")
            if a:
                out.append(f"- {mode}: {a['granted']} granted ({a['panic']} by panic limits) in "
                           f"{a['seconds']:.0f} s; its bucket allows {a['allowed']:.0f} "
                           f"(capacity + rate x time), the panic buckets "
                           f"{a['panic_allowed']:.0f} more, the kill's lost state "
                           f"{a['restart_allows']} more; shared grants beyond bucket and "
                           f"restart: {a['shared_beyond']:.0f}")
        out.append("")
    return "\n".join(out)


def metrics_of(gateway_stats):
    """The library's counters from a gateway's stats page, snake_case (Node's
    are camelCase)."""
    m = gateway_stats.get("limiter") or {}
    return {"".join("_" + ch.lower() if ch.isupper() else ch for ch in k): v
            for k, v in m.items()}


def svg_chart(res):
    """Per gateway: p99 per bin, one line per mode and the control requests'
    (log scale), and the ratio of each mode's p99 to its control's in the same
    bin; fault windows shaded."""
    W, PH, L, R, T = 900, 200, 60, 20, 30
    gws = [g for g in GATEWAYS if g in res["runs"]]
    H = T + len(gws) * (2 * PH + 98) + 10
    total = res["meta"]["total_s"]
    phases = res["meta"]["phases"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
             f'font-family="sans-serif" font-size="11">',
             f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{L}" y="18" font-size="13">Edge latency under Redis faults '
             f'({res["meta"]["server"]}, {res["meta"]["date"]}; a shared 2-core machine, '
             f'load average {res["meta"]["loadavg"]})</text>']
    y0 = T
    for gw in gws:
        runs = res["runs"][gw]
        for panel in ("p99", "ratio"):
            top, bot = y0 + 20, y0 + PH
            lo, hi = (0.1, 3000.0) if panel == "p99" else (0.1, 1000.0)

            def X(t):
                return L + (W - L - R) * t / total

            def Y(v, lo=lo, hi=hi, top=top, bot=bot):
                v = min(max(v, lo), hi)
                return bot - (bot - top) * (math.log10(v) - math.log10(lo)) / (
                    math.log10(hi) - math.log10(lo))
            for name, a, b in phases:
                if name in FAULT_PHASES:
                    parts.append(f'<rect x="{X(a):.1f}" y="{top}" width="{X(b) - X(a):.1f}" '
                                 f'height="{bot - top}" fill="{FAULT_PHASES[name]}" '
                                 f'fill-opacity="0.15"/>')
                    if panel == "p99":
                        parts.append(f'<text x="{X(a) + 2:.1f}" y="{top + 10}" font-size="9" '
                                     f'fill="#333">{name}</text>')
            parts.append(f'<rect x="{L}" y="{top}" width="{W - L - R}" height="{bot - top}" '
                         f'fill="none" stroke="#999"/>')
            v = lo
            while v <= hi * 1.0001:
                parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(v):.1f}" y2="{Y(v):.1f}" '
                             f'stroke="#eee"/><text x="{L - 4}" y="{Y(v) + 3:.1f}" '
                             f'text-anchor="end">{v:g}</text>')
                v *= 10
            if panel == "p99":
                for ref, label, dy in ((3, "3 ms", 11), (5, "5 ms", -3)):
                    parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(ref):.1f}" '
                                 f'y2="{Y(ref):.1f}" stroke="#000" stroke-dasharray="4 3"/>'
                                 f'<text x="{W - R - 4}" y="{Y(ref) + dy:.1f}" '
                                 f'text-anchor="end">{label}</text>')
                title = (f"{gw} gateway: p99 latency per 0.5 s, ms (log); grey: the control "
                         f"requests (unlimited path) of each run")
            else:
                parts.append(f'<line x1="{L}" x2="{W - R}" y1="{Y(1):.1f}" y2="{Y(1):.1f}" '
                             f'stroke="#888"/>')
                title = f"{gw} gateway: p99 / the same run's control p99 in the same 0.5 s (log)"
            parts.append(f'<text x="{L}" y="{top - 5}" font-size="12">{title}</text>')
            if panel == "p99":
                for mode in MODES:
                    if mode in runs:
                        pts = " ".join(f"{X(t):.1f},{Y(c):.1f}" for t, _, c in runs[mode]["series"])
                        parts.append(f'<polyline fill="none" stroke="{COLORS["control"]}" '
                                     f'stroke-width="0.8" stroke-opacity="0.7" points="{pts}"/>')
            for mode in MODES:
                if mode not in runs:
                    continue
                pts = " ".join(
                    f"{X(t):.1f},{Y(p if panel == 'p99' else p / c):.1f}"
                    for t, p, c in runs[mode]["series"] if panel == "p99" or c > 0)
                parts.append(f'<polyline fill="none" stroke="{COLORS[mode]}" stroke-width="1.5" '
                             f'points="{pts}"/>')
            y0 += PH + 25
        step = 5 if total > 20 else 1
        for t in range(0, int(total) + 1, step):
            parts.append(f'<text x="{L + (W - L - R) * t / total:.1f}" y="{y0 - 12}" '
                         f'text-anchor="middle" fill="#666">{t}</text>')
        y0 += 8
        x = L
        for mode in ("control",) + MODES:
            parts.append(f'<line x1="{x}" x2="{x + 20}" y1="{y0}" y2="{y0}" '
                         f'stroke="{COLORS[mode]}" stroke-width="2"/>'
                         f'<text x="{x + 24}" y="{y0 + 4}">{mode}</text>')
            x += 90
        parts.append(f'<text x="{W - R}" y="{y0 + 4}" text-anchor="end" fill="#666">'
                     f'seconds into the run (first {phases[0][2]:g} s: warm-up)</text>')
        y0 += 40
    parts.append("</svg>")
    return "\n".join(parts)


SERVER_ORDER = ("redis7.0", "valkey8.1", "valkey9.1")


def render(res, docs_dir, bench_md):
    """The chart of this run (docs_dir/edge-TAG.svg and .png); with bench_md,
    its section from every bench/edge/results-*.json, else docs_dir/edge-table.md."""
    tag = res["meta"]["server"]
    os.makedirs(docs_dir, exist_ok=True)
    svg_path = os.path.join(docs_dir, f"edge-{tag}.svg")
    with open(svg_path, "w") as f:
        f.write(svg_chart(res))
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-o", svg_path[:-4] + ".png", svg_path], check=True)
    tbl = table(res)
    if bench_md and os.path.exists(bench_md):
        every = []
        for path in glob.glob(os.path.join(HERE, "results-*.json")):
            with open(path) as f:
                every.append(json.load(f))
        every.sort(key=lambda d: (SERVER_ORDER.index(d["meta"]["server"])
                                  if d["meta"]["server"] in SERVER_ORDER else 99))
        replace_section(bench_md, every)
    else:
        with open(os.path.join(docs_dir, "edge-table.md"), "w") as f:
            f.write(tbl + "\n")
    return tbl


BEGIN, END = "<!-- edge-bench:begin -->", "<!-- edge-bench:end -->"


def replace_section(path, every):
    """BENCHMARKS.md: the edge section between its markers (added at the end
    the first time), one table set per server run."""
    body = [f"{BEGIN}\n## At the edge: HTTP gateways under Redis faults (`make bench-edge`)\n",
            "Generated by `bench/edge/edge.py` from `bench/edge/results-*.json`. One run per "
            "server, on a shared 2-core machine (load average when it ended below; other "
            "engineers' builds and tests were running): absolute figures are noisy, compare "
            "within one run. Latency is end to end from the request's due time (open loop). "
            "Control: the requests on the unlimited path in the same run and phase (absolute "
            "ms); added: a limited request percentile minus the control's; >3 ms / >5 ms: "
            "limited requests more than 3 / 5 ms above the control's median; panic: decisions "
            "by the panic limits. The phases, the chart and what was learned: "
            "[docs/edge.md](docs/edge.md).\n"]
    for res in every:
        m = res["meta"]
        fi = [v for runs in res["runs"].values() for run in runs.values() for t, w, v in run["marks"]
              if w == "fork_info"]
        fork = ", ".join(f"{v['latest_fork_usec'] / 1000:.0f}" for v in fi)
        body.append(f"### {m['server']}: {m['date']}\n\nLoad average {m['loadavg']} at the "
                    f"end, {m['elapsed_s'] / 60:.1f} min; dataset {m['data_gb']:g} GB for the "
                    f"fork (each run's fork: {fork} ms).\n\n{table(res)}")
    body.append(f"{END}\n")
    with open(path) as f:
        s = f.read()
    new = "\n".join(body)
    if BEGIN in s and END in s:
        a = s.index(BEGIN)
        b = s.index(END) + len(END) + 1
        s = s[:a] + new + s[b:]
    else:
        s = s.rstrip("\n") + "\n\n" + new
    with open(path, "w") as f:
        f.write(s)


# ------------------------------------------------------------------- main

def finish_run(run, phases):
    out = {k: v for k, v in run.items() if k != "records"}
    out["series"] = series(run, 0.5)
    out["phases"] = analyse(run, phases)
    return out


def check(res):
    """What a run must show to count: every mode decided, denied the abusive
    tenant, went to its panic limits while Redis was away, and nothing died."""
    problems = []
    for gw, runs in res["runs"].items():
        for mode, run in runs.items():
            gst = run["gateway_stats"]
            if not all(run["alive"].values()):
                problems.append(f"{gw}/{mode}: a process died: {run['alive']}")
            if run["errors"]:
                problems.append(f"{gw}/{mode}: faults failed: {run['errors']}")
            if run["summary"]["done"] == 0:
                problems.append(f"{gw}/{mode}: no request answered")
            if gst["unlimited"] == 0:
                problems.append(f"{gw}/{mode}: no control request reached the gateway")
            if gst["redis_decisions"] == 0:
                problems.append(f"{gw}/{mode}: no decision from Redis")
            own = {"lua": "decisions_lua", "module": "decisions_module",
                   "leased": "decisions_local"}[mode]
            if not metrics_of(gst).get(own):
                problems.append(f"{gw}/{mode}: no decision by {own} (the mode did not run)")
            if gst["denied"] == 0:
                problems.append(f"{gw}/{mode}: the abusive tenant was never denied")
            if gst["fallbacks"] == 0:
                problems.append(f"{gw}/{mode}: the outage never reached the panic limits")
            if run["summary"]["s5xx"]:
                problems.append(f"{gw}/{mode}: {run['summary']['s5xx']} responses 5xx")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--server", default="redis7.0")
    ap.add_argument("--tag", default=None)
    ap.add_argument("--out", default=None,
                    help="write the results and reports there, not into the tree "
                         "(required with --quick)")
    ap.add_argument("--data-gb", type=float, default=2.0,
                    help="dataset for the fork stall (GB of 1000-byte values, default 2)")
    ap.add_argument("--gateways", default=",".join(GATEWAYS))
    ap.add_argument("--modes", default=",".join(MODES),
                    help="a subset, for development")
    ap.add_argument("--render-only", default=None)
    args = ap.parse_args(argv)
    tag = args.tag or (args.server if args.server in servers.SERVERS
                       else os.path.basename(args.server))
    if args.render_only:
        with open(args.render_only) as f:
            res = json.load(f)
        print(render(res, os.path.join(ROOT, "docs"), os.path.join(ROOT, "BENCHMARKS.md")))
        return 0
    if args.quick and not args.out:
        ap.error("--quick needs --out DIR (the quick run does not touch the tree)")
    b = Bench(args)
    phases = b.phases
    res = {"meta": {"server": tag, "quick": args.quick, "phases": phases, "total_s": b.total,
                    "timeout_ms": TIMEOUT_MS, "retry_ms": RETRY_MS, "lease_batch": LEASE_BATCH,
                    "fraction": FRACTION, "tenants": TENANTS, "gateways": {},
                    "data_gb": 0 if args.quick else args.data_gb},
           "runs": {}}
    t_start = time.time()
    try:
        for gw in args.gateways.split(","):
            cap = b.capacity(gw)
            rate = max(50, int(cap * FRACTION))
            r = max(1, rate // 80)     # the abusive tenant: 20 r, a quarter of the load
            res["meta"]["gateways"][gw] = {"capacity": cap, "rate": rate, "r": r}
            res["runs"][gw] = {}
            for mode in args.modes.split(","):
                log(f"{gw}/{mode}: {rate} req/s for {b.total:.0f} s")
                done = finish_run(b.run(gw, mode, rate, r), phases)
                res["runs"][gw][mode] = done
                st = done["phases"].get("stall", {})
                log(f"{gw}/{mode}: steady p99 {done['phases']['steady']['p99']:.2f} ms, "
                    f"stall p99 {st.get('p99', float('nan')):.2f} ms, "
                    f"timeouts {done['summary']['timeouts']}, 5xx {done['summary']['s5xx']}")
    finally:
        b.close()
    res["meta"]["date"] = datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")
    res["meta"]["loadavg"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    res["meta"]["elapsed_s"] = time.time() - t_start
    problems = check(res)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(res, f)
        render(res, args.out, None)
    else:
        path = os.path.join(HERE, f"results-{tag}.json")
        with open(path, "w") as f:
            json.dump(res, f, indent=1)
        print(render(res, os.path.join(ROOT, "docs"), os.path.join(ROOT, "BENCHMARKS.md")))
    log(f"done in {res['meta']['elapsed_s']:.0f} s")
    if problems:
        for p in problems:
            log(f"FAILED: {p}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
