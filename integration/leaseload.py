"""Conservation of RL.CONCURRENCY under load: client processes of many
workers each, acquiring and releasing leases on one key, some of them
crashing (a worker that abandons its lease, and a whole process killed
with SIGKILL and started again), every call timed on the server's clock.

Each worker sends `TIME, RL.CONCURRENCY ... ACQUIRE id, TIME` in one
pipeline (so the call ran at a server instant in [T0, T1]), holds what it
got for a random while, then releases it the same way, or abandons it.
Every event is appended to the worker's own log file as it happens (a
RELEASE also before it is sent), so a process killed at any point leaves
everything it knew. The checks, both
sound whatever the brackets' widths (they can miss a fault, never invent
one; each bracket is taken CLOCK_SLACK_US wider, as TIME's microseconds
were once seen out of order with the pipelines they bracket):

- **held units never exceed the limit**: the instants at which a lease
  was surely held (from the end of its ACQUIRE's bracket to the start of
  its RELEASE's, or to the start of its ACQUIRE's plus lease_ms for an
  abandoned one) never overlap more than `limit` at once;
- **lapsed leases free within their lease**: every denial is justified:
  at least `limit` leases might have been held during its bracket (from
  the start of their ACQUIRE's bracket to the end of their RELEASE's, or
  to the end of their ACQUIRE's plus lease_ms for one abandoned, lapsed
  before its release, or in flight in the killed process; an ACQUIRE the
  killed process sent without seeing its reply counts as held until the
  kill plus lease_ms, the kill's instant taken once the server has dropped
  the process's connections). A lease that outlived its lease_ms would
  show as a denial with fewer than `limit` possible holders.
- at the end, once the last lease could have lapsed, the key is gone.

    python integration/leaseload.py [--seconds 20] [--server valkey9.1]

prints the figures (bench: BENCHMARKS.md's RL.CONCURRENCY section);
test_concurrency_load.py runs it shorter.
"""
import argparse
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import redis

KEY = "rl:{load}:inflight"
# How far two TIME readings may disagree with the order the server ran
# their pipelines in (see analyse).
CLOCK_SLACK_US = 5


def server_us(t):
    return t[0] * 1_000_000 + t[1]


def worker(port, limit, lease_ms, seconds, crash_p, hold_ms, logpath, seed, deadline_us, name):
    """One worker's loop, logging every event to `logpath` as it happens.
    Its connection is named `name` (its process and generation)."""
    rng = random.Random(seed)
    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=30, client_name=name)
    n = 0
    with open(logpath, "a", buffering=1) as log:
        while True:
            n += 1
            rid = f"{seed}:{n}"
            log.write(f"try {rid}\n")
            p = c.pipeline(transaction=False)
            p.time()
            p.execute_command("RL.CONCURRENCY", KEY, limit, lease_ms, "ACQUIRE", rid)
            p.time()
            t0, rep, t1 = p.execute()
            t0, t1 = server_us(t0), server_us(t1)
            log.write(f"acq {rid} {t0} {t1} {rep[0]} {rep[3]}\n")
            if t1 >= deadline_us:
                if rep[0]:
                    release(c, log, rid, limit, lease_ms)
                return
            if not rep[0]:
                time.sleep(min(max(rep[3], 1), 20) / 1000 * rng.random())
                continue
            time.sleep(rng.random() * 2 * hold_ms / 1000)
            if rng.random() < crash_p:
                log.write(f"abandon {rid}\n")  # a crash: the lease is never released
                continue
            release(c, log, rid, limit, lease_ms)


def release(c, log, rid, limit, lease_ms):
    # Logged before it is sent: a process killed after this line may or
    # may not have released (the write reached the file before the call).
    log.write(f"relsend {rid}\n")
    p = c.pipeline(transaction=False)
    p.time()
    p.execute_command("RL.CONCURRENCY", KEY, limit, lease_ms, "RELEASE", rid)
    p.time()
    t0, rep, t1 = p.execute()
    log.write(f"rel {rid} {server_us(t0)} {server_us(t1)} {rep[0]}\n")


