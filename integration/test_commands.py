"""The contract (docs/contract.md) for the four commands, one server at a time:
replies, DRYRUN/PARTIAL/COST, errors, WRONGTYPE, rule changes, TTLs, INFO
counters, memory per state, the compact and wide state forms, and when
effects may be skipped. (Moved here from the Rust integration tests, so one
suite owns every test that needs a server; persistence, replication,
cluster, hostile input and resources have suites of their own.)
"""
import time

import pytest
import redis

from rltesting.clock import room, server_ms
from rltesting.proc import SERVER, wait_until
from rltesting.replication import start_replica, wait_ack, wait_aof_rewrite
from rltesting.replies import COMMANDS, least_memory_usage

MAX = (1 << 53) - 1
# A window so long that no refill or window boundary happens during a test
# (windows are aligned to multiples of their length on the Unix clock; a
# 2^40 ms window next turns over in 2039).
FOREVER_MS = 1 << 40


def limit_args(cmd, limit, ms):
    """Positional arguments for `limit` units per `ms` (the bucket refills its
    whole capacity per period)."""
    return [limit, limit, ms] if cmd == "RL.TOKENBUCKET" else [limit, ms]


def call(c, cmd, key, limit, ms, *opts):
    reply = c.execute_command(cmd, key, *limit_args(cmd, limit, ms), *opts)
    assert isinstance(reply, list) and len(reply) == 5, reply
    return reply


def digest(c, key):
    return c.execute_command("DEBUG", "DIGEST-VALUE", key)[0]


def pexpiretime(c, key):
    return c.execute_command("PEXPIRETIME", key)


def dirty(c):
    return c.info("persistence")["rdb_changes_since_last_save"]


def mem(c, key):
    """MEMORY USAGE of `key` without glibc's reuse slack (replies.least_memory_usage)."""
    return least_memory_usage(c, key, SERVER.malloc)


def block_size(c, n):
    """The size the server's allocator gives an n-byte block: under jemalloc
    its smallest bin that holds n (DEBUG MALLCTL arenas.bin.I.size, asked of
    the server); under libc malloc glibc's malloc_usable_size of n-byte
    blocks, asked of the same C library, which the server links."""
    if SERVER.malloc.startswith("jemalloc"):
        for i in range(64):
            size = int(c.execute_command("DEBUG", "MALLCTL", f"arenas.bin.{i}.size"))
            if size >= n:
                return size
        raise AssertionError(f"no jemalloc bin holds {n} bytes")
    import ctypes
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.malloc_usable_size.restype = ctypes.c_size_t
    libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    # glibc may hand out a slightly larger free chunk it does not split (see
    # mem()): the smallest of several blocks is the size of a fresh one.
    blocks = [libc.malloc(n) for _ in range(64)]
    try:
        return min(libc.malloc_usable_size(p) for p in blocks)
    finally:
        for p in blocks:
            libc.free(p)


# The module's state blocks: two packed words (the compact form), and the
# wide token bucket and sliding counter states.
COMPACT_BYTES, WIDE_BUCKET_BYTES, WIDE_COUNTER_BYTES = 16, 32, 24


def snapshot(c, keys):
    return [(digest(c, k), pexpiretime(c, k)) for k in keys]


@pytest.mark.parametrize("cmd", COMMANDS)
def test_fresh_key_draining_and_cost_above_limit(r, cmd):
    k = f"fresh:{cmd}"
    assert call(r, cmd, k, 3, FOREVER_MS)[:3] == [1, 3, 2]
    assert call(r, cmd, k, 3, FOREVER_MS, "COST", 2)[:4] == [1, 3, 0, 0]
    rep = call(r, cmd, k, 3, FOREVER_MS)
    assert rep[:3] == [0, 3, 0], "denied once drained"
    assert rep[3] > 0 and rep[4] >= rep[3], f"retry and reset are in the future: {rep}"
    # COST above the limit can never be granted: retry -1, nothing stored.
    assert call(r, cmd, f"big:{cmd}", 3, 1000, "COST", 4) == [0, 3, 3, -1, 0]
    assert r.exists(f"big:{cmd}") == 0


