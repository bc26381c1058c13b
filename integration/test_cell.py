"""CL.THROTTLE against redis-cell itself (issue 30), in two releases.

- redis-cell 0.5, whose replies this module gives: RL_CELL_MODULE names a
  redis-cell 0.5 module (libredis_cell.so) built elsewhere (0.5 is
  published only as source on its repository, and this repository carries
  neither its code nor a recipe for it); without it the 0.5 tests skip
  (RL_CELL_REQUIRED=1 fails them).
- redis-cell 0.2.2, the newest release on crates.io, which `make peers`
  builds by cargo (RL_CELL022_MODULE; every `make check` and `make test`
  run has it). It computes the same GCRA on the same state, so the same
  sequences run against it, with what 0.2.2 answers differently (each
  checked here: rounded_up, ZERO_RATES): it truncates retry_after and
  reset_after to whole seconds where 0.5 rounds a partial second up (this
  module answers 0.5's: one more when the ms had a remainder); its error
  texts lack 0.5's `Store error: `; it takes a zero rate (0.2.5 refuses
  it, as this module does). The replication test is 0.5's only (0.3.0
  began to replicate the command).

For the clocked tests this file links a one-symbol shim whose first
dependency is libfaketime and whose second is that module: servers dlopen
modules with RTLD_DEEPBIND, so loaded directly, redis-cell's clock_gettime
would bind to libc's and ignore the fake clock. Both servers run under
libfaketime with one frozen clock read from a file (FAKETIME_TIMESTAMP_FILE,
FAKETIME_NO_CACHE=1) that the test sets before every call, so both see the
same instant: the server's cached time (this module's clock) and
redis-cell's `clock_gettime` alike.

- the differential: random sequences of valid and invalid calls (mixed
  parameters and quantities, bursts, denials, time standing, creeping and
  jumping), the same on both; every reply (all five fields, or the error
  text) and every key's PTTL must be equal;
- the live swap: keys written by redis-cell, the RDB loaded by this module
  instead, the same sequence goes on equal to redis-cell going on;
- the rollback: what redis-cell finds in an RDB this module wrote;
- replication (0.5): this module's replica ends with its primary's DEBUG
  DIGEST after a mixed workload; redis-cell's replica does not.

Redis 7.0 (Debian's, with jemalloc) does not start under libfaketime 0.9.10
(its clock_gettime recursion guard trips at start-up): those tests skip
there with that reason.
"""
import os
import random
import shutil
import subprocess
import tempfile

import pytest
import redis

from rltesting import proc
from rltesting.proc import Server, wait_until
from rltesting.replies import least_memory_usage

# The redis-cell modules by release: "0.5" (built elsewhere), "0.2.2"
# (`make peers`, from crates.io).
CELLS = {"0.5": os.environ.get("RL_CELL_MODULE", ""), "0.2.2": os.environ.get("RL_CELL022_MODULE", "")}
FAKETIME_LIB = os.environ.get("RL_FAKETIME_LIB", "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# 1970-01-12 13:46:40.123456 UTC. libfaketime reads the file's time through
# a double and truncates to ns: near 2026 (2^31 s) a double's step is 238 ns,
# so most µs instants came out 1 ns early, and gettimeofday (the server's
# clock) a whole µs early, while redis-cell's clock_gettime kept the ns. Below
# 2^22 s the step is under 0.47 ns, and writing each instant 0.3 ns late
# makes both clocks read it exactly.
T0_US = 1_000_000_123_456
MAX_US = 4_000_000_000_000
CALLS = int(os.environ.get("RL_CELL_CALLS", "10000"))
# The shims that load each redis-cell behind libfaketime (see the
# docstring), linked once per session on first use.
SHIMS = {}


def need_cell(version):
    """The path of redis-cell `version`'s faketime shim; skips (or fails)
    without that module."""
    plain = CELLS[version]
    if plain and not os.path.exists(plain):
        pytest.fail(f"redis-cell {version}: {plain} does not exist")
    if not plain:
        if version == "0.5":
            msg = ("RL_CELL_MODULE does not name a redis-cell 0.5 module (libredis_cell.so, built outside "
                   "this repository): the comparison with redis-cell 0.5 is not run")
        else:
            msg = "RL_CELL022_MODULE is not set (`make peers` builds redis-cell 0.2.2 from crates.io)"
        if os.environ.get("RL_CELL_REQUIRED") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    if version not in SHIMS:
        d = tempfile.mkdtemp(prefix="rl-cell-shim-")
        src, out = os.path.join(d, "shim.c"), os.path.join(d, "libredis_cell_faketime.so")
        with open(src, "w") as f:
            f.write("int rl_cell_faketime_shim;\n")
        cell = os.path.abspath(plain)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", out, src, "-Wl,--no-as-needed", FAKETIME_LIB, cell,
                        "-Wl,-rpath,%s:%s" % (os.path.dirname(FAKETIME_LIB), os.path.dirname(cell))], check=True)
        SHIMS[version] = out
    return SHIMS[version]


