"""Hostile input: mutated RESTORE payloads, random RL.STATE payloads and
junk arguments. Every call must answer an error or succeed with a key that
then behaves; the server must never crash (PING after every payload).

RESTORE payloads are real DUMPs, mutated at the module-value level (the
body our decoder sees, re-wrapped with correct lengths) and at the raw byte
level (anything after the type byte), truncated and extended; the DUMP
trailer (RDB version + CRC64) is recomputed every time so that Redis hands
the bytes to the module's rdb_load instead of refusing them at the checksum.
Everything is seeded: a failure message carries the payload in hex.
"""
import os
import random
import struct

import pytest
import redis

from rltesting.payloads import (
    MAX_ARG, Dump, crc64, fw_body, grant_body, mutate, payload, random_log, random_payloads, sc_body, sl_body, tb_body,
    with_trailer,
)
from rltesting.proc import SERVER
from rltesting.replies import TYPE_NAMES, check_reply

HUGE = MAX_ARG
N_MUTATIONS = int(os.environ.get("RL_HOSTILE_N", "600"))

# ---------------------------------------------------------------------------
# Checks.
# ---------------------------------------------------------------------------

COMMAND_OF = {v: k for k, v in TYPE_NAMES.items()}
PARAMS = {
    "RL.TOKENBUCKET": [10, 1, 1000],
    "RL.SLIDINGLOG": [10, 1000],
    "RL.SLIDINGCOUNTER": [10, 1000],
    "RL.FIXEDWINDOW": [10, 1000],
}


def alive(server, c):
    assert server.alive(), f"redis-server died: {server.log_tail()}"
    assert c.ping()


def check_key_behaves(c, key, ctx):
    """A key that holds one of our types answers its own command sensibly
    (plain, COST 0, DRYRUN, PARTIAL, other parameters) and WRONGTYPE to the
    others; DUMP, DIGEST, MEMORY USAGE, COPY work. Returns the type name.

    A restored or RL.STATE-set key may carry an expiry in the past or the
    next millisecond; it is made persistent first so that it cannot vanish
    between the checks (a WRONGTYPE check on a key that just expired would
    create a fresh key instead). A key already gone is not checked."""
    c.persist(key)
    t = c.type(key).decode()
    if t == "none":
        return None
    assert t in COMMAND_OF, f"{ctx}: unexpected type {t}"
    own = COMMAND_OF[t]
    for cmd, params in PARAMS.items():
        if cmd == own:
            continue
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            c.execute_command(cmd, key, *params)
    for params, opts, cost, partial in [
        (PARAMS[own], ["COST", 0], 0, False),
        (PARAMS[own], ["DRYRUN"], 1, False),
        ([1, 1, 1][:len(PARAMS[own])], ["COST", 2, "PARTIAL"], 2, True),
        ([MAX_ARG] * len(PARAMS[own]), ["COST", MAX_ARG], MAX_ARG, False),
        (PARAMS[own], [], 1, False),
    ]:
        if c.exists(key) == 0:  # a restored state may expire at once
            break
        rep = c.execute_command(own, key, *params, *opts)
        check_reply(rep, cost, partial, params[0])
    # One transaction, so a restored state near its end cannot expire between
    # the checks (EXEC runs its commands at one instant of the key clock).
    p = c.pipeline(transaction=True)
    p.dump(key)
    p.execute_command("DEBUG", "DIGEST-VALUE", key)
    p.memory_usage(key)
    p.copy(key, key + ":copy", replace=True)
    p.execute_command("DEBUG", "DIGEST-VALUE", key + ":copy")
    d, digest, mem, copied, copy_digest = p.execute()
    if d is not None:
        assert isinstance(digest[0], bytes)
        assert mem > 0
        assert copied and digest == copy_digest
        c.restore(key + ":again", 0, d, replace=True)
        c.delete(key + ":copy", key + ":again")
    return t


def sl_state(c, key, entries, abs_ms=0):
    assert c.execute_command("RL.STATE", key, payload("sl", abs_ms, sl_body(entries))) == b"OK"


