"""Replication and persistence: replicas, WAIT, AOF rewrite and BGSAVE
waits, and a tap on a primary's replication stream."""
import os
import subprocess

from rltesting.proc import wait_until
from rltesting import proc

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
            self.proc = subprocess.Popen([proc.REDIS_CLI, "-p", str(server.port), "--replica"],
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
