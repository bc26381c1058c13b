"""RL.CONCURRENCY (docs/contract.md, "RL.CONCURRENCY") on one server at a
time: ACQUIRE / RELEASE / RENEW and their five integers, the retried
ACQUIRE, leases that lapse by themselves and the key that goes with the
last one, DRYRUN and denials that write nothing, errors, the native type's
RDB / DUMP / RESTORE (mutated payloads refused), MEMORY USAGE per lease,
INFO counters and keyspace events, the CONCURRENCY limit of RL.MULTI, and
replication by effect with a replica and the AOF. (COMMAND DOCS, key specs
and ACL: test_adopt.py; the Lua twin: test_lua_twins_concurrency.py.)

Times: every lease a test does not wait out is 10 minutes or more, so
nothing lapses while it runs; the tests that wait for a lapse poll the
server's clock (rltesting.clock.wait_past) past the instant the call's
bracket proves the lease ended, and assert nothing about how long it took.
"""
import math
import random
import time

import pytest
import redis

from rltesting.clock import time_ms, wait_past
from rltesting.payloads import Dump, mutate, with_trailer
from rltesting.proc import wait_until
from rltesting.replication import start_replica, wait_ack, wait_aof_rewrite, wait_replica_synced
from rltesting.replies import db_digest, keyspace

CMD = "RL.CONCURRENCY"
MAX = 2**53 - 1
LONG = 600_000  # a lease no test outlives (10 minutes)


def cc(r, key, limit, lease_ms, action, ident, *opts):
    return r.execute_command(CMD, key, limit, lease_ms, action, ident, *opts)


def bracketed(r, *args):
    """(T0 ms, reply, T1 ms): the call between two server clock reads."""
    p = r.pipeline(transaction=False)
    p.time()
    p.execute_command(*args)
    p.time()
    t0, rep, t1 = p.execute(raise_on_error=False)
    return time_ms(t0), rep, time_ms(t1)


def dirty(r):
    return int(r.info("persistence")["rdb_changes_since_last_save"])


def test_acquire_release_renew(r):
    k = "cc:{t}:basic"
    # A fresh lease ends lease_ms from now: reset_after_ms is exactly it.
    assert cc(r, k, 2, LONG, "ACQUIRE", "a") == [1, 2, 1, 0, LONG]
    t0 = time.monotonic()
    assert cc(r, k, 2, LONG, "ACQUIRE", "b") == [1, 2, 0, 0, LONG]
    # Full: c waits for a's lease, which ends first; b's ends LONG after b's
    # ACQUIRE, less the ms the server's clock moved since (at most what this
    # test's clock saw, rounded up)
    allowed, limit, remaining, retry, reset = cc(r, k, 2, LONG, "ACQUIRE", "c")
    moved = math.ceil((time.monotonic() - t0) * 1000)
    assert (allowed, limit, remaining) == (0, 2, 0) and 0 < retry <= LONG
    assert LONG - moved - 1 <= reset <= LONG, (reset, moved)
    # COST above the limit never fits.
    assert cc(r, k, 2, LONG, "ACQUIRE", "c", "COST", 3)[:4] == [0, 2, 0, -1]
    # RELEASE says what it freed, once: idempotent.
    rep = cc(r, k, 2, LONG, "RELEASE", "a")
    assert rep[:4] == [1, 2, 1, 0] and 0 < rep[4] <= LONG
    assert cc(r, k, 2, LONG, "RELEASE", "a")[:4] == [0, 2, 1, 0]
    assert cc(r, k, 2, LONG, "ACQUIRE", "c")[:4] == [1, 2, 0, 0]
    # RENEW: a live lease runs lease_ms from now; none: 0 and -1.
    assert cc(r, k, 2, LONG, "RENEW", "b") == [1, 2, 0, 0, LONG]
    assert cc(r, k, 2, LONG, "RENEW", "a")[:4] == [0, 2, 0, -1]
    # The last release deletes the key.
    cc(r, k, 2, LONG, "RELEASE", "b")
    assert r.exists(k) == 1
    assert cc(r, k, 2, LONG, "RELEASE", "c") == [1, 2, 2, 0, 0]
    assert r.exists(k) == 0


