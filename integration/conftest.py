import os

import pytest

from rltesting import fixtures
from rltesting.proc import MODULE, SERVER
import twins

# The fixtures every suite takes, and the Lua twin suites' (test_lua_twins*.py).
server_factory = fixtures.server_factory
server = fixtures.server
plain = twins.plain
tw = twins.tw


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
