"""Primary and replica: the module replicates effects (`RL.STATE key
payload` with the absolute expiry), never the command, so a replica holds
byte-identical state with the same absolute expiry, replicates nothing for a
call that grants nothing, and a promoted replica continues every limit where
the primary left it."""
import os
import random
import time

import pytest
import redis

from rltesting.clock import room
from rltesting.proc import wait_until
from rltesting.replication import ReplicationTap, start_replica, wait_ack, wait_replica_synced
from rltesting.replies import check_reply, COMMANDS, db_digest, granted_units, keyspace, NEVER, rl, TYPE_NAMES
from rltesting.workload import run_pipelined, Workload

SEED = int(os.environ.get("RL_SEED", "0")) or random.randrange(1, 2**31)

# Long parameters (the key outlives the test) and short ones (the key expires
# during the test). A parameter change on a key stays within its class.
LONG = {
    "RL.TOKENBUCKET": [[5, 1, 60000], [10, 3, 600000], [50, 7, 3600000], [8, 1, 60000]],
    "RL.SLIDINGLOG": [[5, 60000], [10, 600000], [50, 3600000], [7, 60000]],
    "RL.SLIDINGCOUNTER": [[5, 60000], [10, 600000], [50, 3600000], [7, 120000]],
    "RL.FIXEDWINDOW": [[5, 60000], [10, 600000, "FROMFIRST"], [50, 3600000], [7, 120000, "FROMFIRST"]],
}
SHORT = {
    "RL.TOKENBUCKET": [[4, 1, 40], [6, 2, 100], [3, 3, 150]],
    "RL.SLIDINGLOG": [[4, 40], [6, 100], [3, 150]],
    "RL.SLIDINGCOUNTER": [[4, 40], [6, 100], [3, 150]],
    "RL.FIXEDWINDOW": [[4, 40], [6, 100, "FROMFIRST"], [3, 150]],
}


def _abbrev(cmd):
    return {"RL.TOKENBUCKET": "tb", "RL.SLIDINGLOG": "sl", "RL.SLIDINGCOUNTER": "sc",
            "RL.FIXEDWINDOW": "fw"}[cmd]


class RandomWorkload:
    """Every command, COST (0, 1, several, more than the limit), PARTIAL,
    DRYRUN, parameter changes, denials, expiring keys, WRONGTYPE calls and
    COPY, issued in pipelined batches from one seeded generator."""

    def __init__(self, seed, nlong=5, nshort=3):
        self.rnd = random.Random(seed)
        self.keys = []  # (cmd, key, param set)
        for cmd in COMMANDS:
            for i in range(nlong):
                self.keys.append((cmd, f"rl:{_abbrev(cmd)}:long:{i}", LONG[cmd]))
            for i in range(nshort):
                self.keys.append((cmd, f"rl:{_abbrev(cmd)}:short:{i}", SHORT[cmd]))
        self.params = {k: self.rnd.choice(ps) for _, k, ps in self.keys}
        self.stats = {"granted": 0, "denied": 0, "cost0": 0, "dryrun": 0, "partial": 0,
                      "changes": 0, "wrongtype": 0, "copies": 0}

    def op(self):
        rnd = self.rnd
        if rnd.random() < 0.01:
            return ("copy",)
        if rnd.random() < 0.02:
            # Another type's key (a string, or another algorithm's limiter
            # that never expires): WRONGTYPE, nothing changes.
            cmd = rnd.choice(COMMANDS)
            other = rnd.choice(["rl:string"] + [f"rl:typed:{_abbrev(c)}" for c in COMMANDS if c != cmd])
            return ("call", cmd, other, NEVER[cmd](5), 1, False, False)
        cmd, key, ps = rnd.choice(self.keys)
        if rnd.random() < 0.15:
            self.params[key] = rnd.choice(ps)
            self.stats["changes"] += 1
        params = self.params[key]
        limit = params[0]
        x = rnd.random()
        if x < 0.12:
            cost = 0
        elif x < 0.62:
            cost = 1
        elif x < 0.92:
            cost = rnd.randint(2, limit)
        else:
            cost = limit + rnd.randint(1, 3)
        partial = rnd.random() < 0.2
        dryrun = rnd.random() < 0.15
        return ("call", cmd, key, params, cost, partial, dryrun)

    def run(self, client, nops):
        run_pipelined(client, nops, self.op, self._send, self._check)

    def _send(self, pipe, op):
        if op[0] == "copy":
            src = self.rnd.choice(self.keys)[1]
            pipe.execute_command("COPY", src, f"copy:{src}", "REPLACE")
            return
        _, cmd, key, params, cost, partial, dryrun = op
        # Options in any order and any case.
        opts = [["COST", cost]] + [["PARTIAL"]] * partial + [["DRYRUN"]] * dryrun
        self.rnd.shuffle(opts)
        args = [cmd, key, *params]
        for o in opts:
            word = o[0].lower() if self.rnd.random() < 0.3 else o[0]
            args += [word, *o[1:]]
        pipe.execute_command(*args)

    def _check(self, op, reply):
        if op[0] == "copy":
            assert not isinstance(reply, Exception), reply
            self.stats["copies"] += 1
            return
        _, cmd, key, params, cost, partial, dryrun = op
        if key == "rl:string" or key.startswith("rl:typed:"):
            assert isinstance(reply, redis.exceptions.ResponseError), reply
            assert str(reply).startswith("WRONGTYPE"), reply
            self.stats["wrongtype"] += 1
            return
        assert not isinstance(reply, Exception), (op, reply)
        check_reply(reply, cost, partial, params[0])
        g = granted_units(reply, cost, partial)
        if cost == 0:
            self.stats["cost0"] += 1
        elif dryrun:
            self.stats["dryrun"] += 1
        elif g == 0:
            self.stats["denied"] += 1
        else:
            self.stats["granted"] += 1
            if partial and g < cost:
                self.stats["partial"] += 1