def test_a_retried_acquire_renews_instead_of_holding_twice(r):
    k = "cc:retry"
    assert cc(r, k, 3, LONG, "ACQUIRE", "req-1", "COST", 2) == [1, 3, 1, 0, LONG]
    # The same call again (a client that timed out): one lease, renewed.
    assert cc(r, k, 3, LONG, "ACQUIRE", "req-1", "COST", 2) == [1, 3, 1, 0, LONG]
    # Its own units do not count against it: up to the limit, down again.
    assert cc(r, k, 3, LONG, "ACQUIRE", "req-1", "COST", 3) == [1, 3, 0, 0, LONG]
    assert cc(r, k, 3, LONG, "ACQUIRE", "req-2")[:3] == [0, 3, 0]
    assert cc(r, k, 3, LONG, "ACQUIRE", "req-1", "COST", 1) == [1, 3, 2, 0, LONG]
    assert cc(r, k, 3, LONG, "RELEASE", "req-1")[:3] == [1, 3, 3]


def test_options_partial_dryrun_cost_zero_write_nothing_unless_they_take(r):
    k = "cc:opts"
    before = dirty(r)
    # DRYRUN and COST 0 on a fresh key: answers, no key, no write.
    assert cc(r, k, 5, LONG, "ACQUIRE", "a", "DRYRUN", "COST", 2) == [1, 5, 3, 0, LONG]
    assert cc(r, k, 5, LONG, "ACQUIRE", "a", "COST", 0) == [1, 5, 5, 0, 0]
    assert cc(r, k, 5, LONG, "ACQUIRE", "a", "cost", "0", "partial") == [0, 5, 5, 0, 0]
    assert r.exists(k) == 0 and dirty(r) == before
    assert cc(r, k, 5, LONG, "acquire", "a", "COST", 4) == [1, 5, 1, 0, LONG]
    after = dirty(r)
    assert after > before
    # A denial writes nothing; PARTIAL holds what is free.
    assert cc(r, k, 5, LONG, "ACQUIRE", "b", "COST", 3)[:3] == [0, 5, 1]
    assert dirty(r) == after
    assert cc(r, k, 5, LONG, "ACQUIRE", "b", "COST", 3, "PARTIAL")[:3] == [1, 5, 0]
    assert cc(r, k, 5, LONG, "RELEASE", "b")[:3] == [1, 5, 1]
    # RELEASE and RENEW of an id holding nothing write nothing.
    after = dirty(r)
    assert cc(r, k, 5, LONG, "RELEASE", "zz")[0] == 0 and cc(r, k, 5, LONG, "RENEW", "zz")[0] == 0
    assert dirty(r) == after


def test_the_key_expires_with_its_last_lease(r):
    """The key's expiry is the latest lease's end (PEXPIREAT now_ms +
    reset_after_ms); a lapsed lease frees its units by itself."""
    k = "cc:lapse"
    t0, rep, t1 = bracketed(r, CMD, k, 1, 300, "ACQUIRE", "a")
    assert rep == [1, 1, 0, 0, 300]
    exp = r.execute_command("PEXPIRETIME", k)
    assert t0 + 300 <= exp <= t1 + 300
    rep = cc(r, k, 1, 300, "ACQUIRE", "b")
    assert rep[:3] == [0, 1, 0] and 0 < rep[3] <= 300
    # A longer lease for b would be granted once a's has lapsed: past its
    # end on the server's clock (the key lives through exp's millisecond).
    wait_past(r, exp + 1)
    assert r.exists(k) == 0
    assert cc(r, k, 1, LONG, "ACQUIRE", "b") == [1, 1, 0, 0, LONG]
    # A lapsed holder's RENEW fails clearly; its RELEASE frees nothing.
    assert cc(r, k, 1, LONG, "RENEW", "a")[:4] == [0, 1, 0, -1]
    assert cc(r, k, 1, LONG, "RELEASE", "a")[0] == 0


