"""Failover under load on real processes (integration/failover.py): what an
unplanned failover costs a rate limit, in grants beyond its capacity.

A bucket of capacity C that never refills; client threads grant one unit at
a time through redis-py's `Sentinel` and count every grant they receive;
the over-admission is the grants beyond C. Configurations:

    async    default asynchronous replication
    minrep   min-replicas-to-write 1, min-replicas-max-lag 1
    strict   each grant followed by WAIT <every replica> <timeout> in the
             same plain pipeline (not MULTI/EXEC: inside a transaction WAIT
             cannot block and answers at once); a grant counts only when
             WAIT says every replica has it, else it is an error (WAIT 1
             with two replicas once let 428 acknowledged grants be granted
             again: the sentinels promoted the replica that lacked them)
    libstrict  the same through the Python client library's own strict
             mode: RateLimit(client, strict=Strict(<every replica>, 100))
             on a redis-py Sentinel master_for() client; a grant counts
             when a decision is allowed from the shared limit
    nodestrict the same through the Node library's strict mode (ioredis
             `sentinels`, strict: {replicas: <every replica>, timeoutMs:
             100}); long mode only

Faults: a lone SIGKILL of the primary (`lone`); the primary<->replica links
cut at a random moment and the primary SIGKILLed after N further grants, as
in a machine crash (`cut`); a partition that leaves the old primary and one
gateway on one side (`test_partition_*`); kill -9 of a server persisting to
an AOF (`test_aof_*`).

The bound a crash must fit: the grants the old primary acknowledged after
the last byte its promoted replica received: the grants the clients
received while the link was cut, plus the replica's lag at the cut (the
effects between its frozen offset and the primary's offset read right
after the cut), give or take one in flight per client.

make test runs one run of each; RL_FAILOVER_RUNS=20 runs each crash
configuration 20 times and prints the distributions (docs/operations.md,
"What a failover costs").
"""
import json
import os
import random
import shutil
import sys
import threading

import pytest
import redis

import failover as F
from rltesting.proc import SERVER, wait_until

RUNS = int(os.environ.get("RL_FAILOVER_RUNS", "1"))
SKIP = F.nft_unavailable()
# slow: the failover and partition runs (make check leaves them to make test).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SKIP is not None, reason=f"no packet filter: {SKIP}")]

CLIENTS = 6
STRICT = ("strict", "libstrict", "nodestrict")
NODE = os.path.join(os.path.dirname(F.NODE_GRANTER), "..", "..", "node_modules", "ioredis")
node = pytest.mark.skipif(not os.path.isdir(NODE) or shutil.which("node") is None,
                          reason="the Node library's dependencies are not installed (make "
                                 "test-clients-node installs them)")
WAIT_MS = 100

# make test runs this suite on every server build; the crash runs that
# assert the two headline properties (async within its bound, strict never
# over) run on each, the rest (lone kill, min-replicas, partitions: ~55 s)
# on Debian's redis-server only, unless RL_FAILOVER_ALL=1 or the long mode.
ON_EVERY_SERVER = (os.environ.get("RL_FAILOVER_ALL") == "1" or RUNS > 1
                   or os.path.realpath(SERVER.path) == os.path.realpath(shutil.which("redis-server") or "/"))
heavy = pytest.mark.skipif(not ON_EVERY_SERVER,
                           reason="on Debian's redis-server only (RL_FAILOVER_ALL=1 runs it here)")


class Shared:
    """One topology for the runs of this module (a crash run restarts the
    killed node as a replica, a partition run ends with the old primary a
    replica again); a test that fails leaves it to be rebuilt for the next."""

    def __init__(self):
        self.t = None

    def get(self):
        if self.t is None:
            self.t = F.Topology()
        return self.t

    def drop(self):
        if self.t is not None:
            self.t.close()
            self.t = None


@pytest.fixture(scope="module")
def shared():
    sh = Shared()
    yield sh
    sh.drop()  # processes and the nftables table, also after a failure


@pytest.fixture
def topo(shared, request):
    failed = request.session.testsfailed
    t = shared.get()
    yield t
    # The call's report is logged before teardown. A topology the last run
    # could not restore is rebuilt for the next test. After a failure, each
    # process's log ends on stderr first (its directory goes with it), so
    # the report says what the sentinels did (+tilt, +switch-master,
    # +convert-to-slave).
    if request.session.testsfailed != failed:
        for p in t.nodes + t.sentinels:
            sys.stderr.write(f"--- {type(p).__name__} {p.host}:{p.port}: its log ends\n{p.log_tail(30)}")
    if request.session.testsfailed != failed or getattr(t, "broken", False):
        shared.drop()


def configure(topo, minrep):
    """min-replicas-to-write 1 / max-lag 1 on every data node, or off."""
    args = ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "1"] if minrep else []
    topo.data_args = args  # what a restarted node gets (the module fixture starts with none)
    for n in topo.data_nodes:
        if n.alive():
            wait_until(lambda: set_minrep(n, minrep), timeout=60, what=f"{n.addr} configured")