@pytest.fixture(params=["0.5", "0.2.2"])
def peer(request):
    """The redis-cell release a test compares with."""
    need_cell(request.param)
    return request.param


class Clock:
    """The frozen fake time both servers read, in µs."""

    def __init__(self):
        fd, self.path = tempfile.mkstemp(prefix="rl-faketime-")
        os.close(fd)
        self.set(T0_US)

    def set(self, us):
        assert us < MAX_US, "past the range where libfaketime reads µs exactly"
        self.us = us
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{us // 1_000_000}.{us % 1_000_000:06d}0003\n")
        os.replace(tmp, self.path)

    def advance(self, us):
        self.set(self.us + us)

    def env(self, real_monotonic=False):
        extra = {"FAKETIME_DONT_FAKE_MONOTONIC": "1"} if real_monotonic else {}
        return {
            **extra,
            **os.environ,
            "LD_PRELOAD": FAKETIME_LIB,
            "FAKETIME_TIMESTAMP_FILE": self.path,
            "FAKETIME_FMT": "%s",
            "FAKETIME_NO_CACHE": "1",
        }


class FakeTimeServer(Server):
    """A server started under libfaketime with `clock`'s file."""

    def __init__(self, clock, args=(), dir=None, real_monotonic=False):
        self.clock = clock
        self.real_monotonic = real_monotonic
        if dir is not None:
            os.makedirs(dir, exist_ok=True)
        super().__init__(args=args, module=False, dir=dir)

    def start(self):
        if BROKEN.get(proc.REDIS_SERVER):
            pytest.skip(BROKEN[proc.REDIS_SERVER])
        err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            self.command_line(), cwd=self.dir, env=self.clock.env(self.real_monotonic),
            stdout=subprocess.DEVNULL, stderr=err,
        )
        try:
            wait_until(self._ready, timeout=15, what=f"server under libfaketime on {self.port}")
        except AssertionError:
            self.kill9()
            err.seek(0)
            text = err.read().decode(errors="replace")
            if "libfaketime" in text and "recursive" in text:
                BROKEN[proc.REDIS_SERVER] = f"{proc.REDIS_SERVER} does not start under libfaketime: " + \
                    "libfaketime: Unexpected recursive calls to clock_gettime()"
                pytest.skip(BROKEN[proc.REDIS_SERVER])
            raise


# Server binaries that do not start under libfaketime (Debian's Redis 7.0:
# its jemalloc reads the clock while libfaketime initialises): asked once.
BROKEN = {}


@pytest.fixture
def clock():
    c = Clock()
    yield c
    os.unlink(c.path)


@pytest.fixture
def servers(clock):
    started = []

    def make(kind, dir=None, extra=(), real_monotonic=False):
        """kind: "ours", or a redis-cell release ("0.5", "0.2.2")."""
        mod = ["--loadmodule", proc.MODULE, "CL.THROTTLE"] if kind == "ours" else ["--loadmodule", need_cell(kind)]
        s = FakeTimeServer(clock, args=[*mod, *extra], dir=dir, real_monotonic=real_monotonic)
        started.append(s)
        return s

    yield make
    for s in started:
        s.close()


def answer(r, args):
    try:
        return r.execute_command("CL.THROTTLE", *args)
    except redis.ResponseError as e:
        return ("error", str(e))


