"""Failover on real processes: a primary, replicas and Sentinels, each on its
own loopback address, and packet-filter rules (nftables) that cut links
between those addresses.

Addresses: every topology takes a /24 of its own inside 127.0.0.0/8,
127.A.B.0/24 with A and B drawn at random (never 127.0.0.x, where everything
else on the machine listens), so two topologies never share an address and
a rule written for one cannot touch another's traffic. In it:

    .2  the primary        .3, .4      the replicas
    .5, .6, .7  sentinels  .10, .11 ...  gateways (the clients' source addresses)

Every data node loads the module and has `protected-mode no` (protected mode
admits 127.0.0.1 only), `bind-source-addr` (its outgoing connections, the
replication link included, leave from its own address, or the rules and the
sentinels see 127.0.0.1) and `replica-announce-ip`. Sentinels run from the
same binary (`REDIS_SERVER sentinel.conf --sentinel`), as Debian's
redis-sentinel does.

Rules: one nftables table per topology, `rl_failover_<pid>_<hex>` (family
ip), one output chain on the loopback; `Firewall.cut(a, b)` drops every
packet between the address sets a and b, both ways; `heal()` removes every
rule; `close()` deletes the table. Tables are deleted when the fixture that
made them ends, also when the test fails, and by an atexit guard for a
process that dies between the two. Nothing here ever routes outside
127.0.0.0/8: every address is checked to be in it.
"""
import atexit
import ctypes
import ipaddress
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import redis
from redis.connection import Connection
from redis.sentinel import Sentinel, SentinelManagedConnection

from rltesting.proc import MODULE, REDIS_SERVER, ROOT, ServerProcess, wait_until

SERVICE = "rl"
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def _loopback(addr):
    if ipaddress.ip_address(addr) not in LOOPBACK:
        raise ValueError(f"{addr} is not in 127.0.0.0/8")
    return addr


