"""Real redis-server processes for the integration suite.

Every server runs on 127.0.0.1 on a free port, in its own temp directory,
with the module loaded, and is killed (SIGKILL after a grace period) when
the test that started it finishes — also when the test fails.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get(
    "RL_MODULE", os.path.join(ROOT, "target", "release", "libredis_ratelimit.so")
)
REDIS_SERVER = os.environ.get("REDIS_SERVER", shutil.which("redis-server") or "redis-server")
REDIS_CLI = os.environ.get("REDIS_CLI", shutil.which("redis-cli") or "redis-cli")


class ServerBuild:
    """What REDIS_SERVER is, from `REDIS_SERVER --version`:
    "Redis server v=7.0.15 sha=... malloc=jemalloc-5.3.0 ..." or
    "Valkey server v=9.1.2 sha=... malloc=libc ...". Tests adapt to it
    (option names, RDB magic, allocator accounting) or skip with a reason.
    Asked on first use, so a script may still set harness.REDIS_SERVER
    after importing this module."""

    def __init__(self):
        self._probed = None

    def _probe(self):
        if self._probed is None or self._probed[0] != REDIS_SERVER:
            out = subprocess.run([REDIS_SERVER, "--version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=30).stdout
            words = out.split()
            fields = dict(w.split("=", 1) for w in words if "=" in w)
            if not words or words[0] not in ("Redis", "Valkey") or "v" not in fields:
                raise RuntimeError(f"{REDIS_SERVER} --version: unrecognised answer {out!r}")
            version = tuple(int(x) for x in fields["v"].split("."))
            self._probed = (REDIS_SERVER, words[0].lower(), version, fields.get("malloc", "?"))
        return self._probed

    @property
    def path(self):
        return self._probe()[0]

    @property
    def family(self):
        """"redis" or "valkey"."""
        return self._probe()[1]

    @property
    def version(self):
        """(major, minor, patch) as ints."""
        return self._probe()[2]

    @property
    def malloc(self):
        """"libc" (the Valkey wheels) or "jemalloc-5.3.0" (Debian's Redis)."""
        return self._probe()[3]

    @property
    def valkey(self):
        return self.family == "valkey"

    @property
    def rdb_magic(self):
        """The first bytes of the RDB files it writes (also an AOF preamble):
        Valkey 9 writes "VALKEY" + its own RDB version (080), earlier
        servers "REDIS" + a 4-digit version."""
        return b"VALKEY" if self.valkey and self.version >= (9,) else b"REDIS"

    def __str__(self):
        v = ".".join(map(str, self.version))
        return f"{'Valkey' if self.valkey else 'Redis'} {v} (malloc={self.malloc})"


SERVER = ServerBuild()


def free_port():
    """A TCP port that is free now (and whose +10000 cluster bus port is free too)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s2:
            try:
                s2.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def wait_until(pred, timeout=30.0, interval=0.01, what="condition"):
    """Poll `pred` until it returns a truthy value; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError) as e:
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what} (last error: {last_exc})")


class ServerProcess:
    """What every server process of the tests shares: `proc`, the log file
    LOG in `dir`, and how to tell it is alive and kill it."""
    LOG = "redis.log"

    def log_tail(self, n=40):
        try:
            with open(os.path.join(self.dir, self.LOG)) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