def test_token_bucket_reply_values(r):
    # capacity 10, 1 token per second.
    assert r.execute_command("RL.TOKENBUCKET", "k", 10, 1, 1000) == [1, 10, 9, 0, 1000]
    assert call(r, "RL.TOKENBUCKET", "k2", 10, 10_000, "COST", 10) == [1, 10, 0, 0, 10_000]
    # PARTIAL on an emptied bucket; cost above what is there.
    rep = r.execute_command("RL.TOKENBUCKET", "p", 5, 1, 3_600_000, "COST", 3)
    assert rep[:3] == [1, 5, 2]
    rep = r.execute_command("RL.TOKENBUCKET", "p", 5, 1, 3_600_000, "COST", 4, "PARTIAL")
    assert rep[:3] == [2, 5, 0], "PARTIAL grants the 2 that are there"
    assert 3 * 3_600_000 < rep[3] <= 4 * 3_600_000, f"retry for 4 tokens: {rep}"
    assert 4 * 3_600_000 < rep[4] <= 5 * 3_600_000, f"reset: {rep}"


def test_token_bucket_refills_after_a_wait(r):
    """The tokens regained after a wait lie between what the shortest and
    the longest possible server-side elapsed times give."""
    args = ["RL.TOKENBUCKET", "r", 1000, 1, 10]  # one token per 10 ms
    t0 = time.monotonic()
    rep = r.execute_command(*args, "COST", 1000)
    t1 = time.monotonic()
    assert rep[:3] == [1, 1000, 0]
    time.sleep(0.2)  # lets tokens come back; the bounds below are measured
    t2 = time.monotonic()
    rep = r.execute_command(*args, "COST", 0)
    t3 = time.monotonic()
    lo = int((t2 - t1) * 1000) // 10
    hi = int((t3 - t0) * 1000) // 10 + 1
    assert lo <= rep[2] <= hi, f"remaining {rep[2]} not in [{lo}, {hi}]"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_dryrun_and_partial(r, cmd):
    k = f"dp:{cmd}"
    assert call(r, cmd, k, 5, FOREVER_MS, "DRYRUN", "COST", 2)[:4] == [1, 5, 3, 0], \
        "DRYRUN answers as the call would"
    assert r.exists(k) == 0, "DRYRUN created the key"
    call(r, cmd, k, 5, FOREVER_MS, "COST", 4)
    rep = call(r, cmd, k, 5, FOREVER_MS, "partial", "cost", 3)
    assert rep[:3] == [1, 5, 0], "PARTIAL grants the one unit left"
    assert rep[3] > 0
    assert call(r, cmd, k, 5, FOREVER_MS, "PARTIAL")[:3] == [0, 5, 0], "nothing left"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_ttl_equals_reset_and_key_expires_when_fresh(r, cmd):
    """After a write the TTL is reset_after_ms; the key disappears when the
    limiter is fresh again, and not before.

    RL.FIXEDWINDOW's window is aligned to the epoch: the test starts with
    half of a 1 s window left (rltesting.clock.room), and the check that the
    state is not fresh before its expiry holds for a call that the server's
    clock shows ended before it."""
    k = f"ttl:{cmd}"
    room(r, 1000, 500)
    t0 = time.monotonic()
    rep = call(r, cmd, k, 10, 1000, "COST", 3)
    ttl = r.pttl(k)
    waited = int((time.monotonic() - t0) * 1000)
    assert rep[4] > 0
    assert rep[4] - waited - 1 <= ttl <= rep[4], f"pttl {ttl} vs reset {rep[4]}"
    exp = pexpiretime(r, k)
    # Before the expiry the state is not fresh yet: a nonzero reset.
    p = r.pipeline(transaction=False)
    p.execute_command(cmd, k, *limit_args(cmd, 10, 1000), "COST", 0)
    p.time()
    early, (sec, usec) = p.execute()
    assert sec * 1000 + usec // 1000 >= exp or early[4] > 0, early
    wait_until(lambda: r.exists(k) == 0, timeout=5, interval=0.005, what="key to expire")
    assert server_ms(r) >= exp, "expired before its expiry time"
    assert call(r, cmd, k, 10, 1000, "COST", 0) == [1, 10, 10, 0, 0], "fresh again"


