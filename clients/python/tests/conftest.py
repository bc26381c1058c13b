"""Real redis-server processes for the client tests (the test-support
package rltesting, testing/). redis_ratelimit is the package installed in
the virtualenv: `make venv` installs this tree's editable; the unpinned
install test (clients/fresh-install.sh) a fresh `pip install`."""
import os

import pytest

from rltesting.cluster import Cluster
from rltesting import fixtures
from rltesting.proc import MODULE

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


@pytest.fixture
def cluster(server_factory):
    return Cluster(server_factory, primaries=3)