class Server(ServerProcess):
    """One redis-server process with the module loaded."""

    def __init__(self, args=(), module=True, dir=None, port=None):
        self.port = port or free_port()
        self.owns_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="rl-it-")
        self.extra = list(args)
        self.module = module
        self.proc = None
        self.start()

    def command_line(self):
        cmd = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--logfile", "redis.log",
            "--save", "",
            "--appendonly", "no",
            "--enable-debug-command", "yes",
            "--protected-mode", "no",
        ]
        if self.module:
            cmd += ["--loadmodule", MODULE]
        return cmd + self.extra

    def start(self):
        self.proc = subprocess.Popen(
            self.command_line(), cwd=self.dir,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self._ready, timeout=30, what=f"redis-server on {self.port}")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(
                f"redis-server exited with {self.proc.returncode}: {self.log_tail()}"
            )
        try:
            # no retries: redis-py 6+ would retry a refused connection with
            # backoff (in 7: seconds per server start)
            return self.client(retry=Retry(NoBackoff(), 0)).ping()
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.exceptions.ConnectionError:
            return False

    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)


    def stop(self):
        """Graceful shutdown without saving (SIGTERM), SIGKILL if it hangs."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def restart(self, extra=None):
        self.stop()
        if extra is not None:
            self.extra = list(extra)
        self.start()

    def close(self):
        self.kill9() if self.alive() else None
        if self.owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def module_commands():
    """(command, limit-arguments) for each of the three commands."""
    return [
        ("RL.TOKENBUCKET", lambda limit, ms: [limit, limit, ms]),
        ("RL.SLIDINGLOG", lambda limit, ms: [limit, ms]),
        ("RL.SLIDINGCOUNTER", lambda limit, ms: [limit, ms]),
    ]


# ---------------------------------------------------------------------------
# Helpers for the topology suites (replication, persistence, cluster).
# ---------------------------------------------------------------------------

# Parameters under which no unit ever comes back in a test's lifetime (the
# next token, window or log entry is ~285,000 years away): replies are then
# time-independent and grants can be counted exactly.
HUGE = (1 << 53) - 1
NEVER = {
    "RL.TOKENBUCKET": lambda limit: [limit, 1, HUGE],
    "RL.SLIDINGLOG": lambda limit: [limit, HUGE],
    "RL.SLIDINGCOUNTER": lambda limit: [limit, HUGE],
}
COMMANDS = ("RL.TOKENBUCKET", "RL.SLIDINGLOG", "RL.SLIDINGCOUNTER")
TYPE_NAMES = {
    "RL.TOKENBUCKET": "rl-tokbkt",
    "RL.SLIDINGLOG": "rl-slilog",
    "RL.SLIDINGCOUNTER": "rl-slicnt",
}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def options(cost=None, partial=False, dryrun=False, refund=None):
    """The options every command takes, as arguments (None/False: absent)."""
    args = [] if cost is None else ["COST", cost]
    if partial:
        args.append("PARTIAL")
    if dryrun:
        args.append("DRYRUN")
    if refund is not None:
        args += ["REFUND", refund]
    return args


def rl(client, cmd, key, params, cost=None, partial=False, dryrun=False):
    """One rate-limit call; returns the five integers, checked for shape."""
    reply = client.execute_command(cmd, key, *params, *options(cost, partial, dryrun))
    check_reply(reply, cost if cost is not None else 1, partial, params[0])
    return reply


def check_reply(reply, cost, partial, limit):
    """Invariants every reply keeps, whatever the state."""
    assert isinstance(reply, list) and len(reply) == 5, reply
    assert all(isinstance(x, int) for x in reply), reply
    allowed, lim, remaining, retry, reset = reply
    assert lim == limit, reply
    assert 0 <= remaining <= limit, reply
    assert reset >= 0, reply
    if partial:
        assert 0 <= allowed <= cost, reply
        full = allowed == cost
    else:
        assert allowed in (0, 1), reply
        full = allowed == 1
    if full:
        assert retry == 0, reply
    elif cost > limit:
        assert retry == -1, reply
    else:
        assert retry > 0, reply


def granted_units(reply, cost, partial):
    """Units a reply says were granted."""
    if partial:
        return reply[0]
    return cost if reply[0] == 1 else 0


def info_field(client, field, section=None):
    """One field of INFO (as returned by redis-py: int, str, ...)."""
    return client.info(section or "everything").get(field)


def wait_replica_synced(master, replica, timeout=30):
    """Wait until the replica has the master's full stream (by offset)."""
    def synced():
        ri = replica.info("replication")
        if ri.get("master_link_status") != "up":
            return False
        mo = master.info("replication")["master_repl_offset"]
        return ri.get("slave_repl_offset", -1) >= mo
    wait_until(synced, timeout=timeout, what="replica caught up with the master")


def start_replica(server_factory, master_server, args=()):
    """A replica of `master_server`, fully synced, and the master's sync fork
    gone. The master's diskless sync delay is set to 0 so the initial sync
    starts at once."""
    m = master_server.client()
    m.config_set("repl-diskless-sync-delay", 0)
    rep = server_factory(
        ["--replicaof", "127.0.0.1", str(master_server.port), "--repl-timeout", "3600", *args]
    )
    rc = rep.client()
    wait_until(
        lambda: rc.info("replication").get("master_link_status") == "up",
        what="replica link up",
    )
    wait_replica_synced(m, rc)
    # The master's sync child may outlive the transfer (Redis 8 keeps it a
    # moment longer); until it exits the master refuses SAVE and BGSAVE.
    wait_until(lambda: m.info("persistence")["rdb_bgsave_in_progress"] == 0,
               what="the master's replication fork exited")
    return rep


