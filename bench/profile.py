#!/usr/bin/env python3
"""Where a request's time goes: instructions per request under callgrind.

For each server build, one server process (the module and the floor module
loaded, `hz 1`, no persistence) runs under `valgrind --tool=callgrind`.
Every case's keys are written first (KEYS keys per case, twice over, so the
keyspace's dictionaries are sized and done rehashing), with TTLs of an
hour or more, so nothing expires during the run. Then, per case, WINDOWS
windows of N requests each (one connection, pipeline 16, every key in
turn): the counters are zeroed (`callgrind_control -z`) before a window
and dumped (`-d`) after it, and each window is counted inclusively

- inside `processInputBuffer`: the whole request (parsing it and the
  command with its reply; no cron, no socket writes), and
- inside `call()`: the command's own execution.

A case's figure is the median of its windows, per request. Instruction
counts do not move with the load of this shared machine; repeated runs
agree within about 1%. The ratio to the floor is floor / case (1.00: as
cheap as the floor; the target is 0.90 or more).

Cases: the floor (`FLOOR.WRITE`, and `FLOOR.MULTI` for RL.MULTI's shape, of
../shared/floor/floor.c, or FLOOR_C), RL.TOKENBUCKET, RL.SLIDINGCOUNTER,
RL.FIXEDWINDOW (windows of a day: see DAY), RL.SLIDINGLOG, RL.MULTI with 1 and 2 limits,
RL.CONCURRENCY (a held id's ACQUIRE: see CC_ID), all granted, and the
token-bucket Lua twin for context; once with the floor's numbers (10^9, 1,
3600000) and once with a typical limit, 100 an hour (100, 1, 3600000).
Last, with a replica attached (a plain server, not under valgrind), the
single commands against `FLOOR.EFFECT` (the floor replicated by effect)
with the typical numbers.

Servers: `--server` NAME or PATH, repeatable; NAME is one of
rltesting.servers, `all` is all of them (the default when
rltesting.servers is there, else redis-server).

Usage: bench/profile.py [--server S ...] [--requests N] [--keys K] [--windows W]
                        [--out docs/PROFILE.md] [--json bench/profile.json]
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "release", "libredis_ratelimit.so"))
FLOOR_C = os.environ.get("FLOOR_C", os.path.join(ROOT, "..", "shared", "floor", "floor.c"))
# RL.CONCURRENCY's floor of its own shape (FLOOR.LEASE: FLOOR.WRITE's work
# for a request of its six arguments), this repository's own.
LEASE_C = os.path.join(ROOT, "bench", "floor", "lease.c")
HOUR = "3600000"
BIG = "1000000000"
PIPELINE = 16

# (label, floor label or None, the command for key(s) k; "lua" is EVALSHA
# of lua/tokenbucket.lua). Three sets:
#
# - the floor's numbers: a capacity of 10^9, one token an hour, an hour's
#   expiry (ten-digit numbers: the floor's digit-by-digit parse costs more);
# - a typical limit, "100 an hour" (100, 1, 3600000), the floor given the
#   same numbers;
# - REPLICA_CASES: the typical limit with a replica attached, each single
#   command against FLOOR.EFFECT (the floor replicated by effect, as the
#   contract asks: docs/contract.md), run last, after a replica (a plain
#   server with both modules, not under valgrind) has synced.
TYPICAL = ("100", "1", HOUR)
# RL.FIXEDWINDOW's windows are epoch-aligned: an hour's window could end
# during a run and expire every key of the case at once (its figure would
# then count key creation). It runs with windows of a day instead (eight
# digits: the same one-word parse as the hour's seven).
DAY = "86400000"


def single(cmd, prefix, nums):
    """`cmd key nums...`, the window commands given `limit window_ms`."""
    cap, rate, period = nums
    if cmd == "RL.FIXEDWINDOW":
        return lambda k: [cmd, prefix + k, cap, DAY]
    if cmd in ("RL.SLIDINGCOUNTER", "RL.SLIDINGLOG"):
        return lambda k: [cmd, prefix + k, cap, period]
    return lambda k: [cmd, prefix + k, cap, rate, period]


def multi(cmd, n, prefix, nums):
    """`cmd n key... (TOKENBUCKET nums)...` (RL.MULTI or FLOOR.MULTI)."""
    keys = ["%s%s:" % (prefix, "ab"[i]) for i in range(n)]
    return lambda k: [cmd, str(n), *[p + k for p in keys], *(["TOKENBUCKET", *nums] * n)]


# CL.THROTTLE's numbers for each set: max_burst count period (seconds),
# one unit an hour as the token buckets refill, so that a key's TTL (the
# TAT ahead of now) is an hour or more from its first grant: the typical
# set 100 at once (99 1 3600, RL.TOKENBUCKET's 100 1 3600000); the floor's
# set the largest burst whose tolerance fits 2^63 ns at that rate, 10^6.
THROTTLE_NUMS = {BIG: ("1000000", "1", "3600"), "100": ("99", "1", "3600")}


def throttle(prefix, nums):
    burst, count, period = THROTTLE_NUMS[nums[0]]
    return lambda k: ["CL.THROTTLE", prefix + k, burst, count, period]


# RL.CONCURRENCY: an ACQUIRE of one unit by an id that already holds its
# lease (a retry: it renews, so every call writes, as every other case's
# does), a limit of the set's capacity, leases of an hour, and an id as
# gateways make them (a 36-character UUID, hashed on every call).
CC_ID = "7f3a9c2e-5b1d-4e8f-a6c0-2d9b8e4f1a3c"


def concurrency(prefix, nums, cmd="RL.CONCURRENCY"):
    return lambda k: [cmd, prefix + k, nums[0], HOUR, "ACQUIRE", CC_ID]


def case_set(suffix, pfx, nums):
    s, fw, fm = suffix, "FLOOR.WRITE" + suffix, "FLOOR.MULTI %d" + suffix
    return [
        (fw, None, single("FLOOR.WRITE", pfx + "fw:", nums)),
        (fm % 1, None, multi("FLOOR.MULTI", 1, pfx + "fm1", nums)),
        (fm % 2, None, multi("FLOOR.MULTI", 2, pfx + "fm2", nums)),
        ("RL.TOKENBUCKET" + s, fw, single("RL.TOKENBUCKET", pfx + "tb:", nums)),
        ("RL.SLIDINGCOUNTER" + s, fw, single("RL.SLIDINGCOUNTER", pfx + "sc:", nums)),
        ("RL.FIXEDWINDOW" + s, fw, single("RL.FIXEDWINDOW", pfx + "fx:", nums)),
        ("RL.SLIDINGLOG" + s, fw, single("RL.SLIDINGLOG", pfx + "sl:", nums)),
        ("RL.MULTI, 1 limit" + s, fm % 1, multi("RL.MULTI", 1, pfx + "m1", nums)),
        ("RL.MULTI, 2 limits" + s, fm % 2, multi("RL.MULTI", 2, pfx + "m2", nums)),
        ("CL.THROTTLE" + s, fw, throttle(pfx + "cl:", nums)),
        ("FLOOR.LEASE" + s, None, concurrency(pfx + "fl:", nums, "FLOOR.LEASE")),
        ("RL.CONCURRENCY" + s, "FLOOR.LEASE" + s, concurrency(pfx + "cc:", nums)),
        ("RL.CONCURRENCY vs FLOOR.WRITE" + s, fw, concurrency(pfx + "cw:", nums)),
    ]


CASES = case_set("", "", (BIG, "1", HOUR)) + [("Lua twin (token bucket)", "FLOOR.WRITE", "lua")] + case_set(
    ", 100/h", "t", TYPICAL)
REPLICA = ", 100/h, replica"
REPLICA_CASES = [
    ("FLOOR.EFFECT" + REPLICA, None, single("FLOOR.EFFECT", "rfe:", TYPICAL)),
    ("RL.TOKENBUCKET" + REPLICA, "FLOOR.EFFECT" + REPLICA, single("RL.TOKENBUCKET", "rtb:", TYPICAL)),
    ("RL.SLIDINGCOUNTER" + REPLICA, "FLOOR.EFFECT" + REPLICA, single("RL.SLIDINGCOUNTER", "rsc:", TYPICAL)),
    ("RL.FIXEDWINDOW" + REPLICA, "FLOOR.EFFECT" + REPLICA, single("RL.FIXEDWINDOW", "rfx:", TYPICAL)),
    ("RL.SLIDINGLOG" + REPLICA, "FLOOR.EFFECT" + REPLICA, single("RL.SLIDINGLOG", "rsl:", TYPICAL)),
    ("RL.CONCURRENCY" + REPLICA, "FLOOR.EFFECT" + REPLICA, concurrency("rcc:", TYPICAL)),
]
ALL_CASES = CASES + REPLICA_CASES
# The Lua twin costs ~15 native calls: its windows are a tenth as long.
LUA_SHARE = 10

# Module API calls inside call(), by row of the breakdown (Valkey's VM_*
# names are read as RM_*).
API_ROWS = [
    ("RM_OpenKey + RM_CloseKey", ["RM_OpenKey", "RM_CloseKey"]),
    ("RM_KeyType, RM_ModuleTypeGetType/GetValue", ["RM_KeyType", "RM_ModuleTypeGetType", "RM_ModuleTypeGetValue"]),
    ("RM_SetExpire / RM_SetAbsExpire", ["RM_SetExpire", "RM_SetAbsExpire"]),
    ("RM_SignalModifiedKey", ["RM_SignalModifiedKey"]),
    ("RM_ReplicateVerbatim / RM_Replicate", ["RM_ReplicateVerbatim", "RM_Replicate"]),
    ("RM_ReplyWithArray + RM_ReplyWithLongLong", ["RM_ReplyWithArray", "RM_ReplyWithLongLong"]),
    ("RM_StringPtrLen / RM_StringToLongLong (arguments)", ["RM_StringPtrLen", "RM_StringToLongLong"]),
    ("RM_Milliseconds / RM_CachedMicroseconds (clock)", ["RM_Milliseconds", "RM_CachedMicroseconds"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp(args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    """One RESP connection: pipelined requests, parsed replies."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=600)
        self.buf = b""
        self.pos = 0

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = self.buf[self.pos:i]
                self.pos = i + 2
                return line
            self._more()

    def _more(self):
        self.buf = self.buf[self.pos:]
        self.pos = 0
        chunk = self.s.recv(1 << 16)
        if not chunk:
            sys.exit("profile: the server closed the connection")
        self.buf += chunk

    def reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b":":
            return int(rest)
        if t == b"+":
            return rest.decode()
        if t == b"-":
            sys.exit("profile: error reply: %s" % rest.decode())
        if t == b"*":
            return [self.reply() for _ in range(int(rest))]
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) - self.pos < n + 2:
                self._more()
            v = self.buf[self.pos:self.pos + n]
            self.pos += n + 2
            return v.decode(errors="replace")
        sys.exit("profile: unexpected reply %r" % line)

    def call(self, *args):
        self.s.sendall(resp(args))
        return self.reply()

    def pipeline(self, reqs):
        """Send `reqs` (encoded) PIPELINE at a time; every reply must grant."""
        for i in range(0, len(reqs), PIPELINE):
            chunk = reqs[i:i + PIPELINE]
            self.s.sendall(b"".join(chunk))
            for req in chunk:
                r = self.reply()
                # CL.THROTTLE's first field is `limited`: 0 when granted.
                granted = 0 if b"\r\nCL.THROTTLE\r\n" in req[:32] else 1
                if not isinstance(r, list) or r[0] != granted:
                    sys.exit("profile: a request was not granted: %r" % (r,))