def now_us(c):
    s, us = c.time()
    return s * 1_000_000 + us


def real_dumps(c):
    """{name: Dump} of real keys of every type and shape (rdbcompression off,
    so the body is stored verbatim and can be edited in place)."""
    c.config_set("rdbcompression", "no")
    rng = random.Random(7)
    t = now_us(c)
    # Keys on short limits expire: each is made persistent in the
    # transaction that writes it, so none can expire before its DUMP below
    # (a 1 s fixed window aligned to the epoch ended before the DUMP in a CI
    # run on Redis 7.0, and DUMP answered nil).
    def persistent(*args):
        p = c.pipeline(transaction=True)
        p.execute_command(*args)
        p.persist(args[1])
        p.execute()

    persistent("RL.TOKENBUCKET", "tb", 10, 1, 1000, "COST", 3)
    c.execute_command("RL.TOKENBUCKET", "tb-big", MAX_ARG, 7, MAX_ARG, "COST", MAX_ARG - 5)
    persistent("RL.SLIDINGCOUNTER", "sc", 10, 1000, "COST", 4)
    c.execute_command("RL.SLIDINGCOUNTER", "sc-big", MAX_ARG, MAX_ARG, "COST", MAX_ARG)
    persistent("RL.FIXEDWINDOW", "fw", 10, 3_600_000, "COST", 4)
    c.execute_command("RL.FIXEDWINDOW", "fw-big", MAX_ARG, MAX_ARG, "COST", MAX_ARG, "FROMFIRST")
    # Logs in the three entry widths (4, 8 and 16 bytes), set by RL.STATE.
    sl_state(c, "sl1", random_log(rng, t, 12, 50_000_000, 9))
    sl_state(c, "sl2", random_log(rng, t, 12, 1 << 40, 1 << 20))
    sl_state(c, "sl4", [(t - (1 << 40), MAX_ARG - 7), (t, 3)])
    sl_state(c, "sl-many", random_log(rng, t, 3000, 60_000_000, 3))
    out = {}
    for k in ["tb", "tb-big", "sc", "sc-big", "fw", "fw-big", "sl1", "sl2", "sl4", "sl-many"]:
        c.persist(k)
        d = c.dump(k)
        assert d is not None, f"{k} expired before its DUMP"
        out[k] = Dump(d)
    return out


# ---------------------------------------------------------------------------
# Tests.
# ---------------------------------------------------------------------------

def test_crc64_matches_redis(r):
    assert crc64(b"123456789") == 0xE9C6D914C4B8D9CA  # the check value in Redis's crc64.c
    r.set("s", "hello")
    d = r.dump("s")
    assert crc64(d[:-8]) == struct.unpack("<Q", d[-8:])[0]
    # A rebuilt DUMP is accepted and round-trips.
    r.config_set("rdbcompression", "no")
    r.execute_command("RL.TOKENBUCKET", "k", 10, 1, 1000)
    dump = Dump(r.dump("k"))
    r.restore("k2", 0, dump.build(), replace=True)
    assert Dump(r.dump("k2")).body == dump.body


def test_real_dumps_round_trip(r):
    dumps = real_dumps(r)
    for name, d in dumps.items():
        r.restore(name + ":rt", 0, d.build())
        assert Dump(r.dump(name + ":rt")).body == d.body, name
        check_key_behaves(r, name + ":rt", name)


def test_restore_rejects_bodies_of_another_type(r):
    """A body handed to the wrong type's decoder (module id swapped) is
    refused, never misread."""
    dumps = real_dumps(r)
    ids = {n: d.module_id for n, d in dumps.items()}
    for name, d in dumps.items():
        for other, mid in ids.items():
            if mid == d.module_id:
                continue
            with pytest.raises(redis.ResponseError):
                r.restore("x", 0, d.build(module_id=mid), replace=True)
    assert r.exists("x") == 0
    assert r.ping()


