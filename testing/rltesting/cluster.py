"""Redis Cluster of module-loaded nodes (created with redis-cli), and hash
tags by slot."""
from redis.crc import key_slot

from rltesting.proc import run_cli, wait_until
from rltesting.replication import wait_replica_synced
from rltesting.replies import _s

__all__ = ["CLUSTER_ARGS", "Cluster", "key_slot", "tags_in_slots"]

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
