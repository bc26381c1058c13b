import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import MODULE, SERVER  # noqa: E402
import server_fixtures  # noqa: E402

server_factory = server_fixtures.server_factory
server = server_fixtures.server


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
