"""Failover under load on real processes (integration/failover.py): what an
unplanned failover costs a rate limit, in grants beyond its capacity.

A bucket of capacity C that never refills; client threads grant one unit at
a time through redis-py's `Sentinel` and count every grant they receive;
the over-admission is the grants beyond C. Configurations:

    async    default asynchronous replication
    minrep   min-replicas-to-write 1, min-replicas-max-lag 1
    strict   each grant followed by WAIT 1 <timeout> in the same plain
             pipeline (not MULTI/EXEC: inside a transaction WAIT cannot
             block and answers at once); a grant counts only when WAIT says
             a replica has it, else it is an error

Faults: a lone SIGKILL of the primary (`lone`); the primary<->replica links
cut at a random moment and the primary SIGKILLed after N further grants, as
in a machine crash (`cut`); a partition that leaves the old primary and one
gateway on one side (`test_partition_*`); kill -9 of a server persisting to
an AOF (`test_aof_*`).

The bound a crash must fit: the grants the old primary acknowledged after
the last byte it replicated, i.e. the grants the clients received while the
link was cut (counted between the moment the cut began and the kill), plus
at most one in flight per client at either end.

make test runs one run of each; RL_FAILOVER_RUNS=20 runs each crash
configuration 20 times and prints the distributions (docs/operations.md,
"What a failover costs").
"""
import json
import os
import random
import threading

import pytest
import redis

import failover as F
from harness import SERVER, wait_until

RUNS = int(os.environ.get("RL_FAILOVER_RUNS", "1"))
SKIP = F.nft_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=f"no packet filter: {SKIP}")

CLIENTS = 6
WAIT_MS = 100


@pytest.fixture(scope="module")
def topo():
    """One topology for the crash runs of this module (each run restarts
    the killed node as a replica); its processes and nftables table go when
    the module ends, also on failure."""
    t = F.Topology()
    yield t
    t.close()


def configure(topo, minrep):
    """min-replicas-to-write 1 / max-lag 1 on every data node, or off."""
    args = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"] if minrep else []
    topo.data_args = args  # what a restarted node gets (the module fixture starts with none)
    for n in topo.data_nodes:
        if n.alive():
            c = n.client()
            c.config_set("min-replicas-to-write", 1 if minrep else 0)
            c.config_set("min-replicas-max-lag", 1 if minrep else 10)


def one_run(topo, config, fault, capacity, after_cut):
    configure(topo, config == "minrep")
    try:
        cut_at = random.randint(capacity // 10, capacity // 5)
        r = F.crash_run(topo, capacity, cut_at, None if fault == "lone" else after_cut,
                        strict_wait_ms=WAIT_MS if config == "strict" else None,
                        nclients=CLIENTS, cut_deadline_s=3.0)
    finally:
        F.restore_topology(topo)
    r.update(config=config, fault=fault, server=str(SERVER))
    print(json.dumps(r))
    return r


def check(r):
    k = r["clients"]
    if r["config"] == "strict":
        # Every counted grant was on a replica before it was counted.
        assert r["over"] <= 0, r
    else:
        # Over-admission is the grants the link never carried: those made
        # while it was cut, give or take one in flight per client.
        assert r["window"] - k <= r["over"] <= r["window_hi"] + k, r


def summary(rs):
    overs = sorted(r["over"] for r in rs)
    wins = sorted(r["window_hi"] for r in rs)
    return (f"{rs[0]['config']}/{rs[0]['fault']} runs={len(rs)} over: min={overs[0]} "
            f"median={overs[len(overs) // 2]} max={overs[-1]} all={overs}; "
            f"window_hi: min={wins[0]} max={wins[-1]}")


@pytest.mark.parametrize("config,fault", [
    ("async", "lone"), ("async", "cut"), ("minrep", "cut"), ("strict", "cut"),
])
def test_crash_failover(topo, config, fault):
    """A failover after a crash over-admits no more than the grants made while
    the link was down (async, minrep), and never with strict mode."""
    rs = [one_run(topo, config, fault, capacity=2000, after_cut=300) for _ in range(RUNS)]
    for r in rs:
        check(r)
    print(summary(rs))


@pytest.mark.skipif(RUNS == 1, reason="long mode only (RL_FAILOVER_RUNS > 1)")
@pytest.mark.parametrize("config", ["async", "minrep", "strict"])
def test_crash_failover_long_cut(topo, config):
    """The link cut for 3 s before the kill: asynchronous replication loses
    all of it; min-replicas-to-write caps the loss at the lag it allows."""
    rs = [one_run(topo, config, "cut", capacity=20000, after_cut=10**9) for _ in range(RUNS)]
    for r in rs:
        check(r)
    print(summary(rs))


@pytest.mark.skipif(RUNS == 1, reason="long mode only (RL_FAILOVER_RUNS > 1)")
@pytest.mark.parametrize("config", ["minrep", "strict"])
def test_crash_failover_long_lone(topo, config):
    rs = [one_run(topo, config, "lone", capacity=2000, after_cut=None) for _ in range(RUNS)]
    for r in rs:
        check(r)
    print(summary(rs))
