"""Real server processes for the tests, benchmarks and scripts.

Every server runs on 127.0.0.1 on a free port, in its own temp directory,
with the module loaded, and is killed (SIGKILL after a grace period) when
the test that started it finishes — also when the test fails.

MODULE, REDIS_SERVER and REDIS_CLI are read when a process starts, so a
script may set them (rltesting.proc.REDIS_SERVER = ...) after importing.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# The repository this package lives in (it is installed editable by
# `make venv`, so its files stay where they are): testing/rltesting/proc.py.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    Asked on first use, so a script may still set rltesting.proc.REDIS_SERVER
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


def listens(pid, port):
    """True when process `pid` holds a listening TCP socket on `port`
    (Linux /proc). A port that merely accepts connections may belong to
    another test's process that took it between free_port() and the bind
    of the process this test started."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                return True
        except OSError:
            continue
    return False


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


class PortInUse(AssertionError):
    """A child could not listen on its port: another process took it
    between free_port() and the child's bind (a test run in another lane,
    or a client's outgoing connection)."""


def exited(what, code, output):
    """The error for a child that exited before it was ready, with its
    output: PortInUse when that says its port was taken (Redis, Valkey,
    Python, Node and Rust all say "address already in use")."""
    kind = PortInUse if "address already in use" in output.lower() else AssertionError
    return kind(f"{what} exited with {code}: {output}")


def retry_taken_port(start, attempts=5):
    """Call `start` (which picks a free port and starts a child on it) again
    while it raises PortInUse, `attempts` times in all; return its value."""
    for _ in range(attempts - 1):
        try:
            return start()
        except PortInUse:
            pass
    return start()


class ServerProcess:
    """What every server process of the tests shares: `proc`, the log file
    LOG in `dir`, and how to tell it is alive and kill it."""
    LOG = "redis.log"

    def answers_as_itself(self, client):
        """True when this process listens on its port and serves commands
        through `client` (PING answers; a server loading its data set
        raises BusyLoadingError). A server that failed to bind its port
        exits, but a ping may meanwhile reach another test's server that
        holds the port: it must not pass for this one. Raises PortInUse or
        AssertionError once it has exited."""
        if self.proc.poll() is not None:
            raise exited(os.path.basename(REDIS_SERVER), self.proc.returncode, self.log_tail())
        return listens(self.proc.pid, self.port) and client.ping()

    def _log_lines(self):
        try:
            with open(os.path.join(self.dir, self.LOG), errors="replace") as f:
                return f.readlines()
        except OSError:
            return None

    def log_tail(self, n=40):
        lines = self._log_lines()
        return "(no log)" if lines is None else "".join(lines[-n:])

    def crash_log(self, n=100):
        """The start of the log's bug report (its stack traces) if it has
        one, else the log's last n lines."""
        lines = self._log_lines()
        if lines is None:
            return "(no log)"
        start = next((i for i, ln in enumerate(lines) if "BUG REPORT START" in ln), None)
        return "".join(lines[start:start + n] if start is not None else lines[-n:])

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.alive():
            self.stopped = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)


class Server(ServerProcess):
    """One redis-server process with the module loaded."""

    def __init__(self, args=(), module=True, dir=None, port=None):
        self.port = port
        self.owns_dir = dir is None
        self.dir = dir or tempfile.mkdtemp(prefix="rl-it-")
        self.extra = list(args)
        self.module = module
        self.proc = None
        # a port the caller chose is kept (and fails if taken)
        self.start() if port is not None else retry_taken_port(self._start_on_a_free_port)

    def _start_on_a_free_port(self):
        self.port = free_port()
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
        self.stopped = False
        self.proc = subprocess.Popen(
            self.command_line(), cwd=self.dir,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_until(self._ready, timeout=30, what=f"redis-server on {self.port}")

    def _ready(self):
        try:
            # no retries: redis-py 6+ would retry a refused connection with
            # backoff (in 7: seconds per server start)
            return self.answers_as_itself(self.client(retry=Retry(NoBackoff(), 0)))
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.exceptions.ConnectionError:
            return False

    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)


    def stop(self):
        """Graceful shutdown without saving (SIGTERM), SIGKILL if it hangs."""
        if self.alive():
            self.stopped = True
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
        """Kill it and remove its directory. A server that exited while no
        one was stopping it (a crash, or a signal from outside the tests)
        leaves its log's tail on stderr first: pytest shows it with the
        test's report, as the directory is gone after."""
        if self.proc is not None and not self.alive() and not getattr(self, "stopped", False):
            sys.stderr.write(f"redis-server on port {self.port} exited ({self.proc.returncode}) "
                             f"before the test stopped it; its log:\n{self.crash_log()}\n")
        self.kill9() if self.alive() else None
        if self.owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def run_cli(*args, timeout=120):
    """Run redis-cli; fail with its output when it exits non-zero."""
    p = subprocess.run(
        [REDIS_CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=timeout, text=True,
    )
    if p.returncode != 0:
        raise AssertionError(f"redis-cli {' '.join(map(str, args))} failed: {p.stdout[-4000:]}")
    return p.stdout