def set_minrep(n, minrep):
    """True once the node took both settings; False while a node the last
    run restarted does not answer yet (a reset connection, a timeout)."""
    try:
        c = n.client()
        c.config_set("min-replicas-to-write", 1 if minrep else 0)
        c.config_set("min-replicas-max-lag", 1 if minrep else 10)
        return True
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False


def one_run(topo, config, fault, after_cut):
    configure(topo, config == "minrep")
    try:
        cut_at = random.randint(200, 400)
        r = F.crash_run(topo, cut_at, None if fault == "lone" else after_cut,
                        strict_wait_ms=WAIT_MS if config in STRICT else None,
                        nclients=CLIENTS, cut_deadline_s=3.0,
                        library={"libstrict": True, "nodestrict": "node"}.get(config, False))
    except F.TopologyMoved:
        topo.broken = True  # nothing to restore: the topology is rebuilt
        raise
    finally:
        if not getattr(topo, "broken", False):
            try:
                F.restore_topology(topo)
            except AssertionError as e:
                # Preparing the next run, not part of this one's measurement
                # (seen once on Valkey 9.1: a sentinel that did not list the
                # restarted replica within 60 s): a new topology is built.
                print(f"topology not restored ({e}); it will be rebuilt")
                topo.broken = True
    r.update(config=config, fault=fault, server=str(SERVER))
    print(json.dumps(r))
    return r


def measured_run(shared, config, fault, after_cut):
    """One run; a run that found the sentinels had moved the primary before
    its fault (F.TopologyMoved: it measured nothing) is run again once on a
    new topology, and fails the test if that happens twice in a row."""
    for attempt in (1, 2):
        t = shared.get()
        try:
            return one_run(t, config, fault, after_cut)
        except F.TopologyMoved as e:
            if attempt == 2:
                raise
            print(f"run not measured, run again on a new topology: {e}")
        finally:
            if getattr(t, "broken", False):
                shared.drop()


def runs(shared, config, fault, after_cut):
    """RUNS runs on the shared topology; one whose end-of-run restore failed
    (topo.broken) is rebuilt before the next run, not only before the next
    test (seen on Valkey 9.1 in the long mode: the next run found the
    sentinels not knowing the topology and failed)."""
    return [measured_run(shared, config, fault, after_cut) for _ in range(RUNS)]


def check(r):
    k = r["clients"]
    if r["config"] in STRICT:
        # Every counted grant was on a replica before it was counted.
        assert r["over"] <= 0, r
    else:
        # Over-admission is the grants the link never carried: every grant
        # made while it was cut (give or take one in flight per client),
        # and at most those plus the replica's lag when it was cut (the
        # effects between its last offset and the primary's).
        assert r["window"] - k <= r["over"] <= r["bound"], r


def summary(rs):
    overs = sorted(r["over"] for r in rs)
    wins = sorted(r["bound"] for r in rs)
    return (f"{rs[0]['config']}/{rs[0]['fault']} runs={len(rs)} over: min={overs[0]} "
            f"median={overs[len(overs) // 2]} max={overs[-1]} all={overs}; "
            f"bound: min={wins[0]} max={wins[-1]}")


long_only = pytest.mark.skipif(RUNS == 1, reason="long mode only (RL_FAILOVER_RUNS > 1)")


@pytest.mark.parametrize("config,fault", [
    pytest.param("async", "lone", marks=heavy), ("async", "cut"),
    pytest.param("minrep", "cut", marks=heavy), ("strict", "cut"),
    pytest.param("libstrict", "cut", marks=heavy),
    pytest.param("nodestrict", "cut", marks=[node, long_only]),
])
def test_crash_failover(topo, shared, config, fault):
    """A failover after a crash over-admits no more than the grants made while
    the link was down (async, minrep), and never with strict mode."""
    rs = runs(shared, config, fault, 300)
    for r in rs:
        check(r)
    print(summary(rs))


@pytest.mark.skipif(RUNS == 1, reason="long mode only (RL_FAILOVER_RUNS > 1)")
@pytest.mark.parametrize("config", ["async", "minrep", "strict", "libstrict"])
def test_crash_failover_long_cut(topo, shared, config):
    """The link cut for 3 s before the kill: asynchronous replication loses
    all of it; min-replicas-to-write caps the loss at the lag it allows."""
    rs = runs(shared, config, "cut", 10**9)
    for r in rs:
        check(r)
    print(summary(rs))


@pytest.mark.skipif(RUNS == 1, reason="long mode only (RL_FAILOVER_RUNS > 1)")
@pytest.mark.parametrize("config", ["minrep", "strict", "libstrict"])
def test_crash_failover_long_lone(topo, shared, config):
    rs = runs(shared, config, "lone", None)
    for r in rs:
        check(r)
    print(summary(rs))


