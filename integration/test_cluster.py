"""Redis Cluster: three primaries made with `redis-cli --cluster create`,
driven through redis.cluster.RedisCluster with hash-tagged per-tenant keys
(rl:{tenant}:route). Grants are exact per tenant, and limits continue exactly
when their slots move to another node (`redis-cli --cluster reshard`, i.e.
MIGRATE = DUMP/RESTORE) or when a replica takes over (CLUSTER FAILOVER)."""
import random
import re
import time

from rltesting.cluster import Cluster, key_slot, tags_in_slots
from rltesting.proc import wait_until
from rltesting.replication import wait_replica_synced
from rltesting.replies import COMMANDS, db_digest, granted_units, keyspace, NEVER, rl
from rltesting.workload import Workload

ROUTES = ("login", "search", "upload")


def abbrev(cmd):
    return {"RL.TOKENBUCKET": "tb", "RL.SLIDINGLOG": "sl", "RL.SLIDINGCOUNTER": "sc",
            "RL.FIXEDWINDOW": "fw"}[cmd]


def tenant_keys(tenants, kind):
    """(cmd, key) for every tenant, route and command."""
    return [(cmd, f"rl:{{{t}}}:{route}:{kind}:{abbrev(cmd)}")
            for t in tenants for route in ROUTES for cmd in COMMANDS]


class Counting:
    """Calls from several threads, each with its own cluster client; counts
    the units each key was granted (exact: no call may fail)."""

    def __init__(self, cluster, keys, limit, threads=2, seed=1):
        self.keys = keys
        self.limit = limit
        self.granted = [dict.fromkeys((k for _, k in keys), 0) for _ in range(threads)]
        self.workers = []
        for t in range(threads):
            client = cluster.client()
            rnd = random.Random(seed * 100 + t)
            self.workers.append(Workload(self._caller(client, rnd, self.granted[t]), limit=10**6))

    def _caller(self, client, rnd, granted):
        def call(i):
            cmd, key = self.keys[rnd.randrange(len(self.keys))]
            cost = rnd.randint(1, 3)
            partial = rnd.random() < 0.3
            reply = rl(client, cmd, key, NEVER[cmd](self.limit), cost=cost, partial=partial)
            granted[key] += granted_units(reply, cost, partial)
        return call

    @property
    def calls(self):
        return sum(w.calls for w in self.workers)

    def start(self):
        for w in self.workers:
            w.start()

    def finish(self):
        errors = []
        for w in self.workers:
            try:
                w.finish()
            except Exception as e:  # noqa: BLE001 - collected, re-raised below
                errors.append(e)
        if errors:
            raise errors[0]

    def total(self, key):
        return sum(g[key] for g in self.granted)


def assert_remaining_exact(rc, keys, limit, counting):
    for cmd, key in keys:
        reply = rl(rc, cmd, key, NEVER[cmd](limit), cost=0)
        assert reply[:3] == [1, limit, limit - counting.total(key)], (key, reply, counting.total(key))


def node_view(cluster, key):
    """(digest, PEXPIRETIME) of a key, read on the node that owns it."""
    c = cluster.owner(key_slot(key.encode())).client()
    return (c.execute_command("DEBUG", "DIGEST-VALUE", key)[0], c.execute_command("PEXPIRETIME", key))


MEASURED = re.compile(r"MEMORY USAGE adds (\d+) bytes per key that the server does not count \(measured\)")


def measured_overhead(server):
    """The bytes the module measured at load for MEMORY USAGE (its log line),
    or None while it has not."""
    m = MEASURED.search(server.log_tail(10**6))
    return int(m.group(1)) if m else None