def _settled_keys(m):
    """The primary's keys, when none of them is expired but not yet deleted
    (DBSIZE counts those, KEYS does not); None otherwise."""
    keys = sorted(m.keys("*"))
    return keys if m.dbsize() == len(keys) else None


def assert_same_keyspace(m, r, sync=None):
    """Same keys, types, digests and exact expiries on both sides, and the
    same DEBUG DIGEST. A key expires at its reset, which for a sliding
    counter holding only its previous window is the next window boundary
    (any moment, even for the long parameters): an expiry that falls inside
    the comparison shows the primary without the key and the replica still
    with it (the DEL in flight). Such a comparison is repeated; a difference
    while no key expired fails.

    `sync()` waits until `r` has all of `m`'s stream, by offset (default):
    WAIT alone does not cover the expiry DELs (it waits for the calling
    client's own writes), and Valkey 8.1 streams nothing to a replica fresh
    from a full sync until its first ACK (its offset stayed 0 for ~0.7 s
    while the primary's moved on)."""
    for _ in range(10):
        (sync or (lambda: wait_replica_synced(m, r)))()
        before = _settled_keys(m)
        mk, rk = keyspace(m), keyspace(r)
        dm, dr = db_digest(m), db_digest(r)
        if before is not None and _settled_keys(m) == before:
            break
    else:
        raise AssertionError("keys kept expiring during every comparison")
    assert set(mk) == set(rk)
    for k in mk:
        assert mk[k] == rk[k], f"{k}: primary {mk[k]} != replica {rk[k]} (RL_SEED={SEED})"
    assert dm == dr, f"DEBUG DIGEST differs (RL_SEED={SEED})"
    return mk


@pytest.mark.parametrize("run", range(3))
def test_random_workload_replica_matches_primary(server_factory, run):
    """A randomized workload on the primary, with a replica attached in the
    middle (initial sync by RDB, then the effect stream) and a replica of
    that replica: after WAIT every key has the same type, DEBUG
    DIGEST-VALUE and exact PEXPIRETIME on all three servers. The seed is
    random per session (RL_SEED=n repeats one); failures print it."""
    primary = server_factory()
    m = primary.client()
    m.set("rl:string", "not a limiter")
    for cmd in COMMANDS:
        rl(m, cmd, f"rl:typed:{_abbrev(cmd)}", NEVER[cmd](5))
    w = RandomWorkload(SEED + run)

    def settled():
        """Every short-lived key (and COPY of one) has expired on the primary
        and been deleted there, so its DEL is in the replication stream: no
        key can expire while the two sides are compared."""
        live = m.keys("*")
        return not any(b":short:" in k for k in live) and m.dbsize() == len(live)

    w.run(m, 1200)  # before the replica exists: reaches it through the RDB sync
    rep = start_replica(server_factory, primary)
    r = rep.client()
    wait_until(settled, timeout=20, what="short keys expired")
    wait_ack(m)
    assert_same_keyspace(m, r)

    w.run(m, 1500)
    sub = start_replica(server_factory, rep)  # a chained replica
    wait_until(settled, timeout=20, what="short keys expired")
    w.run(m, 1500)  # the expired keys come back as fresh limiters
    wait_until(settled, timeout=20, what="short keys expired")
    wait_ack(m)
    ks = assert_same_keyspace(m, r)
    subc = sub.client()
    wait_replica_synced(r, subc)
    assert_same_keyspace(m, subc, sync=lambda: (wait_replica_synced(m, r), wait_replica_synced(r, subc)))

    # The workload did what it claims (it would be vacuous otherwise).
    s = w.stats
    assert min(s["granted"], s["denied"], s["cost0"], s["dryrun"], s["partial"],
               s["changes"], s["wrongtype"], s["copies"]) > 0, (s, f"RL_SEED={SEED}")
    types = {t for t, _, _ in ks.values()}
    assert types == {TYPE_NAMES[c] for c in COMMANDS} | {"string"}, types
    # Every limiter key carries an expiry (its reset): none lives forever.
    for k, (t, _, exp) in ks.items():
        if t.startswith("rl-"):
            assert exp > 0, (k, exp)