@pytest.mark.parametrize("cmd", COMMANDS)
def test_bad_input_answers_errors_and_changes_nothing(r, cmd):
    k = f"bad:{cmd}"
    call(r, cmd, k, 5, FOREVER_MS)
    d0, e0 = digest(r, k), pexpiretime(r, k)
    n = len(limit_args(cmd, 1, 1))

    def base():
        return [k, *limit_args(cmd, 5, FOREVER_MS)]

    cases = [
        ([], "wrong number of arguments"),
        ([k], "wrong number of arguments"),
        ([k, *limit_args(cmd, 1, 1)[:n - 1]], "wrong number of arguments"),
    ]
    for bad in ["0", "-1", "abc", "1.5", "9007199254740992", "", " 1", "+1", "99999999999999999999"]:
        for pos in range(n):
            args = base()
            args[pos + 1] = bad
            cases.append((args, "must be an integer between 1 and 9007199254740991"))
    for opts in [["COST"], ["COST", "1", "COST", "1"], ["PARTIAL", "PARTIAL"], ["DRYRUN", "dryrun"],
                 ["FOO"], ["COST", "1", "EXTRA"]]:
        cases.append((base() + opts, "syntax error"))
    for bad in ["-1", "x", "9007199254740992"]:
        cases.append((base() + ["COST", bad], "COST must be an integer between 0 and 9007199254740991"))
    for args, expect in cases:
        with pytest.raises(redis.ResponseError) as e:
            r.execute_command(cmd, *args)
        assert expect in str(e.value), (args, str(e.value))
    # The error names the argument.
    args = base()
    args[1] = "0"
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command(cmd, *args)
    assert ("capacity" if cmd == "RL.TOKENBUCKET" else "limit") in str(e.value), str(e.value)
    assert (digest(r, k), pexpiretime(r, k)) == (d0, e0), "an error changed the key"
    assert r.ping()


def test_wrongtype_across_all_types(r):
    r.set("str", "x")
    for cmd in COMMANDS:
        call(r, cmd, f"wt:{cmd}", 5, FOREVER_MS)
    keys = [f"wt:{cmd}" for cmd in COMMANDS] + ["str"]
    for cmd in COMMANDS:
        for k in keys:
            if k == f"wt:{cmd}":
                continue
            d0 = digest(r, k)
            for opts in [[], ["DRYRUN"]]:
                with pytest.raises(redis.ResponseError) as e:
                    call(r, cmd, k, 5, FOREVER_MS, *opts)
                assert str(e.value).startswith(
                    "WRONGTYPE Operation against a key holding the wrong kind of value"), \
                    (cmd, k, str(e.value))
            assert digest(r, k) == d0
    assert r.type("wt:RL.SLIDINGLOG") == b"rl-slilog"


def test_runtime_rule_changes(r):
    """Parameters may change from call to call; the stored state carries over."""
    tb = ["RL.TOKENBUCKET", "tb"]
    # Token bucket: tokens are capped at the new capacity.
    assert r.execute_command(*tb, 100, 1, 3_600_000, "COST", 10)[2] == 90
    assert r.execute_command(*tb, 50, 1, 3_600_000, "COST", 0)[:3] == [1, 50, 50]
    assert r.execute_command(*tb, 200, 1, 3_600_000, "COST", 0)[:3] == [1, 200, 90], \
        "raising the capacity keeps the 90 tokens"
    # Windows: the units already granted count under the new limit.
    for cmd in ("RL.SLIDINGLOG", "RL.SLIDINGCOUNTER", "RL.FIXEDWINDOW"):
        k = f"rc:{cmd}"
        call(r, cmd, k, 10, FOREVER_MS, "COST", 6)
        assert call(r, cmd, k, 5, FOREVER_MS, "COST", 0)[:3] == [1, 5, 0], cmd
        assert call(r, cmd, k, 5, FOREVER_MS)[0] == 0, cmd
        assert call(r, cmd, k, 20, FOREVER_MS, "COST", 0)[2] == 14, cmd


def test_info_counts_granted_partial_and_denied(r):
    for cmd in COMMANDS:
        k = f"info:{cmd}"
        call(r, cmd, k, 2, FOREVER_MS)  # granted
        call(r, cmd, k, 2, FOREVER_MS, "COST", 2, "PARTIAL")  # partial
        call(r, cmd, k, 2, FOREVER_MS)  # denied
        call(r, cmd, k, 2, FOREVER_MS, "COST", 0)  # granted
    info = r.info("ratelimit")
    for name in ("tokenbucket", "slidinglog", "slidingcounter", "fixedwindow"):
        got = tuple(info.get(f"ratelimit_{name}_{what}") for what in ("granted", "partial", "denied"))
        assert got == (2, 1, 1), (name, info)


