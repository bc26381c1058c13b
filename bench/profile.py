#!/usr/bin/env python3
"""Where a request's time goes: instruction counts per call under callgrind.

For each server build, starts one server (with the module and the floor
module) under `valgrind --tool=callgrind`, drives it with redis-benchmark
(pipeline 16, 50 clients, as `make bench`), and for each case zeroes the
counters, runs N requests and dumps them. The counts are deterministic
(instructions, not time), so unlike throughput they do not depend on what
else runs on this shared machine. Writes docs/PROFILE.md.

Cases: INCR; the floor (`FLOOR.WRITE` of /work/shared/floor/floor.c: the
least any module command with this contract does, built here with the
redismodule.h the redis-module crate bundles); each RL command granting and
denying; the token-bucket Lua twin granting. For the module commands the
handler is split into the module API calls it makes and the module's own
code (the handler minus those).

Servers: `--server` NAME or PATH, repeatable; NAME is one of
integration/servers.py (redis7.0, valkey8.1, valkey9.1), `all` is all of
them (the default when integration/servers.py is there, else redis-server).

Usage: bench/profile.py [--server S ...] [--requests N] [--out docs/PROFILE.md] [--json bench/profile.json]
"""

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get("RL_MODULE", os.path.join(ROOT, "target", "release", "libredis_ratelimit.so"))
HOUR = 3600000
FLOOR_C = os.environ.get("FLOOR_C", "/work/shared/floor/floor.c")

# (label, redis-benchmark command, kind): kind picks the command body row.
CASES = [
    ("INCR", ["INCR", "k:__rand_int__"], "incr"),
    ("FLOOR.WRITE (the floor)", ["FLOOR.WRITE", "fl:__rand_int__", "1000000000", "1", str(HOUR)], "floor"),
    ("RL.TOKENBUCKET granted", ["RL.TOKENBUCKET", "tb:__rand_int__", "1000000000", "1", "1000"], "module"),
    ("RL.TOKENBUCKET denied", ["RL.TOKENBUCKET", "tbd:__rand_int__", "1", "1", str(HOUR)], "module"),
    ("RL.SLIDINGCOUNTER granted", ["RL.SLIDINGCOUNTER", "sc:__rand_int__", "1000000000", "60000"], "module"),
    ("RL.SLIDINGCOUNTER denied", ["RL.SLIDINGCOUNTER", "scd:__rand_int__", "1", str(HOUR)], "module"),
    ("RL.SLIDINGLOG granted", ["RL.SLIDINGLOG", "sl:__rand_int__", "1000000000", "60000"], "module"),
    ("RL.SLIDINGLOG denied", ["RL.SLIDINGLOG", "sld:__rand_int__", "1", str(HOUR)], "module"),
    ("RL.MULTI 1 limit granted", ["RL.MULTI", "1", "m1:__rand_int__", "TOKENBUCKET", "1000000000", "1", "1000"], "module"),
    ("RL.MULTI 2 limits granted", ["RL.MULTI", "2", "ma:__rand_int__", "mb:__rand_int__", "TOKENBUCKET", "1000000000", "1",
                                   "1000", "TOKENBUCKET", "1000000000", "1", "1000"], "module"),
    ("Lua token bucket granted", None, "lua"),
]

# Module API calls a handler makes, by row.
API_ROWS = [
    ("RM_OpenKey + RM_CloseKey (key lookup, incl. the expiry check)", ["RM_OpenKey", "RM_CloseKey"]),
    ("RM_ModuleTypeSetValue (new keys only)", ["RM_ModuleTypeSetValue"]),
    ("RM_SetAbsExpire / RM_SetExpire", ["RM_SetAbsExpire", "RM_SetExpire"]),
    ("RM_SignalModifiedKey", ["RM_SignalModifiedKey"]),
    ("RM_Replicate (the effect, when something can read it)", ["RM_Replicate"]),
    ("RM_ReplicateVerbatim (counts the change when nothing can)", ["RM_ReplicateVerbatim"]),
    ("  of which lookupCommandByCString", ["lookupCommandByCString"]),
    ("RM_ReplyWithArray + 5 × RM_ReplyWithLongLong", ["RM_ReplyWithArray", "RM_ReplyWithLongLong"]),
    ("RM_StringPtrLen (reading arguments)", ["RM_StringPtrLen"]),
    ("RM_KeyType, RM_ModuleTypeGetType/GetValue (what the key holds)",
     ["RM_KeyType", "RM_ModuleTypeGetType", "RM_ModuleTypeGetValue"]),
]
# Rows that are part of another row (not subtracted again).
NESTED = {"lookupCommandByCString"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=120).stdout.strip()


