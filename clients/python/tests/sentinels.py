"""A primary, its replicas and 3 sentinels on real processes (free ports,
temp dirs), the server binary of REDIS_SERVER in sentinel mode, so the
suites' server matrix applies. Fast timings: a primary is "down" after
200 ms, so a failover takes about a second."""
import os
import shutil
import subprocess
import tempfile

import redis

from rltesting.proc import free_port, REDIS_SERVER, wait_until
from rltesting.replication import start_replica

SERVICE = "rl"


class Sentinel:
    def __init__(self, primary_port, quorum=2):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rl-sentinel-")
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
                    f"logfile sentinel.log\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} {quorum}\n"
                    f"sentinel down-after-milliseconds {SERVICE} 200\n"
                    f"sentinel failover-timeout {SERVICE} 2000\n")
        self.proc = subprocess.Popen([REDIS_SERVER, conf, "--sentinel"], cwd=self.dir,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5,
                                  decode_responses=True)
        wait_until(self._ready, timeout=30, what=f"sentinel on {self.port}")

    def _ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"sentinel exited with {self.proc.returncode}: {self.log()}")
        return self.client.ping()

    def log(self):
        try:
            with open(os.path.join(self.dir, "sentinel.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return "(no log)"

    def master(self):
        return self.client.execute_command("SENTINEL", "MASTER", SERVICE)

    def primary_port(self):
        return int(self.client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)[1])

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


class Deployment:
    """primary + replicas (module on each unless told) + 3 sentinels, all
    of which know each other and every replica before the test starts."""

    def __init__(self, server_factory, replica_module=(True,)):
        self.primary = server_factory()
        self.replicas = [start_replica(server_factory, self.primary)
                         if m else _plain_replica(server_factory, self.primary)
                         for m in replica_module]
        self.sentinels = []
        try:
            self.sentinels = [Sentinel(self.primary.port) for _ in range(3)]

            def known():
                for s in self.sentinels:
                    m = _pairs(s.master())
                    if int(m["num-other-sentinels"]) < 2 or \
                            int(m["num-slaves"]) < len(self.replicas):
                        return False
                return True
            wait_until(known, timeout=30, what="the sentinels know each other and the replicas")
        except BaseException:
            self.close()
            raise

    @property
    def addrs(self):
        return [("127.0.0.1", s.port) for s in self.sentinels]

    def wait_promoted(self, timeout=30):
        """Every sentinel names a new primary, and that server says it is one."""
        old = self.primary.port

        def promoted():
            ports = {s.primary_port() for s in self.sentinels}
            if len(ports) != 1 or old in ports:
                return False
            port = ports.pop()
            rep = next(r for r in self.replicas if r.port == port)
            return rep if rep.client().info("replication")["role"] == "master" else False
        return wait_until(promoted, timeout=timeout, what="a replica promoted by the sentinels")

    def close(self):
        for s in self.sentinels:
            s.close()


def _plain_replica(server_factory, primary):
    m = primary.client()
    m.config_set("repl-diskless-sync-delay", 0)
    rep = server_factory(["--replicaof", "127.0.0.1", str(primary.port)], module=False)
    rc = rep.client()
    wait_until(lambda: rc.info("replication").get("master_link_status") == "up",
               what="replica link up")
    return rep


def _pairs(reply):
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))