def test_memory_usage_of_every_type_and_a_compact_log(r):
    """MEMORY USAGE works for every type and stays small; 1,000 grants at
    distinct times in a sliding log fit in 8 KB (a sorted-set log of the
    same grants takes ~127 KB)."""
    for cmd in COMMANDS:
        for i, cost in enumerate([1, 3, 7]):
            k = f"m:{cmd}:{i}"
            call(r, cmd, k, 10, 3_600_000 * (i + 1), "COST", cost)
            call(r, cmd, k, 10, 3_600_000 * (i + 1))
            assert 0 < r.memory_usage(k) < 400, (k, r.memory_usage(k))
    last = None
    for _ in range(1000):
        # One grant per call; successive calls are at distinct µs.
        last = r.execute_command("RL.SLIDINGLOG", "log", 1_000_000, 60_000)
    assert last[2] == 1_000_000 - 1000
    m = mem(r, "log")
    assert m <= 8 * 1024, f"MEMORY USAGE of 1,000 grants: {m} bytes"
    print(f"sliding log, 1000 grants: MEMORY USAGE = {m} bytes")
    # A grant of COST n costs the same as a grant of 1.
    r.execute_command("RL.SLIDINGLOG", "big", 1_000_000, 60_000, "COST", 1000)
    r.execute_command("RL.SLIDINGLOG", "one", 1_000_000, 60_000)
    assert mem(r, "big") == mem(r, "one")


def test_compact_and_wide_states_behave_the_same(server_factory):
    """Bucket and counter states are kept in a 16-byte compact form when they
    fit it (the usual case) and in full otherwise. The two forms must be
    invisible: same replies, digests, DUMPs and expiries, across switches
    between them in both directions, reloads, RESTORE, COPY and replication."""
    master = server_factory()
    replica = start_replica(server_factory, master)
    c, rc = master.client(), replica.client()

    def tb(k, cap, period, cost):
        return c.execute_command("RL.TOKENBUCKET", k, cap, 1, period, "COST", cost)

    # Per-hour bucket: compact. A bucket refilling over 2^40 ms: wide (its
    # level needs more than 128 bits with the time). Same name length.
    assert tb("tb:c", 100, 3_600_000, 1)[:3] == [1, 100, 99]
    assert tb("tb:w", 100, FOREVER_MS, 1)[:3] == [1, 100, 99]
    # MEMORY USAGE counts the blocks as the allocator sizes them.
    bucket_extra = block_size(c, WIDE_BUCKET_BYTES) - block_size(c, COMPACT_BYTES)
    assert mem(c, "tb:w") - mem(c, "tb:c") == bucket_extra, "bucket state: 16 bytes compact, 32 wide"
    # Switch forms both ways through rule changes; the level carries over.
    assert tb("tb:c", 100, FOREVER_MS, 1)[:3] == [1, 100, 98]
    assert mem(c, "tb:c") == mem(c, "tb:w"), "compact -> wide"
    assert tb("tb:c", 100, 3_600_000, 1)[:3] == [1, 100, 97]
    assert mem(c, "tb:w") - mem(c, "tb:c") == bucket_extra, "wide -> compact"
    assert tb("tb:w", 100, FOREVER_MS, 1)[:3] == [1, 100, 98]

    # Counter: compact until a window counts 2^43 units or more.
    def sc(k, cost):
        return c.execute_command("RL.SLIDINGCOUNTER", k, MAX, 3_600_000, "COST", cost)

    big = 1 << 43
    assert sc("sc:c", 5)[:3] == [1, MAX, MAX - 5]
    assert sc("sc:w", big)[:3] == [1, MAX, MAX - big]
    # 16 bytes compact, 24 wide, as the allocator sizes them: Redis 7.0's
    # jemalloc has no 24-byte bin (16 and 32), Redis 8.2's has; glibc gives
    # both 24 usable bytes.
    counter_extra = block_size(c, WIDE_COUNTER_BYTES) - block_size(c, COMPACT_BYTES)
    assert mem(c, "sc:w") - mem(c, "sc:c") == counter_extra, "counter state: 16 bytes compact, 24 wide"
    assert sc("sc:c", big)[:3] == [1, MAX, MAX - big - 5]
    assert mem(c, "sc:c") == mem(c, "sc:w"), "compact -> wide"

    # Both forms survive every way a value is copied, with equal digests.
    keys = ["tb:c", "tb:w", "sc:c", "sc:w"]
    before = [(digest(c, k), pexpiretime(c, k), c.dump(k)) for k in keys]
    assert before[0][0] != before[1][0], "different states, different digests"
    wait_ack(c)
    for k, (d, e, _) in zip(keys, before):
        assert digest(rc, k) == d, f"{k} on the replica"
        assert pexpiretime(rc, k) == e, f"{k} expiry on the replica"
    c.execute_command("DEBUG", "RELOAD")
    for k, (d, e, dump) in zip(keys, before):
        assert digest(c, k) == d, f"{k} after DEBUG RELOAD"
        assert c.dump(k) == dump, f"{k}: the RDB bytes do not depend on the form"
        c.restore(f"{k}:r", e, dump, absttl=True)
        assert digest(c, f"{k}:r") == d, f"{k} after RESTORE"
        c.copy(k, f"{k}:c")
        assert digest(c, f"{k}:c") == d, f"{k} after COPY"
    # After the reload the compact key is still compact.
    assert mem(c, "tb:w") - mem(c, "tb:c") == bucket_extra, "forms kept across DEBUG RELOAD"
    # And the restored and copied keys go on from the same state.
    assert tb("tb:c:r", 100, 3_600_000, 1)[:3] == [1, 100, 96]
    assert tb("tb:w:c", 100, FOREVER_MS, 1)[:3] == [1, 100, 97]