def test_errors(r):
    r.set("str", "x")
    cases = [
        ([CMD, "k"], "wrong number of arguments"),
        ([CMD, "k", 1, 1000, "ACQUIRE"], "wrong number of arguments"),
        ([CMD, "k", 0, 1000, "ACQUIRE", "a"], f"limit must be an integer between 1 and {MAX}"),
        ([CMD, "k", 1, 0, "ACQUIRE", "a"], f"lease_ms must be an integer between 1 and {MAX}"),
        ([CMD, "k", 1, 2**53, "ACQUIRE", "a"], f"lease_ms must be an integer between 1 and {MAX}"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "COST", -1], f"COST must be an integer between 0 and {MAX}"),
        ([CMD, "k", 1, 1000, "TAKE", "a"], "syntax error"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "COST"], "syntax error"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "REFUND", 1], "syntax error"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "PARTIAL", "PARTIAL"], "syntax error"),
        ([CMD, "k", 1, 1000, "RELEASE", "a", "DRYRUN"], "syntax error"),
        ([CMD, "k", 1, 1000, "RENEW", "a", "b"], "syntax error"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "COST", 1, "PARTIAL", "DRYRUN", "x"], "syntax error"),
        ([CMD, "k", 1, 1000, "ACQUIRE", "a", "COST", 1, "PARTIAL", "DRYRUN", "COST", 1], "syntax error"),
        ([CMD, "str", 1, 1000, "ACQUIRE", "a"], "WRONGTYPE"),
    ]
    for args, want in cases:
        with pytest.raises(redis.ResponseError, match=want):
            r.execute_command(*args)
    assert r.exists("k") == 0
    # Another limiter's key, and this one's key under another command.
    r.execute_command("RL.TOKENBUCKET", "tb", 5, 1, 1000)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        cc(r, "tb", 1, 1000, "ACQUIRE", "a")
    cc(r, "cc", 1, LONG, "ACQUIRE", "a")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.execute_command("RL.SLIDINGLOG", "cc", 5, 1000)
    assert r.type("cc") == b"rl-concur"
    # Ids are binary-safe, any length, the empty one too.
    assert cc(r, "bin", 3, LONG, "ACQUIRE", b"\x00\xff id")[0] == 1
    assert cc(r, "bin", 3, LONG, "ACQUIRE", b"")[0] == 1
    assert cc(r, "bin", 3, LONG, "ACQUIRE", "x" * 10_000)[:3] == [1, 3, 0]
    assert cc(r, "bin", 3, LONG, "RELEASE", b"\x00\xff id")[:3] == [1, 3, 1]


def test_dump_restore_reload_and_copy_keep_the_leases(r):
    k = "cc:persist"
    for i in range(20):
        cc(r, k, 100, LONG + i, "ACQUIRE", f"id{i}", "COST", 1 + i % 3)
    digest = r.execute_command("DEBUG", "DIGEST-VALUE", k)
    exp = r.execute_command("PEXPIRETIME", k)
    r.restore("cc:copy", exp, r.dump(k), absttl=True)
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "cc:copy") == digest
    r.copy(k, "cc:copy2")
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "cc:copy2") == digest
    r.execute_command("DEBUG", "RELOAD")
    assert r.execute_command("DEBUG", "DIGEST-VALUE", k) == digest
    assert r.execute_command("PEXPIRETIME", k) == exp
    # The reloaded leases decide as before: id3 holds 1 unit, 60 - 20 in all.
    held = sum(1 + i % 3 for i in range(20))
    assert cc(r, k, 100, LONG, "ACQUIRE", "new", "COST", 0)[2] == 100 - held
    assert cc(r, k, 100, LONG, "RELEASE", "id3")[:3] == [1, 100, 100 - held + 1]


def test_restore_refuses_mutated_payloads(server):
    c = server.client()
    c.config_set("rdbcompression", "no")
    for i in range(6):
        cc(c, "cc:m", 50, LONG, "ACQUIRE", f"i{i}", "COST", 2)
    d = Dump(c.dump("cc:m"))
    rng = random.Random(46)
    accepted = rejected = 0
    for i in range(400):
        how = rng.randrange(4)
        if how <= 1:
            p = d.build(body=mutate(rng, d.body))
        elif how == 2:
            p = with_trailer(d.value[:rng.randrange(1, len(d.value))], d.version)
        else:
            p = d.build(body=d.body[:rng.randrange(len(d.body))])
        try:
            c.restore("x", 0, p, replace=True)
        except redis.ResponseError:
            rejected += 1
            continue
        finally:
            assert server.alive() and c.ping(), p.hex()
        accepted += 1
        # Anything accepted is a valid state: it answers, dumps and copies.
        c.persist("x")
        if c.exists("x"):
            rep = cc(c, "x", MAX, LONG, "ACQUIRE", "probe", "COST", 0)
            assert rep[0] == 1 and 0 <= rep[2] <= MAX, p.hex()
            assert c.dump("x") is not None
    assert rejected > 0, (accepted, rejected)
    # A body given to another type's decoder is refused.
    c.execute_command("RL.FIXEDWINDOW", "fw", 5, 60000)
    with pytest.raises(redis.ResponseError):
        c.restore("y", 0, Dump(c.dump("fw")).build(module_id=d.module_id), replace=True)
    with pytest.raises(redis.ResponseError):
        c.restore("y", 0, d.build(module_id=Dump(c.dump("fw")).module_id), replace=True)


