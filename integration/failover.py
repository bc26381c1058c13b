"""Failover under load, on the topologies of topology.py (a primary, replicas
and Sentinels on their own loopback addresses, nftables rules between them):
granting clients (harness threads through redis-py's Sentinel, the Python
library's RateLimit, or the Node library's granter processes), one crash
run (`crash_run`), the restore after it, and a partition run
(`partition_run`). test_failover.py runs them and asserts their bounds.
"""
import json
import os
import random
import subprocess
import threading
import time

import redis

from rltesting.proc import ROOT, wait_until
from topology import SERVICE, _die_with_parent
from topology import Topology, nft_unavailable  # noqa: F401 - test_failover.py uses them as F.*

# ---------------------------------------------------------------------------
# Granting clients
# ---------------------------------------------------------------------------

HUGE = (1 << 53) - 1  # refill interval: no token ever comes back


def bucket_call(capacity):
    """The arguments of a grant from a bucket of `capacity` that never refills."""
    return ["RL.TOKENBUCKET", None, capacity, 1, HUGE]


class Granters:
    """`n` client threads granting one unit at a time from `key`, each
    through its own `gateway.primary()` client. A grant is counted when its
    reply says allowed; in strict mode (`wait_timeout_ms`), the grant and
    `WAIT 1 <timeout>` go in one plain pipeline and the grant counts only
    when WAIT answers >= 1 (else it is an error: unacknowledged). Errors
    (connection, READONLY, NOREPLICAS, no primary known) are counted by kind
    and the call is retried. A thread stops at its first denial once
    `stop_on_denial` is set (after the old primary is gone), or at stop()."""

    def __init__(self, gateways, key, capacity, n=6, wait_timeout_ms=None, wait_replicas=1,
                 library=False):
        self.key = key
        self.library = library
        self.wait_replicas = wait_replicas
        self.capacity = capacity
        self.wait_timeout_ms = wait_timeout_ms
        self.lock = threading.Lock()
        self.granted = 0
        self.unacked = 0
        self.denied_early = 0
        self.by_addr = {}  # grants counted, by the address of the server that made them
        self.errors = {}
        self.stop_on_denial = threading.Event()
        self._stop = threading.Event()
        self.done = [threading.Event() for _ in range(n)]
        self.failures = []
        self.threads = [threading.Thread(target=self._run, args=(gateways[i % len(gateways)], i),
                                         daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, gateway, i):
        try:
            r = gateway.primary()
            if self.library:
                self._run_library(r)
                return
            args = ["RL.TOKENBUCKET", self.key, self.capacity, 1, HUGE]
            while not self._stop.is_set():
                try:
                    if self.wait_timeout_ms is None:
                        allowed = r.execute_command(*args)[0]
                        acked = True
                    else:
                        p = r.pipeline(transaction=False)
                        p.execute_command(*args)
                        p.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
                        reply, acks = p.execute()
                        allowed, acked = reply[0], acks >= self.wait_replicas
                except redis.exceptions.RedisError as e:
                    kind = type(e).__name__
                    msg = str(e)
                    if "NOREPLICAS" in msg:
                        kind = "NOREPLICAS"
                    with self.lock:
                        self.errors[kind] = self.errors.get(kind, 0) + 1
                    time.sleep(0.005)
                    continue
                with self.lock:
                    if allowed == 1 and acked:
                        self.granted += 1
                        # This thread's pool holds one connection, to the
                        # primary it last asked the sentinels for.
                        addr = r.connection_pool.master_address
                        self.by_addr[addr] = self.by_addr.get(addr, 0) + 1
                    elif allowed == 1:
                        self.unacked += 1
                    elif not self.stop_on_denial.is_set():
                        self.denied_early += 1
                if allowed != 1 and self.stop_on_denial.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.failures.append(e)
        finally:
            self.done[i].set()

    def _run_library(self, r):
        """The same loop through the Python client library (clients/python):
        `RateLimit(client, strict=Strict(wait_replicas, wait_timeout_ms))`
        on the gateway's Sentinel-managed client; a grant is counted when a
        decision says allowed and comes from the shared limit (source
        "module"), i.e. the library saw WAIT acknowledge it. Its failures
        (connection, READONLY, NOREPLICAS, unreplicated) are the breaker's;
        the decisions it makes meanwhile (panic) are counted by source."""
        from redis_ratelimit import Breaker, Panic, RateLimit, Strict, token_bucket
        strict = None if self.wait_timeout_ms is None else \
            Strict(replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms)
        rl = RateLimit(r, backend="module", strict=strict,
                       breaker=Breaker(failures=3, open_ms=20))
        lim = rl.limiter(token_bucket("failover", self.capacity, 1, HUGE),
                         panic=Panic(limit=1, window_ms=HUGE))
        try:
            while not self._stop.is_set():
                d = lim.limit(self.key)
                with self.lock:
                    if d.source == "module" and d.allowed:
                        self.granted += 1
                        addr = r.connection_pool.master_address
                        self.by_addr[addr] = self.by_addr.get(addr, 0) + 1
                    elif d.source == "module":
                        if not self.stop_on_denial.is_set():
                            self.denied_early += 1
                    else:
                        self.errors[d.source] = self.errors.get(d.source, 0) + 1
                if d.source != "module":
                    time.sleep(0.005)
                elif not d.allowed and self.stop_on_denial.is_set():
                    break
        finally:
            m = rl.metrics()
            with self.lock:
                self.unacked += m.get("unreplicated", 0)
                self.errors["failures"] = self.errors.get("failures", 0) + m["failures"]

    def count(self):
        with self.lock:
            return self.granted

    def on(self, addr):
        """Grants counted from the server at `addr`."""
        with self.lock:
            return self.by_addr.get(addr, 0)

    def wait_count(self, n, timeout=60):
        return wait_until(lambda: self.count() >= n or self.failures, timeout=timeout,
                          interval=0.001, what=f"{n} grants")

    def wait_done(self, timeout=90):
        wait_until(lambda: all(d.is_set() for d in self.done), timeout=timeout,
                   interval=0.01, what="every client saw the bucket empty")

    def stop(self):
        self._stop.set()
        for t in self.threads:
            t.join(30)
        if self.failures:
            raise self.failures[0]


NODE_GRANTER = os.path.join(ROOT, "clients", "node", "test", "fixtures", "failover_granter.js")


class NodeGranters:
    """Granters' interface for crash_run, the grants made by the Node
    library (clients/node, ioredis `sentinels`): one node process
    (clients/node/test/fixtures/failover_granter.js) running `n` loops, each
    with its own client and RateLimit, strict with `wait_replicas` /
    `wait_timeout_ms` when wait_timeout_ms is set. It writes one byte per
    decision; a reader thread counts them. Its connections leave from
    127.0.0.1 (ioredis has no source address option): fine for a crash run,
    whose cut is between the primary and the replicas."""

    def __init__(self, topo, key, capacity, n=6, wait_timeout_ms=None, wait_replicas=1):
        self.wait_replicas = wait_replicas
        self.lock = threading.Lock()
        self.granted = self.denied_early = self.unacked = 0
        self.errors = {}
        self.failures = []
        self.stop_on_denial = threading.Event()
        arg = {"sentinels": [list(x.addr) for x in topo.sentinels], "name": SERVICE,
               "key": key, "capacity": capacity, "periodMs": HUGE, "clients": n,
               "timeoutMs": 500, "replicas": wait_replicas if wait_timeout_ms else 0,
               "waitMs": wait_timeout_ms or 0}
        self.proc = subprocess.Popen(["node", NODE_GRANTER, json.dumps(arg)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        self.tail = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        try:
            while True:
                chunk = self.proc.stdout.read1(1 << 16)
                if not chunk:
                    break
                nl = chunk.find(b"\n")
                body = chunk if nl < 0 else chunk[:nl]
                with self.lock:
                    self.granted += body.count(b"g")
                    self.denied_early += body.count(b"d")
                    p = body.count(b"p")
                    if p:
                        self.errors["panic"] = self.errors.get("panic", 0) + p
                if nl >= 0:
                    self.tail = chunk[nl:] + self.proc.stdout.read()
                    break
        except BaseException as e:  # noqa: BLE001 - reported by stop()
            self.failures.append(e)

    def count(self):
        with self.lock:
            return self.granted

    def wait_count(self, n, timeout=60):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"node granter exited {self.proc.returncode}: "
                                     f"{self.proc.stderr.read().decode()[-2000:]}")
            return self.count() >= n or self.failures
        return wait_until(ready, timeout=timeout, interval=0.001, what=f"{n} grants (node)")

    def stop(self):
        self.proc.stdin.close()
        self.reader.join(60)
        self.proc.wait(60)
        if self.failures:
            raise self.failures[0]
        m = json.loads(self.tail.strip() or b"{}").get("metrics", [])
        self.unacked = sum(x.get("unreplicated", 0) for x in m)
        self.errors["failures"] = sum(x.get("failures", 0) for x in m)


def grant_effect(c, key, capacity):
    """Make two grants of `key` on the primary `c`; return the bytes one
    grant's effect adds to the replication stream (the second grant's: the
    first creates the key). Divides a replica's lag in bytes into grants."""
    for _ in range(2):
        before = c.info("replication")["master_repl_offset"]
        assert c.execute_command("RL.TOKENBUCKET", key, capacity, 1, HUGE)[0] == 1
    effect = c.info("replication")["master_repl_offset"] - before
    assert effect > 0, "a grant added nothing to the replication stream"
    return effect


def grants_in(nbytes, effect):
    """The most grants `nbytes` of replication stream can hold (grants of
    `effect` bytes each, rounded up; none for a negative count)."""
    return -(-max(0, nbytes) // effect)


def crash_run(topo, cut_at, after_cut, strict_wait_ms=None, nclients=6, cut_deadline_s=5.0,
              continue_grants=200, capacity=10**9, wait_replicas=None, library=False):
    """One failover under load. The clients grant from a fresh bucket of
    `capacity` that never refills. With `after_cut` None: once `cut_at`
    grants were received the primary is SIGKILLed (a lone process kill; the
    kernel still delivers its socket buffers). Otherwise at `cut_at` grants
    the primary<->replica links are cut (every packet dropped, one nft
    transaction), and after `after_cut` further grants (or `cut_deadline_s`
    seconds, if the primary stops granting: min-replicas) it is SIGKILLed,
    as in a machine crash. The sentinels promote a replica; the rules are
    removed only after the promotion (else the dead primary's queued bytes
    would still reach the replicas). The clients go on until they received
    `continue_grants` more from the new primary. Strict mode pipelines
    `WAIT wait_replicas` (default: every replica) after each grant; with
    `library`, the clients are the Python library's `RateLimit` (its own
    strict mode, `Strict(wait_replicas, strict_wait_ms)`, when
    strict_wait_ms is set) on each gateway's Sentinel-managed client;
    with library="node", the Node library's (NodeGranters).

    over = grants received + tokens the new primary still holds - capacity:
    the grants beyond capacity the bucket ends up making, without draining
    it (the capacity is too large to run out on the old primary at any
    client speed). window = the grants received after the cut was in place
    and before the kill; window_hi = the same from just before the nft
    command ran (grants made while it ran may fall either side)."""
    key = f"rl:failover:{random.getrandbits(40):x}"
    old = topo.primary
    oc = old.client()
    effect = grant_effect(oc, key, capacity)
    gws = [topo.gateway() for _ in range(2)]
    if library == "node":
        g = NodeGranters(topo, key, capacity, n=nclients, wait_timeout_ms=strict_wait_ms,
                         wait_replicas=wait_replicas or len(topo.replicas()))
    else:
        g = Granters(gws, key, capacity, n=nclients, wait_timeout_ms=strict_wait_ms,
                     wait_replicas=wait_replicas or len(topo.replicas()), library=library)
    try:
        g.wait_count(cut_at)
        named = [s.primary_addr() for s in topo.sentinels]
        if named.count(old.addr) <= len(named) // 2:
            # A primary that died on its own is the module's failure, not
            # the machine's: that is never run again.
            assert old.alive(), f"the primary exited before the fault: {old.log_tail()}"
            raise TopologyMoved(topo, old, named)
        if after_cut is not None:
            cut_lo = g.count()
            topo.firewall.cut([old.host], [n.host for n in topo.replicas()])
            at_cut = g.count()
        # Where the primary's stream is now, and what was counted before.
        at_read = g.count()
        p_off = oc.info("replication")["master_repl_offset"]
        if after_cut is not None:
            deadline = time.monotonic() + cut_deadline_s
            wait_until(lambda: g.count() >= at_cut + after_cut or time.monotonic() > deadline
                       or g.failures, timeout=cut_deadline_s + 30, interval=0.001,
                       what="grants after the cut")
        old.kill9()
        at_kill = g.count()
        if after_cut is None:
            at_cut = cut_lo = at_kill  # no cut: nothing was made while a link was down
        t_kill = time.monotonic()
        r_off = {n.addr: n.client().info("replication").get("slave_repl_offset", 0)
                 for n in topo.replicas()}
        new = topo.wait_promoted(old)
        promote_s = time.monotonic() - t_kill
        topo.firewall.heal()
        if strict_wait_ms is not None and g.wait_replicas > len(topo.replicas()) - 1:
            # WAIT for every replica: the new primary has one fewer until
            # the dead node is back (as a replica of it); until then strict
            # clients fail closed.
            # Strict clients need the dead node linked again, not the
            # sentinels' view of it (the run's end waits for that).
            restore_topology(topo, sentinels=False)
        g.wait_count(at_kill + continue_grants)
    finally:
        g.stop()
        topo.firewall.heal()
    assert g.denied_early == 0, "a denial: the bucket ran out"
    remaining = new.client().execute_command("RL.TOKENBUCKET", key, capacity, 1, HUGE,
                                             "COST", 0)[2]
    # The grants the promoted replica never received: at most the effects
    # between its last offset and the primary's offset read above, plus
    # every grant counted after that read.
    lag = grants_in(p_off - r_off[new.addr], effect)
    return {
        "over": g.granted + 2 + remaining - capacity, "granted": g.granted + 2,
        "window": at_kill - at_cut, "window_hi": at_kill - cut_lo,
        "bound": lag + at_kill - at_read + nclients, "lag_at_read": lag,
        "before_cut": cut_lo, "errors": dict(g.errors), "unacked": g.unacked,
        "promote_s": round(promote_s, 2), "clients": nclients, "library": library,
    }


FAILOVER_EVENTS = ("+sdown", "-sdown", "+odown", "+tilt", "-tilt", "+try-failover",
                   "+elected-leader", "+switch-master", "+new-epoch", "+vote-for-leader")


class TopologyMoved(AssertionError):
    """Before the fault was injected, the sentinels already named another
    primary than the one the run started on: a failover nobody caused
    (seen once on a loaded CI machine, Redis 7.0: the sentinels had moved
    from .2 to .3 while the first grants were made). The run measured
    nothing; the caller may rebuild the topology and run again. The message
    carries each sentinel's failover events, to tell why."""

    def __init__(self, topo, old, named):
        lines = []
        for s in topo.sentinels:
            ev = [ln.rstrip() for ln in s.log_tail(400).splitlines()
                  if any(e in ln for e in FAILOVER_EVENTS)]
            lines.append(f"sentinel {s.host}: " + (" | ".join(ev[-12:]) or "(no events)"))
        super().__init__(f"the sentinels name {named}, the run started on {old.addr}\n"
                         + "\n".join(lines))


def restore_topology(topo, sentinels=True):
    """After a crash run: restart the killed node as a replica of the new
    primary, so the next run has two replicas again; wait until the
    sentinels know it (unless `sentinels` is false)."""
    dead = [n for n in topo.data_nodes if not n.alive()]
    for n in dead:
        n.start(topo.data_args + ["--replicaof", topo.primary.host, str(topo.primary.port)])
        wait_until(lambda: n.client().info("replication").get("master_link_status") == "up",
                   what="restarted node linked")
    if sentinels:
        topo.wait_sentinels_ready()


def partition_run(topo, hold_grants=2000, minority_clients=1, majority_clients=3):
    """A partition, not a crash: {old primary, gateway A} cut off from {the
    replicas, the sentinels, gateway B}. Gateway A keeps the connection it
    has to the old primary; gateway B follows the sentinels. One bucket,
    large enough never to run out here, so each side grants at its rate:

      before   both gateways grant
      during   the partition: the sentinels promote a replica; B grants on
               the new primary; A grants on the old primary until it refuses
               writes (NOREPLICAS, with min-replicas-to-write) or the
               partition ends, once B made `hold_grants` on the new primary
      healed   the partition healed, the old primary is still a primary
               until the sentinels turn it into a replica of the new one:
               A still grants on it
      after    it rejoined (the resync discards every write it took since
               the cut); both gateways go on until A's client got a grant
               from the new primary

    lost = grants the clients received - units the new primary counts as
    spent at the end: the grants it will hand out a second time. Returns
    the grants per gateway and phase, lost, the promoted replica's lag at
    the cut in grants (lag_at_cut: the effects between the offset it was
    promoted at and the old primary's offset read right after the cut),
    and whether the old primary's key matches the new primary's after it
    rejoined."""
    capacity = 10**9
    key = f"rl:partition:{random.getrandbits(40):x}"
    old = topo.primary
    oc = old.client()
    effect = grant_effect(oc, key, capacity)
    gw_a, gw_b = topo.gateway(), topo.gateway()
    a = Granters([gw_a], key, capacity, n=minority_clients)
    b = Granters([gw_b], key, capacity, n=majority_clients)
    snaps = {}
    try:
        wait_until(lambda: a.count() >= 100 and b.count() >= 100 or a.failures or b.failures,
                   timeout=60, interval=0.001, what="warm-up grants")
        snaps["before"] = (a.count(), b.count())
        majority = [n.host for n in topo.replicas()] + [s.host for s in topo.sentinels] + [gw_b.host]
        topo.firewall.cut([old.host, gw_a.host], majority)
        t = {"cut": time.monotonic()}
        snaps["cut"] = (a.count(), b.count())
        on_old = {"cut": a.on(old.addr) + b.on(old.addr)}
        # Where the old primary's stream is now: every grant counted so far
        # was made before this offset (the test reaches the old primary
        # from an address no rule drops).
        p_off = oc.info("replication")["master_repl_offset"]
        new = topo.wait_promoted(old)
        t["promoted"] = time.monotonic()
        # The offset the promoted replica had reached: it started a new
        # history one byte after it.
        r_off = new.client().info("replication")["second_repl_offset"] - 1
        assert r_off > 0, f"the promoted replica reports no offset it was promoted at: {r_off}"
        snaps["promoted"] = (a.count(), b.count())
        refused_at = []

        def held():
            with a.lock:
                if a.errors.get("NOREPLICAS", 0) and not refused_at:
                    refused_at.append(a.granted)
                    t["refused"] = time.monotonic()
            return b.count() >= snaps["promoted"][1] + hold_grants
        wait_until(held, timeout=120, interval=0.005, what="grants on the new primary")
        snaps["during"] = (a.count(), b.count())
        on_old["heal"] = a.on(old.addr) + b.on(old.addr)
        topo.firewall.heal()
        t["heal"] = time.monotonic()
        # Healed, the old primary is still a primary until the sentinels see
        # it again and turn it into a replica (they wait to see it claim the
        # role for a while first): gateway A's connection still reaches it.

        def rejoined():
            # while it resyncs (a full sync loads the new primary's RDB) it
            # may not answer within 2 s: not yet, ask again
            try:
                info = old.client(socket_timeout=2).info("replication")
            except (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError):
                return False
            return (info["role"] == "slave" and info.get("master_host") == new.host
                    and info.get("master_link_status") == "up")
        wait_until(rejoined, timeout=60, interval=0.02, what="the old primary rejoined as a replica")
        snaps["rejoined"] = (a.count(), b.count())
        t["rejoined"] = time.monotonic()
        on_old["rejoined"] = a.on(old.addr) + b.on(old.addr)
        wait_until(lambda: a.count() > snaps["rejoined"][0] + 100, timeout=60, interval=0.005,
                   what="gateway A granting on the new primary")
        snaps["after"] = (a.count(), b.count())
    finally:
        a.stop()
        b.stop()
        topo.firewall.heal()
    def same():
        return (old.client().execute_command("DEBUG", "DIGEST-VALUE", key)
                == new.client().execute_command("DEBUG", "DIGEST-VALUE", key))
    try:
        wait_until(same, timeout=30, what="the rejoined old primary caught up")
        matches = True
    except AssertionError:
        matches = False
    spent = capacity - new.client().execute_command(
        "RL.TOKENBUCKET", key, capacity, 1, HUGE, "COST", 0)[2]
    (a0, b0), (ac, bc), (a1, b1), (ar, br), (a2, b2) = (
        snaps["before"], snaps["cut"], snaps["during"], snaps["rejoined"], snaps["after"])
    total = a.granted + b.granted + 2  # the two grant_effect made
    # The grants counted before the cut that the promoted replica never
    # received: at most the effects between its offset and the old
    # primary's offset read right after the cut.
    lag = grants_in(p_off - r_off, effect)
    return {
        "before": a0 + b0, "cut_slack": (ac + bc) - (a0 + b0),
        "during_old_primary": a1 - ac, "during_new_primary": b1 - bc,
        "old_primary_refused_after": None if not refused_at else refused_at[0] - ac,
        "old_primary_granted_after_refusal": None if not refused_at else a1 - refused_at[0],
        "old_primary_from_cut": on_old["rejoined"] - on_old["cut"],
        "healed_old_primary": on_old["rejoined"] - on_old["heal"],
        "healed_a": ar - a1, "healed_b": br - b1,
        "after_rejoin": (a2 - ar) + (b2 - br), "granted": total, "spent": spent,
        "lag_at_cut": lag,
        "lost": total - spent, "old_primary_errors": dict(a.errors),
        "rejoined_state_matches": matches, "clients": minority_clients + majority_clients,
        "seconds": {k: round(v - t["cut"], 2) for k, v in t.items() if k != "cut"},
    }