# Parameter sets: (max_burst, count, period). Small bursts and long
# periods, sub-µs emission intervals (remaining's 0/0), periods that do
# not divide evenly, a zero burst.
PARAMS = [(0, 1, 1), (2, 1, 10), (5, 3, 7), (15, 30, 60), (9, 7, 3), (3, 2_000_000_000, 3), (100, 1000, 1), (1, 1, 86400)]
INVALID = [
    ["k"], ["k", "1", "2"], ["k", "1", "2", "3", "4", "5"],
    ["k", "x", "1", "1"], ["k", "1", "1.5", "1"], ["k", "1", "1", "1", " 1"], ["k", "1", "1", "1", "9223372036854775808"],
    ["k", "1", "0", "10"], ["k", "1", "10", "0"], ["k", "1", "3000000000", "1"],
]


# The calls whose answers changed after 0.2.2: a zero rate (a count or a
# period of 0, or an emission interval under 1 ns), refused since 0.2.5
# (as this module refuses it), answered by 0.2.2
# (test_what_022_answers_differently).
ZERO_RATES = [["k", "1", "0", "10"], ["k", "1", "10", "0"], ["k", "1", "3000000000", "1"]]


def one_call(rng, keys, peer="0.5"):
    if rng.random() < 0.02:
        return rng.choice([x for x in INVALID if peer == "0.5" or x not in ZERO_RATES])
    k = rng.randrange(keys)
    b, c, p = PARAMS[k % len(PARAMS)] if rng.random() < 0.95 else rng.choice(PARAMS)
    q = rng.choice([1, 1, 1, 1, 0, 2, 3, b, b + 1, b + 2])
    args = [f"cell:{k}", b, c, p]
    return args + [q] if q != 1 or rng.random() < 0.5 else args


def one_step(rng):
    return rng.choice([0, 0, 0, 1, 999, 1000, 1001, rng.randrange(1, 2_000_000), rng.randrange(1, 30_000_000),
                       rng.randrange(1, 400) * 1000])


def rounded_up(want, got):
    """Whether `got` (this module: 0.5's answers) is `want` (redis-cell
    0.2.2's) as 0.5 gives it: with retry_after and reset_after, which 0.2.2
    truncates to whole seconds, each the same or one more (a partial second
    rounded up), and each error text under `Store error: `. The number of
    fields rounded up, or None when it is not."""
    if isinstance(want, tuple) or isinstance(got, tuple):
        ok = isinstance(want, tuple) and got == ("error", want[1].replace("Cell error: ", "Cell error: Store error: ", 1))
        return 0 if ok else None
    if got[:3] != want[:3]:
        return None
    ups = 0
    for w, g in zip(want[3:], got[3:]):
        if g == w:
            continue
        if w == -1 or g != w + 1:
            return None
        ups += 1
    return ups


def run_sequence(rng, clock, a, b, calls, keys, peer="0.5"):
    """`calls` random calls on both clients at the same fake instants; the
    replies and the keys' PTTLs must be equal (against 0.2.2: equal but for
    the rounding of rounded_up). Returns the number of denials and of
    fields rounded up."""
    ra, rb = a.client(), b.client()
    denied = ups = 0
    for i in range(calls):
        clock.advance(one_step(rng))
        args = one_call(rng, keys, peer)
        # One event-loop pass first: Redis 8.2 refreshes a cached time
        # there, not per command (PTTLs differed at the expiry millisecond).
        ra.ping(), rb.ping()
        want, got = answer(ra, args), answer(rb, args)
        up = 0 if got == want else rounded_up(want, got) if peer == "0.2.2" else None
        assert up is not None, \
            f"call {i} CL.THROTTLE {args} at {clock.us} us: redis-cell {peer} {want}, CL.THROTTLE {got}"
        ups += up
        if isinstance(want, list):
            denied += want[0]
            assert rb.pttl(args[0]) == ra.pttl(args[0]), f"call {i} {args}: PTTL differs"
    return denied, ups