def test_stream_carries_one_effect_per_grant(server_factory):
    """What the primary sends its replicas (read with `redis-cli --replica`):
    exactly one `RL.STATE key payload` per call that granted units, never
    the command itself (a replica must not run it with its own clock), and
    nothing for denied, COST 0 or DRYRUN calls."""
    primary = server_factory()
    m = primary.client()
    with ReplicationTap(primary) as tap:
        grants = 0
        for cmd in COMMANDS:
            for i in range(3):
                key = f"rl:eff:{cmd}:{i}"
                params = NEVER[cmd](10)
                for cost, partial, dryrun in [(3, False, False), (0, False, False), (4, False, True),
                                              (8, False, False), (8, True, False), (1, False, False),
                                              (1, False, True), (5, True, False)]:
                    reply = rl(m, cmd, key, params, cost=cost, partial=partial, dryrun=dryrun)
                    if granted_units(reply, cost, partial) and not dryrun:
                        grants += 1
        assert grants == len(COMMANDS) * 3 * 2  # COST 3, then PARTIAL 8 takes the other 7
        lines = tap.take()
    rl_lines = [ln for ln in lines if ln.upper().startswith('"RL.')]
    assert all(ln.startswith('"RL.STATE","rl:eff:') for ln in rl_lines), rl_lines[:5]
    assert len(rl_lines) == grants, rl_lines
    assert len(rl_lines) == len(lines) - lines.count('"SELECT","0"'), lines


def test_transactions_scripts_and_functions_replicate_effects(server_factory):
    """Calls inside MULTI/EXEC, EVAL and FCALL replicate their effects (one
    RL.STATE per grant, inside the transaction) and nothing when nothing was
    granted; the replica ends up identical."""
    primary = server_factory()
    rep = start_replica(server_factory, primary)
    m, r = primary.client(), rep.client()
    m.execute_command(
        "FUNCTION", "LOAD",
        "#!lua name=rltest\n"
        "redis.register_function('take', function(keys, args)\n"
        "  return redis.call(args[1], keys[1], unpack(args, 2))\n"
        "end)")
    script = "return redis.call(ARGV[1], KEYS[1], unpack(ARGV, 2))"

    def via(kind, cmd, key, params, *opts):
        args = [cmd, *params, *opts]
        if kind == "eval":
            return m.eval(script, 1, key, *args)
        if kind == "fcall":
            return m.fcall("take", 1, key, *args)
        return m.execute_command(cmd, key, *params, *opts)

    with ReplicationTap(primary) as tap:
        for cmd in COMMANDS:
            key = f"rl:tx:{cmd}"
            params = NEVER[cmd](10)
            # Nothing granted: nothing in the stream, not even MULTI/EXEC.
            pipe = m.pipeline(transaction=True)
            pipe.execute_command(cmd, key, *params, "COST", 11)
            pipe.execute_command(cmd, key, *params, "COST", 0)
            pipe.execute_command(cmd, key, *params, "COST", 2, "DRYRUN")
            assert [x[0] for x in pipe.execute()] == [0, 1, 1]
            assert via("eval", cmd, key, params, "COST", 3, "DRYRUN")[0] == 1
            assert via("fcall", cmd, key, params, "COST", 0)[0] == 1
            assert tap.take() == [], cmd
            assert m.exists(key) == 0

            # Two grants and a denial in one transaction: two effects in it.
            pipe = m.pipeline(transaction=True)
            pipe.execute_command(cmd, key, *params, "COST", 2)
            pipe.execute_command(cmd, key, *params, "COST", 20)
            pipe.execute_command(cmd, key, *params, "COST", 3)
            assert [x[:3] for x in pipe.execute()] == [[1, 10, 8], [0, 10, 8], [1, 10, 5]]
            lines = [ln for ln in tap.take() if ln != '"SELECT","0"']
            assert lines[0] == '"MULTI"' and lines[-1] == '"EXEC"', lines
            assert len(lines) == 4 and all(ln.startswith(f'"RL.STATE","{key}"') for ln in lines[1:3]), lines

            assert via("eval", cmd, key, params, "COST", 1)[:3] == [1, 10, 4]
            assert via("fcall", cmd, key, params, "COST", 4, "PARTIAL")[:3] == [4, 10, 0]
            assert via("eval", cmd, key, params)[:3] == [0, 10, 0]
            lines = [ln for ln in tap.take() if ln not in ('"SELECT","0"', '"MULTI"', '"EXEC"')]
            assert len(lines) == 2 and all(ln.startswith(f'"RL.STATE","{key}"') for ln in lines), lines
    wait_ack(m)
    assert_same_keyspace(m, r)