@heavy
@pytest.mark.parametrize("config", ["async", "minrep"])
def test_partition(topo, config):
    """The old primary and gateway A cut off from the replicas, the sentinels
    and gateway B. Without min-replicas-to-write the old primary grants for
    as long as the partition lasts; with it, it refuses writes once its
    replicas' acknowledgements are more than 1 s old. Either way every grant
    it made in the partition is erased when it rejoins as a replica: the
    bucket hands those units out again."""
    configure(topo, config == "minrep")
    rs = []
    for _ in range(RUNS):
        r = F.partition_run(topo)
        r.update(config=config, server=str(SERVER))
        print(json.dumps(r))
        rs.append(r)
        topo.wait_sentinels_ready()
        # What is lost is what the old primary granted from the cut until
        # it rejoined as a replica, plus what it had granted before the cut
        # and not yet sent to the replica that was promoted (its lag at the
        # cut: ci15 lost 231 more than the old primary granted after the
        # cut, on a loaded machine), give or take one in flight per client
        # at either end.
        extra = r["lost"] - r["old_primary_from_cut"]
        assert -(r["cut_slack"] + r["clients"]) <= extra <= r["lag_at_cut"] + r["clients"], r
        assert r["old_primary_from_cut"] >= r["during_old_primary"], r
        assert r["rejoined_state_matches"], r
        if config == "async":
            assert r["old_primary_refused_after"] is None, r
        else:
            # It refused writes before the partition ended, and granted
            # nothing after its first refusal while the partition lasted.
            # (Healed, it may grant again for a moment: the replicas'
            # queued acknowledgements reach it before their links close.)
            assert r["old_primary_refused_after"] is not None, r
            assert r["old_primary_granted_after_refusal"] <= r["clients"], r
    if RUNS > 1:
        lost = sorted(r["lost"] for r in rs)
        print(f"partition/{config} runs={len(rs)} lost: min={lost[0]} "
              f"median={lost[len(lost) // 2]} max={lost[-1]} all={lost}")


def has_waitaof(c):
    """WAITAOF exists: Redis 7.2+ and Valkey (Debian's Redis 7.0 lacks it)."""
    c.set_response_callback("COMMAND", lambda reply, **kw: reply)
    try:
        return c.execute_command("COMMAND", "INFO", "WAITAOF") not in ([], [None], None)
    except redis.exceptions.ResponseError:
        return False


@pytest.mark.parametrize("fsync,waitaof", [
    ("always", False), ("everysec", False), ("everysec", True), ("always", True),
])
def test_aof_kill9(server_factory, fsync, waitaof):
    """kill -9 of a server persisting to an AOF, under load, then a restart
    from the AOF. appendfsync always: every grant acknowledged before the
    kill is still spent (the AOF is written and fsynced before the reply).
    everysec: the AOF is normally written before the reply, but while a
    background fsync is still running the server holds its writes back for
    up to 2 s and replies anyway, so a kill -9 can lose acknowledged grants
    (seen here on a loaded disk: 1,082 of 4,734); the test asserts only
    that nothing unacknowledged appears and prints what was lost. An OS
    crash or power cut (not produced here) also loses everysec's writes not
    yet fsynced. WAITAOF 1 0 after each grant (Redis 7.2+, Valkey) counts a
    grant only once it is fsynced: then none is lost, with either setting."""
    s = server_factory(["--appendonly", "yes", "--appendfsync", fsync])
    c = s.client()
    if waitaof and not has_waitaof(c):
        pytest.skip(f"{SERVER} has no WAITAOF")
    capacity, key = 100000, "rl:aof:kill9"
    args = ["RL.TOKENBUCKET", key, capacity, 1, F.HUGE]
    lock = threading.Lock()
    counts = {"acked": 0, "unacked": 0}
    stop = threading.Event()

    def grant():
        r = s.client()
        while not stop.is_set():
            try:
                if waitaof:
                    p = r.pipeline(transaction=False)
                    p.execute_command(*args)
                    p.execute_command("WAITAOF", 1, 0, 0)
                    reply, (local, _) = p.execute()
                    ok = reply[0] == 1 and local >= 1
                else:
                    ok = r.execute_command(*args)[0] == 1
            except redis.exceptions.ConnectionError:
                return
            with lock:
                counts["acked" if ok else "unacked"] += 1

    threads = [threading.Thread(target=grant, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    target = random.randint(8, 40) if fsync == "everysec" and waitaof else random.randint(300, 3000)
    wait_until(lambda: counts["acked"] >= target, timeout=60, interval=0.001, what="grants")
    s.kill9()
    stop.set()
    for t in threads:
        t.join(30)
    acked = counts["acked"]
    s.start()
    spent = capacity - s.client().execute_command(*args, "COST", 0)[2]
    # Nothing beyond the acknowledged grants, the calls in flight at the
    # kill (one per client) and, with WAITAOF, the grants whose WAITAOF had
    # not answered.
    assert spent <= acked + counts["unacked"] + len(threads), (acked, spent, counts)
    print(json.dumps({"fsync": fsync, "waitaof": waitaof, "acked": acked, "spent": spent,
                      "lost": max(0, acked - spent), "server": str(SERVER)}))
    if fsync == "always" or waitaof:
        # Every acknowledged grant survived.
        assert acked <= spent, (acked, spent, counts)