def test_memory_usage_per_lease(r):
    """MEMORY USAGE counts the lease buffer: about 24 bytes a lease (its
    end, its units and the id's hash), at most 25 % more as it grows."""
    def usage(n):
        k = f"cc:mem:{n}"
        p = r.pipeline(transaction=False)
        for i in range(n):
            p.execute_command(CMD, k, MAX, LONG, "ACQUIRE", f"request-{i:08d}-0000-0000-0000-000000000000")
        p.execute()
        return r.memory_usage(k, samples=0)
    small, big = usage(100), usage(1100)
    per_lease = (big - small) / 1000
    print(f"MEMORY USAGE: 100 leases {small} B, 1100 leases {big} B: {per_lease:.1f} B per lease")
    assert 24 <= per_lease <= 32, per_lease
    assert usage(1) <= 256  # a one-lease key: the box, a buffer of 4 leases, the server's wrapper


def test_info_counters_and_events(r):
    r.config_set("notify-keyspace-events", "KEd")
    p = r.pubsub()
    p.psubscribe("__keyevent@0__:*")
    p.get_message(timeout=5)
    k = "cc:info"
    cc(r, k, 2, LONG, "ACQUIRE", "a")                       # granted, rl.concurrency
    cc(r, k, 2, LONG, "ACQUIRE", "b", "COST", 3)            # denied
    cc(r, k, 2, LONG, "ACQUIRE", "b", "COST", 3, "PARTIAL")  # partial, rl.concurrency
    cc(r, k, 2, LONG, "RENEW", "a")                         # granted, rl.concurrency
    cc(r, k, 2, LONG, "RENEW", "zz")                        # denied
    cc(r, k, 2, LONG, "RELEASE", "a")                       # refunds, rl.refund
    cc(r, k, 2, LONG, "RELEASE", "a")                       # refunds (nothing freed, no event)
    cc(r, k, 2, LONG, "RELEASE", "b")                       # refunds, rl.refund (the key deleted)
    info = r.info("ratelimit")
    got = [info[f"ratelimit_concurrency_{c}"] for c in ("granted", "partial", "denied", "refunds")]
    assert got == [2, 1, 2, 3], info
    events = []
    while (m := p.get_message(timeout=2)) is not None:
        if m["type"] == "pmessage":
            events.append(m["channel"].decode().split(":", 1)[1])
    assert events == ["rl.concurrency", "rl.concurrency", "rl.concurrency", "rl.refund", "rl.refund"], events
    p.close()


def multi(r, keys, limits, *opts):
    return r.execute_command("RL.MULTI", len(keys), *keys, *limits, *opts)


def test_multi_in_flight_and_rate_in_one_step(r):
    """'At most 2 in flight and 3 per hour' as one atomic step."""
    keys = ["rl:{t}:inflight", "rl:{t}:rate"]
    lim = lambda rid: ["CONCURRENCY", 2, LONG, rid, "TOKENBUCKET", 3, 1, 3_600_000]  # noqa: E731
    rep = multi(r, keys, lim("r1"))
    assert rep[:6] == [1, 2, 1, 0, LONG, 0] and rep[6] == [[1, 2, 1, 0, LONG], [1, 3, 2, 0, 3_600_000]], rep
    assert multi(r, keys, lim("r2"))[0] == 1
    rep = multi(r, keys, lim("r3"))
    assert rep[0] == 0 and rep[5] == 0, rep          # the in-flight limit binds
    assert rep[6][1][:3] == [0, 3, 1], rep           # the rate limit took nothing
    assert cc(r, keys[0], 2, LONG, "RELEASE", "r1")[0] == 1
    assert multi(r, keys, lim("r3"))[0] == 1         # a slot again; the last token
    assert cc(r, keys[0], 2, LONG, "RELEASE", "r2")[0] == 1
    rep = multi(r, keys, lim("r4"))
    assert rep[0] == 0 and rep[5] == 1, rep          # now the rate limit binds
    assert rep[6][0][:3] == [0, 2, 1], rep           # and no lease was taken
    assert cc(r, keys[0], 2, LONG, "ACQUIRE", "probe", "COST", 0)[2] == 1
    # REFUND: r3 was not served after all: its unit and its token come back.
    rep = multi(r, keys, lim("r3"), "REFUND", 1)
    assert rep[0] == 1 and rep[6][0][0] == 1 and rep[6][1][0] == 1, rep
    assert r.exists(keys[0]) == 0                    # its last lease: the key went
    # DRYRUN and PARTIAL with a weight.
    lw = ["CONCURRENCY", 4, LONG, "big", "WEIGHT", 2, "TOKENBUCKET", 3, 1, 3_600_000]
    assert multi(r, keys, lw, "COST", 3, "DRYRUN")[0] == 0
    assert multi(r, keys, lw, "COST", 3, "PARTIAL")[0] == 1   # the bucket has 1 token
    assert cc(r, keys[0], 4, LONG, "ACQUIRE", "probe", "COST", 0)[2] == 2