def test_calls_that_grant_nothing_replicate_nothing(server_factory):
    """Denied, COST 0 and DRYRUN calls (on existing and on missing keys) do
    not move master_repl_offset more than an idle primary does over the same
    time, change no key, no expiry and nothing RDB would count as dirty."""
    primary = server_factory(["--repl-ping-replica-period", "3600"])
    rep = start_replica(server_factory, primary)
    m, r = primary.client(), rep.client()

    drained = {}
    for cmd in COMMANDS:
        for i, params in enumerate([NEVER[cmd](3), LONG[cmd][1]]):
            key = f"rl:quiet:{cmd}:{i}"
            g = granted_units(rl(m, cmd, key, params, cost=params[0], partial=True), params[0], True)
            assert g == params[0]
            drained[key] = (cmd, params)
    half = {}
    for cmd in COMMANDS:
        key = f"rl:quiet:{cmd}:half"
        params = NEVER[cmd](10)
        assert rl(m, cmd, key, params, cost=4)[:3] == [1, 10, 6]
        half[key] = (cmd, params)
    wait_ack(m)
    m.save()
    before = keyspace(m)
    assert_same_keyspace(m, r)

    def offset():
        return m.info("replication")["master_repl_offset"]

    def quiet_calls():
        n = 0
        for _ in range(40):
            for key, (cmd, params) in drained.items():
                assert rl(m, cmd, key, params)[0] == 0  # denied
                assert rl(m, cmd, key, params, cost=2, partial=True)[0] == 0
                assert rl(m, cmd, key, params, cost=0)[0] == 1
                assert rl(m, cmd, key, params, dryrun=True)[0] == 0
                n += 4
            for key, (cmd, params) in half.items():
                assert rl(m, cmd, key, params, cost=7)[0] == 0  # more than remain
                assert rl(m, cmd, key, params, cost=3, dryrun=True)[:3] == [1, 10, 3]
                assert rl(m, cmd, key, params, cost=9, partial=True, dryrun=True)[0] == 6
                assert rl(m, cmd, key, params, cost=0)[:3] == [1, 10, 6]
                n += 4
            for cmd in COMMANDS:
                fresh = f"rl:quiet:{cmd}:missing"
                assert rl(m, cmd, fresh, NEVER[cmd](5), cost=0)[:3] == [1, 5, 5]
                assert rl(m, cmd, fresh, NEVER[cmd](5), cost=2, dryrun=True)[:3] == [1, 5, 3]
                assert rl(m, cmd, fresh, NEVER[cmd](5), cost=6)[:4] == [0, 5, 5, -1]
                n += 3
        return n

    o0, t0 = offset(), time.monotonic()
    n = quiet_calls()
    busy_drift, busy_time = offset() - o0, time.monotonic() - t0
    assert n > 1000

    # The same span of time with the primary idle (INFO is not replicated).
    o1, t1 = offset(), time.monotonic()
    while time.monotonic() - t1 < busy_time:
        m.info("replication")
        time.sleep(0.005)
    idle_drift = offset() - o1

    assert busy_drift <= idle_drift, (busy_drift, idle_drift)
    assert keyspace(m) == before
    assert m.info("persistence")["rdb_changes_since_last_save"] == 0
    for cmd in COMMANDS:
        assert m.exists(f"rl:quiet:{cmd}:missing") == 0
    stats = m.info("ratelimit")
    assert all(stats[f"ratelimit_{c[3:].lower()}_denied"] > 0 for c in COMMANDS), stats
    # A real grant does move it (the measurement is not blind).
    cmd, params = "RL.TOKENBUCKET", NEVER["RL.TOKENBUCKET"](10)
    o2 = offset()
    assert rl(m, cmd, "rl:quiet:RL.TOKENBUCKET:half", params)[0] == 1
    assert offset() > o2
    assert m.info("persistence")["rdb_changes_since_last_save"] == 1, "a grant is one change"


