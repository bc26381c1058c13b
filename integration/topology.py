"""The topologies of the failover suite (failover.py, test_failover.py), real
processes: a primary, replicas and Sentinels, each on its own loopback
address, and packet-filter rules (nftables) that cut links
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
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile

import redis
from redis.connection import Connection
from redis.sentinel import Sentinel, SentinelManagedConnection

from rltesting.proc import MODULE, REDIS_SERVER, ServerProcess, retry_taken_port, wait_until

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
        try:
            return self.answers_as_itself(self.client(socket_timeout=2))
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
        retry_taken_port(self._start_on_a_free_port)

    def _start_on_a_free_port(self):
        self.port = free_port(self.host)
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