def test_cluster_tenant_limits_exact_and_survive_reshard(server_factory):
    """Per-tenant grants are exact under two concurrent cluster clients, and
    moving live tenants' slots with `redis-cli --cluster reshard` during the
    workload continues every limit exactly on the new owner; drained keys
    (which denied calls do not touch) arrive byte-identical."""
    cluster = Cluster(server_factory)
    # A cluster node serves no slot when it loads the module, so the load-time
    # MEMORY USAGE probe waits until it does; then it measures what a
    # standalone server of the same build measures.
    standalone = measured_overhead(server_factory())
    assert standalone is not None
    for node in cluster.nodes:
        wait_until(lambda: measured_overhead(node) is not None, timeout=30,
                   what="the MEMORY USAGE probe ran on a cluster node")
        assert measured_overhead(node) == standalone
    rc = cluster.client()
    src = cluster.owner(0)
    dst = next(s for s in cluster.nodes if s is not src)
    moved = tags_in_slots(0, 64, 3, prefix="m")  # the first 64 slots of src
    stay = tags_in_slots(8000, 16384, 3, prefix="s")  # elsewhere
    assert all(cluster.owner(key_slot(t.encode())) is src for t in moved)

    # Hash tags: every key of a tenant lives in one slot, on one node.
    for t in moved + stay:
        slots = {rc.execute_command("CLUSTER", "KEYSLOT", k) for _, k in tenant_keys([t], "x")}
        assert slots == {key_slot(t.encode())}

    # 1. Exact per tenant under concurrency: two clients race to drain small
    #    limits; exactly the limit is granted per key, not one more.
    burst = tenant_keys(moved + stay, "burst")
    c1 = Counting(cluster, burst, limit=30, seed=1)
    c1.start()
    try:
        wait_until(lambda: all(c1.total(k) == 30 for _, k in burst) or
                   any(not w.is_alive() for w in c1.workers), timeout=60, what="burst limits drained")
        n = c1.calls
        wait_until(lambda: c1.calls >= n + 100 or any(not w.is_alive() for w in c1.workers),
                   what="calls after draining")
    finally:
        c1.finish()
    for cmd, key in burst:
        assert c1.total(key) == 30, key
        owner = cluster.owner(key_slot(key.encode()))
        assert owner.client().exists(key) == 1  # stored on the slot's owner

    # 2. Move the moved tenants' slots to dst while calls keep coming.
    live = tenant_keys(moved + stay, "live")
    big = 10**6
    owners_before = {t: cluster.owner(key_slot(t.encode())) for t in stay}
    burst_before = {k: node_view(cluster, k) for _, k in burst}
    c2 = Counting(cluster, live, limit=big, seed=2)
    c2.start()
    try:
        wait_until(lambda: c2.calls >= 300 or any(not w.is_alive() for w in c2.workers),
                   what="workload under way")
        before = c2.calls
        t0 = time.monotonic()
        cluster.reshard(src, dst, 64)
        reshard_ms = (time.monotonic() - t0) * 1000
        during = c2.calls - before
        wait_until(lambda: c2.calls >= before + during + 300 or any(not w.is_alive() for w in c2.workers),
                   what="workload after reshard")
    finally:
        c2.finish()
    assert during > 0, "the reshard should have happened during the workload"

    for t in moved:
        assert cluster.owner(key_slot(t.encode())) is dst
    for t in stay:
        assert cluster.owner(key_slot(t.encode())) is owners_before[t]
    for cmd, key in live + burst:
        owner = cluster.owner(key_slot(key.encode()))
        assert owner.client().exists(key) == 1, key
        if key.startswith("rl:{m"):
            assert owner is dst
            slot = key_slot(key.encode())
            assert src.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert sum(c2.total(k) for _, k in live) > 0
    for _, key in burst:
        (d0, exp0), (d1, exp1) = burst_before[key], node_view(cluster, key)
        assert d1 == d0, key
        # MIGRATE sends the TTL relative (Redis's own RESTORE ttl), so the
        # expiry may move later by the time the transfer took, never earlier.
        if key.startswith("rl:{m"):
            assert 0 <= exp1 - exp0 <= reshard_ms + 1, (key, exp0, exp1, reshard_ms)
        else:
            assert exp1 == exp0, key
    rc = cluster.client()
    assert_remaining_exact(rc, live, big, c2)
    for cmd, key in burst:  # still drained on the new owner
        assert rl(rc, cmd, key, NEVER[cmd](30))[:3] == [0, 30, 0], key