def wait_ack(master, replicas=1):
    """WAIT until `replicas` replicas acknowledged everything written so far."""
    wait_until(lambda: master.wait(replicas, 1000) >= replicas, what="WAIT acknowledged")


def keyspace(client, pattern="*"):
    """{key: (type, DEBUG DIGEST-VALUE, PEXPIRETIME)} for every key."""
    out = {}
    for k in client.scan_iter(match=pattern, count=1000):
        t = _s(client.type(k))
        if t == "none":
            continue
        d = _s(client.execute_command("DEBUG", "DIGEST-VALUE", k)[0])
        out[_s(k)] = (t, d, client.execute_command("PEXPIRETIME", k))
    return out


def db_digest(client):
    """DEBUG DIGEST: the whole dataset, values and expiries."""
    return _s(client.execute_command("DEBUG", "DIGEST"))


def wait_aof_rewrite(client, timeout=60):
    """Wait until no AOF rewrite is running or scheduled, then check it
    succeeded."""
    def done():
        p = client.info("persistence")
        return p["aof_rewrite_in_progress"] == 0 and p["aof_rewrite_scheduled"] == 0
    wait_until(done, timeout=timeout, what="AOF rewrite finished")
    assert client.info("persistence")["aof_last_bgrewrite_status"] == "ok"


def wait_bgsave(client, timeout=60):
    wait_until(
        lambda: client.info("persistence")["rdb_bgsave_in_progress"] == 0,
        timeout=timeout, what="BGSAVE finished",
    )
    assert client.info("persistence")["rdb_last_bgsave_status"] == "ok"