def test_failover_continues_limits(server_factory):
    """Promote the replica (REPLICAOF NO ONE) in the middle of a workload:
    writes are paused on the primary, the replica catches up, is promoted,
    and the primary dies. Every limit continues on the new primary: grants
    across both servers never exceed a limit, drained limiters stay drained
    with consistent retry/reset, and nobody gets a fresh bucket or an empty
    window."""
    primary = server_factory()
    rep = start_replica(server_factory, primary)
    old, new = primary.client(), rep.client()

    LIMIT = 300
    keys = [(cmd, f"rl:fo:{cmd}:{i}") for cmd in COMMANDS for i in range(4)]
    granted = {k: 0 for _, k in keys}
    state = {"client": old, "retried": 0}

    # Drained limiters with real (one hour) periods: their retry/reset must
    # carry over. The windows aligned to the epoch are a day long, begun
    # with 2 minutes of the day left at least (rltesting.clock.room): none
    # ends between the drain and the check after the failover.
    hour = {"RL.TOKENBUCKET": [5, 1, 3600000], "RL.SLIDINGLOG": [5, 3600000],
            "RL.SLIDINGCOUNTER": [5, 86_400_000], "RL.FIXEDWINDOW": [5, 86_400_000]}
    room(old, 86_400_000, 120_000)
    last = {}
    for cmd in COMMANDS:
        key = f"rl:fo:hour:{cmd}"
        assert rl(old, cmd, key, hour[cmd], cost=5)[0] == 1
        t_sent = time.monotonic()
        last[cmd] = (rl(old, cmd, key, hour[cmd]), t_sent)
        assert last[cmd][0][:3] == [0, 5, 0]

    def call(i):
        cmd, key = keys[i % len(keys)]
        cost = 1 + i % 3
        try:
            reply = rl(state["client"], cmd, key, NEVER[cmd](LIMIT), cost=cost, partial=True)
        except redis.exceptions.ConnectionError:
            # The primary was killed while this call was paused (CLIENT
            # PAUSE WRITE): it never ran there. Retry on the new primary.
            wait_until(lambda: state["client"] is new, what="client switched")
            state["retried"] += 1
            reply = rl(new, cmd, key, NEVER[cmd](LIMIT), cost=cost, partial=True)
        granted[key] += reply[0]

    w = Workload(call, limit=20000)
    w.start()
    try:
        wait_until(lambda: w.calls >= 150 or w.error, what="workload under way")
        old.execute_command("CLIENT", "PAUSE", 30000, "WRITE")
        wait_replica_synced(old, new)
        assert_same_keyspace(old, new, sync=lambda: wait_replica_synced(old, new))
        new.execute_command("REPLICAOF", "NO", "ONE")
        state["client"] = new
        primary.kill9()
        n_at_failover = w.calls
        granted_at_failover = sum(granted.values())
        wait_until(lambda: w.calls >= n_at_failover + 150 or w.error, what="workload continues")
    finally:
        w.finish()

    assert new.info("replication")["role"] == "master"
    # Units were granted by both primaries, not all by one of them.
    assert 0 < granted_at_failover < sum(granted.values()) < LIMIT * len(keys)
    for cmd, key in keys:
        # Drain what is left on the new primary: the total is exactly LIMIT.
        reply = rl(new, cmd, key, NEVER[cmd](LIMIT), cost=LIMIT, partial=True)
        granted[key] += reply[0]
        assert granted[key] == LIMIT, (key, granted[key])
        assert rl(new, cmd, key, NEVER[cmd](LIMIT))[:3] == [0, LIMIT, 0]

    for cmd in COMMANDS:
        key = f"rl:fo:hour:{cmd}"
        (_, _, _, retry0, reset0), t0 = last[cmd]
        reply = rl(new, cmd, key, hour[cmd])
        elapsed_ms = (time.monotonic() - t0) * 1000
        assert reply[0] == 0, (cmd, reply)  # no fresh bucket / empty window
        # The same waits, minus the time that passed (within a ms of rounding).
        assert retry0 - elapsed_ms - 1 <= reply[3] <= retry0, (cmd, reply, retry0, elapsed_ms)
        assert reset0 - elapsed_ms - 1 <= reply[4] <= reset0, (cmd, reply, reset0, elapsed_ms)
        assert reply[2] <= 1, (cmd, reply)
