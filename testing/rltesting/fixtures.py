"""The pytest fixtures that start real servers, shared by the integration
suites (integration/conftest.py) and the Python client's tests
(clients/python/tests/conftest.py): each conftest imports them."""
import pytest

from rltesting.proc import Server


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
    """A server with the module loaded."""
    return server_factory()
