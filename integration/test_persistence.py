"""Persistence: AOF (with and without the RDB preamble, kill -9 mid-workload,
rewrite), RDB (SAVE/BGSAVE/DEBUG RELOAD), DUMP/RESTORE, and a committed RDB
fixture written by the current encoding that every future build must still
load."""
import os
import random
import shutil

import pytest
import redis

from rltesting.proc import SERVER, wait_until
from rltesting.replication import wait_aof_rewrite, wait_bgsave
from rltesting.replies import COMMANDS, db_digest, granted_units, keyspace, load_json, NEVER, rl, TYPE_NAMES
from rltesting.workload import Workload

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
SEED = int(os.environ.get("RL_SEED", "0")) or random.randrange(1, 2**31)


def aof_args(preamble):
    return ["--appendonly", "yes", "--appendfsync", "always",
            "--aof-use-rdb-preamble", preamble]


def populate(c):
    """Keys of all four types in varied states that outlive the test: COST
    n, PARTIAL, runtime parameter changes, extreme arguments. Returns
    {key: (cmd, params, remaining)} for the keys whose COST 0 reply is
    time-independent."""
    exact = {}
    rnd = random.Random(SEED)
    for cmd in COMMANDS:
        for i in range(6):
            key = f"rl:p:{cmd}:never:{i}"
            limit = rnd.choice([5, 100, 10**6])
            params = NEVER[cmd](limit)
            used = 0
            for _ in range(rnd.randint(1, 6)):
                cost = rnd.randint(1, max(1, limit // 3))
                used += granted_units(rl(c, cmd, key, params, cost=cost, partial=True), cost, True)
            assert used > 0
            exact[key] = (cmd, params, limit - used)
        big = (1 << 53) - 1
        key = f"rl:p:{cmd}:max"
        assert rl(c, cmd, key, NEVER[cmd](big), cost=big - 3)[0] == 1
        exact[key] = (cmd, NEVER[cmd](big), 3)
    # Real-looking parameters (the keys live minutes to hours): digests only.
    # A fixed window aligned to the epoch expires at its window's end, which
    # can be any moment: its windows are chosen to end ten minutes or more
    # after now, so that no key expires during the test.
    aligned = far_aligned_windows(c, 2)
    real = {
        "RL.TOKENBUCKET": [[10, 1, 600000], [100, 1, 600000], [7, 3, 3600000]],
        "RL.SLIDINGLOG": [[10, 60000], [100, 600000], [7, 3600000]],
        "RL.SLIDINGCOUNTER": [[10, 60000], [100, 600000], [7, 3600000]],
        "RL.FIXEDWINDOW": [[10, 60000, "FROMFIRST"], [100, 600000, "FROMFIRST"],
                           [7, aligned[0]], [50, aligned[1]]],
    }
    for cmd in COMMANDS:
        for i in range(4):
            key = f"rl:p:{cmd}:real:{i}"
            for _ in range(rnd.randint(1, 8)):
                params = rnd.choice(real[cmd])  # rules change between calls
                cost = rnd.randint(1, 4)
                rl(c, cmd, key, params, cost=cost, partial=rnd.random() < 0.5)
    return exact


def far_aligned_windows(c, n, margin_ms=600000):
    """n window lengths (whole minutes, one to four hours) whose window
    aligned to the epoch, on the server's clock, ends more than margin_ms
    from now."""
    sec, usec = c.time()
    now = sec * 1000 + usec // 1000
    found = [w for w in range(3600000, 4 * 3600000, 60000) if w - now % w > margin_ms][:n]
    assert len(found) == n, now
    return found


def holds_commands(aof):
    """Whether an AOF holds a rate-limit command itself (as a RESP command
    name) rather than its effect."""
    low = aof.lower()
    return any(f"${len(c)}\r\n{c.lower()}\r\n".encode() in low for c in COMMANDS)


def assert_exact(c, exact):
    for key, (cmd, params, remaining) in exact.items():
        assert rl(c, cmd, key, params, cost=0)[:4] == [1, params[0], remaining, 0], key


def assert_unchanged(c, snap, digest):
    now = keyspace(c)
    assert set(now) == set(snap)
    for k in snap:
        assert now[k] == snap[k], (k, snap[k], now[k])
    assert db_digest(c) == digest


@pytest.mark.parametrize("rewrite", [False, True], ids=["no-rewrite", "rewrite-during-workload"])
@pytest.mark.parametrize("preamble", ["yes", "no"])
def test_aof_kill9_keeps_every_acknowledged_grant(server_factory, preamble, rewrite):
    """appendfsync always, kill -9 during a workload, restart: every grant
    acknowledged before the kill is still counted (remaining ≤ limit −
    acknowledged), and at most the one call in flight is counted besides."""
    srv = server_factory(aof_args(preamble))
    c = srv.client()
    rnd = random.Random(SEED)
    keys = [(cmd, f"rl:aof:{cmd}:{i}", NEVER[cmd](limit))
            for cmd in COMMANDS for i, limit in enumerate([10**6, 10**6, 60])]
    acked = {k: 0 for _, k, _ in keys}
    inflight = {}

    def call(i):
        cmd, key, params = keys[rnd.randrange(len(keys))]
        cost, partial = rnd.randint(1, 3), rnd.random() < 0.3
        inflight.clear()
        inflight[key] = cost
        reply = rl(c, cmd, key, params, cost=cost, partial=partial)
        acked[key] += granted_units(reply, cost, partial)
        inflight.clear()

    w = Workload(call, limit=50000, stop_on=(redis.exceptions.ConnectionError,))
    w.start()
    try:
        wait_until(lambda: w.calls >= 400 or not w.is_alive(), what="workload under way")
        if rewrite:
            c2 = srv.client()
            c2.bgrewriteaof()
            wait_aof_rewrite(c2)
            n = w.calls
            wait_until(lambda: w.calls >= n + 200 or not w.is_alive(), what="workload after rewrite")
        srv.kill9()
    finally:
        w.finish()

    srv.start()
    c = srv.client()
    assert sum(acked.values()) >= 200
    for cmd, key, params in keys:
        limit = params[0]
        remaining = rl(c, cmd, key, params, cost=0)[2]
        assert remaining <= limit - acked[key], (key, remaining, limit, acked[key])
        assert remaining >= limit - acked[key] - inflight.get(key, 0), (key, remaining, acked[key])


@pytest.mark.parametrize("preamble", ["yes", "no"])
def test_aof_replay_and_rewrite_keep_state(server_factory, preamble):
    """Restart from the AOF (replayed effects, not commands: no clock is
    read) and again after BGREWRITEAOF: every key keeps its exact digest and
    PEXPIRETIME, and the limits go on where they were."""
    srv = server_factory(aof_args(preamble))
    c = srv.client()
    exact = populate(c)
    snap, digest = keyspace(c), db_digest(c)

    srv.kill9()
    srv.start()
    c = srv.client()
    assert_unchanged(c, snap, digest)

    c.bgrewriteaof()
    wait_aof_rewrite(c)
    aofdir = os.path.join(srv.dir, "appendonlydir")
    base = [f for f in os.listdir(aofdir) if ".base." in f]
    assert len(base) == 1, base
    with open(os.path.join(aofdir, base[0]), "rb") as f:
        data = f.read()
    if preamble == "yes":
        assert data.startswith(SERVER.rdb_magic), data[:16]
    else:
        # A rewritten AOF holds states (RL.STATE), never the commands.
        assert b"RL.STATE" in data
        assert not holds_commands(data)

    srv.kill9()
    srv.start()
    c = srv.client()
    assert_unchanged(c, snap, digest)
    assert_exact(c, exact)
    # And they continue: one more unit on each exact key.
    for key, (cmd, params, remaining) in exact.items():
        if remaining:
            assert rl(c, cmd, key, params)[:3] == [1, params[0], remaining - 1], key


def test_aof_holds_effects_not_commands(server_factory):
    """The AOF gets one RL.STATE per grant, and nothing for denied, COST 0 or
    DRYRUN calls."""
    srv = server_factory(aof_args("no"))
    c = srv.client()
    grants = 0
    for cmd in COMMANDS:
        key = f"rl:aofeff:{cmd}"
        params = NEVER[cmd](4)
        for cost, partial, dryrun in [(1, False, False), (0, False, False), (3, False, True),
                                      (5, False, False), (9, True, False), (2, False, False),
                                      (1, True, False), (1, False, True)]:
            reply = rl(c, cmd, key, params, cost=cost, partial=partial, dryrun=dryrun)
            grants += bool(granted_units(reply, cost, partial) and not dryrun)
    assert grants == 2 * len(COMMANDS)
    aofdir = os.path.join(srv.dir, "appendonlydir")
    incr = [f for f in os.listdir(aofdir) if ".incr." in f]
    assert len(incr) == 1, incr
    with open(os.path.join(aofdir, incr[0]), "rb") as f:
        data = f.read()
    assert data.count(b"RL.STATE") == grants
    assert not holds_commands(data)


def test_rdb_save_restart_keeps_state(server_factory):
    """SAVE, restart; BGSAVE, kill -9, restart; DEBUG RELOAD: digests and
    exact expiries survive each, and the limits continue exactly."""
    srv = server_factory()
    c = srv.client()
    exact = populate(c)
    snap, digest = keyspace(c), db_digest(c)

    c.save()
    srv.stop()
    srv.start()
    c = srv.client()
    assert_unchanged(c, snap, digest)

    c.bgsave()
    wait_bgsave(c)
    srv.kill9()
    srv.start()
    c = srv.client()
    assert_unchanged(c, snap, digest)

    c.execute_command("DEBUG", "RELOAD")
    assert_unchanged(c, snap, digest)
    assert_exact(c, exact)


def test_dump_restore_and_copy_keep_state(server_factory):
    """DUMP/RESTORE (what MIGRATE does) and COPY carry the exact state: same
    digest, the limit continues on the new key, and the two keys are then
    independent."""
    srv = server_factory()
    c = srv.client()
    exact = populate(c)
    other = server_factory().client()
    for key, (cmd, params, remaining) in exact.items():
        payload = c.dump(key)
        exp = c.execute_command("PEXPIRETIME", key)
        other.restore(key, exp, payload, absttl=True)
        c.execute_command("COPY", key, key + ":copy")
        d = c.execute_command("DEBUG", "DIGEST-VALUE", key)
        assert other.execute_command("DEBUG", "DIGEST-VALUE", key) == d
        assert c.execute_command("DEBUG", "DIGEST-VALUE", key + ":copy") == d
        assert other.execute_command("PEXPIRETIME", key) == exp
        assert c.execute_command("PEXPIRETIME", key + ":copy") == exp
        assert other.type(key).decode() == TYPE_NAMES[cmd]
        if remaining:
            assert rl(other, cmd, key, params)[:3] == [1, params[0], remaining - 1]
            assert rl(c, cmd, key + ":copy", params)[:3] == [1, params[0], remaining - 1]
            assert rl(c, cmd, key, params, cost=0)[:3] == [1, params[0], remaining]


def test_rdb_fixture_of_encoding_v1_loads(server_factory, tmp_path):
    """integration/fixtures/ratelimit-v1.rdb was written by encoding version
    1 (regenerate with fixtures/make_rdb_fixture.py). Every build must load
    it into the same states: same types, digests, expiries, and the same
    time-independent COST 0 replies. A change to the encoding that breaks
    existing RDB files fails here."""
    expected = load_json(os.path.join(FIXTURES, "ratelimit-v1.json"))
    shutil.copy(os.path.join(FIXTURES, "ratelimit-v1.rdb"), tmp_path / "dump.rdb")
    srv = server_factory(dir=str(tmp_path))
    c = srv.client()
    keys = {k.decode() for k in c.keys("*")}
    assert keys == set(expected["keys"]), keys
    for key, e in expected["keys"].items():
        assert c.type(key).decode() == e["type"], key
        assert c.execute_command("DEBUG", "DIGEST-VALUE", key)[0].decode() == e["digest"], key
        assert c.execute_command("PEXPIRETIME", key) == e["pexpiretime"], key
        if "cost0" in e:
            assert rl(c, e["command"], key, e["params"], cost=0)[:4] == e["cost0"], key
            rem = e["cost0"][2]
            denied = rl(c, e["command"], key, e["params"], cost=rem + 1, dryrun=True)
            assert denied[:3] == [0, e["params"][0], rem], key
    types = {e["type"] for e in expected["keys"].values()}
    assert types == {"rl-tokbkt", "rl-slilog", "rl-slicnt"}
    # The loaded states are live: a grant works and the key saves again.
    for key, e in expected["keys"].items():
        if "cost0" in e and e["cost0"][2] > 0:
            rem = e["cost0"][2]
            assert rl(c, e["command"], key, e["params"])[:3] == [1, e["params"][0], rem - 1], key
    c.save()
    c.execute_command("DEBUG", "RELOAD")
    assert {k.decode() for k in c.keys("*")} == keys
