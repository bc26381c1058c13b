"""Keyspace notifications: every write emits one event of the module class
(`d`) per key written, named after the command (`rl.tokenbucket`,
`rl.slidinglog`, `rl.slidingcounter`, `rl.fixedwindow`, `rl.multi`; `rl.refund` for a REFUND
that gives units back); a DRYRUN, a denial, COST 0 and a refund that gives
nothing back emit none. Replicas emit the event of the limiter's kind for
each RL.STATE they apply. A real subscriber on its own connection sees the
events; a marker key written after each step (a string event, class `$`)
ends what the step emitted."""
import pytest

from rltesting.clock import room
from rltesting.replication import start_replica, wait_ack

MARKER = "notifications:marker"


class Subscriber:
    """A pattern subscription to every keyspace channel of db 0."""

    def __init__(self, server, flags="K$d"):
        self.c = server.client()
        self.c.config_set("notify-keyspace-events", flags)
        self.ps = self.c.pubsub()
        self.ps.psubscribe("__keyspace@0__:*")
        msg = self.ps.get_message(timeout=5)
        assert msg and msg["type"] == "psubscribe", msg
        self.n = 0

    def events(self, writer):
        """The (key, event) pairs emitted since the last call: everything
        before the marker, which `writer` (a client of the server the
        subscriber listens to) sets now."""
        self.n += 1
        writer.set(MARKER, self.n)
        got = []
        while True:
            msg = self.ps.get_message(timeout=10)
            assert msg is not None, f"no marker event after {got}"
            if msg["type"] != "pmessage":
                continue
            key = msg["channel"].decode().split(":", 1)[1]
            event = msg["data"].decode()
            if key == MARKER:
                assert event == "set", event
                return got
            got.append((key, event))

    def close(self):
        self.ps.close()
        self.c.close()


@pytest.fixture
def sub(server):
    s = Subscriber(server)
    yield s
    s.close()


TB = ["5", "1", "3600000"]
WIN = ["5", "3600000"]


def test_notification_each_single_command_emits_its_name(server, r, sub):
    r.execute_command("RL.TOKENBUCKET", "tb", *TB)
    r.execute_command("RL.SLIDINGLOG", "sl", *WIN)
    r.execute_command("RL.SLIDINGCOUNTER", "sc", *WIN)
    r.execute_command("RL.TOKENBUCKET", "tb", *TB, "COST", "2", "PARTIAL")
    assert sub.events(r) == [
        ("tb", "rl.tokenbucket"),
        ("sl", "rl.slidinglog"),
        ("sc", "rl.slidingcounter"),
        ("tb", "rl.tokenbucket"),
    ]


def test_notification_multi_emits_once_per_key_written(server, r, sub):
    # The generic path (a sliding log), the word-state fast path (two token
    # buckets), one limit (the single command's path) and WEIGHT.
    r.execute_command("RL.MULTI", "2", "m1", "m2", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN)
    r.execute_command("RL.MULTI", "2", "w1", "w2", "TOKENBUCKET", *TB, "SLIDINGCOUNTER", *WIN)
    r.execute_command("RL.MULTI", "1", "o1", "SLIDINGLOG", *WIN)
    r.execute_command("RL.MULTI", "1", "o2", "TOKENBUCKET", *TB)
    r.execute_command("RL.MULTI", "2", "g1", "g2", "TOKENBUCKET", *TB, "WEIGHT", "2", "SLIDINGCOUNTER", *WIN)
    assert sub.events(r) == [
        ("m1", "rl.multi"), ("m2", "rl.multi"),
        ("w1", "rl.multi"), ("w2", "rl.multi"),
        ("o1", "rl.multi"),
        ("o2", "rl.multi"),
        ("g1", "rl.multi"), ("g2", "rl.multi"),
    ]


def test_notification_refund_emits_rl_refund(server, r, sub):
    for cmd, key, params in (("RL.TOKENBUCKET", "tb", TB), ("RL.SLIDINGLOG", "sl", WIN),
                             ("RL.SLIDINGCOUNTER", "sc", WIN)):
        r.execute_command(cmd, key, *params, "COST", "2")
        r.execute_command(cmd, key, *params, "REFUND", "1")  # still not fresh: stored
        r.execute_command(cmd, key, *params, "REFUND", "5")  # fresh again: deleted
        assert r.exists(key) == 0
    r.execute_command("RL.MULTI", "2", "m1", "m2", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN)
    r.execute_command("RL.MULTI", "2", "m1", "m2", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN, "REFUND", "1")
    assert sub.events(r) == [
        ("tb", "rl.tokenbucket"), ("tb", "rl.refund"), ("tb", "rl.refund"),
        ("sl", "rl.slidinglog"), ("sl", "rl.refund"), ("sl", "rl.refund"),
        ("sc", "rl.slidingcounter"), ("sc", "rl.refund"), ("sc", "rl.refund"),
        ("m1", "rl.multi"), ("m2", "rl.multi"),
        ("m1", "rl.refund"), ("m2", "rl.refund"),
    ]


