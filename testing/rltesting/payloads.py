"""The module's values as bytes: DUMP payloads (the RDB framing with its
CRC-64 trailer) and RL.STATE payloads of every kind, and seeded mutators of
them, for the hostile-input suite (integration/test_hostile.py) and the
valgrind workload (fuzz/valgrind_workload.py)."""
import struct

MAX_ARG = (1 << 53) - 1

# ---------------------------------------------------------------------------
# CRC-64/Jones as Redis computes it (reflected, poly 0xad93d23594c935a9,
# init 0, no final xor), and the DUMP framing.
# ---------------------------------------------------------------------------

_POLY_REFLECTED = int(f"{0xAD93D23594C935A9:064b}"[::-1], 2)


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY_REFLECTED if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc64(data, crc=0):
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def with_trailer(value, rdb_version):
    """`value` (type byte + serialized value) + RDB version + CRC64."""
    p = bytes(value) + rdb_version
    return p + struct.pack("<Q", crc64(p))


def enc_len(n):
    """RDB length encoding (canonical)."""
    if n < 1 << 6:
        return bytes([n])
    if n < 1 << 14:
        return bytes([0x40 | n >> 8, n & 0xFF])
    if n < 1 << 32:
        return b"\x80" + struct.pack(">I", n)
    return b"\x81" + struct.pack(">Q", n)


def read_len(d, i):
    t = d[i] >> 6
    if t == 0:
        return d[i] & 0x3F, i + 1
    if t == 1:
        return (d[i] & 0x3F) << 8 | d[i + 1], i + 2
    if d[i] == 0x80:
        return struct.unpack_from(">I", d, i + 1)[0], i + 5
    assert d[i] == 0x81, d[i]
    return struct.unpack_from(">Q", d, i + 1)[0], i + 9


RDB_TYPE_MODULE_2 = 7
OPCODE_STRING = 5
OPCODE_EOF = 0


class Dump:
    """A module value's DUMP: module id, the one string buffer our rdb_save
    writes (the state's encoding), RDB version."""

    def __init__(self, payload):
        d = payload
        assert d[0] == RDB_TYPE_MODULE_2, d[:2]
        assert crc64(d[:-8]) == struct.unpack("<Q", d[-8:])[0], "crc64 differs from Redis's"
        self.module_id, i = read_len(d, 1)
        op, i = read_len(d, i)
        assert op == OPCODE_STRING
        n, i = read_len(d, i)
        self.body = d[i:i + n]
        assert d[i + n] == OPCODE_EOF and i + n + 1 == len(d) - 10
        self.version = d[-10:-8]
        self.value = d[:-10]

    def build(self, body=None, module_id=None):
        body = self.body if body is None else body
        mid = self.module_id if module_id is None else module_id
        v = (bytes([RDB_TYPE_MODULE_2]) + enc_len(mid) + enc_len(OPCODE_STRING)
             + enc_len(len(body)) + body + bytes([OPCODE_EOF]))
        return with_trailer(v, self.version)


# ---------------------------------------------------------------------------
# The states' encodings and the RL.STATE payload (crates/ratelimit-core).
# ---------------------------------------------------------------------------

def tb_body(tokens, frac, den, last_us):
    return struct.pack("<BQQQQ", 1, tokens, frac, den, last_us)


def sc_body(start_us, cur, prev):
    return struct.pack("<BQQQ", 1, start_us, cur, prev)


def fw_body(start_ms, count):
    return struct.pack("<BQQ", 1, start_ms, count)


def sl_body(entries):
    """Canonical sliding-log encoding of [(time_us, count)], times increasing."""
    if not entries:
        return struct.pack("<BQ", 1, 0)
    deltas = [0] + [b[0] - a[0] for a, b in zip(entries, entries[1:])]
    d = max((x.bit_length() for x in deltas[1:]), default=0)
    c = max((cnt - 1).bit_length() for _, cnt in entries)
    if d + c <= 32:
        words, cbits = 1, c
    elif d + c <= 64:
        words, cbits = 2, c
    else:
        words, cbits = 4, 64
    out = struct.pack("<BQQBB", 1, len(entries), entries[0][0], words, cbits)
    for delta, (_, cnt) in zip(deltas, entries):
        out += (delta << cbits | (cnt - 1)).to_bytes(4 * words, "little")
    return out


KIND = {"tb": 1, "sl": 2, "sc": 3, "grant": 4, "refund": 5, "fw": 6}


def payload(kind, abs_ms, body):
    return bytes([KIND[kind]]) + struct.pack("<Q", abs_ms) + body


def grant_body(now_us, window_ms, units):
    return struct.pack("<BQQQ", 1, now_us, window_ms, units)


def random_log(rng, now_us, n, spread_us, max_count):
    t = now_us - spread_us
    out = []
    for _ in range(n):
        t += rng.randint(1, max(1, 2 * spread_us // max(n, 1)))
        out.append((t, rng.randint(1, max_count)))
    return out


# ---------------------------------------------------------------------------
# Mutations.
# ---------------------------------------------------------------------------

INTERESTING_8 = [0, 1, 2, 4, 0x3F, 0x40, 0x7F, 0x80, 0x81, 0xC0, 0xFE, 0xFF]
INTERESTING_64 = [0, 1, 2, 999, 1000, 1001, 1 << 32, (1 << 53) - 2, MAX_ARG, 1 << 53,
                  (1 << 53) * 1000, 1 << 62, (1 << 63) - 1, 1 << 63, (1 << 64) - 1000,
                  (1 << 64) - 1]


def mutate(rng, data, field_base=1):
    """A few random edits; u64 writes favour the state's field offsets
    (`field_base + 8k`)."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 6))):
        op = rng.randrange(9)
        if op == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:
            b[rng.randrange(len(b))] = rng.choice(INTERESTING_8)
        elif op in (2, 3) and len(b) >= 8:
            if op == 2 and len(b) >= field_base + 8:
                i = field_base + 8 * rng.randrange((len(b) - field_base) // 8)
            else:
                i = rng.randrange(len(b) - 7)
            v = rng.choice(INTERESTING_64)
            if rng.random() < 0.3:
                v = (v + rng.randint(-3, 3)) % (1 << 64)
            b[i:i + 8] = struct.pack("<Q", v)
        elif op == 4:
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        elif op == 5 and b:
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 9)]
        elif op == 6 and b:
            del b[rng.randrange(len(b)):]
        elif op == 7:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 17)))
        elif op == 8 and b:
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 16)]
    return bytes(b)


def random_payloads(rng, t):
    """Valid RL.STATE payloads of every kind, around `t` (µs)."""
    ms = t // 1000
    yield payload("tb", ms + 5000, tb_body(rng.randint(0, 9), rng.randint(0, 999_999), 1_000_000, t))
    yield payload("sc", ms + 2000, sc_body(t - t % 1_000_000, rng.randint(1, 9), rng.randint(0, 9)))
    yield payload("sl", ms + 60_000, sl_body(random_log(rng, t, rng.randint(0, 40), 30_000_000, 5)))
    yield payload("grant", ms + 1000, grant_body(t, 1000, rng.randint(1, 5)))
    yield payload("tb", 0, tb_body(0, 0, 1000, t))
    yield payload("fw", ms + 3000, fw_body(ms - ms % 3000, rng.randint(1, 9)))
    yield payload("fw", 0, fw_body(ms + rng.randint(-5, 5), rng.randint(1, 9)))
