"""COST n FORCE: debits that settle (issue 46, item 2), on every kind.

A debit takes all its units even past the limit and leaves a debt later
calls wait out. Time-safe: what must happen at one instant runs in one
MULTI/EXEC (every command in it reads the server's one cached time; on
Redis 7.0, whose module reads its own clock per call, the waits and
resets of two calls differ by what ClockSlack allows); a
debt's end is awaited by polling the server's clock (rltesting.clock.
wait_past) past the instant the reply names, measured from a TIME read
after the call, so a stalled run waits longer but cannot fail.
"""
import random
import struct

import pytest
import redis

from rltesting.clock import one_window, server_ms, wait_past
from rltesting.cluster import Cluster, key_slot, tags_in_slots
from rltesting.payloads import payload
from rltesting.replies import ClockSlack
from rltesting.replication import start_replica, wait_ack, wait_aof_rewrite, wait_replica_synced

# (command, the policy of a limit of 5): a bucket of 5 regaining 5 a second
# (one token per 200 ms), windows of a second.
KINDS = {
    "tokenbucket": ("RL.TOKENBUCKET", [5, 5, 1000]),
    "slidinglog": ("RL.SLIDINGLOG", [5, 1000]),
    "slidingcounter": ("RL.SLIDINGCOUNTER", [5, 1000]),
    "fixedwindow": ("RL.FIXEDWINDOW", [5, 1000]),
    "fixedwindow-fromfirst": ("RL.FIXEDWINDOW", [5, 1000, "FROMFIRST"]),
}
# Reserve-then-settle on a limit of 10 nothing refills during a test.
SLOW = {
    "tokenbucket": ("RL.TOKENBUCKET", [10, 1, 3_600_000]),
    "slidinglog": ("RL.SLIDINGLOG", [10, 3_600_000]),
    "slidingcounter": ("RL.SLIDINGCOUNTER", [10, 1 << 40]),
    "fixedwindow": ("RL.FIXEDWINDOW", [10, 1 << 40]),
    "fixedwindow-fromfirst": ("RL.FIXEDWINDOW", [10, 3_600_000, "FROMFIRST"]),
}


def at_once(r, *calls, clk=None):
    """The calls in one MULTI/EXEC: one instant for the module (Redis 7.2+,
    Valkey; `clk`, a ClockSlack, sees the transaction's round trip)."""
    p = r.pipeline(transaction=True)
    for c in calls:
        p.execute_command(*c)
    return clk.execute(p) if clk else p.execute()


def one_instant(r, calls):
    """at_once inside one epoch-aligned window of a second, with 300 ms of
    it left: on Redis 7.0 the calls of one MULTI read the clock apart, so a
    window boundary between them would let the second one in (one_window
    runs it again, on fresh keys, if it straddled one). `calls(attempt)`
    gives the calls; returns (attempt, replies, the ClockSlack)."""
    clk = ClockSlack(r)
    return one_window(r, 1000, 300, lambda a: (a, at_once(r, *calls(a), clk=clk), clk))


def same(clk, u, v):
    """Two replies alike: the first three elements equal, the wait and the
    reset within the clock's slack."""
    return u[:3] == v[:3] and clk.close(u[3], v[3]) and clk.close(u[4], v[4])


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_force_takes_past_the_limit_and_the_debt_is_waited_out(r, kind):
    cmd, policy = KINDS[kind]
    attempt, (forced, after, dry), clk = one_instant(r, lambda a: [
        [cmd, f"force:{kind}:{a}", *policy, "COST", 7, "FORCE"],
        [cmd, f"force:{kind}:{a}", *policy],
        [cmd, f"force:{kind}:{a}", *policy, "DRYRUN"],
    ])
    key = f"force:{kind}:{attempt}"
    t_after = server_ms(r)
    # Granted all 7 of a limit of 5: remaining 0, never negative.
    assert forced[0] == 1 and forced[1] == 5 and forced[2] == 0, forced
    wait = forced[3]
    assert wait > 0 and forced[4] >= wait, forced
    # The next call at the same instant is denied, with the same wait
    # (the forced reply answers for a following call of one unit).
    assert same(clk, after, [0, 5, 0, wait, forced[4]]), (forced, after)
    assert same(clk, dry, after), (after, dry)
    assert r.pttl(key) > 0
    # Once the debt and the next unit are paid back, it is granted: the
    # call ran before t_after + 1 (TIME in whole ms, the module in µs).
    wait_past(r, t_after + 1 + wait)
    again = r.execute_command(cmd, key, *policy)
    assert again[0] == 1, (forced, again)


