"""Real redis-server processes for the client tests (the test-support
package rltesting, testing/). redis_ratelimit is the package installed in
the virtualenv: `make venv` installs this tree's editable; the unpinned
install test (clients/fresh-install.sh) a fresh `pip install`."""
import os
import signal

import pytest

from rltesting.cluster import CLUSTER_ARGS, Cluster
from rltesting import fixtures
from rltesting.proc import MODULE, Server

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

server_factory = fixtures.server_factory
server = fixtures.server


def pytest_sessionstart(session):
    if not os.path.exists(MODULE):
        raise pytest.UsageError(f"module not built: {MODULE} (run `make build`)")


@pytest.fixture
def plain(server_factory):
    """A redis-server without the module (the Lua backend)."""
    return server_factory(module=False)


@pytest.fixture(scope="session")
def shared_cluster():
    """The session's three-primary cluster, made on first use (a new one
    takes 2 s, and a run has six cluster tests): `cluster` hands it to each
    test reset to a fresh cluster's state, or makes a new one when a node
    has died. Every node is killed at the end of the session."""
    started = []

    def make(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s

    box = {"cluster": None, "make": make}
    yield box
    for s in started:
        s.close()


def reset_cluster(c):
    """What a test may have changed, put back as a new cluster has it: every
    node running (SIGCONT), the node timeout of CLUSTER_ARGS, no other
    client connected, no keys, no scripts, command statistics at zero; then
    every node reports cluster_state ok and all agree on the slot map (the
    slots a test resharded stay where they went)."""
    timeout = CLUSTER_ARGS[CLUSTER_ARGS.index("--cluster-node-timeout") + 1]
    for s in c.nodes:
        s.proc.send_signal(signal.SIGCONT)
    for s in c.nodes:
        r = s.client()
        r.config_set("cluster-node-timeout", timeout)
        r.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        r.flushall()
        r.script_flush()
        r.config_resetstat()
        r.close()
    c.wait_ok()


@pytest.fixture
def cluster(shared_cluster):
    c = shared_cluster["cluster"]
    if c is not None and all(s.alive() for s in c.nodes):
        reset_cluster(c)
    else:
        if c is not None:
            for s in c.nodes:
                s.close()
        c = shared_cluster["cluster"] = Cluster(shared_cluster["make"], primaries=3)
    return c
