import os

import pytest

from rltesting import fixtures
from rltesting.proc import MODULE, SERVER

# The fixtures every suite takes.
server_factory = fixtures.server_factory
server = fixtures.server


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