@pytest.mark.parametrize("kind", sorted(SLOW))
def test_reserve_then_settle(r, kind):
    cmd, policy = SLOW[kind]
    # Reserve 5 of 10, the work used 3: REFUND 2.
    down = f"settle:down:{kind}"
    reserve, settle = at_once(r, [cmd, down, *policy, "COST", 5], [cmd, down, *policy, "REFUND", 2])
    assert reserve[:3] == [1, 10, 5] and settle[:3] == [2, 10, 7], (reserve, settle)
    # Reserve 5, the work used 8: COST 3 FORCE (fits: no debt).
    up = f"settle:up:{kind}"
    reserve, settle = at_once(r, [cmd, up, *policy, "COST", 5], [cmd, up, *policy, "COST", 3, "FORCE"])
    assert reserve[:3] == [1, 10, 5] and settle[:4] == [1, 10, 2, 0], (reserve, settle)
    # Reserve 8, the work used 15: COST 7 FORCE leaves a debt of 5; the
    # next request is denied; a REFUND repays the debt first.
    debt = f"settle:debt:{kind}"
    clk = ClockSlack(r)
    reserve, settle, nxt, refund, after = at_once(
        r,
        [cmd, debt, *policy, "COST", 8],
        [cmd, debt, *policy, "COST", 7, "FORCE"],
        [cmd, debt, *policy],
        [cmd, debt, *policy, "REFUND", 6],
        [cmd, debt, *policy],
        clk=clk,
    )
    assert reserve[:3] == [1, 10, 2], reserve
    assert settle[:3] == [1, 10, 0] and settle[3] > 0, settle
    assert nxt[:3] == [0, 10, 0] and clk.close(nxt[3], settle[3]), (settle, nxt)
    # 15 used of 10, 6 back: 9 used, 1 left (the log gives back the newest
    # units: the 7 forced then 1 of the 8 reserved).
    assert refund[:3] == [6, 10, 1], refund
    assert after[:4] == [1, 10, 0, 0], after


def test_multi_force_takes_from_every_limit(r):
    limits = [
        "TOKENBUCKET", 5, 5, 1000,
        "SLIDINGLOG", 5, 1000,
        "SLIDINGCOUNTER", 5, 1000,
        "FIXEDWINDOW", 5, 1000, "WEIGHT", 1,
    ]
    def tagged(a):
        return [f"{{m}}tb{a}", f"{{m}}sl{a}", f"{{m}}sc{a}", f"{{m}}fw{a}"]
    attempt, (forced, nxt), clk = one_instant(r, lambda a: [
        ["RL.MULTI", 4, *tagged(a), *limits, "COST", 7, "FORCE"],
        ["RL.MULTI", 4, *tagged(a), *limits],
    ])
    keys = tagged(attempt)
    t_after = server_ms(r)
    assert forced[0] == 1 and forced[2] == 0, forced
    per = forced[6]
    assert [p[0] for p in per] == [7, 7, 7, 7] and [p[2] for p in per] == [0, 0, 0, 0], per
    # The call's wait is the longest limit's, for one following request.
    assert forced[3] == max(p[3] for p in per) > 0, forced
    assert nxt[0] == 0 and clk.close(nxt[3], forced[3]), (forced, nxt)
    assert all(p[0] == 0 for p in nxt[6]), nxt
    wait_past(r, t_after + 1 + forced[3])
    assert r.execute_command("RL.MULTI", 4, *keys, *limits)[0] == 1
    # WEIGHT multiplies the debit: 3 x 4 = 12 units of a limit of 5.
    w = r.execute_command("RL.MULTI", 1, "{m}w", "SLIDINGLOG", 5, 1000, "WEIGHT", 4, "COST", 3, "FORCE")
    assert w[6][0][:3] == [12, 5, 0] and w[0] == 1, w


