"""RL.MULTI's calls and checks, shared by test_multi.py and
test_multi_replication.py: the argument list of a call, its reply checked
against the reference model (models.combine), raw replies, dumps."""
import os
import random

from rltesting.replies import NEVER, options
from models import combine

SEED = int(os.environ.get("RL_SEED", "0")) or random.randrange(1, 2**31)

ALGOS = ("TOKENBUCKET", "SLIDINGLOG", "SLIDINGCOUNTER", "FIXEDWINDOW")
SINGLE = {"TOKENBUCKET": "RL.TOKENBUCKET", "SLIDINGLOG": "RL.SLIDINGLOG",
          "SLIDINGCOUNTER": "RL.SLIDINGCOUNTER", "FIXEDWINDOW": "RL.FIXEDWINDOW"}
TYPE_OF = {"TOKENBUCKET": "rl-tokbkt", "SLIDINGLOG": "rl-slilog", "SLIDINGCOUNTER": "rl-slicnt",
           "FIXEDWINDOW": "rl-fixwin"}
NEVER_ALGO = {a: NEVER[SINGLE[a]] for a in ALGOS}


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


# ---------------------------------------------------------------------------
# Calling RL.MULTI and checking the shape of its reply.
# ---------------------------------------------------------------------------

def multi_args(keys, limits, cost=None, partial=False, dryrun=False, refund=None):
    """limits: [(algo, params, weight or None)]."""
    args = ["RL.MULTI", len(keys), *keys]
    for algo, params, weight in limits:
        args += [algo, *params]
        if weight is not None:
            args += ["WEIGHT", weight]
    return args + options(cost, partial, dryrun, refund)


def multi(client, keys, limits, **kw):
    reply = client.execute_command(*multi_args(keys, limits, **kw))
    check_multi(reply, limits, **kw)
    return reply


def check_multi(reply, limits, cost=None, partial=False, dryrun=False, refund=None):
    """Invariants of every RL.MULTI reply."""
    n = len(limits)
    cost = 1 if cost is None else cost
    assert isinstance(reply, list) and len(reply) == 7, reply
    per = reply[6]
    assert isinstance(per, list) and len(per) == n, reply
    weights = [w or 1 for _, _, w in limits]
    for (algo, params, w), p in zip(limits, per):
        assert len(p) == 5 and all(isinstance(x, int) for x in p), reply
        assert p[1] == params[0], reply
        assert 0 <= p[2] <= params[0] and p[4] >= 0 and p[3] >= -1, reply
    if refund is None:
        # Every limit took the same number of requests: g x WEIGHT units.
        g = per[0][0] // weights[0]
        assert all(p[0] == g * wt for p, wt in zip(per, weights)), reply
        assert 0 <= g <= cost and (partial or g in (0, cost)), reply
        for p, wt in zip(per, weights):
            want = cost * wt
            if p[0] == want:
                assert p[3] == 0, reply
            elif want > p[1]:
                assert p[3] == -1, reply
    else:
        for p, wt in zip(per, weights):
            assert 0 <= p[0] <= refund * wt, reply
    # Elements 1-6 follow from the per-limit replies by the rules of docs/contract.md, "RL.MULTI".
        assert reply[:6] == combine(per, weights, cost, partial, refund)[:6], reply
    return reply


def error_text(exc):
    """The server's error text (redis-py strips a leading "ERR ")."""
    msg = str(exc)
    first = msg.split(" ", 1)[0]
    return msg if first.isupper() and first.isalpha() and first != "ERR" and len(first) > 3 \
        and first in ("WRONGTYPE", "CROSSSLOT", "MOVED") else "ERR " + msg


def raw(client, *args):
    """A command's reply without redis-py's response callbacks."""
    conn = client.connection_pool.get_connection(args[0])
    try:
        conn.send_command(*args)
        return conn.read_response()
    finally:
        client.connection_pool.release(conn)


def dump_all(client, keys):
    return [(client.dump(k), client.execute_command("PEXPIRETIME", k)) for k in keys]


def server_us(client):
    s, us = client.time()
    return s * 1_000_000 + us
