"""RL.MULTI and REFUND replicated by effect (a random workload's replica
equals its primary; one effect per written key) and routed in Redis
Cluster (key specs with numkeys: CROSSSLOT, hash tags, redirection by a
cluster client)."""
import random

import pytest
import redis

from rltesting.cluster import Cluster, key_slot, tags_in_slots
from rltesting.proc import wait_until
from rltesting.replication import ReplicationTap, start_replica, wait_ack
from rltesting.replies import db_digest, HUGE, keyspace
from rltesting.workload import run_pipelined

from multicalls import ALGOS, SEED, SINGLE, TYPE_OF, _s, check_multi, dump_all, multi, multi_args

# ---------------------------------------------------------------------------
# Replication.
# ---------------------------------------------------------------------------

LONGP = {"TOKENBUCKET": [[6, 1, 60000], [10, 3, 600000]], "SLIDINGLOG": [[6, 60000], [10, 600000]],
         "SLIDINGCOUNTER": [[6, 60000], [10, 600000]], "FIXEDWINDOW": [[6, 60000], [10, 600000]]}
SHORTP = {"TOKENBUCKET": [[4, 1, 40], [6, 2, 100]], "SLIDINGLOG": [[4, 40], [6, 100]],
          "SLIDINGCOUNTER": [[4, 40], [6, 100]], "FIXEDWINDOW": [[4, 40], [6, 100]]}


class MultiWorkload:
    """Single calls and RL.MULTI calls over 2-4 keys of mixed algorithms,
    with WEIGHT, PARTIAL, DRYRUN, COST 0, REFUND (single and multi), long
    and short-lived keys, issued in pipelined batches."""

    def __init__(self, seed):
        self.rnd = random.Random(seed)
        self.keys = []
        for algo in ALGOS:
            for i in range(4):
                self.keys.append((algo, f"rl:w:{algo}:long:{i}", LONGP[algo]))
            for i in range(2):
                self.keys.append((algo, f"rl:w:{algo}:short:{i}", SHORTP[algo]))
        self.stats = dict.fromkeys(["multi_granted", "multi_denied", "multi_dryrun", "refund",
                                    "multi_refund", "single"], 0)

    def op(self):
        rnd = self.rnd
        n = rnd.randint(1, 4)
        picks = rnd.sample(self.keys, n)
        limits = [(a, rnd.choice(ps), rnd.choice([None, 1, 2, 3])) for a, _, ps in picks]
        keys = [k for _, k, _ in picks]
        x = rnd.random()
        if x < 0.12:
            return ("refund", keys, limits, rnd.randint(1, 4))
        if x < 0.3:
            a, k, ps = picks[0]
            return ("single", a, k, rnd.choice(ps), rnd.choice([0, 1, 2]), rnd.random() < 0.4)
        cost = rnd.choice([0, 1, 1, 1, 2, 3])
        return ("multi", keys, limits, cost, rnd.random() < 0.3, rnd.random() < 0.15)

    def run(self, client, nops):
        run_pipelined(client, nops, self.op, self._send, self._check)

    def _send(self, pipe, op):
        if op[0] == "refund":
            _, keys, limits, n = op
            if len(keys) == 1 and self.rnd.random() < 0.5:
                pipe.execute_command(SINGLE[limits[0][0]], keys[0], *limits[0][1], "REFUND", n)
            else:
                pipe.execute_command(*multi_args(keys, limits, refund=n))
        elif op[0] == "single":
            _, a, k, p, cost, refund = op
            pipe.execute_command(SINGLE[a], k, *p, *(["REFUND", cost + 1] if refund else ["COST", cost]))
        else:
            _, keys, limits, cost, partial, dryrun = op
            pipe.execute_command(*multi_args(keys, limits, cost=cost, partial=partial, dryrun=dryrun))

    def _check(self, op, reply):
        assert not isinstance(reply, Exception), (op, reply)
        if op[0] == "refund":
            self.stats["refund"] += 1
            if len(reply) == 7:
                self.stats["multi_refund"] += 1
                check_multi(reply, op[2], refund=op[3])
        elif op[0] == "single":
            self.stats["single"] += 1
        else:
            _, keys, limits, cost, partial, dryrun = op
            check_multi(reply, limits, cost=cost, partial=partial, dryrun=dryrun)
            if dryrun:
                self.stats["multi_dryrun"] += 1
            elif reply[0] and cost:
                self.stats["multi_granted"] += 1
            elif cost:
                self.stats["multi_denied"] += 1

def assert_same(m, r):
    mk, rk = keyspace(m), keyspace(r)
    assert mk == rk, f"RL_SEED={SEED}"
    assert db_digest(m) == db_digest(r)
    return mk