# 10,000 calls: about 20 s a release on one server. make check keeps the
# live swap, which runs 1,500 calls of the same sequences.
@pytest.mark.slow
def test_differential_against_redis_cell(servers, clock, peer):
    a, b = servers(peer), servers("ours")
    rng = random.Random(30)
    denied, ups = run_sequence(rng, clock, a, b, CALLS, keys=24, peer=peer)
    # The sequence is worth something: many denials, and every key used.
    assert denied > CALLS // 10, denied
    # Against 0.2.2, both of its roundings were met: many partial seconds
    # (rounded up here), and equal fields too (the times that had none are
    # in the equal replies).
    assert ups > CALLS // 10 if peer == "0.2.2" else ups == 0, ups
    print(f"redis-cell {peer}: {CALLS} calls, {denied} denied, {ups} fields rounded up: equal")


def test_live_swap_from_redis_cell(servers, clock, tmp_path, peer):
    """redis-cell's keys (strings holding the TAT) carry on under this
    module exactly: an RDB saved by redis-cell, loaded once by redis-cell
    (the oracle) and once by this module; the same calls answer the same,
    and a written key becomes this module's type."""
    rng = random.Random(31)
    src = servers(peer, dir=str(tmp_path / "src"))
    r = src.client()
    for _ in range(400):
        clock.advance(one_step(rng))
        answer(r, one_call(rng, 8, peer))
    strings = [k for k in r.keys("cell:*") if r.type(k) == b"string"]
    assert len(strings) >= 4
    r.save()
    src.stop()
    for d in ("oracle", "swap"):
        shutil.copytree(str(tmp_path / "src"), str(tmp_path / d))
    a = servers(peer, dir=str(tmp_path / "oracle"))
    b = servers("ours", dir=str(tmp_path / "swap"))
    rb = b.client()
    assert sorted(rb.keys("cell:*")) == sorted(a.client().keys("cell:*"))
    # A denial leaves redis-cell's string as it is; a grant converts it.
    run_sequence(rng, clock, a, b, 1500, keys=8, peer=peer)
    types = {rb.type(k) for k in rb.keys("cell:*")}
    assert b"rl-gcrate" in types, types


def test_what_022_answers_differently(servers, clock):
    """What redis-cell 0.2.2 answers that 0.5 and this module do not, each
    checked on both: a zero rate (0.2.2 answers five integers; this module
    refuses it, as 0.2.5 and later do), and a partial second, which 0.2.2
    truncates and this module rounds up."""
    a, b = servers("0.2.2"), servers("ours")
    ra, rb = a.client(), b.client()
    for args in ZERO_RATES:
        want, got = answer(ra, args), answer(rb, args)
        assert isinstance(want, list) and len(want) == 5, want
        assert got == ("error", "Cell error: Store error: Zero rates are not supported"), got
    # 2 per 10 s: after one grant the bucket is 10 s - 0.5 ms from full
    for r in (ra, rb):
        r.execute_command("CL.THROTTLE", "half", 1, 1, 10)
    clock.advance(500)
    ra.ping(), rb.ping()
    want = ra.execute_command("CL.THROTTLE", "half", 1, 1, 10)
    got = rb.execute_command("CL.THROTTLE", "half", 1, 1, 10)
    assert (want, got) == ([0, 2, 0, -1, 19], [0, 2, 0, -1, 20])


def test_rollback_to_redis_cell(servers, clock, tmp_path, peer):
    """What redis-cell finds in an RDB this module wrote: converted keys
    (rl-gcrate) cannot load without this module; with it loaded beside
    redis-cell (no CL.THROTTLE argument) the RDB loads, and deleting the
    converted keys (SCAN TYPE rl-gcrate, docs/operations.md) leaves
    redis-cell a keyspace it can serve; at worst each key would expire by
    itself within (max_burst + 1) x period / count seconds of its last
    grant."""
    d = tmp_path / "db"
    b = servers("ours", dir=str(d))
    rb = b.client()
    rb.set("cell:s", str(T0_US * 1000))
    assert rb.execute_command("CL.THROTTLE", "cell:n", 2, 1, 10) == [0, 3, 2, -1, 10]
    assert rb.type("cell:n") == b"rl-gcrate" and rb.pttl("cell:n") == 10_000
    rb.save()
    b.stop()
    # redis-cell alone: the server refuses the RDB (a module type it lacks).
    with pytest.raises(AssertionError):
        servers(peer, dir=str(d))
    # Both modules, ratelimit without the argument: the command is redis-cell's.
    a = servers(peer, dir=str(d), extra=["--loadmodule", proc.MODULE])
    ra = a.client()
    assert ra.type("cell:n") == b"rl-gcrate"
    converted = list(ra.scan_iter(_type="rl-gcrate"))
    assert converted == [b"cell:n"]
    ra.unlink(*converted)
    assert ra.execute_command("CL.THROTTLE", "cell:n", 2, 1, 10) == [0, 3, 2, -1, 10]


