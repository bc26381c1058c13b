"""Real redis-server processes for the integration suite.

Every server runs on 127.0.0.1 on a free port, in its own temp directory,
with the module loaded, and is killed (SIGKILL after a grace period) when
the test that started it finishes — also when the test fails.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE = os.environ.get(
    "RL_MODULE", os.path.join(ROOT, "target", "release", "libredis_ratelimit.so")
)
REDIS_SERVER = os.environ.get("REDIS_SERVER", shutil.which("redis-server") or "redis-server")
REDIS_CLI = os.environ.get("REDIS_CLI", shutil.which("redis-cli") or "redis-cli")


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


class Server:
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
            return self.client().ping()
        except redis.exceptions.BusyLoadingError:
            return False
        except redis.exceptions.ConnectionError:
            return False

    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)

    def log_tail(self, n=40):
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

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