def effects_replicated(c):
    return c.info("ratelimit")["ratelimit_effects_replicated"]


def test_effects_are_skipped_only_while_nothing_can_read_them(server_factory):
    """With no replica, no backlog and no AOF, grants skip building and
    replicating their effect (it would reach nobody) but still count as
    changes. Whatever later reads the stream must still see every grant: a
    replica attached afterwards (its snapshot holds the earlier grants, the
    fork of the full sync switches effects back on) and an AOF enabled at
    run time (its rewrite holds the earlier grants, the per-call AOF check
    the later ones)."""
    master = server_factory()
    m = master.client()
    wait_until(lambda: effects_replicated(m) == 0, what="the module to see no listener")
    keys = []
    d0 = dirty(m)
    for i in range(20):
        for cmd in COMMANDS:
            k = f"e:{cmd}:{i}"
            call(m, cmd, k, 100, 3_600_000)
            keys.append(k)
    assert dirty(m) - d0 == 20 * len(COMMANDS), "each grant counts toward save points"
    assert effects_replicated(m) == 0

    replica = start_replica(server_factory, master)
    rc = replica.client()
    assert effects_replicated(m) == 1, "the full sync's fork switches effects on"
    for i, k in enumerate(list(keys)):
        cmd = COMMANDS[i % len(COMMANDS)]
        call(m, cmd, k, 100, 3_600_000, "COST", 2)
        fresh = f"{k}:after"
        call(m, cmd, fresh, 100, 3_600_000)
        keys.append(fresh)
    wait_ack(m)
    assert snapshot(rc, keys) == snapshot(m, keys), "replica attached after skipped effects"

    # AOF switched on at run time, on a server that skips effects.
    s = server_factory(["--appendfsync", "always"])
    c = s.client()
    wait_until(lambda: effects_replicated(c) == 0, what="the module to see no listener")
    keys = []
    for i in range(30):
        k = f"aof:{i}"
        call(c, COMMANDS[i % len(COMMANDS)], k, 100, 3_600_000)
        keys.append(k)
    c.config_set("appendonly", "yes")
    wait_until(lambda: c.info("persistence")["aof_enabled"] == 1, what="AOF on")
    wait_aof_rewrite(c)
    for i, k in enumerate(list(keys)):
        cmd = COMMANDS[i % len(COMMANDS)]
        call(c, cmd, k, 100, 3_600_000, "COST", 3)
        fresh = f"{k}:after"
        call(c, cmd, fresh, 100, 3_600_000)
        keys.append(fresh)
    before = snapshot(c, keys)
    s.restart(s.extra + ["--appendonly", "yes"])
    c = s.client()
    assert snapshot(c, keys) == before, "AOF enabled after skipped effects"


# ---------------------------------------------------------------------------
# RL.FIXEDWINDOW's own cases: exact replies against the server's clock,
# the key's expiry at the window's end, FROMFIRST, refunds, the empty window.
# ---------------------------------------------------------------------------