def test_refused_calls(server_factory):
    """Where redis-cell computes with negative numbers (or wraps), this
    module answers an error and writes nothing."""
    r = server_factory(args=["--loadmodule", proc.MODULE, "CL.THROTTLE"], module=False).client()
    for args in (["k", -1, 1, 1], ["k", 1, -1, 1], ["k", 1, 1, 1, -1], ["k", 1, 1, -5]):
        with pytest.raises(redis.ResponseError, match="must not be negative"):
            r.execute_command("CL.THROTTLE", *args)
    with pytest.raises(redis.ResponseError, match="2\\^63"):
        r.execute_command("CL.THROTTLE", "k", 2**62, 1, 10)
    assert r.exists("k") == 0
    r.rpush("l", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.execute_command("CL.THROTTLE", "l", 1, 1, 1)
    r.set("s", "not a time")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        r.execute_command("CL.THROTTLE", "s", 1, 1, 1)


def test_not_registered_without_the_argument(server_factory):
    r = server_factory().client()
    with pytest.raises(redis.ResponseError, match="unknown command"):
        r.execute_command("CL.THROTTLE", "k", 1, 1, 1)
    assert r.execute_command("COMMAND", "DOCS", "CL.THROTTLE") in ([], {})


def test_unknown_argument_refuses_the_load(server_factory):
    with pytest.raises(AssertionError, match="exited"):
        server_factory(args=["--loadmodule", proc.MODULE, "NOPE"], module=False)


def test_loading_beside_redis_cell_is_refused(server_factory, peer):
    """With the argument, this module refuses to load after redis-cell,
    saying why; without it, both load and the command is redis-cell's."""
    cell = CELLS[peer]
    with pytest.raises(AssertionError) as e:
        server_factory(args=["--loadmodule", cell, "--loadmodule", proc.MODULE, "CL.THROTTLE"], module=False)
    assert "CL.THROTTLE exists already if redis-cell is loaded" in str(e.value)
    r = server_factory(args=["--loadmodule", cell, "--loadmodule", proc.MODULE], module=False).client()
    assert r.execute_command("CL.THROTTLE", "k", 2, 1, 10)[:3] == [0, 3, 2]
    assert r.type("k") == b"string"


def digest_workload(rng, clock, r, calls):
    for _ in range(calls):
        clock.advance(rng.choice([0, 1, 500, 1500, 250_000]))
        answer(r, one_call(rng, 6))


@pytest.mark.parametrize("kind", ["ours", "0.5"])
def test_replica_digest(servers, clock, kind):
    """A replica of this module ends with its primary's DEBUG DIGEST after a
    mixed workload (the effect carries the TAT and the absolute expiry).
    redis-cell replicates the command, which the replica recomputes with
    its own clock: the replica runs under its own fake clock, 1.5 ms behind
    the primary's. (Both with the real monotonic clock: the replication
    timers need it to run.)"""
    if kind != "ours":
        need_cell(kind)
    primary = servers(kind, extra=["--repl-diskless-sync-delay", "0"], real_monotonic=True)
    other = Clock()
    other.set(clock.us)
    try:
        mod = ["--loadmodule", proc.MODULE, "CL.THROTTLE"] if kind == "ours" else ["--loadmodule", need_cell(kind)]
        replica = FakeTimeServer(other, args=[*mod, "--replicaof", "127.0.0.1", str(primary.port)], real_monotonic=True)
        try:
            rr = replica.client()
            wait_until(lambda: rr.info("replication").get("master_link_status") == "up", what="replica link")
            rng = random.Random(32)
            rp = primary.client()
            for _ in range(20):
                digest_workload(rng, clock, rp, 50)
                other.set(clock.us - 1500)
            off = rp.info("replication")["master_repl_offset"]
            wait_until(lambda: rr.info("replication").get("slave_repl_offset", 0) >= off, what="replica caught up")
            same = rp.execute_command("DEBUG", "DIGEST") == rr.execute_command("DEBUG", "DIGEST")
            assert same == (kind == "ours"), f"{kind}: replica digest {'equals' if same else 'differs from'} the primary's"
        finally:
            replica.close()
    finally:
        os.unlink(other.path)


def test_the_native_state_persists_and_moves(server_factory):
    """rl-gcrate through AOF rewrite and replay, RDB reload, DUMP/RESTORE and
    COPY keeps every key's value and expiry; MEMORY USAGE counts it as the
    other compact states (16 bytes behind the value pointer)."""
    s = server_factory(args=["--loadmodule", proc.MODULE, "CL.THROTTLE", "--appendonly", "yes"], module=False)
    r = s.client()
    for i in range(50):
        r.execute_command("CL.THROTTLE", f"g:{i}", 20, 1, 60, 1 + i % 5)
    r.set("g:cell", "1000000000000000000")  # a redis-cell string stays one until granted
    r.execute_command("RL.TOKENBUCKET", "tb", 10, 1, 1000)

    def snapshot():
        return r.execute_command("DEBUG", "DIGEST"), {k: r.pexpiretime(k) for k in r.keys("g:*")}

    before = snapshot()
    assert r.type("g:0") == b"rl-gcrate"
    r.bgrewriteaof()
    wait_until(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, what="AOF rewrite")
    r.execute_command("DEBUG", "LOADAOF")
    assert snapshot() == before
    r.execute_command("DEBUG", "RELOAD")
    assert snapshot() == before
    r.restore("g:restored", r.pexpiretime("g:1"), r.dump("g:1"), absttl=True)
    r.copy("g:1", "g:copied")
    v = r.execute_command("DEBUG", "DIGEST-VALUE", "g:1")
    assert r.execute_command("DEBUG", "DIGEST-VALUE", "g:restored", "g:copied") == v * 2
    assert least_memory_usage(r, "g:1", proc.SERVER.malloc) == least_memory_usage(r, "tb", proc.SERVER.malloc)
    with pytest.raises(redis.ResponseError, match="invalid RL.STATE payload"):
        r.execute_command("RL.STATE", "g:bad", b"\x07" + b"\x00" * 8 + b"\x02" + b"\x00" * 8)


def test_command_docs_and_acl(server_factory):
    """Registered with the argument: COMMAND DOCS describe it, its key is
    argument 1, and where the server has module ACL categories it is in
    @ratelimit (a user with +@ratelimit calls it, and is refused RL.STATE)."""
    r = server_factory(args=["--loadmodule", proc.MODULE, "CL.THROTTLE"], module=False).client()
    def raw(*args):  # redis-py would parse any COMMAND subcommand's reply as COMMAND's
        conn = r.connection_pool.get_connection("COMMAND")
        try:
            conn.send_command(*args)
            return conn.read_response()
        finally:
            r.connection_pool.release(conn)

    docs = raw("COMMAND", "DOCS", "CL.THROTTLE")
    assert docs[0].upper() == b"CL.THROTTLE", docs
    doc = dict(zip(docs[1][::2], docs[1][1::2]))
    assert b"redis-cell" in doc[b"summary"] and doc[b"module"] == b"ratelimit", doc
    assert raw("COMMAND", "GETKEYS", "CL.THROTTLE", "k", 1, 1, 1) == [b"k"]
    if b"ratelimit" not in r.acl_cat():
        print("SKIPPED the ACL half: the server has no module ACL categories")
        return
    assert b"cl.throttle" in r.acl_cat("ratelimit")
    r.acl_setuser("app", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@ratelimit"])
    app = redis.Redis(host="127.0.0.1", port=r.connection_pool.connection_kwargs["port"], username="app",
                      password="pw")
    assert app.execute_command("CL.THROTTLE", "k", 1, 1, 1)[0] == 0
    with pytest.raises(redis.exceptions.NoPermissionError):
        app.execute_command("RL.STATE", "k", b"\x07")
