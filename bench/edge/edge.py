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

For each gateway (examples/node, examples/python, examples/rust; the Rust
one is target/quick/rl-gateway of `make gateway-rust`, or RL_GATEWAY_RUST),
in front of its own trivial upstream (the Rust one in front of Node's), one
Redis server with the module (--server, default
redis7.0 of rltesting.servers (testing/)) and three runs with the same load and
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
import json
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
from report import (  # noqa: E402  (bench/edge/report.py: analysis and reports)
    GATEWAYS, INSTANCES, MODES, analyse, capacity_of, metrics_of, render, series)

MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "release",
                                                  "libredis_ratelimit.so"))
RUST_GATEWAY = os.environ.get("RL_GATEWAY_RUST") or os.path.join(ROOT, "target", "quick",
                                                                   "rl-gateway")
CONTROL_EVERY = 4       # every 4th request of the mix goes to an unlimited path
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
    elif gw == "rust":
        head = [RUST_GATEWAY]
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
    if gw in ("node", "rust"):   # the Rust gateway: in front of the faster of the two
        return ["node", os.path.join(ROOT, "examples", "node", "upstream.js"), "--port", str(port)]
    return [sys.executable, os.path.join(ROOT, "examples", "python", "upstream.py"),
            "--port", str(port)]


def http_ok(url):
    with urllib.request.urlopen(url, timeout=1) as r:
        return r.status == 200


def stats(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_gateway/stats", timeout=2) as r:
        return json.load(r)



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

    def trips(self, started, marks, port):
        """Samples the gateway's breaker trips at every phase boundary (its own
        thread: a slow stats page must not delay a fault)."""
        for t in sorted({p[1] for p in self.phases} | {p[2] for p in self.phases}):
            delay = started + t - time.time()
            if delay > 0:
                time.sleep(delay)
            try:
                marks.append((t, "trips", metrics_of(stats(port)).get("trips")))
            except OSError:
                marks.append((t, "trips", None))

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
            tt = threading.Thread(target=self.trips, args=(started, marks, port))
            ft.start()
            tt.start()
            so, se = lp.communicate()
            ft.join()
            tt.join()
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
    ap.add_argument("--rate", type=int, default=0,
                    help="offer this many req/s to each gateway instead of FRACTION of its "
                         "measured capacity (no capacity run), for development")
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
            if args.rate:   # a fixed load: runs before and after a change compare
                cap, rate = 0, args.rate
            else:
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
