"""Real redis-server processes for the client tests (the project's harness)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "integration"))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from harness import MODULE, Cluster, Server  # noqa: E402


def pytest_sessionstart(session):
    if not os.path.exists(MODULE):
        raise pytest.UsageError(f"module not built: {MODULE} (run `make build`)")


@pytest.fixture
def server_factory():
    started = []

    def make(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.close()


@pytest.fixture
def server(server_factory):
    """A redis-server with the module loaded."""
    return server_factory()


@pytest.fixture
def plain(server_factory):
    """A redis-server without the module (the Lua backend)."""
    return server_factory(module=False)


@pytest.fixture
def cluster(server_factory):
    return Cluster(server_factory, primaries=3)