@pytest.mark.parametrize("sanitize", ["yes", "no"])
def test_restore_mutated_payloads(server, sanitize):
    c = server.client()
    if c.config_get("sanitize-dump-payload"):
        c.config_set("sanitize-dump-payload", sanitize)
    elif sanitize == "no":
        # Valkey 9.1 validates every dump payload and dropped the option
        # (valkey-io/valkey#3721): the [yes] case runs as it is.
        pytest.skip(f"{SERVER}: no sanitize-dump-payload option (payloads are always "
                    "validated); the [yes] case covers this server")
    dumps = real_dumps(c)
    rng = random.Random(f"restore-{sanitize}")
    accepted = rejected = 0
    for name, d in dumps.items():
        base = d.build()
        n = N_MUTATIONS if len(d.body) < 1000 else N_MUTATIONS // 5
        for i in range(n):
            how = rng.randrange(6)
            if how <= 1:  # the body our decoder sees, correctly framed
                body = mutate(rng, d.body)
                p = d.build(body=body)
            elif how == 2:  # any byte after the type byte, trailer recomputed
                p = with_trailer(d.value[:1] + mutate(rng, d.value[1:], field_base=16), d.version)
            elif how == 3:  # truncated
                p = with_trailer(d.value[:rng.randrange(1, len(d.value))], d.version)
            elif how == 4:  # extended (inside the body, or after the value)
                extra = bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
                p = d.build(body=d.body + extra) if rng.random() < 0.5 else \
                    with_trailer(d.value + extra, d.version)
            else:  # the body cut short but framed as complete
                p = d.build(body=d.body[:rng.randrange(len(d.body))])
            ctx = f"{name} #{i} ({sanitize}): {p.hex()}"
            try:
                c.restore("m", 0, p, replace=True)
            except redis.ResponseError as e:
                assert "internal error" not in str(e), ctx
                rejected += 1
                alive(server, c)
                continue
            except redis.ConnectionError as e:
                raise AssertionError(f"server died on {ctx}: {server.log_tail()}") from e
            accepted += 1
            alive(server, c)
            # Anything accepted is canonical: it dumps to the body it was
            # given (when our framing parser reads the payload the same way).
            try:
                sent = Dump(p).body
            except (AssertionError, IndexError, struct.error):
                sent = None
            if sent is not None:
                assert Dump(c.dump("m")).body == sent, ctx
            check_key_behaves(c, "m", ctx)
            alive(server, c)
        assert c.restore("m", 0, base, replace=True)
    # Both paths were exercised: some mutations keep a valid state.
    print(f"RESTORE sanitize-dump-payload={sanitize}: {accepted} accepted, {rejected} refused")
    assert accepted > 0 and rejected > 0, (accepted, rejected)
    alive(server, c)


