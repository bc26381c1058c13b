"""Real redis-server processes for the client tests (the project's harness)."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "integration"))
# RL_TEST_INSTALLED (the unpinned install test): the installed package, not this tree's
if not os.environ.get("RL_TEST_INSTALLED"):
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

from harness import MODULE, Cluster  # noqa: E402
import server_fixtures  # noqa: E402

server_factory = server_fixtures.server_factory
server = server_fixtures.server


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
