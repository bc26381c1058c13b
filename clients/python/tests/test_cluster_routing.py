"""A sync RateLimit on a RedisCluster sends each call to the client of the
node that holds the key's slot (so that a timed-out call waits one timeout,
test_bound.py). What that must not break: a slot that moved (MOVED, then
the call goes through the cluster client, which follows it and learns the
new map), and a node that is gone for good (the map is re-read on a thread
of its own after a failed call, and the breaker's probe finds the new
owner)."""
import signal

import stall_probe
from rltesting.cluster import tags_in_slots
from rltesting.proc import wait_until
from support import cluster_client

from redis_ratelimit import Breaker, Panic, RateLimit

T = stall_probe.TIMEOUT_MS / 1000


def first_slot_key(cluster, node):
    """A key in the first slot `node` serves: the slot cluster.reshard(node,
    other, 1) moves."""
    lo = min(lo for lo, _, port in cluster._slot_map(node.client()) if port == node.port)
    return f"rl:{{{tags_in_slots(lo, lo + 1, 1)[0]}}}:api", lo


def calls_on(node, field="calls"):
    stats = node.client().info("commandstats")
    return next((v.get(field, 0) for k, v in stats.items()
                 if k.lower() == "cmdstat_rl.tokenbucket"), 0)


def test_a_moved_slot_is_followed_and_learnt(cluster):
    src, dst = cluster.nodes[0], cluster.nodes[1]
    key, slot = first_slot_key(cluster, src)
    rl = RateLimit(cluster_client(src.port, 1.0))
    lim = rl.limiter(stall_probe.POLICY)
    before = [lim.limit(key) for _ in range(3)]
    cluster.reshard(src, dst, 1)
    assert cluster.owner(slot) is dst
    src.client().config_resetstat()
    after = [lim.limit(key) for _ in range(5)]
    ds = before + after
    assert [d.source for d in ds] == ["module"] * 8, ds
    # the bucket's state moved with the slot: one unit a call, throughout
    assert [d.remaining for d in ds] == list(range(99, 91, -1)), ds
    # The first call after the move was answered MOVED twice by the old
    # owner (the node's client, then the cluster client, whose map was as
    # old), then made on the new owner; the map learnt, the other four went
    # straight there.
    assert calls_on(src) == 0 and calls_on(src, "rejected_calls") <= 2
    assert calls_on(dst) == 5
    assert rl.metrics()["failures"] == 0


def test_the_map_is_reread_after_a_failed_call(cluster):
    """The key's slot moves to another node, then its old owner stops. The
    calls still sent there time out and the breaker opens; the map is
    re-read meanwhile, so the probe after open_ms finds the new owner and
    the module decides again while the old owner is still stopped."""
    for s in cluster.nodes:     # no node is declared failed while this runs
        s.client().config_set("cluster-node-timeout", 60_000)
    src, dst = cluster.nodes[0], cluster.nodes[1]
    key, slot = first_slot_key(cluster, src)
    rl = RateLimit(cluster_client(src.port, T), breaker=Breaker(failures=3, open_ms=100))
    lim = rl.limiter(stall_probe.POLICY, panic=Panic(limit=5, window_ms=60_000))
    assert lim.limit("rl:{w}:api").source == "module"   # backend detected, map read
    cluster.reshard(src, dst, 1)
    src.proc.send_signal(signal.SIGSTOP)
    try:
        assert lim.limit(key).source == "panic"
        wait_until(lambda: lim.limit(key).source == "module", timeout=20,
                   what="the module deciding from the slot's new owner")
        assert calls_on(dst) >= 1
    finally:
        src.proc.send_signal(signal.SIGCONT)