def test_restore_crafted_payloads(r, server):
    """Hand-made hostile bodies: absurd entry counts (no allocation before
    the length check), non-canonical formats, zero counts, overflowing times
    and sums, every field at its bound."""
    dumps = real_dumps(r)
    tb, sl, sc, fw = dumps["tb"], dumps["sl1"], dumps["sc"], dumps["fw"]
    t = now_us(r)
    bad_logs = [
        struct.pack("<BQQBB", 1, 1 << 61, t, 1, 0) + b"\0" * 8,          # n huge, tiny body
        struct.pack("<BQQBB", 1, (1 << 64) - 1, t, 4, 64),                 # n = 2^64-1
        struct.pack("<BQQBB", 1, 1 << 62, t, 4, 64) + b"\0" * 16,          # n × 16 overflows
        struct.pack("<BQQBB", 1, 2, t, 3, 0) + b"\0" * 24,                 # width 3
        struct.pack("<BQQBB", 1, 2, t, 1, 33) + b"\0" * 8,                 # count bits > width
        struct.pack("<BQQBB", 1, 2, t, 4, 63) + b"\0" * 32,                # words 4 needs cbits 64
        struct.pack("<BQQBB", 1, 2, t, 2, 0) + struct.pack("<QQ", 0, 1),   # not canonical (fits 1)
        struct.pack("<BQQBB", 1, 2, t, 1, 0) + struct.pack("<II", 0, 0),   # time not increasing
        struct.pack("<BQQBB", 1, 1, t, 1, 0) + struct.pack("<I", 1),       # first delta ≠ 0
        struct.pack("<BQQBB", 1, 2, (1 << 64) - 1, 1, 0) + struct.pack("<II", 0, 1),  # time overflows
        struct.pack("<BQQBB", 1, 2, t, 4, 64)                               # units sum overflows
        + ((0 << 64) | ((1 << 64) - 1)).to_bytes(16, "little") + ((1 << 64) | 0).to_bytes(16, "little"),
        struct.pack("<BQ", 1, 0) + b"\0",                                   # empty + trailing
        struct.pack("<BQ", 2, 0),                                           # unknown version
    ]
    bad_tbs = [
        tb_body(1, 0, 0, t), tb_body(1, 0, 1001, t), tb_body(1, 1000, 1000, t),
        tb_body(MAX_ARG, 0, 1000, t), tb_body(1, 0, (MAX_ARG + 1) * 1000, t),
        tb_body(0, 0, 1000, t) + b"\0", tb_body(0, 0, 1000, t)[:-1], b"", b"\x02" + b"\0" * 32,
    ]
    bad_scs = [
        sc_body(t - t % 1000, 0, 0), sc_body(t - t % 1000, MAX_ARG + 1, 0),
        sc_body(t - t % 1000, 1, MAX_ARG + 1), sc_body(t - t % 1000 + 1, 1, 0),
        sc_body(0, 1, 0) + b"\0", b"\x01",
    ]
    ms = t // 1000
    bad_fws = [
        fw_body(ms, 0), fw_body(ms, MAX_ARG + 1), fw_body(0, (1 << 64) - 1),
        fw_body(ms, 1) + b"\0", fw_body(ms, 1)[:-1], fw_body(ms, 1)[:9], b"\x01", b"",
        b"\x02" + fw_body(ms, 1)[1:], b"\x00" + fw_body(ms, 1)[1:],
    ]
    for d, bodies in [(sl, bad_logs), (tb, bad_tbs), (sc, bad_scs), (fw, bad_fws)]:
        for body in bodies:
            with pytest.raises(redis.ResponseError):
                r.restore("bad", 0, d.build(body=body), replace=True)
            assert r.exists("bad") == 0
            assert server.alive() and r.ping()
    # Extremes that are valid are accepted and behave.
    good = [
        (tb, tb_body(MAX_ARG - 1, MAX_ARG * 1000 - 1, MAX_ARG * 1000, (1 << 64) - 1)),
        (tb, tb_body(0, 0, 1000, 0)),
        (sc, sc_body((1 << 64) - 1 - ((1 << 64) - 1) % 1000, MAX_ARG, MAX_ARG)),
        (sc, sc_body(0, 1, 0)),
        (sl, sl_body([((1 << 64) - 2, MAX_ARG), ((1 << 64) - 1, 1)])),
        (sl, sl_body([(0, (1 << 64) - 2), (1 << 63, 1)])),
        (sl, sl_body([])),
        (fw, fw_body((1 << 64) - 1, MAX_ARG)),
        (fw, fw_body(0, 1)),
        (fw, fw_body(ms + 123, 7)),
    ]
    for d, body in good:
        r.restore("good", 0, d.build(body=body), replace=True)
        assert Dump(r.dump("good")).body == body
        check_key_behaves(r, "good", body.hex())
    assert server.alive() and r.ping()