def wait(cond, what, timeout=120):
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            sys.exit("profile: timed out waiting for " + what)
        time.sleep(0.2)


def inclusive(path):
    """Function name -> inclusive instruction count (the real function, not
    its inlined pieces), plus the program total."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = None
    funcs = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m:
            continue
        n = int(m.group(1).replace(",", ""))
        rest = m.group(2)
        if rest.startswith("PROGRAM TOTALS"):
            total = n
            continue
        fm = re.match(r"(.*?):(\S+) \[(.*)\]$", rest)
        if not fm:
            continue  # an inlined range, attributed to a source file
        name = fm.group(2)
        # Valkey names the module API VM_* and its dispatcher after itself.
        if name.startswith("VM_"):
            name = "RM_" + name[3:]
        elif name == "ValkeyModuleCommandDispatcher":
            name = "RedisModuleCommandDispatcher"
        funcs[name] = max(funcs.get(name, 0), n)
    return total, funcs


def resolve_servers(specs):
    """[(name, binary)] for --server arguments: a path, a name of
    integration/servers.py, or `all`."""
    sys.path.insert(0, os.path.join(ROOT, "integration"))
    try:
        import servers as known  # integration/servers.py
    except ImportError:
        known = None
    if not specs:
        specs = ["all"] if known else [shutil.which("redis-server") or "redis-server"]
    out = []
    for spec in specs:
        for item in spec.split(","):
            if item == "all":
                if not known:
                    sys.exit("profile: `all` needs integration/servers.py; give server binaries instead")
                out += [(n, known.server_path(n)) for n in known.SERVERS]
            elif os.sep in item or os.path.exists(item):
                out.append((None, os.path.abspath(item)))
            elif known and item in known.SERVERS:
                out.append((item, known.server_path(item)))
            else:
                sys.exit("profile: unknown server %r (a path, all, or a name of integration/servers.py)" % item)
    return out


def server_version(binary):
    """('Redis 7.0.15' / 'Valkey 9.1.2', malloc) from `--version`."""
    v = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    product = "Valkey" if v.lower().startswith("valkey") else "Redis"
    ver = re.search(r"v=(\S+)", v)
    mal = re.search(r"malloc=(\S+)", v)
    return "%s %s" % (product, ver.group(1) if ver else "?"), mal.group(1) if mal else "?"


def build_floor(tmp):
    """floor.so from FLOOR_C, or None (with a note) when it is not there."""
    if not os.path.exists(FLOOR_C):
        print("profile: %s not found: the floor rows are left out" % FLOOR_C, flush=True)
        return None
    headers = glob.glob(os.path.expanduser("~/.cargo/registry/src/*/redis-module-*/src/include/redismodule.h"))
    if not headers:
        sys.exit("profile: redismodule.h not found (the redis-module crate bundles it: run `cargo build` once)")
    out = os.path.join(tmp, "floor.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I", os.path.dirname(sorted(headers)[-1]), FLOOR_C,
                    "-o", out], check=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", help="NAME, PATH or all (repeatable; default all)")
    ap.add_argument("--requests", type=int, default=100000)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "PROFILE.md"))
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "profile.json"), help="where the raw counts go")
    ap.add_argument("--from-json", help="rewrite the report from a saved bench/profile.json")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as fh:
            saved = json.load(fh)
        write(a.out, saved["requests"], saved["servers"])
        return
    for tool in ("valgrind", "callgrind_annotate", "callgrind_control", "redis-benchmark", "redis-cli", "gcc"):
        if not shutil.which(tool):
            sys.exit("profile: %s is required (make deps installs it)" % tool)
    n = a.requests
    tmp = tempfile.mkdtemp(prefix="rl-profile-")
    floor = build_floor(tmp)
    runs = []
    for name, binary in resolve_servers(a.server):
        version, malloc = server_version(binary)
        print("== %s (%s, malloc=%s)" % (name or binary, version, malloc), flush=True)
        sdir = tempfile.mkdtemp(prefix="srv-", dir=tmp)
        runs.append({"name": name or version, "version": version, "malloc": malloc, "binary": binary,
                     "results": profile_server(binary, floor, n, sdir)})
    with open(a.json, "w") as fh:
        json.dump({"requests": n, "servers": runs}, fh, indent=1)
    write(a.out, n, runs)
    shutil.rmtree(tmp, ignore_errors=True)


def profile_server(binary, floor, n, tmp):
    """Every case on one server build: [(label, cmd, kind, total, funcs)]."""
    modules = ["--loadmodule", MODULE] + (["--loadmodule", floor] if floor else [])
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + os.path.join(tmp, "cg.out"),
         binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tmp] + modules,
        stdout=open(os.path.join(tmp, "server.log"), "w"), stderr=subprocess.STDOUT)
    results = []
    replica = None
    try:
        deadline = time.time() + 120
        while cli(port, "PING") != "PONG":
            if time.time() > deadline or server.poll() is not None:
                sys.exit("profile: %s under valgrind did not start (see %s)" % (binary, tmp))
            time.sleep(0.5)
        with open(os.path.join(ROOT, "lua", "tokenbucket.lua")) as f:
            sha = cli(port, "SCRIPT", "LOAD", f.read())
        dumps = 0
        for phase in ("standalone", "replica"):
            if phase == "standalone":
                # The module replicates effects until its first check finds
                # no replica, no backlog and no AOF (src/listeners.rs).
                wait(lambda: "ratelimit_effects_replicated:0" in cli(port, "INFO", "ratelimit"),
                     "the module to see a standalone server")
            else:
                rport = free_port()
                replica = subprocess.Popen(
                    [binary, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", tmp, "--dbfilename", "replica.rdb"] + modules,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait(lambda: cli(rport, "PING") == "PONG", "the replica to start")
                cli(rport, "REPLICAOF", "127.0.0.1", port)
                wait(lambda: "master_link_status:up" in cli(rport, "INFO", "replication"), "the replica link")
            for label, cmd, kind in CASES:
                if kind == "floor" and not floor:
                    continue
                if phase == "replica" and not (kind in ("incr", "floor") or "granted" in label and kind == "module"):
                    continue
                if cmd is None:
                    cmd = ["EVALSHA", sha, "1", "ltb:__rand_int__", "1000000000", "1", "1000"]
                label = "%s, %s" % (label, "no replica" if phase == "standalone" else "replica attached")
                bench = ["redis-benchmark", "-p", str(port), "-P", "16", "-c", "50", "-r", "1000", "-q"]
                # Warm up: keys exist, denied keys are drained, buffers are sized.
                # (20 calls per key on average: every key of a "denied" case is drained.)
                subprocess.run(bench + ["-n", str(max(n // 5, 20000))] + cmd, capture_output=True, check=True)
                subprocess.run(["callgrind_control", "-z", str(server.pid)], capture_output=True, check=True)
                subprocess.run(bench + ["-n", str(n)] + cmd, capture_output=True, check=True)
                subprocess.run(["callgrind_control", "-d", str(server.pid)], capture_output=True, check=True)
                dumps += 1
                files = [p for p in glob.glob(os.path.join(tmp, "cg.out*")) if re.search(r"\.%d$" % dumps, p)]
                if not files:
                    sys.exit("profile: no callgrind dump for %s" % label)
                total, funcs = inclusive(files[0])
                body = BODY[kind]
                if not total or funcs.get(body, 0) < n:
                    sys.exit("profile: %s: the dump does not show %s run %d times" % (label, body, n))
                if kind == "module":
                    # Granted calls replicate their effect with a replica, and
                    # only count the change without; denied calls do neither.
                    expect = {"RM_Replicate": "granted" in label and phase == "replica",
                              "RM_ReplicateVerbatim": "granted" in label and phase == "standalone"}
                    for fn, yes in expect.items():
                        if (funcs.get(fn, 0) > 0) != yes:
                            sys.exit("profile: %s: %s %s" % (label, fn, "not called" if yes else "called"))
                results.append((label, cmd, kind, total, funcs))
                print("%-48s %7.0f instructions per request" % (label, total / n), flush=True)
    finally:
        if replica is not None:
            replica.kill()
            replica.wait()
        cli(port, "SHUTDOWN", "NOSAVE")
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    return results


# The function whose inclusive count is the command body, by case kind.
BODY = {"incr": "incrCommand", "module": "RedisModuleCommandDispatcher", "floor": "RedisModuleCommandDispatcher",
        "lua": "evalShaCommand"}


def phase_of(label):
    return label.rsplit(", ", 1)[-1]


def write(path, n, runs):
    per = lambda v: v / n  # noqa: E731
    lines = []
    w = lines.append
    w("# Profile: instructions per request")
    w("")
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    w("Generated by `make profile` (`bench/profile.py`) on %s; do not edit by hand." % stamp)
    w("")
    w("Each server build (%s) runs with the module and the floor module under `valgrind "
      "--tool=callgrind`; each case is `redis-benchmark -P 16 -c 50 -r 1000 -n %d` after a warm-up, with "
      "the counters zeroed before and dumped after, so every figure is instructions per request, measured "
      "on the server. Instruction counts are deterministic: unlike requests/s they do not move with the "
      "load of this shared machine. They are not time (cache misses and system calls cost more than their "
      "instruction count), so the ratios here differ from `BENCHMARKS.md`, but they show where the work "
      "is. The cases run twice: on a standalone server (no replica, no backlog, no AOF: the module then "
      "skips building effects nobody can read, see `src/listeners.rs`), then with a replica attached "
      "(every grant replicates its effect; INCR and the floor feed the replica their command)."
      % (", ".join("%s (malloc=%s)" % (r["version"], r["malloc"]) for r in runs), n))
    w("")
    w("The floor is `FLOOR.WRITE key a b c` of `/work/shared/floor/floor.c`, built with the redismodule.h "
      "the redis-module crate bundles: parse three numbers, open the key for writing, keep a 16-byte "
      "module value, set a relative expiry, `ReplicateVerbatim`, reply five integers. It is the least a "
      "native command with this contract does; the target is within 10% of it (× floor ≤ 1.10) for every "
      "command on every server.")
    w("")
    w("## Summary")
    w("")
    w("| case | " + " | ".join("%s | × floor" % r["version"] for r in runs) + " |")
    w("|---|" + "---:|---:|" * len(runs))
    labels = []
    for r in runs:
        for res in r["results"]:
            if res[0] not in labels:
                labels.append(res[0])
    for label in labels:
        cells = []
        for r in runs:
            by = {res[0]: res for res in r["results"]}
            floor = {phase_of(res[0]): per(res[3]) for res in r["results"] if res[2] == "floor"}
            res = by.get(label)
            if res is None:
                cells += ["", ""]
                continue
            f = floor.get(phase_of(label))
            cells += ["%.0f" % per(res[3]), "%.2f" % (per(res[3]) / f) if f else ""]
        w("| %s | %s |" % (label, " | ".join(cells)))
    w("")
    w("\"× floor\" is the case's count divided by the floor's on the same server in the same setting "
      "(lower is cheaper). On Redis 7.0 the module reads the clock itself; on Valkey (and Redis 7.2+) it "
      "takes the server's cached command time (`RedisModule_CachedMicroseconds`, `src/clock.rs`).")
    w("")
    w("With a replica attached, a grant replicates its effect (`RedisModule_Replicate` of `RL.STATE key "
      "payload`, the state with its absolute expiry) where the floor replicates the command it received "
      "(`ReplicateVerbatim`). On Redis, `RedisModule_Replicate` looks the command name up on every call "
      "(`lookupCommandByCString`: an sds copy, a split on `|`, a dictionary lookup; the \"of which\" row "
      "below), which the module API offers no way around; that lookup is what puts the Redis 7.0 replica "
      "cases above 1.10. On Valkey the module sets `SKIP_COMMAND_VALIDATION` (`src/ffi.rs`) and the "
      "lookup is gone (Valkey still looks the name up during a slot export, where it needs the slot).")
    for r in runs:
        write_server(w, per, r)
    w("")
    w("Rerun: `make profile` (all servers, 5-8 minutes each on this loaded machine; needs valgrind, which `make deps` installs), "
      "or one server: `make profile SERVER=valkey9.1` (a name of `integration/servers.py` or a path).")
    w("")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("\n".join(lines))
    print("wrote", path)


def write_server(w, per, run):
    results = run["results"]
    incr = {phase_of(r[0]): per(r[3]) for r in results if r[2] == "incr"}
    w("")
    w("## %s (malloc=%s)" % (run["version"], run["malloc"]))
    w("")
    w("| case | per request | × INCR | command body | own code of the module |")
    w("|---|---:|---:|---:|---:|")
    for label, cmd, kind, total, f in results:
        own = "%.0f" % per(own_code(f)) if kind == "module" else ""
        w("| %s | %.0f | %.2f | %.0f | %s |" % (label, per(total), incr[phase_of(label)] / per(total),
                                                per(f.get(BODY[kind], 0)), own))
    w("")
    w("\"per request\" is everything the server does for one request: reading and parsing it, the "
      "command, the reply, bookkeeping, propagation. \"× INCR\" is the count of INCR in the same "
      "setting divided by the case's (higher is cheaper; the throughput ratio's counterpart). "
      "\"command body\" is `incrCommand`, the module dispatcher (the handler and every API call it "
      "makes) or `evalShaCommand`.")
    w("")
    w("### Inside a module command (%s)" % run["version"])
    w("")
    mods = [r for r in results if r[2] == "module"]
    w("| | " + " | ".join(r[0].replace("RL.", "").lower() for r in mods) + " |")
    w("|---|" + "---:|" * len(mods))
    for row, names in API_ROWS:
        w("| %s | %s |" % (row, " | ".join("%.0f" % per(sum(r[4].get(x, 0) for x in names)) for r in mods)))
    w("| the module's own code (parse, read the clock, decide, encode the effect) | %s |"
      % " | ".join("%.0f" % per(own_code(r[4])) for r in mods))
    w("| other module API calls | %s |" % " | ".join("%.0f" % per(
        sum(v for k, v in r[4].items() if k.startswith("RM_")) - sum(r[4].get(x, 0) for _, names in API_ROWS
                                                                     for x in names if x not in NESTED))
        for r in mods))
    w("| dispatch (module context set-up and tear-down) | %s |" % " | ".join("%.0f" % per(dispatch(r[4])) for r in mods))


def dispatch(f):
    return f.get("moduleCreateContext", 0) + f.get("moduleFreeContext", 0)


def own_code(f):
    """The dispatcher minus every module API call made under it and the
    context set-up: what the module's own instructions cost. (Callgrind's
    inclusive figure for the Rust handler itself is unreliable here, as
    the API is called through function pointers.)"""
    api = sum(v for k, v in f.items() if k.startswith("RM_"))
    return max(f.get("RedisModuleCommandDispatcher", 0) - api - dispatch(f), 0)


if __name__ == "__main__":
    main()