@pytest.mark.parametrize(
    "args",
    [
        ["RL.TOKENBUCKET", "k", 5, 1, 1000, "COST", 7, "FORCE", "PARTIAL"],
        ["RL.SLIDINGLOG", "k", 5, 1000, "FORCE", "REFUND", 2],
        ["RL.FIXEDWINDOW", "k", 5, 1000, "FORCE", "FORCE"],
        ["RL.MULTI", 1, "k", "TOKENBUCKET", 5, 1, 1000, "CHECK", "FORCE"],
        ["RL.MULTI", 1, "k", "SLIDINGCOUNTER", 5, 1000, "SHADOW", "FORCE"],
        ["RL.MULTI", 1, "k", "CONCURRENCY", 5, 1000, "id-1", "COST", 7, "FORCE"],
        ["RL.CONCURRENCY", "k", 5, 1000, "ACQUIRE", "id-1", "COST", 7, "FORCE"],
    ],
)
def test_force_is_refused_where_it_has_no_meaning(r, args):
    with pytest.raises(redis.ResponseError, match="syntax error"):
        r.execute_command(*args)
    assert not r.exists("k")


def test_a_bucket_in_debt_persists_and_moves(r):
    """DUMP/RESTORE and DEBUG RELOAD keep a debt; RL.STATE (the decoder
    RDB and RESTORE share) takes encoding version 2, negative whole tokens
    down to -(2^53 - 1), and refuses a deeper debt, negative tokens in
    version 1 and a version 2 state not in debt."""
    policy = [5, 1, 3_600_000]
    r.execute_command("RL.TOKENBUCKET", "debt", *policy, "COST", 12, "FORCE")
    digest = r.execute_command("DEBUG", "DIGEST-VALUE", "debt")
    pexp = r.pexpiretime("debt")
    dump = r.dump("debt")
    r.delete("debt")
    r.restore("debt", pexp, dump, absttl=True)
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "debt") == digest
    r.execute_command("DEBUG", "RELOAD")
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "debt") == digest
    dry = r.execute_command("RL.TOKENBUCKET", "debt", *policy, "DRYRUN")
    # 8 tokens to the next one at 1 an hour (less what refilled meanwhile).
    assert dry[:3] == [0, 5, 0] and dry[3] > 7 * 3_600_000, dry
    now_us = server_ms(r) * 1000
    abs_ms = now_us // 1000 + 3_600_000

    def state(version, tokens):
        body = struct.pack("<BqQQQ", version, tokens, 0, 3_600_000_000, now_us)
        return payload("tb", abs_ms, body)

    assert r.execute_command("RL.STATE", "deep", state(2, -((1 << 53) - 1))) is not None
    deep = r.execute_command("RL.TOKENBUCKET", "deep", *policy, "DRYRUN")
    assert deep[:3] == [0, 5, 0], deep
    r.execute_command("RL.STATE", "seven", state(2, -7))
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "seven") != b"0" * 40
    for bad in (state(2, -(1 << 53)), state(1, -7), state(2, 3)):
        with pytest.raises(redis.ResponseError, match="invalid RL.STATE payload"):
            r.execute_command("RL.STATE", "bad", bad)
        assert not r.exists("bad")


def test_debits_replicate_and_rewrite_as_effects(server_factory):
    """Debits on every kind and RL.MULTI, mixed with takes and refunds,
    with a replica and the AOF: the replica's keys have the primary's
    digests and PEXPIRETIME (the effect carries the state in debt), and an
    AOF rewrite loaded back gives the same digests."""
    primary = server_factory(["--appendonly", "yes"])
    m = primary.client()
    rc = start_replica(server_factory, primary).client()
    rng = random.Random(462)
    hour = 3_600_000
    for i in range(400):
        k = rng.randrange(6)
        opts = rng.choice([["COST", rng.randint(0, 12), "FORCE"], ["COST", rng.randint(0, 4)], ["REFUND", rng.randint(1, 6)],
                           ["COST", rng.randint(20, 40), "FORCE"]])
        cmd = [
            ["RL.TOKENBUCKET", f"r:tb{k}", 5, rng.choice([1, 2]), hour],
            ["RL.SLIDINGLOG", f"r:sl{k}", 5, hour],
            ["RL.SLIDINGCOUNTER", f"r:sc{k}", 5, hour],
            ["RL.FIXEDWINDOW", f"r:fw{k}", 5, hour, *(["FROMFIRST"] if k % 2 else [])],
            ["RL.MULTI", 2, f"{{r}}mt{k}", f"{{r}}ms{k}", "TOKENBUCKET", 5, 1, hour, "SLIDINGLOG", 5, hour, "WEIGHT", 2],
        ][rng.randrange(5)]
        m.execute_command(*cmd, *opts)
    wait_ack(m)
    wait_replica_synced(m, rc)
    keys = sorted(m.keys("*"))
    assert len(keys) > 20
    debts = 0
    for key in keys:
        assert m.execute_command("DEBUG", "DIGEST-VALUE", key) == rc.execute_command("DEBUG", "DIGEST-VALUE", key), key
        assert m.pexpiretime(key) == rc.pexpiretime(key), key
        if key.startswith(b"r:tb") and m.execute_command("RL.TOKENBUCKET", key, 5, 1, hour, "DRYRUN")[3] > 5 * hour:
            debts += 1
    assert debts > 0, "no bucket was left in debt"
    before = {k: m.execute_command("DEBUG", "DIGEST-VALUE", k) for k in keys}
    m.execute_command("BGREWRITEAOF")
    wait_aof_rewrite(m)
    m.execute_command("DEBUG", "LOADAOF")
    assert {k: m.execute_command("DEBUG", "DIGEST-VALUE", k) for k in keys} == before