def test_multi_one_concurrency_limit_is_the_single_command(r):
    t0 = time.monotonic()
    for i in range(6):
        rid = f"id{i % 4}"
        opts = [["COST", 2], [], ["PARTIAL", "COST", 3], ["DRYRUN"]][i % 4]
        a = multi(r, ["m:one"], ["CONCURRENCY", 5, LONG, rid], *opts)
        b = cc(r, "s:one", 5, LONG, "ACQUIRE", rid, *opts)
        # each b runs after its a, on leases each b set after its a: the
        # waits differ by at most the ms the server's clock moved since the
        # first call (at most what this test saw, rounded up), and 1 ms of
        # rounding
        moved = math.ceil((time.monotonic() - t0) * 1000)
        assert a[:3] == b[:3] and a[5] == 0, (i, a, b)
        assert all(abs(a[j] - b[j]) <= moved + 1 for j in (3, 4)), (i, a, b, moved)
    # The same leases (their ends differ by the calls' microseconds).
    for rid in ("id0", "id1", "id2"):
        assert cc(r, "m:one", 5, LONG, "RELEASE", rid)[:3] == cc(r, "s:one", 5, LONG, "RELEASE", rid)[:3]


def workload(rng, m, n, prefix="cc"):
    """n random calls on 6 keys: acquires (COST, PARTIAL, DRYRUN), releases,
    renewals, RL.MULTI with a concurrency limit, short leases that lapse."""
    for _ in range(n):
        k = f"{prefix}:{{w}}:{rng.randrange(6)}"
        lease = rng.choice([LONG, LONG, 50, 200])
        rid = f"r{rng.randrange(8)}"
        x = rng.random()
        if x < 0.45:
            opts = rng.choice([[], ["COST", 2], ["COST", 3, "PARTIAL"], ["DRYRUN"], ["COST", 0]])
            m.execute_command(CMD, k, rng.choice([3, 5]), lease, "ACQUIRE", rid, *opts)
        elif x < 0.7:
            m.execute_command(CMD, k, 5, lease, "RELEASE", rid)
        elif x < 0.85:
            m.execute_command(CMD, k, 5, lease, "RENEW", rid)
        else:
            k2 = f"{prefix}:{{w}}:rate"
            opts = rng.choice([[], ["REFUND", 1], ["COST", 2, "PARTIAL"]])
            try:
                multi(m, [k, k2], ["CONCURRENCY", 5, lease, rid, "SLIDINGLOG", 50, LONG], *opts)
            except redis.ResponseError as e:  # a key that became another's type: never here
                raise AssertionError(e)


def test_replica_and_aof_hold_the_same_leases(server_factory):
    """Effects, not commands: after a random workload (short leases lapsing
    on the way, releases deleting keys) the replica's keys have the same
    DEBUG DIGEST-VALUE and PEXPIRETIME, and so has an AOF rewrite loaded
    back."""
    primary = server_factory(["--appendonly", "yes"])
    m = primary.client()
    rep = start_replica(server_factory, primary)
    rc = rep.client()
    rng = random.Random(4646)
    workload(rng, m, 1500)
    # the short leases lapse and their keys go (and the DELs replicate)
    wait_until(lambda: all(m.execute_command("PTTL", k) > 300_000 or m.exists(k) == 0
                           for k in m.keys("cc:*")), timeout=20, what="short leases lapsed")
    wait_ack(m)
    wait_replica_synced(m, rc)
    mk, rk = keyspace(m, "cc:*"), keyspace(rc, "cc:*")
    assert mk == rk
    assert any(t == "rl-concur" for t, _, _ in mk.values())
    assert db_digest(m) == db_digest(rc)
    # The AOF rewrite emits RL.STATE of the whole leases; loaded back, the same.
    before = db_digest(m)
    m.execute_command("BGREWRITEAOF")
    wait_aof_rewrite(m)
    m.execute_command("DEBUG", "LOADAOF")
    assert db_digest(m) == before


def test_a_replica_refuses_the_command(server_factory):
    primary = server_factory()
    rep = start_replica(server_factory, primary)
    with pytest.raises(redis.ReadOnlyError):
        cc(rep.client(), "k", 1, 1000, "ACQUIRE", "a", "DRYRUN")