def test_replica_matches_after_multi_and_refund_workload(server_factory):
    """A random workload with RL.MULTI and REFUND: after WAIT, every key has
    the same DEBUG DIGEST-VALUE and PEXPIRETIME on primary and replica."""
    primary = server_factory()
    m = primary.client()
    w = MultiWorkload(SEED)
    w.run(m, 600)
    rep = start_replica(server_factory, primary)
    r = rep.client()
    w.run(m, 2500)

    def settled():
        live = m.keys("*")
        return not any(b":short:" in k for k in live) and m.dbsize() == len(live)
    wait_until(settled, timeout=20, what="short keys expired")
    wait_ack(m)
    ks = assert_same(m, r)
    assert min(w.stats.values()) > 0, w.stats
    # (Which types are left depends on the seed: refunds and expiry make
    # keys fresh again.)
    assert ks and {t for t, _, _ in ks.values()} <= set(TYPE_OF.values()), (ks, f"RL_SEED={SEED}")
    for k, (t, _, exp) in ks.items():
        assert exp > 0, (k, exp)


def test_stream_one_effect_per_written_key(server):
    """Denied and DRYRUN multi calls (and COST 0) replicate nothing, not even
    MULTI/EXEC; a granted call replicates one RL.STATE per key inside one
    MULTI/EXEC; a refund that empties a limiter replicates its deletion."""
    m = server.client()
    keys = ["rl:{s}:a", "rl:{s}:b", "rl:{s}:c"]
    limits = [("TOKENBUCKET", [5, 1, HUGE], None), ("SLIDINGLOG", [5, HUGE], 2),
              ("SLIDINGCOUNTER", [5, HUGE], None)]
    with ReplicationTap(server) as tap:
        assert multi(m, keys, limits, cost=3)[0] == 0          # the log cannot take 6
        assert multi(m, keys, limits, cost=2, dryrun=True)[0] == 1
        assert multi(m, keys, limits, cost=0)[0] == 1
        assert multi(m, keys, limits, cost=5, partial=True, dryrun=True)[0] == 2
        assert tap.take() == []
        assert m.exists(*keys) == 0
        assert multi(m, keys, limits, cost=2)[0] == 1
        lines = [ln for ln in tap.take() if ln != '"SELECT","0"']
        assert lines[0] == '"MULTI"' and lines[-1] == '"EXEC"', lines
        assert [ln.split(",")[:2] for ln in lines[1:-1]] == [['"RL.STATE"', f'"{k}"'] for k in keys], lines
        before = dump_all(m, keys)
        assert multi(m, keys, limits, cost=1)[0] == 0          # the log has 1 left, needs 2
        assert tap.take() == []
        assert dump_all(m, keys) == before
        # Refund: the bucket and the counter become fresh (deleted), the log
        # keeps nothing either.
        rep = multi(m, keys, limits, refund=2)
        assert [p[0] for p in rep[6]] == [2, 4, 2]
        lines = [ln for ln in tap.take() if ln not in ('"SELECT","0"', '"MULTI"', '"EXEC"')]
        assert len(lines) == 3 and all(_s(ln).split(",")[1] == f'"{k}"' for ln, k in zip(lines, keys)), lines
        assert m.exists(*keys) == 0


# ---------------------------------------------------------------------------
# Cluster.
# ---------------------------------------------------------------------------

def test_cluster_crossslot_hashtag_and_redirection(server_factory):
    """Keys in different slots: CROSSSLOT, nothing changes. With a hash tag
    the call succeeds on the owner, and a cluster client routes it to the
    owner of the tag's slot wherever that is."""
    cluster = Cluster(server_factory)
    a, b = "rl:{alpha}:s", "rl:{beta}:m"
    assert key_slot(a.encode()) != key_slot(b.encode())
    limits = [("SLIDINGLOG", [5, 60000], None), ("TOKENBUCKET", [20, 1, 60000], None)]
    owner = cluster.owner(key_slot(a.encode())).client()
    with pytest.raises(redis.exceptions.ResponseError, match="CROSSSLOT"):
        owner.execute_command(*multi_args([a, b], limits))
    assert owner.exists(a) == 0
    # A node that owns neither slot redirects (MOVED) rather than running it.
    tags = tags_in_slots(0, 16384, 60)
    cc = cluster.client()
    granted = {}
    for tag in tags:
        keys = [f"rl:{{{tag}}}:user7:s", f"rl:{{{tag}}}:tenant"]
        for _ in range(3):
            rep = cc.execute_command(*multi_args(keys, limits))
            check_multi(rep, limits)
        granted[tag] = rep[6][1][2]
    assert set(granted.values()) == {17}
    owners = {cluster.owner(key_slot(t.encode())).port for t in tags}
    assert len(owners) == 3, owners
    for tag in tags[:10]:
        node = cluster.owner(key_slot(tag.encode())).client()
        assert node.exists(f"rl:{{{tag}}}:user7:s", f"rl:{{{tag}}}:tenant") == 2
        other = next(s for s in cluster.nodes if s.port != cluster.owner(key_slot(tag.encode())).port)
        with pytest.raises(redis.exceptions.ResponseError, match="MOVED"):
            other.client().execute_command(*multi_args([f"rl:{{{tag}}}:x", f"rl:{{{tag}}}:y"], limits))