def test_notification_none_without_a_write(server, r, sub):
    full = {"RL.TOKENBUCKET": ["1", "1", "3600000"], "RL.SLIDINGLOG": ["1", "3600000"],
            "RL.SLIDINGCOUNTER": ["1", "3600000"]}
    for cmd, params in full.items():
        key = cmd.lower()
        r.execute_command(cmd, key, *params)
    assert len(sub.events(r)) == 3
    for cmd, params in full.items():
        key = cmd.lower()
        assert r.execute_command(cmd, key, *params)[0] == 0  # denied
        r.execute_command(cmd, key, *params, "COST", "0")
        r.execute_command(cmd, key + ":dry", *params, "DRYRUN")
        r.execute_command(cmd, key + ":fresh", *params, "REFUND", "1")  # nothing to give back
        r.execute_command(cmd, key, *params, "PARTIAL", "COST", "3")  # granted 0
    r.execute_command("RL.MULTI", "2", "rl.tokenbucket", "x", "TOKENBUCKET", *full["RL.TOKENBUCKET"],
                      "SLIDINGLOG", *WIN)  # one limit denies: nothing written
    r.execute_command("RL.MULTI", "2", "y1", "y2", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN, "DRYRUN")
    r.execute_command("RL.MULTI", "1", "y3", "TOKENBUCKET", *TB, "COST", "0")
    r.execute_command("RL.MULTI", "2", "y4", "y5", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN, "REFUND", "1")
    with pytest.raises(Exception):
        r.execute_command("RL.TOKENBUCKET", MARKER, *TB)  # WRONGTYPE once the marker exists
    assert sub.events(r) == []


def test_notification_module_class_only(server, r):
    # Without the module class (`d`), the same calls emit nothing.
    s = Subscriber(server, flags="K$")
    try:
        r.execute_command("RL.TOKENBUCKET", "tb", *TB)
        r.execute_command("RL.MULTI", "1", "m", "SLIDINGLOG", *WIN)
        assert s.events(r) == []
    finally:
        s.close()


def test_notification_replica_emits_the_limiters_kind(server_factory):
    m = server_factory()
    mc = m.client()
    rep = start_replica(server_factory, m)
    rc = rep.client()
    s = Subscriber(rep)
    try:
        mc.execute_command("RL.TOKENBUCKET", "tb", *TB)
        mc.execute_command("RL.SLIDINGLOG", "sl", *WIN, "COST", "2")
        mc.execute_command("RL.SLIDINGCOUNTER", "sc", *WIN)
        mc.execute_command("RL.MULTI", "2", "m1", "m2", "TOKENBUCKET", *TB, "SLIDINGLOG", *WIN)
        mc.execute_command("RL.SLIDINGLOG", "sl", *WIN, "REFUND", "1")
        mc.execute_command("RL.TOKENBUCKET", "tb", *TB, "DRYRUN")
        wait_ack(mc)
        # The marker is written on the master and replicated after them.
        assert s.events(mc) == [
            ("tb", "rl.tokenbucket"),
            ("sl", "rl.slidinglog"),
            ("sc", "rl.slidingcounter"),
            ("m1", "rl.tokenbucket"), ("m2", "rl.slidinglog"),
            ("sl", "rl.refund"),
        ]
        assert rc.exists("tb", "sl", "sc", "m1", "m2") == 5
    finally:
        s.close()


def test_notification_fixed_window(server, r, sub):
    """RL.FIXEDWINDOW emits `rl.fixedwindow` per write (both window modes),
    `rl.refund` for a refund that gives units back (stored or deleted), and
    nothing for a denial, COST 0, DRYRUN or a refund of nothing."""
    room(r, 3_600_000, 30_000)  # the hour's window holds every call
    r.execute_command("RL.FIXEDWINDOW", "fw", *WIN)
    r.execute_command("RL.FIXEDWINDOW", "ff", *WIN, "FROMFIRST", "COST", "2")
    r.execute_command("RL.FIXEDWINDOW", "fw", *WIN, "COST", "9", "PARTIAL")
    r.execute_command("RL.FIXEDWINDOW", "ff", *WIN, "REFUND", "1", "FROMFIRST")  # stored
    r.execute_command("RL.FIXEDWINDOW", "ff", *WIN, "REFUND", "5", "FROMFIRST")  # deleted
    assert r.exists("ff") == 0
    assert sub.events(r) == [
        ("fw", "rl.fixedwindow"), ("ff", "rl.fixedwindow"), ("fw", "rl.fixedwindow"),
        ("ff", "rl.refund"), ("ff", "rl.refund"),
    ]
    assert r.execute_command("RL.FIXEDWINDOW", "fw", *WIN)[0] == 0  # denied
    r.execute_command("RL.FIXEDWINDOW", "fw", *WIN, "COST", "0")
    r.execute_command("RL.FIXEDWINDOW", "dry", *WIN, "DRYRUN")
    r.execute_command("RL.FIXEDWINDOW", "none", *WIN, "REFUND", "1")
    r.execute_command("RL.FIXEDWINDOW", "big", *WIN, "COST", "6")
    assert sub.events(r) == []


def test_notification_replica_fixed_window(server_factory):
    m = server_factory()
    mc = m.client()
    rep = start_replica(server_factory, m)
    rc = rep.client()
    s = Subscriber(rep)
    try:
        room(mc, 3_600_000, 30_000)  # the hour's window holds every call
        mc.execute_command("RL.FIXEDWINDOW", "fw", *WIN, "COST", "2")
        mc.execute_command("RL.FIXEDWINDOW", "fw", *WIN, "REFUND", "1")
        mc.execute_command("RL.FIXEDWINDOW", "fw", *WIN, "DRYRUN")
        wait_ack(mc)
        # A refund that stores replicates the state: the kind's event.
        assert s.events(mc) == [("fw", "rl.fixedwindow"), ("fw", "rl.fixedwindow")]
        assert rc.type("fw") == b"rl-fixwin"
        assert rc.execute_command("DEBUG", "DIGEST-VALUE", "fw") == mc.execute_command("DEBUG", "DIGEST-VALUE", "fw")
        assert rc.execute_command("PEXPIRETIME", "fw") == mc.execute_command("PEXPIRETIME", "fw")
    finally:
        s.close()