def start_server(cmd, port, log_dir, valgrind=None, what="the server"):
    """Start the server command line `cmd` (listening on 127.0.0.1:`port`),
    under callgrind writing to `valgrind` when given, its output in
    `log_dir`/server.log: (process, Conn) once it answers PING. Exits naming
    `what` (the process killed) if it stops or does not answer within 180 s
    (valgrind starts slowly). bench/strict_cost.py starts its servers here
    too."""
    if valgrind:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + valgrind, *cmd]
    with open(os.path.join(log_dir, "server.log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 180
    while True:
        if proc.poll() is not None or time.time() > deadline:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
            sys.exit("%s did not start (see %s)" % (what, log_dir))
        try:
            conn = Conn(port)
            conn.call("PING")
            return proc, conn
        except OSError:
            time.sleep(0.2)


def inclusive(path):
    """Function name -> inclusive instruction count."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    funcs = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        fm = re.match(r"(.*?):(\S+) \[(.*)\]$", m.group(2))
        if not fm:
            continue
        name = fm.group(2)
        if name.startswith("VM_"):
            name = "RM_" + name[3:]
        funcs[name] = max(funcs.get(name, 0), int(m.group(1).replace(",", "")))
    return funcs


def resolve_servers(specs):
    """[(name, binary)] for --server arguments: a path, a name of
    rltesting.servers, or `all`."""
    try:
        from rltesting import servers as known  # testing/, installed by make venv
    except ImportError:  # run by a Python without the test virtualenv
        known = None
    if not specs:
        specs = ["all"] if known else [shutil.which("redis-server") or "redis-server"]
    out = []
    for spec in specs:
        for item in spec.split(","):
            if item == "all":
                if not known:
                    sys.exit("profile: `all` needs rltesting.servers; give server binaries instead")
                out += [(n, known.server_path(n)) for n in known.SERVERS]
            elif os.sep in item or os.path.exists(item):
                out.append((None, os.path.abspath(item)))
            elif known and item in known.SERVERS:
                out.append((item, known.server_path(item)))
            else:
                sys.exit("profile: unknown server %r (a path, all, or a name of rltesting.servers)" % item)
    return out


def server_version(binary):
    """('Redis 7.0.15' / 'Valkey 9.1.2', malloc) from `--version`."""
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    product = "Valkey" if v.lower().startswith("valkey") else "Redis"
    ver = re.search(r"v=(\S+)", v)
    mal = re.search(r"malloc=(\S+)", v)
    return "%s %s" % (product, ver.group(1) if ver else "?"), mal.group(1) if mal else "?"


def build_floor(tmp):
    """floor.so from FLOOR_C, built with the redismodule.h the redis-module
    crate bundles."""
    if not os.path.exists(FLOOR_C):
        sys.exit("profile: %s not found (set FLOOR_C to floor.c)" % FLOOR_C)
    headers = glob.glob(os.path.expanduser("~/.cargo/registry/src/*/redis-module-*/src/include/redismodule.h"))
    if not headers:
        sys.exit("profile: redismodule.h not found (the redis-module crate bundles it: run `cargo build` once)")
    out = os.path.join(tmp, "floor.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", os.path.dirname(sorted(headers)[-1]), FLOOR_C,
                    "-o", out], check=True)
    lease = os.path.join(tmp, "lease.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", os.path.dirname(sorted(headers)[-1]), LEASE_C,
                    "-o", lease], check=True)
    return out, lease


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", help="NAME, PATH or all (repeatable; default all)")
    ap.add_argument("--requests", type=int, default=20000, help="requests per window")
    ap.add_argument("--keys", type=int, default=10000, help="keys per case")
    ap.add_argument("--windows", type=int, default=3, help="windows per case (the median is reported)")
    ap.add_argument("--case", action="append",
                    help="only the cases whose label contains this (repeatable; their floors run too)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "PROFILE.md"))
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "profile.json"), help="where the raw counts go")
    ap.add_argument("--from-json", help="rewrite the report from a saved bench/profile.json")
    ap.add_argument("--cell", default=os.environ.get("RL_CELL_SO"),
                    help="redis-cell's module (libredis_cell.so, built outside this repository): its own CL.THROTTLE is "
                         "counted too, on a server of its own, against the same floor")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as fh:
            write(a.out, json.load(fh))
        return
    for tool in ("valgrind", "callgrind_annotate", "callgrind_control", "gcc"):
        if not shutil.which(tool):
            sys.exit("profile: %s is required (make deps installs it)" % tool)
    if a.case:
        for cases in (CASES, REPLICA_CASES):
            keep = {label for label, _, _ in cases if any(c.lower() in label.lower() for c in a.case)}
            keep |= {fl for label, fl, _ in cases if label in keep and fl}
            cases[:] = [c for c in cases if c[0] in keep]
        ALL_CASES[:] = CASES + REPLICA_CASES
    tmp = tempfile.mkdtemp(prefix="rl-profile-")
    runs = []
    t0 = time.time()
    try:
        floor = build_floor(tmp)
        for name, binary in resolve_servers(a.server):
            version, malloc = server_version(binary)
            print("== %s (%s, malloc=%s)" % (name or binary, version, malloc), flush=True)
            sdir = tempfile.mkdtemp(prefix="srv-", dir=tmp)
            results = profile_server(binary, floor, a, sdir)
            if a.cell and not os.path.exists(a.cell):
                print("NOTE: no redis-cell at %s: its rows are left out" % a.cell, flush=True)
            elif a.cell:
                cdir = tempfile.mkdtemp(prefix="cell-", dir=tmp)
                results.update(profile_server(binary, floor, a, cdir, cell=os.path.abspath(a.cell)))
            runs.append({"name": name or version, "version": version, "malloc": malloc, "results": results})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = {"requests": a.requests, "keys": a.keys, "windows": a.windows, "pipeline": PIPELINE,
              "stamp": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(time.time() - t0),
              "servers": runs}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as fh:
        json.dump(report, fh, indent=1)
    write(a.out, report)


CELL_LABEL = "redis-cell's CL.THROTTLE"


CELL_SERVER = " (redis-cell's server)"


def cell_cases():
    """redis-cell's own command, with each set's numbers, and the floors
    measured again on its server (labelled apart: the first server's stay)."""
    fw, ft = "FLOOR.WRITE" + CELL_SERVER, "FLOOR.WRITE, 100/h" + CELL_SERVER
    return [(fw, None, single("FLOOR.WRITE", "cfw:", (BIG, "1", HOUR))),
            (ft, None, single("FLOOR.WRITE", "tcfw:", TYPICAL)),
            (CELL_LABEL, fw, throttle("rc:", (BIG,))),
            (CELL_LABEL + ", 100/h", ft, throttle("trc:", ("100",)))]


def profile_server(binary, floor, a, tmp, cell=None):
    """Every case on one server build: {label: {request, call, windows, api}}.
    With `cell`: redis-cell's module instead of this one, its CL.THROTTLE
    and the floors only."""
    port = free_port()
    out = os.path.join(tmp, "cg.out")
    floor, lease = floor
    modules = ["--loadmodule", cell or MODULE, *([] if cell else ["CL.THROTTLE"]), "--loadmodule", floor,
               "--loadmodule", lease]
    server, conn = start_server(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1",
         "--dir", tmp, *modules],
        port, tmp, valgrind=out, what="profile: %s under valgrind" % binary)
    results = {}
    procs = [(server, port)]  # shut down in reverse order
    dumps = [0]
    try:
        with open(os.path.join(ROOT, "lua", "tokenbucket.lua")) as f:
            sha = conn.call("SCRIPT", "LOAD", f.read())
        if cell:
            cases = cell_cases()
            run_cases(conn, server.pid, out, cases, sha, a, results, dumps)
            for c in cases:
                if c[0] not in [label for label, _, _ in ALL_CASES]:
                    ALL_CASES.append(c)
            return results
        # The module replicates effects until its first check finds no
        # replica, no backlog and no AOF (src/listeners.rs): wait for it.
        wait_effects(conn, 0, "a standalone server")
        run_cases(conn, server.pid, out, CASES, sha, a, results, dumps)
        if REPLICA_CASES:
            # A replica (not under valgrind) of the same build with the same
            # modules; then the module replicates effects (RL.STATE), the
            # floor its FLOOR.STATE.
            rdir = tempfile.mkdtemp(prefix="replica-", dir=tmp)
            rport = free_port()
            replica, rconn = start_server(
                [binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", rdir, "--replicaof", "127.0.0.1", str(port), *modules],
                rport, rdir, what="profile: the replica of %s" % binary)
            procs.append((replica, rport))
            deadline = time.time() + 300
            while "master_link_status:up" not in rconn.call("INFO", "replication"):
                if time.time() > deadline:
                    sys.exit("profile: the replica did not sync")
                time.sleep(0.2)
            wait_effects(conn, 1, "the replica")
            run_cases(conn, server.pid, out, REPLICA_CASES, sha, a, results, dumps)
    finally:
        for proc, p in reversed(procs):
            try:
                Conn(p).s.sendall(resp(["SHUTDOWN", "NOSAVE"]))
            except OSError:
                pass
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return results


def wait_effects(conn, on, what):
    """Wait until the module's INFO says it replicates effects (`on` 1) or
    not (0): its timer re-reads INFO replication every second."""
    deadline = time.time() + 120
    while "ratelimit_effects_replicated:%d" % on not in conn.call("INFO", "ratelimit"):
        if time.time() > deadline:
            sys.exit("profile: the module did not see %s" % what)
        time.sleep(0.2)


def run_cases(conn, pid, out, cases, sha, a, results, dumps):
    """Warm up and count `cases` on the server `pid` (callgrind writing to
    `out`), into `results`; `dumps[0]` counts the dumps so far."""
    def build(cmd, k):
        if cmd == "lua":
            # (The twin's exact range caps capacity × period: 10^6 here.)
            return resp(["EVALSHA", sha, "1", "lua:" + k, "1000000", "1", HOUR])
        return resp(cmd(k))

    keys = [str(i) for i in range(a.keys)]
    reqs = {label: [build(cmd, k) for k in keys] for label, _, cmd in cases}
    # Write every key, then once more: the dictionaries grow during the
    # first pass and finish rehashing (one bucket a lookup) in the second.
    for _ in range(2):
        for label, _, _ in cases:
            conn.pipeline(reqs[label])
    for label, _, cmd in cases:
        n = a.requests // LUA_SHARE if cmd == "lua" else a.requests
        window = [reqs[label][i % a.keys] for i in range(n)]
        per_window = []
        for _ in range(a.windows):
            conn.pipeline(window[:PIPELINE * 4])  # the client's buffers at their steady size
            subprocess.run(["callgrind_control", "-z", str(pid)], capture_output=True, check=True)
            conn.pipeline(window)
            subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
            dumps[0] += 1
            files = [p for p in glob.glob(out + "*") if re.search(r"\.%d$" % dumps[0], p)]
            if not files:
                sys.exit("profile: no callgrind dump for %s" % label)
            f = inclusive(files[0])
            for fn in ("processInputBuffer", "call"):
                if f.get(fn, 0) < n:
                    sys.exit("profile: %s: the dump does not show %s" % (label, fn))
            per_window.append({"request": f["processInputBuffer"] / n, "call": f["call"] / n,
                               "api": {k: v / n for k, v in f.items() if k.startswith("RM_")}})
        mid = sorted(per_window, key=lambda w: w["call"])[len(per_window) // 2]
        results[label] = {"request": statistics.median(w["request"] for w in per_window),
                          "call": statistics.median(w["call"] for w in per_window),
                          "windows": [[round(w["request"]), round(w["call"])] for w in per_window],
                          "api": mid["api"], "requests": n}
        r = results[label]
        print("%-34s request %7.0f  call() %7.0f   windows %s" % (label, r["request"], r["call"], r["windows"]),
              flush=True)


def write(path, report):
    runs = report["servers"]
    lines = []
    w = lines.append
    w("# Profile: instructions per request")
    w("")
    w("Generated by `make profile` (`bench/profile.py`) on %s (%d s); do not edit by hand."
      % (report["stamp"], report.get("seconds", 0)))
    w("")
    w("One server process per build (%s), with the module and the floor module, under `valgrind "
      "--tool=callgrind`, `hz 1`, no persistence, no replica but for the last set of cases. "
      "Every case's %d keys are written twice first, with TTLs of an hour or more (nothing expires "
      "during the run). Then each case runs %d "
      "windows of %d requests (one connection, pipeline %d, every key in turn; the Lua twin's windows are "
      "a tenth as long), all granted, with the counters zeroed (`callgrind_control -z`) before each window "
      "and dumped after it. Each figure is the median window's count per request, counted inclusively "
      "in `processInputBuffer` (**request**: parsing the request and running the command with its reply; "
      "no cron, no socket writes) and in `call()` (**call()**: the command's own execution). Instruction "
      "counts do not move with the load of the machine; repeated runs agree within about 1%%. They are "
      "not time (cache misses and system calls cost more than their count), so they do not replace "
      "`BENCHMARKS.md`, but they show where the work is."
      % (", ".join("%s (malloc=%s)" % (r["version"], r["malloc"]) for r in runs), report["keys"],
         report["windows"], report["requests"], report["pipeline"]))
    w("")
    w("The floor is `FLOOR.WRITE key a b c` of `floor/floor.c` (the shared floor "
      "module, `../shared/floor/floor.c` or `FLOOR_C`), built with the redismodule.h the redis-module "
      "crate bundles: parse three numbers, open the key for writing, keep a 16-byte module value, set a "
      "relative expiry, `ReplicateVerbatim`, reply five integers; `FLOOR.MULTI` does the same for each "
      "key with RL.MULTI's reply shape, and `FLOOR.EFFECT` replicates by effect (one `RedisModule_Replicate` "
      "of a 25-byte state) as the contract asks. It is the least a native command with this contract does. "
      "Three sets of cases, each command given the same numbers as its floor: the floor's own numbers (a "
      "capacity or limit of 10^9, one token an hour, windows of an hour: ten-digit numbers, whose "
      "digit-by-digit parse costs the floor more); **100/h**, a typical limit, 100 an hour (100, 1, "
      "3600000); and **100/h, replica**, the typical limit with a replica attached (a plain server of the "
      "same build with both modules, synced before the set runs), each single command against "
      "`FLOOR.EFFECT`. RL.FIXEDWINDOW's windows are a day instead of an hour (86400000): they are "
      "aligned on the clock, and an hour's could end during the run and expire all the case's keys at once. "
      "\"× floor\" is floor / case on the same server in the same run (1.000: as cheap as "
      "the floor; three decimals, so that a ratio just under the target does not round up to it); the "
      "target is 0.90 or more for every command on every server, by both measures.")
    w("")
    head = "| | " + " | ".join("%s request | %s call()" % (r["version"], r["version"]) for r in runs) + " |"
    w(head)
    w("|---|" + "---:|---:|" * len(runs))
    labels = [label for label, _, _ in ALL_CASES]
    floors = {label: fl for label, fl, _ in ALL_CASES}
    # redis-cell's rows (also when the report is rewritten from the JSON).
    for label in sorted({x for r in runs for x in r["results"] if CELL_SERVER in x} - set(labels)):
        labels.append(label)
        floors[label] = None
    for label in sorted({x for r in runs for x in r["results"] if x.startswith(CELL_LABEL)} - set(labels)):
        labels.append(label)
        floors[label] = label.replace(CELL_LABEL, "FLOOR.WRITE") + CELL_SERVER
    for label in labels:
        cells = []
        for r in runs:
            res = r["results"].get(label)
            if res is None:
                cells += ["", ""]
                continue
            fl = r["results"].get(floors[label]) if floors[label] else None
            for m in ("request", "call"):
                if fl:
                    cells.append("{:,.0f} ({:.3f}×)".format(res[m], fl[m] / res[m]))
                else:
                    cells.append("{:,.0f}".format(res[m]))
        name = label if floors[label] else "floor: " + label
        w("| %s | %s |" % (name, " | ".join(cells)))
    w("")
    cell = [(label, r["version"], r["results"][label]["request"], r["results"][label]["call"],
             r["results"].get(label.replace(CELL_LABEL, "CL.THROTTLE")))
            for r in runs for label in labels if label.startswith(CELL_LABEL) and label in r["results"]]
    if cell:
        w("CL.THROTTLE (this module's, loaded with the argument `CL.THROTTLE`, given max_burst count period "
          "as 1000000 1 3600 and 99 1 3600) against redis-cell 0.5's own (built outside this repository at "
          "commit 4d42338, loaded alone with the floor on a server of its own, the same numbers), per request / inside call():")
        w("")
        w("| server, case | redis-cell | this module | redis-cell / this module |")
        w("|---|---:|---:|---:|")
        for label, ver, req, call, ours in cell:
            if ours:
                w("| %s, %s | {:,.0f} / {:,.0f} | {:,.0f} / {:,.0f} | {:.2f}× / {:.2f}× |".format(
                    req, call, ours["request"], ours["call"], req / ours["request"], call / ours["call"])
                  % (ver, label.replace(CELL_LABEL, "CL.THROTTLE") or "CL.THROTTLE"))
        w("")
    w("RL.TOKENBUCKET, RL.SLIDINGCOUNTER, RL.FIXEDWINDOW, RL.SLIDINGLOG, CL.THROTTLE, RL.CONCURRENCY and the Lua twin are "
      "compared with `FLOOR.WRITE`; RL.MULTI with n limits with `FLOOR.MULTI` with n keys; with a replica, "
      "the single commands with `FLOOR.EFFECT`, all with the same numbers.")
    w("")
    w("## Module API calls inside call()")
    w("")
    w("Per request, inclusive, in the median window (Valkey's `VM_*` functions under their `RM_*` names). "
      "What is left of call() is the server's own command bookkeeping and the module's own code.")
    mods = [label for label, fl, cmd in ALL_CASES if cmd != "lua"]
    for r in runs:
        w("")
        w("### %s" % r["version"])
        w("")
        present = [m for m in mods if m in r["results"]]
        w("| | " + " | ".join(present) + " |")
        w("|---|" + "---:|" * len(present))
        for row, names in API_ROWS:
            w("| %s | %s |" % (row, " | ".join(
                "{:,.0f}".format(sum(r["results"][m]["api"].get(x, 0) for x in names)) for m in present)))
        w("| call(), all | %s |" % " | ".join("{:,.0f}".format(r["results"][m]["call"]) for m in present))
    w("")
    w("Windows (request, call() per request) of each case, to show the spread:")
    w("")
    for r in runs:
        w("- %s: %s" % (r["version"], "; ".join(
            "%s %s" % (label, " ".join("%d/%d" % tuple(x) for x in r["results"][label]["windows"]))
            for label in labels if label in r["results"])))
    w("")
    w("Rerun: `make profile` (every server of `rltesting.servers`; needs valgrind, which `make deps` "
      "installs), or one server: `make profile SERVER=valkey9.1` (a name or a path).")
    w("")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    print("wrote", path)


if __name__ == "__main__":
    main()