def timed(c, *args):
    """(ms before, reply, ms after) by the server's clock: the call decided
    at a millisecond between the two."""
    t0 = server_ms(c)
    rep = c.execute_command(*args)
    return t0, rep, server_ms(c)


def test_fixed_window_replies_to_the_window_end(r):
    w = 3_600_000  # epoch-aligned hours, with 30 s of this one left
    room(r, w, 30_000)
    for _ in range(20):
        t0, rep, t1 = timed(r, "RL.FIXEDWINDOW", "fw:h", 5, w, "COST", 2)
        if t0 // w == t1 // w:
            break
        r.delete("fw:h")
    end = (t0 // w + 1) * w
    assert rep[:4] == [1, 5, 3, 0]
    assert end - t1 <= rep[4] <= end - t0, (rep, t0, t1)
    assert pexpiretime(r, "fw:h") == end, "the key expires exactly at the window's end"
    t0, rep, t1 = timed(r, "RL.FIXEDWINDOW", "fw:h", 5, w, "COST", 4)
    assert rep[:3] == [0, 5, 3]
    assert rep[3] == rep[4] and end - t1 <= rep[3] <= end - t0, "a denial waits for the window's end"
    assert call(r, "RL.FIXEDWINDOW", "fw:h", 5, w, "COST", 3, "PARTIAL")[:3] == [3, 5, 0]
    assert call(r, "RL.FIXEDWINDOW", "fw:h", 5, w, "COST", 6)[:4] == [0, 5, 0, -1]
    assert pexpiretime(r, "fw:h") == end
    # The empty window: COST 0 or DRYRUN COST 0 on a fresh key, a denial of
    # COST above the limit: everything left, reset 0, nothing written.
    for opts in (["COST", 0], ["DRYRUN", "COST", 0], ["COST", 6], ["COST", 6, "DRYRUN"]):
        rep = call(r, "RL.FIXEDWINDOW", "fw:empty", 5, w, *opts)
        assert rep == [0 if opts[1] == 6 else 1, 5, 5, -1 if opts[1] == 6 else 0, 0], (opts, rep)
        assert r.exists("fw:empty") == 0
    assert r.type("fw:h") == b"rl-fixwin"


def test_fixed_window_from_first(r):
    w = 50_000
    t0, rep, t1 = timed(r, "RL.FIXEDWINDOW", "ff", 3, w, "FROMFIRST")
    assert rep[:4] == [1, 3, 2, 0] and rep[4] == w, "a window starts at its first grant"
    start = pexpiretime(r, "ff") - w
    assert t0 <= start <= t1
    t0, rep, t1 = timed(r, "RL.FIXEDWINDOW", "ff", 3, w, "fromfirst", "COST", 2)
    assert rep[:4] == [1, 3, 0, 0]
    assert start + w - t1 <= rep[4] <= start + w - t0
    assert pexpiretime(r, "ff") == start + w, "a grant in the window keeps its end"
    rep = call(r, "RL.FIXEDWINDOW", "ff", 3, w, "FROMFIRST")
    assert rep[:3] == [0, 3, 0] and 0 < rep[3] == rep[4] <= w
    # The same key read epoch-aligned: a start that is no multiple of the
    # window counts nothing (unless it happens to be one).
    if start % w:
        assert call(r, "RL.FIXEDWINDOW", "ff", 3, w, "COST", 0) == [1, 3, 3, 0, 0]
    # A short FROMFIRST window: the next grant after it ends starts anew.
    t0, rep, _ = timed(r, "RL.FIXEDWINDOW", "ff2", 1, 100, "FROMFIRST")
    first_end = pexpiretime(r, "ff2")
    assert rep[:3] == [1, 1, 0]
    wait_until(lambda: server_ms(r) >= first_end, timeout=5, interval=0.005, what="the window to end")
    t0, rep, t1 = timed(r, "RL.FIXEDWINDOW", "ff2", 1, 100, "FROMFIRST")
    assert rep == [1, 1, 0, 0, 100]
    assert t0 + 100 <= pexpiretime(r, "ff2") <= t1 + 100
    # COST above the limit is the only denial of a window not started.
    assert call(r, "RL.FIXEDWINDOW", "ff3", 2, w, "FROMFIRST", "COST", 3) == [0, 2, 2, -1, 0]
    assert r.exists("ff3") == 0


def test_fixed_window_refunds(r):
    w = 3_600_000
    room(r, w, 30_000)  # the calls share the hour's window
    call(r, "RL.FIXEDWINDOW", "rf", 5, w, "COST", 4)
    e = pexpiretime(r, "rf")
    rep = call(r, "RL.FIXEDWINDOW", "rf", 5, w, "REFUND", 3)
    assert rep[:4] == [3, 5, 4, 0] and rep[4] > 0
    assert pexpiretime(r, "rf") == e, "a refund keeps the window's end"
    rep = call(r, "RL.FIXEDWINDOW", "rf", 5, w, "REFUND", 9)
    assert rep == [1, 5, 5, 0, 0], "back to an empty window"
    assert r.exists("rf") == 0, "a refund to an empty window deletes the key"
    assert call(r, "RL.FIXEDWINDOW", "rf", 5, w, "REFUND", 1) == [0, 5, 5, 0, 0]
    assert r.exists("rf") == 0, "nothing to give back: nothing created"
    call(r, "RL.FIXEDWINDOW", "rff", 5, w, "FROMFIRST", "COST", 5)
    assert call(r, "RL.FIXEDWINDOW", "rff", 5, w, "REFUND", 2, "FROMFIRST")[:3] == [2, 5, 2]


def test_fixed_window_boundary_burst(r):
    """Fixed windows' known weakness: a full limit at the end of one window
    and another at the start of the next, within a few milliseconds."""
    w, limit = 1000, 10
    for _ in range(50):
        wait_until(lambda: server_ms(r) % w >= w - 150, timeout=3, interval=0.002, what="a window's last 150 ms")
        t0, first, _ = timed(r, "RL.FIXEDWINDOW", "burst", limit, w, "COST", limit)
        end = pexpiretime(r, "burst")
        wait_until(lambda: server_ms(r) >= end, timeout=3, interval=0.002, what="the next window")
        _, second, t1 = timed(r, "RL.FIXEDWINDOW", "burst", limit, w, "COST", limit)
        if t1 - t0 < w and first[0] == 1:
            break
        r.delete("burst")
    assert first[:3] == [1, limit, 0] and second[:3] == [1, limit, 0]
    assert t1 - t0 < w, f"2 x limit granted in {t1 - t0} ms, less than one window"


def test_fixed_window_fromfirst_is_its_own_option(r):
    k = "fwopt"
    for opts in [["FROMFIRST", "FROMFIRST"], ["FROMFIRST", "REFUND", "1", "COST", "1"],
                 ["REFUND", "1", "DRYRUN", "FROMFIRST"], ["FROMFIRST", "1"], ["FROM", "FIRST"]]:
        with pytest.raises(redis.ResponseError, match="syntax error"):
            r.execute_command("RL.FIXEDWINDOW", k, 5, 1000, *opts)
    for cmd in ("RL.SLIDINGCOUNTER", "RL.SLIDINGLOG"):
        with pytest.raises(redis.ResponseError, match="syntax error"):
            r.execute_command(cmd, k, 5, 1000, "FROMFIRST")
    with pytest.raises(redis.ResponseError, match="window_ms must be an integer between 1 and 9007199254740991"):
        r.execute_command("RL.FIXEDWINDOW", k, 5, 0, "FROMFIRST")
    assert r.exists(k) == 0


def test_fixed_window_memory_is_one_compact_block(r):
    """A fixed window is always the 16-byte compact form: MEMORY USAGE equals
    a compact token bucket's (same name length, both with a TTL), also at
    the extremes of its range and after DEBUG RELOAD."""
    r.execute_command("RL.TOKENBUCKET", "mem:tb", 100, 1, 3_600_000)
    r.execute_command("RL.FIXEDWINDOW", "mem:fw", 100, 3_600_000)
    r.execute_command("RL.FIXEDWINDOW", "mem:fx", MAX, MAX, "COST", MAX, "FROMFIRST")
    base = mem(r, "mem:tb")
    assert mem(r, "mem:fw") == base and mem(r, "mem:fx") == base, (mem(r, "mem:fw"), mem(r, "mem:fx"), base)
    r.execute_command("DEBUG", "RELOAD")
    assert mem(r, "mem:fw") == mem(r, "mem:tb") == mem(r, "mem:fx")