def node_view(cluster, key):
    """(digest, PEXPIRETIME) of a key, read on the node that owns it."""
    c = cluster.owner(key_slot(key.encode())).client()
    return (c.execute_command("DEBUG", "DIGEST-VALUE", key)[0], c.execute_command("PEXPIRETIME", key))


def test_debts_move_with_their_slots(server_factory):
    """On a three-primary cluster: debits on hash-tagged keys (a bucket in
    debt, a log and a window past their limits, an RL.MULTI debit of one
    tenant) are routed to the slot's owner; a reshard of their slots
    (MIGRATE: DUMP/RESTORE, the bucket's version 2 body) carries them byte
    for byte, and the new owner goes on with the debt."""
    cluster = Cluster(server_factory)
    rc = cluster.client()
    src = cluster.owner(0)
    dst = next(s for s in cluster.nodes if s is not src)
    hour = 3_600_000
    tags = tags_in_slots(0, 64, 3, prefix="fd")
    for t in tags:
        assert rc.execute_command("RL.TOKENBUCKET", f"rl:{{{t}}}:tb", 5, 1, hour, "COST", 9, "FORCE")[:3] == [1, 5, 0]
        assert rc.execute_command("RL.SLIDINGLOG", f"rl:{{{t}}}:sl", 5, hour, "COST", 8, "FORCE")[:3] == [1, 5, 0]
        rep = rc.execute_command("RL.MULTI", 2, f"rl:{{{t}}}:fw", f"rl:{{{t}}}:tpm", "FIXEDWINDOW", 5, 1 << 40,
                                 "TOKENBUCKET", 100, 100, 60_000, "WEIGHT", 20, "COST", 6, "FORCE")
        assert rep[0] == 1 and [p[:3] for p in rep[6]] == [[6, 5, 0], [120, 100, 0]], rep
    keys = [f"rl:{{{t}}}:{k}" for t in tags for k in ("tb", "sl", "fw", "tpm")]
    before = {k: node_view(cluster, k) for k in keys}
    cluster.reshard(src, dst, 64)
    rc = cluster.client()
    for k in keys:
        assert cluster.owner(key_slot(k.encode())) is dst
        # the state byte for byte (MIGRATE sends the TTL relative, so the
        # expiry moves by the time the move took: not compared)
        assert node_view(cluster, k)[0] == before[k][0], k
    for t in tags:
        # still in debt on the new owner: 4 tokens owed, the next one an hour
        # past them; then a refund of 6 repays the debt and leaves 2
        d = rc.execute_command("RL.TOKENBUCKET", f"rl:{{{t}}}:tb", 5, 1, hour)
        assert d[:3] == [0, 5, 0] and d[3] > 4 * hour, d
        assert rc.execute_command("RL.TOKENBUCKET", f"rl:{{{t}}}:tb", 5, 1, hour, "REFUND", 6)[:3] == [6, 5, 2]
        assert rc.execute_command("RL.SLIDINGLOG", f"rl:{{{t}}}:sl", 5, hour)[:3] == [0, 5, 0]