def test_cluster_replica_failover_continues_limits(server_factory):
    """CLUSTER FAILOVER of a shard's replica in the middle of a workload on
    that shard: every limit continues exactly on the promoted replica, and
    the old primary, now its replica, holds identical states."""
    cluster = Cluster(server_factory)
    primary = cluster.owner(0)
    tenants = tags_in_slots(0, 64, 4, prefix="f")
    assert all(cluster.owner(key_slot(t.encode())) is primary for t in tenants)
    replica = cluster.add_replica(primary)

    small = tenant_keys(tenants, "small")
    live = tenant_keys(tenants, "live")
    big = 10**6
    rc = cluster.client()
    for cmd, key in small:  # drained before the failover
        assert rl(rc, cmd, key, NEVER[cmd](5), cost=5)[0] == 1

    work = Counting(cluster, live, limit=big, seed=3)
    work.start()
    try:
        wait_until(lambda: work.calls >= 300 or any(not w.is_alive() for w in work.workers),
                   what="workload under way")
        replica.client().execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: replica.client().info("replication")["role"] == "master" and
                   primary.client().info("replication")["role"] == "slave",
                   timeout=60, what="replica promoted")
        cluster.wait_ok()
        n = work.calls
        wait_until(lambda: work.calls >= n + 300 or any(not w.is_alive() for w in work.workers),
                   what="workload after failover")
    finally:
        work.finish()

    assert cluster.owner(key_slot(tenants[0].encode())) is replica
    rc = cluster.client()
    assert_remaining_exact(rc, live, big, work)
    for cmd, key in small:
        assert rl(rc, cmd, key, NEVER[cmd](5))[:3] == [0, 5, 0], key
    # The old primary, now a replica, holds the same states.
    new, old = replica.client(), primary.client(single_connection_client=True)
    old.execute_command("READONLY")  # reads on a cluster replica
    wait_replica_synced(new, old)
    assert keyspace(new) == keyspace(old)
    assert db_digest(new) == db_digest(old)
    assert sum(work.total(k) for _, k in live) > 0


def test_cluster_concurrency_leases_move_with_their_slots(server_factory):
    """RL.CONCURRENCY's leases on hash-tagged keys: routed to the slot's
    owner, carried by a reshard (MIGRATE: DUMP/RESTORE) byte for byte, and
    released on the new owner; RL.MULTI with a CONCURRENCY limit and a rate
    limit of one tenant is one call on one node, and keys in two slots are
    refused (CROSSSLOT)."""
    cluster = Cluster(server_factory)
    rc = cluster.client()
    src = cluster.owner(0)
    dst = next(s for s in cluster.nodes if s is not src)
    moved = tags_in_slots(0, 64, 3, prefix="cm")
    long = 600_000
    for t in moved:
        k = f"rl:{{{t}}}:inflight"
        for i in range(3):
            assert rc.execute_command("RL.CONCURRENCY", k, 10, long, "ACQUIRE", f"req{i}", "COST", 1 + i)[0] == 1
        rep = rc.execute_command("RL.MULTI", 2, k, f"rl:{{{t}}}:rate", "CONCURRENCY", 10, long, "req9",
                                 "TOKENBUCKET", 10, 1, 3_600_000)
        assert rep[6][0][:3] == [1, 10, 3], rep  # 1 + 2 + 3 + 1 of 10 held
    before = {t: node_view(cluster, f"rl:{{{t}}}:inflight") for t in moved}
    cluster.reshard(src, dst, 64)
    rc = cluster.client()
    for t in moved:
        k = f"rl:{{{t}}}:inflight"
        assert cluster.owner(key_slot(k.encode())) is dst
        assert node_view(cluster, k)[0] == before[t][0], k
        assert rc.execute_command("RL.CONCURRENCY", k, 10, long, "RELEASE", "req2")[:3] == [3, 10, 6]
        # req1's retried ACQUIRE of its 2 units renews it: nothing more held
        assert rc.execute_command("RL.CONCURRENCY", k, 10, long, "ACQUIRE", "req1", "COST", 2)[:3] == [1, 10, 6]
    try:
        rc.execute_command("RL.MULTI", 2, "rl:{a}:x", "rl:{b}:x", "CONCURRENCY", 1, 1000, "r",
                           "CONCURRENCY", 1, 1000, "r")
        raise AssertionError("a cross-slot RL.MULTI ran")
    except Exception as e:  # redis-py's cluster client raises its own error for it
        assert "slot" in str(e).lower(), e