def test_rl_state_random_and_mutated(server):
    c = server.client()
    rng = random.Random("rl-state")
    t = now_us(c)
    seeds = list(random_payloads(rng, t))
    keys = [f"s{i}" for i in range(6)]
    ok = err = 0
    for i in range(N_MUTATIONS * 8):
        r = rng.random()
        if r < 0.15:
            p = bytes(rng.randrange(256) for _ in range(rng.randint(0, 80)))
        elif r < 0.25:
            p = rng.choice(seeds)
        else:
            p = mutate(rng, rng.choice(seeds), field_base=10)
        key = rng.choice(keys)
        ctx = f"#{i} RL.STATE {key} {p.hex()}"
        try:
            res = c.execute_command("RL.STATE", key, p)
        except redis.ResponseError as e:
            msg = str(e)
            assert msg.startswith(("invalid RL.STATE payload", "WRONGTYPE")), f"{ctx}: {msg}"
            err += 1
        except redis.ConnectionError as e:
            raise AssertionError(f"server died on {ctx}: {server.log_tail()}") from e
        else:
            assert res == b"OK", ctx
            ok += 1
            if c.exists(key):
                check_key_behaves(c, key, ctx)
        alive(server, c)
    print(f"RL.STATE: {ok} OK, {err} refused")
    assert ok > 0 and err > 0, (ok, err)
    # Wrong arity and empty payloads.
    for args in [["RL.STATE"], ["RL.STATE", "k"], ["RL.STATE", "k", b"", b""]]:
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            c.execute_command(*args)
    with pytest.raises(redis.ResponseError, match="invalid RL.STATE payload"):
        c.execute_command("RL.STATE", "k", b"")
    alive(server, c)


def test_rl_state_on_other_types(r):
    """RL.STATE never overwrites a key of another type, ours or Redis's."""
    t = now_us(r)
    r.set("str", "v")
    r.execute_command("RL.TOKENBUCKET", "tb", 10, 1, 3_600_000)  # outlives the test
    for key in ["str", "tb"]:
        for p in [payload("sc", 0, sc_body(t - t % 1000, 1, 0)), payload("grant", 0, grant_body(t, 1000, 1)),
                  payload("sl", 0, sl_body([(t, 1)])), payload("fw", 0, fw_body(t // 1000, 1))]:
            with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
                r.execute_command("RL.STATE", key, p)
    assert r.get("str") == b"v"
    assert r.type("tb") == b"rl-tokbkt"


def test_junk_arguments(server):
    c = server.client()
    rng = random.Random("junk")
    junk = [b"", b"\x00", b"\xff" * 3, b"-0", b"+5", b" 5", b"5 ", b"1e3", b"0x10", b"\xd9\xa1",
            b"9" * 17, b"0" * 17 + b"1", b"COST", b"cost", b"PARTIAL", b"DRYRUN", b"\r\n",
            b"18446744073709551616", b"-9223372036854775808", b"nan", b"inf", b"REFUND", b"FROMFIRST",
            b"fromfirst"]
    for cmd, npos in [("RL.TOKENBUCKET", 3), ("RL.SLIDINGLOG", 2), ("RL.SLIDINGCOUNTER", 2), ("RL.FIXEDWINDOW", 2)]:
        for i in range(400):
            n = rng.randint(0, npos + 5)
            args = [rng.choice(junk + [str(rng.randint(0, 20)).encode()]) for _ in range(n)]
            try:
                rep = c.execute_command(cmd, "j", *args)
            except redis.ResponseError as e:
                msg = str(e)
                assert "internal error" not in msg, (cmd, args, msg)
                assert msg.startswith(("wrong number of arguments", "syntax error")) or \
                    " must be an integer between " in msg, (cmd, args, msg)
            else:
                assert isinstance(rep, list) and len(rep) == 5, (cmd, args, rep)
        # Big arguments: 1 MB numbers and option names, 10,000 arguments.
        for args in [[b"1" * (1 << 20)] * npos, [b"1"] * npos + [b"X" * (1 << 20)],
                     [b"1"] * npos + [b"PARTIAL"] * 10_000]:
            with pytest.raises(redis.ResponseError):
                c.execute_command(cmd, "j", *args)
        alive(server, c)
    c.delete("j")
    # Binary and huge key names work like any other key.
    for key in [b"\x00\xff", b"k" * 100_000]:
        rep = c.execute_command("RL.TOKENBUCKET", key, 3, 1, 1000)
        assert rep[0] == 1
        assert c.type(key) == b"rl-tokbkt"
    alive(server, c)