def process_main(a):
    """A client process: `workers` threads, each with its own log file."""
    threads = []
    for w in range(a.workers):
        path = os.path.join(a.logdir, f"p{a.proc}-{a.gen}-w{w}.log")
        args = (a.port, a.limit, a.lease_ms, a.seconds, a.crash, a.hold_ms, path,
                a.proc * 100_000 + a.gen * 1000 + w, a.deadline_us, client_name(a.proc, a.gen))
        threads.append(threading.Thread(target=worker, args=args, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def client_name(proc, gen):
    return f"leaseload-p{proc}-g{gen}"


def spawn(a, proc, gen, deadline_us):
    return subprocess.Popen([sys.executable, __file__, "--child", "--port", str(a.port), "--proc", str(proc),
                             "--gen", str(gen), "--workers", str(a.workers), "--limit", str(a.limit),
                             "--lease-ms", str(a.lease_ms), "--crash", str(a.crash), "--hold-ms", str(a.hold_ms),
                             "--logdir", a.logdir, "--deadline-us", str(deadline_us), "--seconds", str(a.seconds)])


def run(port, limit=32, lease_ms=300, seconds=20.0, processes=3, workers=64, crash=0.03, hold_ms=40,
        kill_at=0.4, logdir=None):
    """Run the load against the server on `port`; return the analysis."""
    c = redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)
    c.delete(KEY)
    logdir = logdir or tempfile.mkdtemp(prefix="rl-leaseload-")
    start_us = server_us(c.time())
    deadline_us = start_us + int(seconds * 1e6)
    a = argparse.Namespace(port=port, workers=workers, limit=limit, lease_ms=lease_ms, crash=crash,
                           hold_ms=hold_ms, logdir=logdir, seconds=seconds)
    procs = {p: spawn(a, p, 0, deadline_us) for p in range(processes)}
    kills = []  # (process, generation, server us right after the kill)
    # Kill one process (SIGKILL) part-way and start it again.
    while server_us(c.time()) < start_us + kill_at * seconds * 1e6:
        time.sleep(0.05)
    victim = random.Random(port).randrange(processes)
    procs[victim].send_signal(signal.SIGKILL)
    procs[victim].wait()
    # The kill's instant on the server: once it has dropped the victim's
    # connections, after running what they had sent (a loaded server may
    # still run a pipeline the process wrote just before it died).
    gone, waited_from = client_name(victim, 0), server_us(c.time())
    while any(cl.get("name") == gone for cl in c.client_list()):
        time.sleep(0.001)
    kills.append((victim, 0, server_us(c.time())))
    drain_us = kills[-1][2] - waited_from
    procs[victim] = spawn(a, victim, 1, deadline_us)
    for p in procs.values():
        p.wait(timeout=seconds + 120)
    return {**analyse(c, logdir, limit, lease_ms, kills, start_us), "kill_drain_us": drain_us}


def analyse(c, logdir, limit, lease_ms, kills, start_us):
    lease_us = lease_ms * 1000
    killed = {(p, g): t for p, g, t in kills}
    sure, maybe, denials = [], [], []
    stats = {"granted": 0, "denied": 0, "released": 0, "abandoned": 0, "lapsed_before_release": 0,
             "killed_in_flight": 0, "killed_unanswered": 0}
    for path in glob.glob(os.path.join(logdir, "*.log")):
        name = os.path.basename(path)
        proc, gen = int(name[1:name.index("-")]), int(name.split("-")[1])
        kill_t = killed.get((proc, gen))
        events = {}
        with open(path) as f:
            lines = f.read().splitlines()
        for line in lines:
            w = line.split()
            if not w:
                continue
            e = events.setdefault(w[1], {})
            if w[0] == "try":
                e["try"] = True
            elif w[0] == "acq" and len(w) == 6:
                e["acq"] = (int(w[2]), int(w[3]), int(w[4]), int(w[5]))
            elif w[0] == "rel" and len(w) == 5:
                e["rel"] = (int(w[2]), int(w[3]), int(w[4]))
            elif w[0] == "abandon":
                e["abandon"] = True
            elif w[0] == "relsend":
                e["relsend"] = True
        for rid, e in events.items():
            if "acq" not in e:
                # sent, no reply seen: only a killed process leaves these
                assert kill_t is not None, (path, rid)
                stats["killed_unanswered"] += 1
                maybe.append((start_us, kill_t + lease_us))
                continue
            a0, a1, granted, retry = e["acq"]
            if not granted:
                stats["denied"] += 1
                denials.append((a0, a1))
                continue
            stats["granted"] += 1
            if "rel" in e:
                r0, r1, freed = e["rel"]
                stats["released"] += 1
                if freed:
                    sure.append((a1, r0))
                    maybe.append((a0, r1))
                else:  # it lapsed first (held longer than its lease)
                    stats["lapsed_before_release"] += 1
                    sure.append((a1, a0 + lease_us))
                    maybe.append((a0, a1 + lease_us))
            else:
                if e.get("abandon"):
                    stats["abandoned"] += 1
                else:
                    assert kill_t is not None, (path, rid)
                    stats["killed_in_flight"] += 1
                # A release sent by a process killed before its reply may
                # have run: then nothing is sure after the grant.
                if not e.get("relsend"):
                    sure.append((a1, a0 + lease_us))
                maybe.append((a0, a1 + lease_us))
    # TIME's microseconds do not order two pipelines exactly: once in CI
    # (Valkey 9.1, ~100,000 denials) a RELEASE's closing TIME and a
    # denial's opening TIME read the same µs, yet the release ran after the
    # denial (the next ACQUIRE, 3 µs later with nothing released between,
    # was granted). So every bracket is taken CLOCK_SLACK_US wider for
    # "maybe held" and as much narrower for "surely held": still sound,
    # and a lease that outlives its lease_ms by more than that still shows.
    maybe = [(s - CLOCK_SLACK_US, e + CLOCK_SLACK_US) for s, e in maybe]
    sure = [(s + CLOCK_SLACK_US, e - CLOCK_SLACK_US) for s, e in sure]
    # Most surely-held leases at once: a sweep over their ends.
    points = sorted([(s, 1) for s, e in sure if s < e] + [(e, -1) for s, e in sure if s < e],
                    key=lambda x: (x[0], x[1]))
    held = most = 0
    for _, d in points:
        held += d
        most = max(most, held)
    # Each denial: the leases that might have been held during it.
    starts = sorted(s for s, _ in maybe)
    ends = sorted(e for _, e in maybe)
    import bisect
    least = None
    unjustified = 0
    examples = []
    for d0, d1 in denials:
        # maybe-intervals [s, e] meeting [d0, d1]: s <= d1 and e >= d0
        n = bisect.bisect_right(starts, d1) - bisect.bisect_left(ends, d0)
        least = n if least is None else min(least, n)
        if n < limit:
            unjustified += 1
            if len(examples) < 5:  # where it fell: from the start, and from each kill's lapse
                examples.append({"from_start_us": d0 - start_us, "bracket_us": d1 - d0, "holders": n,
                                 "from_kill_lapse_us": [d0 - (t + lease_us) for t in killed.values()]})
    last_end = max((e for _, e in maybe), default=start_us)
    now = server_us(c.time())
    while now <= last_end + 1000:
        time.sleep(min(0.05, (last_end + 1000 - now) / 1e6))
        now = server_us(c.time())
    gone = c.exists(KEY) == 0
    info = c.info("ratelimit")
    return {**stats, "limit": limit, "lease_ms": lease_ms, "most_surely_held": most,
            "fewest_possible_holders_at_a_denial": least, "unjustified_denials": unjustified,
            "unjustified_examples": examples,
            "key_gone_after_last_lease": gone, "kills": len(kills),
            "info_granted": info.get("ratelimit_concurrency_granted"),
            "info_denied": info.get("ratelimit_concurrency_denied"),
            "seconds": (now - start_us) / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--port", type=int)
    ap.add_argument("--proc", type=int, default=0)
    ap.add_argument("--gen", type=int, default=0)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--lease-ms", type=int, default=300)
    ap.add_argument("--crash", type=float, default=0.03)
    ap.add_argument("--hold-ms", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--logdir")
    ap.add_argument("--deadline-us", type=int)
    ap.add_argument("--server", default="valkey9.1", help="a name of rltesting.servers or a path")
    a = ap.parse_args()
    if a.child:
        process_main(a)
        return
    from rltesting import proc, servers  # the test servers' launcher (testing/)
    proc.REDIS_SERVER = a.server if os.sep in a.server else servers.server_path(a.server)
    s = proc.Server()
    try:
        out = run(s.port, a.limit, a.lease_ms, a.seconds, a.processes, a.workers, a.crash, a.hold_ms)
    finally:
        s.close()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