def free_port(host):
    """A TCP port free on `host` now."""
    with socket.socket() as s:
        s.bind((_loopback(host), 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# Packet filter
# ---------------------------------------------------------------------------

_LIVE_TABLES = set()


def _nft(*args, check=True):
    p = subprocess.run(["nft", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"nft {' '.join(args)}: {p.stdout.strip()}")
    return p


def nft_unavailable():
    """None when this process can create and delete an nftables table, else
    why not (no nft binary, no CAP_NET_ADMIN, no nf_tables in the kernel)."""
    if shutil.which("nft") is None:
        return "nft is not installed (make deps installs nftables)"
    name = f"rl_failover_probe_{os.getpid()}"
    p = _nft("add", "table", "ip", name, check=False)
    if p.returncode != 0:
        return f"nft cannot create a table here: {p.stdout.strip()}"
    _nft("delete", "table", "ip", name, check=False)
    return None


@atexit.register
def _delete_leftover_tables():
    for name in list(_LIVE_TABLES):
        _nft("delete", "table", "ip", name, check=False)
        _LIVE_TABLES.discard(name)


class Firewall:
    """An nftables table of this topology's own, with one output chain on the
    loopback."""

    def __init__(self):
        _sweep_dead_tables()
        self.table = f"rl_failover_{os.getpid()}_{random.getrandbits(32):08x}"
        _nft("add", "table", "ip", self.table)
        _LIVE_TABLES.add(self.table)
        _nft("add", "chain", "ip", self.table, "out",
             "{ type filter hook output priority 0; policy accept; }")
        self.cuts = []

    def cut(self, a, b):
        """Drop every packet between any address of `a` and any of `b`: one
        nft transaction, so every link goes down at the same instant."""
        lines = []
        for x in a:
            for y in b:
                for src, dst in ((x, y), (y, x)):
                    lines.append(f"add rule ip {self.table} out oifname lo "
                                 f"ip saddr {_loopback(src)} ip daddr {_loopback(dst)} drop")
        p = subprocess.run(["nft", "-f", "-"], input="\n".join(lines) + "\n", text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        if p.returncode != 0:
            raise RuntimeError(f"nft -f: {p.stdout.strip()}")
        self.cuts.append((tuple(a), tuple(b)))

    def heal(self):
        _nft("flush", "chain", "ip", self.table, "out")
        self.cuts = []

    def rules(self):
        return _nft("list", "table", "ip", self.table).stdout

    def close(self):
        if self.table in _LIVE_TABLES:
            _nft("delete", "table", "ip", self.table, check=False)
            _LIVE_TABLES.discard(self.table)


def _sweep_dead_tables():
    """Delete the tables of test processes that died without cleaning up
    (a SIGKILLed pytest runs no atexit handler)."""
    p = _nft("list", "tables", "ip", check=False)
    for line in p.stdout.splitlines():
        name = line.split()[-1] if line.startswith("table ip rl_failover_") else ""
        parts = name.split("_")
        if len(parts) == 4 and parts[2].isdigit() and not os.path.exists(f"/proc/{parts[2]}"):
            _nft("delete", "table", "ip", name, check=False)


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    """In the child before exec: SIGKILL it when the test process dies, so
    a killed test run leaves no servers behind (prctl PR_SET_PDEATHSIG)."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


class Process(ServerProcess):
    """One server process (data node or sentinel) on its own address."""
    LOG = "server.log"

    def __init__(self, host, dir):
        self.host = _loopback(host)
        self.port = free_port(host)
        self.dir = dir
        os.makedirs(dir, exist_ok=True)
        self.proc = None

    @property
    def addr(self):
        return (self.host, self.port)

    def client(self, **kw):
        kw.setdefault("socket_timeout", 10)
        return redis.Redis(host=self.host, port=self.port, **kw)

    def _spawn(self, cmd):
        self.proc = subprocess.Popen(cmd, cwd=self.dir, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        wait_until(self._ready, timeout=30, what=f"{cmd[0]} on {self.host}:{self.port}")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            return self.client(socket_timeout=2).ping()
        except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError):
            return False

    def close(self):
        self.kill9()


class DataNode(Process):
    """A redis-server with the module loaded, on its own address."""

    def __init__(self, host, dir, args=()):
        super().__init__(host, dir)
        self.args = list(args)
        self.start()

    def command_line(self):
        return [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", self.host,
            "--bind-source-addr", self.host,
            "--replica-announce-ip", self.host,
            "--protected-mode", "no",
            "--dir", self.dir,
            "--logfile", "server.log",
            "--save", "",
            "--appendonly", "no",
            "--enable-debug-command", "yes",
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            "--loadmodule", MODULE,
            *self.args,
        ]

    def start(self, args=None):
        if args is not None:
            self.args = list(args)
        self._spawn(self.command_line())

    def role(self):
        return self.client(socket_timeout=2).info("replication")["role"]


class SentinelNode(Process):
    def __init__(self, host, dir, primary, quorum=2, down_after_ms=1000, failover_timeout_ms=5000):
        super().__init__(host, dir)
        self.conf = os.path.join(dir, "sentinel.conf")
        with open(self.conf, "w") as f:
            f.write("\n".join([
                f"port {self.port}",
                f"bind {self.host}",
                f"bind-source-addr {self.host}",
                "protected-mode no",
                f"dir {dir}",
                "logfile server.log",
                f"sentinel announce-ip {self.host}",
                f"sentinel monitor {SERVICE} {primary.host} {primary.port} {quorum}",
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
                f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}",
                f"sentinel parallel-syncs {SERVICE} 2",
                "",
            ]))
        self._spawn([REDIS_SERVER, self.conf, "--sentinel"])

    def primary_addr(self):
        a = self.client(socket_timeout=1).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        return None if a is None else (a[0].decode(), int(a[1]))


# ---------------------------------------------------------------------------
# Clients that leave from a gateway address
# ---------------------------------------------------------------------------

class _SourceBound:
    """A redis-py connection whose socket is bound to `source_addr` before it
    connects (a gateway's own address, so the rules can tell gateways
    apart)."""

    def __init__(self, *args, source_addr=None, **kw):
        self.source_addr = source_addr
        super().__init__(*args, **kw)

    def _connect(self):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.source_addr:
                sock.bind((_loopback(self.source_addr), 0))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.socket_connect_timeout)
            sock.connect((_loopback(self.host), self.port))
            sock.settimeout(self.socket_timeout)
            return sock
        except OSError:
            sock.close()
            raise


class BoundConnection(_SourceBound, Connection):
    pass


class BoundSentinelManagedConnection(_SourceBound, SentinelManagedConnection):
    pass


class Gateway:
    """One application server: a redis-py `Sentinel` whose connections (to
    the sentinels and to the primary) leave from `host`."""

    def __init__(self, host, sentinels, timeout=0.5):
        self.host = _loopback(host)
        kw = dict(socket_timeout=timeout, socket_connect_timeout=timeout)
        self.sentinel = Sentinel([s.addr for s in sentinels], sentinel_kwargs=kw, **kw)
        # Sentinel() made plain connections to the sentinels; bind them too.
        self.sentinel.sentinels = [
            redis.Redis(connection_pool=redis.ConnectionPool(
                connection_class=BoundConnection, host=s.host, port=s.port,
                source_addr=self.host, **kw))
            for s in sentinels
        ]
        self.kw = kw

    def primary(self):
        """A client of the primary the sentinels name; it asks them again
        after a connection error or a READONLY reply."""
        return self.sentinel.master_for(
            SERVICE, connection_class=BoundSentinelManagedConnection,
            source_addr=self.host, **self.kw)


# ---------------------------------------------------------------------------
# The topology
# ---------------------------------------------------------------------------

class Topology:
    """A primary, `replicas` replicas and `sentinels` sentinels, on one /24
    of 127.0.0.0/8, with a firewall of its own. `data_args` go to every data
    node (e.g. min-replicas-to-write)."""

    def __init__(self, replicas=2, sentinels=3, data_args=(), down_after_ms=1000):
        self.base = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
        self.dir = tempfile.mkdtemp(prefix="rl-failover-")
        self.firewall = None
        self.nodes = []
        self.sentinels = []
        self._gateways = 0
        try:
            self.firewall = Firewall()
            self.data_args = list(data_args)
            self.primary = DataNode(self.ip(2), os.path.join(self.dir, "n2"), self.data_args)
            self.nodes.append(self.primary)
            for i in range(replicas):
                self.add_replica(self.ip(3 + i))
            for i in range(sentinels):
                self.sentinels.append(SentinelNode(
                    self.ip(5 + i), os.path.join(self.dir, f"s{5 + i}"), self.primary,
                    quorum=sentinels // 2 + 1, down_after_ms=down_after_ms))
            self.wait_sentinels_ready()
        except BaseException:
            self.close()
            raise

    def ip(self, n):
        return _loopback(f"{self.base}.{n}")

    def add_replica(self, host):
        node = DataNode(host, os.path.join(self.dir, f"n{host.rsplit('.', 1)[1]}"),
                        self.data_args + ["--replicaof", self.primary.host, str(self.primary.port)])
        self.nodes.append(node)
        wait_until(lambda: node.client().info("replication").get("master_link_status") == "up",
                   what=f"replica {host} linked")
        return node

    @property
    def data_nodes(self):
        return list(self.nodes)

    def replicas(self):
        return [n for n in self.nodes if n is not self.primary]

    def wait_sentinels_ready(self):
        """Every sentinel names the primary, knows every live replica and
        every other sentinel (they learn replicas from INFO and each other
        from hello messages)."""
        nrep = len([n for n in self.replicas() if n.alive()])
        nsent = len(self.sentinels)

        def ready():
            for s in self.sentinels:
                c = s.client(socket_timeout=1)
                if s.primary_addr() != self.primary.addr:
                    return False
                reps = c.execute_command("SENTINEL", "REPLICAS", SERVICE)
                ok = [r for r in reps if _field(r, "master-link-status") == "ok"
                      and "s_down" not in _field(r, "flags")]
                if len(ok) < nrep:
                    return False
                if len(c.execute_command("SENTINEL", "SENTINELS", SERVICE)) < nsent - 1:
                    return False
            return True
        wait_until(ready, timeout=60, interval=0.05, what="sentinels know the topology")

    def wait_promoted(self, old, timeout=60):
        """Wait until a majority of sentinels name a live replica other than
        `old` as the primary and that node says it is a primary; return it."""
        by_addr = {n.addr: n for n in self.data_nodes}

        def promoted():
            names = []
            for s in self.sentinels:
                try:
                    names.append(s.primary_addr())
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    pass
            for a in set(names):
                if (a is not None and a != old.addr and names.count(a) > len(self.sentinels) // 2
                        and a in by_addr and by_addr[a].role() == "master"):
                    return by_addr[a]
            return None
        node = wait_until(promoted, timeout=timeout, interval=0.02, what="a replica promoted")
        self.primary = node
        return node

    def gateway(self):
        self._gateways += 1
        return Gateway(self.ip(10 + self._gateways % 200), self.sentinels)

    def close(self):
        for p in self.sentinels + self.nodes:
            try:
                p.close()
            except Exception:  # noqa: BLE001 - best effort teardown
                pass
        if self.firewall is not None:
            self.firewall.close()
        if os.environ.get("RL_FAILOVER_KEEP") == "1":
            print(f"kept {self.dir} (RL_FAILOVER_KEEP=1): every process's server.log")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


def _field(flat, name):
    """A field of a SENTINEL REPLICAS entry (a flat [k, v, k, v] list or a dict)."""
    if isinstance(flat, dict):
        v = flat.get(name, flat.get(name.encode(), ""))
    else:
        d = dict(zip(flat[::2], flat[1::2]))
        v = d.get(name.encode(), d.get(name, b""))
    return v.decode() if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------------------
# Granting clients
# ---------------------------------------------------------------------------

HUGE = (1 << 53) - 1  # refill interval: no token ever comes back


def bucket_call(capacity):
    """The arguments of a grant from a bucket of `capacity` that never refills."""
    return ["RL.TOKENBUCKET", None, capacity, 1, HUGE]


class Granters:
    """`n` client threads granting one unit at a time from `key`, each
    through its own `gateway.primary()` client. A grant is counted when its
    reply says allowed; in strict mode (`wait_timeout_ms`), the grant and
    `WAIT 1 <timeout>` go in one plain pipeline and the grant counts only
    when WAIT answers >= 1 (else it is an error: unacknowledged). Errors
    (connection, READONLY, NOREPLICAS, no primary known) are counted by kind
    and the call is retried. A thread stops at its first denial once
    `stop_on_denial` is set (after the old primary is gone), or at stop()."""

    def __init__(self, gateways, key, capacity, n=6, wait_timeout_ms=None, wait_replicas=1,
                 library=False):
        self.key = key
        self.library = library
        self.wait_replicas = wait_replicas
        self.capacity = capacity
        self.wait_timeout_ms = wait_timeout_ms
        self.lock = threading.Lock()
        self.granted = 0
        self.unacked = 0
        self.denied_early = 0
        self.by_addr = {}  # grants counted, by the address of the server that made them
        self.errors = {}
        self.stop_on_denial = threading.Event()
        self._stop = threading.Event()
        self.done = [threading.Event() for _ in range(n)]
        self.failures = []
        self.threads = [threading.Thread(target=self._run, args=(gateways[i % len(gateways)], i),
                                         daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, gateway, i):
        try:
            r = gateway.primary()
            if self.library:
                self._run_library(r)
                return
            args = ["RL.TOKENBUCKET", self.key, self.capacity, 1, HUGE]
            while not self._stop.is_set():
                try:
                    if self.wait_timeout_ms is None:
                        allowed = r.execute_command(*args)[0]
                        acked = True
                    else:
                        p = r.pipeline(transaction=False)
                        p.execute_command(*args)
                        p.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
                        reply, acks = p.execute()
                        allowed, acked = reply[0], acks >= self.wait_replicas
                except redis.exceptions.RedisError as e:
                    kind = type(e).__name__
                    msg = str(e)
                    if "NOREPLICAS" in msg:
                        kind = "NOREPLICAS"
                    with self.lock:
                        self.errors[kind] = self.errors.get(kind, 0) + 1
                    time.sleep(0.005)
                    continue
                with self.lock:
                    if allowed == 1 and acked:
                        self.granted += 1
                        # This thread's pool holds one connection, to the
                        # primary it last asked the sentinels for.
                        addr = r.connection_pool.master_address
                        self.by_addr[addr] = self.by_addr.get(addr, 0) + 1
                    elif allowed == 1:
                        self.unacked += 1
                    elif not self.stop_on_denial.is_set():
                        self.denied_early += 1
                if allowed != 1 and self.stop_on_denial.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.failures.append(e)
        finally:
            self.done[i].set()

    def _run_library(self, r):
        """The same loop through the Python client library (clients/python):
        `RateLimit(client, strict=Strict(wait_replicas, wait_timeout_ms))`
        on the gateway's Sentinel-managed client; a grant is counted when a
        decision says allowed and comes from the shared limit (source
        "module"), i.e. the library saw WAIT acknowledge it. Its failures
        (connection, READONLY, NOREPLICAS, unreplicated) are the breaker's;
        the decisions it makes meanwhile (panic) are counted by source."""
        from redis_ratelimit import Breaker, Panic, RateLimit, Strict, token_bucket
        strict = None if self.wait_timeout_ms is None else \
            Strict(replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms)
        rl = RateLimit(r, backend="module", strict=strict,
                       breaker=Breaker(failures=3, open_ms=20))
        lim = rl.limiter(token_bucket("failover", self.capacity, 1, HUGE),
                         panic=Panic(limit=1, window_ms=HUGE))
        try:
            while not self._stop.is_set():
                d = lim.limit(self.key)
                with self.lock:
                    if d.source == "module" and d.allowed:
                        self.granted += 1
                        addr = r.connection_pool.master_address
                        self.by_addr[addr] = self.by_addr.get(addr, 0) + 1
                    elif d.source == "module":
                        if not self.stop_on_denial.is_set():
                            self.denied_early += 1
                    else:
                        self.errors[d.source] = self.errors.get(d.source, 0) + 1
                if d.source != "module":
                    time.sleep(0.005)
                elif not d.allowed and self.stop_on_denial.is_set():
                    break
        finally:
            m = rl.metrics()
            with self.lock:
                self.unacked += m.get("unreplicated", 0)
                self.errors["failures"] = self.errors.get("failures", 0) + m["failures"]

    def count(self):
        with self.lock:
            return self.granted

    def on(self, addr):
        """Grants counted from the server at `addr`."""
        with self.lock:
            return self.by_addr.get(addr, 0)

    def wait_count(self, n, timeout=60):
        return wait_until(lambda: self.count() >= n or self.failures, timeout=timeout,
                          interval=0.001, what=f"{n} grants")

    def wait_done(self, timeout=90):
        wait_until(lambda: all(d.is_set() for d in self.done), timeout=timeout,
                   interval=0.01, what="every client saw the bucket empty")

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(30)
        if self.failures:
            raise self.failures[0]


NODE_GRANTER = os.path.join(ROOT, "clients", "node", "test", "fixtures", "failover_granter.js")


class NodeGranters:
    """Granters' interface for crash_run, the grants made by the Node
    library (clients/node, ioredis `sentinels`): one node process
    (clients/node/test/fixtures/failover_granter.js) running `n` loops, each
    with its own client and RateLimit, strict with `wait_replicas` /
    `wait_timeout_ms` when wait_timeout_ms is set. It writes one byte per
    decision; a reader thread counts them. Its connections leave from
    127.0.0.1 (ioredis has no source address option): fine for a crash run,
    whose cut is between the primary and the replicas."""

    def __init__(self, topo, key, capacity, n=6, wait_timeout_ms=None, wait_replicas=1):
        self.wait_replicas = wait_replicas
        self.lock = threading.Lock()
        self.granted = self.denied_early = self.unacked = 0
        self.errors = {}
        self.failures = []
        self.stop_on_denial = threading.Event()
        arg = {"sentinels": [list(x.addr) for x in topo.sentinels], "name": SERVICE,
               "key": key, "capacity": capacity, "periodMs": HUGE, "clients": n,
               "timeoutMs": 500, "replicas": wait_replicas if wait_timeout_ms else 0,
               "waitMs": wait_timeout_ms or 0}
        self.proc = subprocess.Popen(["node", NODE_GRANTER, json.dumps(arg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        self.tail = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            while True:
                chunk = self.proc.stdout.read1(1 << 16)
                if not chunk:
                    break
                nl = chunk.find(b"\n")
                body = chunk if nl < 0 else chunk[:nl]
                with self.lock:
                    self.granted += body.count(b"g")
                    self.denied_early += body.count(b"d")
                    p = body.count(b"p")
                    if p:
                        self.errors["panic"] = self.errors.get("panic", 0) + p
                if nl >= 0:
                    self.tail = chunk[nl:] + self.proc.stdout.read()
                    break
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failures.append(e)

    def count(self):
        with self.lock:
            return self.granted

    def wait_count(self, n, timeout=60):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"node granter exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read().decode()[-2000:]}")
            return self.count() >= n or self.failures
        return wait_until(ready, timeout=timeout, interval=0.001, what=f"{n} grants (node)")

    def stop(self):
        self.proc.stdin.close()
        self.reader.join(60)
        self.proc.wait(60)
        if self.failures:
            raise self.failures[0]
        m = json.loads(self.tail.strip() or b"{}").get("metrics", [])
        self.unacked = sum(x.get("unreplicated", 0) for x in m)
        self.errors["failures"] = sum(x.get("failures", 0) for x in m)


def crash_run(topo, cut_at, after_cut, strict_wait_ms=None, nclients=6, cut_deadline_s=5.0,
              continue_grants=200, capacity=10**9, wait_replicas=None, library=False):
    """One failover under load. The clients grant from a fresh bucket of
    `capacity` that never refills. With `after_cut` None: once `cut_at`
    grants were received the primary is SIGKILLed (a lone process kill; the
    kernel still delivers its socket buffers). Otherwise at `cut_at` grants
    the primary<->replica links are cut (every packet dropped, one nft
    transaction), and after `after_cut` further grants (or `cut_deadline_s`
    seconds, if the primary stops granting: min-replicas) it is SIGKILLed,
    as in a machine crash. The sentinels promote a replica; the rules are
    removed only after the promotion (else the dead primary's queued bytes
    would still reach the replicas). The clients go on until they received
    `continue_grants` more from the new primary. Strict mode pipelines
    `WAIT wait_replicas` (default: every replica) after each grant; with
    `library`, the clients are the Python library's `RateLimit` (its own
    strict mode, `Strict(wait_replicas, strict_wait_ms)`, when
    strict_wait_ms is set) on each gateway's Sentinel-managed client;
    with library="node", the Node library's (NodeGranters).

    over = grants received + tokens the new primary still holds - capacity:
    the grants beyond capacity the bucket ends up making, without draining
    it (the capacity is too large to run out on the old primary at any
    client speed). window = the grants received after the cut was in place
    and before the kill; window_hi = the same from just before the nft
    command ran (grants made while it ran may fall either side)."""
    key = f"rl:failover:{random.getrandbits(40):x}"
    old = topo.primary
    oc = old.client()
    # The bytes one grant's effect adds to the replication stream (the
    # second grant of the key: the first creates it).
    for _ in range(2):
        before = oc.info("replication")["master_repl_offset"]
        assert oc.execute_command("RL.TOKENBUCKET", key, capacity, 1, HUGE)[0] == 1
    effect = oc.info("replication")["master_repl_offset"] - before
    assert effect > 0, "a grant added nothing to the replication stream"
    gws = [topo.gateway() for _ in range(2)]
    if library == "node":
        g = NodeGranters(topo, key, capacity, n=nclients, wait_timeout_ms=strict_wait_ms,
                         wait_replicas=wait_replicas or len(topo.replicas()))
    else:
        g = Granters(gws, key, capacity, n=nclients, wait_timeout_ms=strict_wait_ms,
                     wait_replicas=wait_replicas or len(topo.replicas()), library=library)
    try:
        g.wait_count(cut_at)
        named = [s.primary_addr() for s in topo.sentinels]
        if named.count(old.addr) <= len(named) // 2:
            # A primary that died on its own is the module's failure, not
            # the machine's: that is never run again.
            assert old.alive(), f"the primary exited before the fault: {old.log_tail()}"
            raise TopologyMoved(topo, old, named)
        if after_cut is not None:
            cut_lo = g.count()
            topo.firewall.cut([old.host], [n.host for n in topo.replicas()])
            at_cut = g.count()
        # Where the primary's stream is now, and what was counted before.
        at_read = g.count()
        p_off = oc.info("replication")["master_repl_offset"]
        if after_cut is not None:
            deadline = time.monotonic() + cut_deadline_s
            wait_until(lambda: g.count() >= at_cut + after_cut or time.monotonic() > deadline
                       or g.failures, timeout=cut_deadline_s + 30, interval=0.001,
                       what="grants after the cut")
        old.kill9()
        at_kill = g.count()
        if after_cut is None:
            at_cut = cut_lo = at_kill  # no cut: nothing was made while a link was down
        t_kill = time.monotonic()
        r_off = {n.addr: n.client().info("replication").get("slave_repl_offset", 0)
                 for n in topo.replicas()}
        new = topo.wait_promoted(old)
        promote_s = time.monotonic() - t_kill
        topo.firewall.heal()
        if strict_wait_ms is not None and g.wait_replicas > len(topo.replicas()) - 1:
            # WAIT for every replica: the new primary has one fewer until
            # the dead node is back (as a replica of it); until then strict
            # clients fail closed.
            # Strict clients need the dead node linked again, not the
            # sentinels' view of it (the run's end waits for that).
            restore_topology(topo, sentinels=False)
        g.wait_count(at_kill + continue_grants)
    finally:
        g.stop()
        topo.firewall.heal()
    assert g.denied_early == 0, "a denial: the bucket ran out"
    remaining = new.client().execute_command("RL.TOKENBUCKET", key, capacity, 1, HUGE,
                                             "COST", 0)[2]
    # The grants the promoted replica never received: at most the effects
    # between its last offset and the primary's offset read above, plus
    # every grant counted after that read.
    lag = -(-max(0, p_off - r_off[new.addr]) // effect)
    return {
        "over": g.granted + 2 + remaining - capacity, "granted": g.granted + 2,
        "window": at_kill - at_cut, "window_hi": at_kill - cut_lo,
        "bound": lag + at_kill - at_read + nclients, "lag_at_read": lag,
        "before_cut": cut_lo, "errors": dict(g.errors), "unacked": g.unacked,
        "promote_s": round(promote_s, 2), "clients": nclients, "library": library,
    }


FAILOVER_EVENTS = ("+sdown", "-sdown", "+odown", "+tilt", "-tilt", "+try-failover",
                   "+elected-leader", "+switch-master", "+new-epoch", "+vote-for-leader")


class TopologyMoved(AssertionError):
    """Before the fault was injected, the sentinels already named another
    primary than the one the run started on: a failover nobody caused
    (seen once on a loaded CI machine, Redis 7.0: the sentinels had moved
    from .2 to .3 while the first grants were made). The run measured
    nothing; the caller may rebuild the topology and run again. The message
    carries each sentinel's failover events, to tell why."""

    def __init__(self, topo, old, named):
        lines = []
        for s in topo.sentinels:
            ev = [ln.rstrip() for ln in s.log_tail(400).splitlines()
                  if any(e in ln for e in FAILOVER_EVENTS)]
            lines.append(f"sentinel {s.host}: " + (" | ".join(ev[-12:]) or "(no events)"))
        super().__init__(f"the sentinels name {named}, the run started on {old.addr}\n"
                         + "\n".join(lines))


def restore_topology(topo, sentinels=True):
    """After a crash run: restart the killed node as a replica of the new
    primary, so the next run has two replicas again; wait until the
    sentinels know it (unless `sentinels` is false)."""
    dead = [n for n in topo.data_nodes if not n.alive()]
    for n in dead:
        n.start(topo.data_args + ["--replicaof", topo.primary.host, str(topo.primary.port)])
        wait_until(lambda: n.client().info("replication").get("master_link_status") == "up",
                   what="restarted node linked")
    if sentinels:
        topo.wait_sentinels_ready()


def partition_run(topo, hold_grants=2000, minority_clients=1, majority_clients=3):
    """A partition, not a crash: {old primary, gateway A} cut off from {the
    replicas, the sentinels, gateway B}. Gateway A keeps the connection it
    has to the old primary; gateway B follows the sentinels. One bucket,
    large enough never to run out here, so each side grants at its rate:

      before   both gateways grant
      during   the partition: the sentinels promote a replica; B grants on
               the new primary; A grants on the old primary until it refuses
               writes (NOREPLICAS, with min-replicas-to-write) or the
               partition ends, once B made `hold_grants` on the new primary
      healed   the partition healed, the old primary is still a primary
               until the sentinels turn it into a replica of the new one:
               A still grants on it
      after    it rejoined (the resync discards every write it took since
               the cut); both gateways go on until A's client got a grant
               from the new primary

    lost = grants the clients received - units the new primary counts as
    spent at the end: the grants it will hand out a second time. Returns
    the grants per gateway and phase, lost, and whether the old primary's
    key matches the new primary's after it rejoined."""
    capacity = 10**9
    key = f"rl:partition:{random.getrandbits(40):x}"
    old = topo.primary
    gw_a, gw_b = topo.gateway(), topo.gateway()
    a = Granters([gw_a], key, capacity, n=minority_clients)
    b = Granters([gw_b], key, capacity, n=majority_clients)
    snaps = {}
    try:
        wait_until(lambda: a.count() >= 100 and b.count() >= 100 or a.failures or b.failures,
                   timeout=60, interval=0.001, what="warm-up grants")
        snaps["before"] = (a.count(), b.count())
        majority = [n.host for n in topo.replicas()] + [s.host for s in topo.sentinels] + [gw_b.host]
        topo.firewall.cut([old.host, gw_a.host], majority)
        t = {"cut": time.monotonic()}
        snaps["cut"] = (a.count(), b.count())
        on_old = {"cut": a.on(old.addr) + b.on(old.addr)}
        new = topo.wait_promoted(old)
        t["promoted"] = time.monotonic()
        snaps["promoted"] = (a.count(), b.count())
        refused_at = []

        def held():
            with a.lock:
                if a.errors.get("NOREPLICAS", 0) and not refused_at:
                    refused_at.append(a.granted)
                    t["refused"] = time.monotonic()
            return b.count() >= snaps["promoted"][1] + hold_grants
        wait_until(held, timeout=120, interval=0.005, what="grants on the new primary")
        snaps["during"] = (a.count(), b.count())
        on_old["heal"] = a.on(old.addr) + b.on(old.addr)
        topo.firewall.heal()
        t["heal"] = time.monotonic()
        # Healed, the old primary is still a primary until the sentinels see
        # it again and turn it into a replica (they wait to see it claim the
        # role for a while first): gateway A's connection still reaches it.

        def rejoined():
            info = old.client(socket_timeout=2).info("replication")
            return (info["role"] == "slave" and info.get("master_host") == new.host
                    and info.get("master_link_status") == "up")
        wait_until(rejoined, timeout=60, interval=0.02, what="the old primary rejoined as a replica")
        snaps["rejoined"] = (a.count(), b.count())
        t["rejoined"] = time.monotonic()
        on_old["rejoined"] = a.on(old.addr) + b.on(old.addr)
        wait_until(lambda: a.count() > snaps["rejoined"][0] + 100, timeout=60, interval=0.005,
                   what="gateway A granting on the new primary")
        snaps["after"] = (a.count(), b.count())
    finally:
        a.stop()
        b.stop()
        topo.firewall.heal()
    def same():
        return (old.client().execute_command("DEBUG", "DIGEST-VALUE", key)
                == new.client().execute_command("DEBUG", "DIGEST-VALUE", key))
    try:
        wait_until(same, timeout=30, what="the rejoined old primary caught up")
        matches = True
    except AssertionError:
        matches = False
    spent = capacity - new.client().execute_command(
        "RL.TOKENBUCKET", key, capacity, 1, HUGE, "COST", 0)[2]
    (a0, b0), (ac, bc), (a1, b1), (ar, br), (a2, b2) = (
        snaps["before"], snaps["cut"], snaps["during"], snaps["rejoined"], snaps["after"])
    total = a.granted + b.granted
    return {
        "before": a0 + b0, "cut_slack": (ac + bc) - (a0 + b0),
        "during_old_primary": a1 - ac, "during_new_primary": b1 - bc,
        "old_primary_refused_after": None if not refused_at else refused_at[0] - ac,
        "old_primary_granted_after_refusal": None if not refused_at else a1 - refused_at[0],
        "old_primary_from_cut": on_old["rejoined"] - on_old["cut"],
        "healed_old_primary": on_old["rejoined"] - on_old["heal"],
        "healed_a": ar - a1, "healed_b": br - b1,
        "after_rejoin": (a2 - ar) + (b2 - br), "granted": total, "spent": spent,
        "lost": total - spent, "old_primary_errors": dict(a.errors),
        "rejoined_state_matches": matches, "clients": minority_clients + majority_clients,
        "seconds": {k: round(v - t["cut"], 2) for k, v in t.items() if k != "cut"},
    }
