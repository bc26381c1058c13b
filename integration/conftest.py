import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODULE, SERVER, Server  # noqa: E402


@pytest.fixture
def server_factory():
    """Start any number of servers; all are killed when the test ends."""
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
    return server_factory()


@pytest.fixture
def r(server):
    c = server.client()
    yield c
    c.close()


def pytest_sessionstart(session):
    if not os.path.exists(MODULE):
        raise pytest.UsageError(f"module not built: {MODULE} (run `make build`)")


def pytest_report_header(config):
    return f"server: {SERVER} {SERVER.path}\nmodule: {MODULE}"