def run_cli(*args, timeout=120):
    """Run redis-cli; fail with its output when it exits non-zero."""
    p = subprocess.run(
        [REDIS_CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=timeout, text=True,
    )
    if p.returncode != 0:
        raise AssertionError(f"redis-cli {' '.join(map(str, args))} failed: {p.stdout[-4000:]}")
    return p.stdout


def tags_in_slots(lo, hi, n, prefix="t"):
    """`n` hash tags whose slot lies in [lo, hi)."""
    out, i = [], 0
    while len(out) < n:
        tag = f"{prefix}{i}"
        if lo <= key_slot(tag.encode()) < hi:
            out.append(tag)
        i += 1
    return out


CLUSTER_ARGS = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000", "--repl-diskless-sync-delay", "0")


class Cluster:
    """A Redis Cluster of module-loaded nodes, created with redis-cli."""

    def __init__(self, server_factory, primaries=3):
        self.factory = server_factory
        self.nodes = [server_factory(list(CLUSTER_ARGS)) for _ in range(primaries)]
        run_cli("--cluster", "create", *[f"127.0.0.1:{s.port}" for s in self.nodes],
                "--cluster-replicas", "0", "--cluster-yes")
        self.wait_ok()

    def wait_ok(self):
        """Every node reports cluster_state ok and all agree on the slot map."""
        def ok():
            maps = set()
            for s in self.nodes:
                c = s.client()
                if c.cluster("info")["cluster_state"] != "ok":
                    return False
                maps.add(self._slot_map(c))
            return len(maps) == 1
        wait_until(ok, timeout=60, what="cluster state ok and consistent")

    @staticmethod
    def _slot_map(c):
        return tuple(sorted(
            (int(r[0]), int(r[1]), int(r[2][1])) for r in c.execute_command("CLUSTER", "SLOTS")
        ))

    def node_id(self, server):
        return _s(server.client().execute_command("CLUSTER", "MYID"))

    def owner(self, slot):
        """The server that serves `slot` as a primary (per the first node)."""
        for lo, hi, port in self._slot_map(self.nodes[0].client()):
            if lo <= slot <= hi:
                return next(s for s in self.nodes if s.port == port)
        raise AssertionError(f"slot {slot} unassigned")

    def client(self, **kw):
        from redis.cluster import RedisCluster
        return RedisCluster(host="127.0.0.1", port=self.nodes[0].port, socket_timeout=30, **kw)

    def add_replica(self, primary):
        """A new node joined as a replica of `primary`, fully synced."""
        rep = self.factory(list(CLUSTER_ARGS) + ["--repl-timeout", "3600"])
        self.nodes.append(rep)
        primary.client().config_set("repl-diskless-sync-delay", 0)
        run_cli("--cluster", "add-node", f"127.0.0.1:{rep.port}", f"127.0.0.1:{primary.port}",
                "--cluster-slave", "--cluster-master-id", self.node_id(primary))
        rc = rep.client()
        wait_until(lambda: rc.info("replication").get("master_link_status") == "up",
                   timeout=60, what="cluster replica link up")
        wait_replica_synced(primary.client(), rc)
        # Every node (the primary above all: it must accept the replica's
        # failover request) knows the new node as the primary's replica.
        rid, pid = self.node_id(rep), self.node_id(primary)

        def known():
            for s in self.nodes:
                nodes = _s(s.client().execute_command("CLUSTER", "NODES"))
                row = next((ln.split() for ln in nodes.splitlines() if ln.startswith(rid)), None)
                if row is None or "slave" not in row[2] or row[3] != pid:
                    return False
            return True
        wait_until(known, timeout=60, what="replica known to every node")
        self.wait_ok()
        return rep

    def reshard(self, src, dst, nslots):
        """redis-cli --cluster reshard: move the first `nslots` slots of
        `src` to `dst` (MIGRATE, i.e. DUMP/RESTORE, key by key)."""
        run_cli("--cluster", "reshard", f"127.0.0.1:{self.nodes[0].port}",
                "--cluster-from", self.node_id(src), "--cluster-to", self.node_id(dst),
                "--cluster-slots", nslots, "--cluster-yes", timeout=180)
        self.wait_ok()


class Workload(threading.Thread):
    """Calls `fn(i)` for i = 0, 1, ... in a thread until stopped or `limit`
    calls were made. The first exception is kept and re-raised by
    `finish()`, so a failing call fails the test."""

    def __init__(self, fn, limit=10**6, stop_on=()):
        super().__init__(daemon=True)
        self.fn = fn
        self.limit = limit
        self.stop_on = tuple(stop_on)  # exceptions that end the run quietly
        self.calls = 0
        self.stopped_by = None
        self.error = None
        self._stop_evt = threading.Event()

    def run(self):
        try:
            while not self._stop_evt.is_set() and self.calls < self.limit:
                self.fn(self.calls)
                self.calls += 1
        except self.stop_on as e:
            self.stopped_by = e
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e

    def finish(self, timeout=60):
        self._stop_evt.set()
        self.join(timeout)
        assert not self.is_alive(), "workload thread did not stop"
        if self.error is not None:
            raise self.error


def load_json(path):
    with open(path) as f:
        return json.load(f)


class ReplicationTap:
    """`redis-cli --replica` attached to a primary: the replication stream as
    text lines, one command per line ("RL.STATE","key","\\x01...")."""

    def __init__(self, server):
        self.client = server.client()
        self.client.config_set("repl-diskless-sync-delay", 0)
        self.path = os.path.join(server.dir, f"tap-{id(self)}.txt")
        self.marks = 0
        self.seen = 0
        with open(self.path, "w") as out:
            self.proc = subprocess.Popen([REDIS_CLI, "-p", str(server.port), "--replica"],
                                         stdout=out, stderr=subprocess.STDOUT)
        wait_until(lambda: "Logging commands from master" in self._text(),
                   what="redis-cli --replica synced")
        self.seen = len(self._text().splitlines())

    def _text(self):
        with open(self.path, errors="replace") as f:
            return f.read()

    def take(self):
        """The commands streamed since the last take(): writes a marker key
        and reads up to it (the marker itself is not returned)."""
        self.marks += 1
        marker = f'"SET","rl:tap:mark","{self.marks}"'
        self.client.set("rl:tap:mark", self.marks)
        wait_until(lambda: marker in self._text(), what="replication stream read to the marker")
        lines = self._text().splitlines()
        end = lines.index(marker, self.seen)
        out = lines[self.seen:end]
        self.seen = end + 1
        return [ln for ln in out if not ln.startswith('"PING"') and not ln.startswith("sending REPLCONF")]

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
