"""make test-container: the module's images (make image) under testcontainers.

container/run-tests.sh sets DOCKER_HOST (a podman system service where
docker is not there) and the TESTCONTAINERS_* / TC_HOST settings.
"""
import pathlib
import re
import tomllib

import pytest
import redis
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

ROOT = pathlib.Path(__file__).resolve().parents[2]

VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
TAGS = {server: f"redis-ratelimit:{VERSION}-{server}" for server in ("redis", "valkey")}
MODULE_PATH = "/usr/local/lib/redis-ratelimit/libredis_ratelimit.so"
# The page that prints the testcontainers recipes (the README points to it).
RECIPES = ROOT / "docs" / "containers.md"


def recipe_block(marker):
    """The fenced code block right after the comment `marker` in docs/containers.md."""
    text = RECIPES.read_text()
    m = re.search(re.escape(marker) + r"[^\n]*\n```[a-z]*\n(.*?)\n```\n", text, re.S)
    assert m, f"docs/containers.md has no code block after {marker!r}"
    return m.group(1) + "\n"


# The servers the gateway test runs on: each image with its module, and the
# Redis image started without it (the client library then runs the Lua twins).
SERVERS = {
    "redis": (TAGS["redis"], None, "module"),
    "valkey": (TAGS["valkey"], None, "module"),
    "redis-without-module": (TAGS["redis"], ["--protected-mode", "no"], "lua"),
}


def start(image, command=None, volume=None):
    """A started container of image (its own CMD unless command is given),
    port 6379 mapped on 127.0.0.1; the caller stops it."""
    c = DockerContainer(image).with_exposed_ports(6379)
    if command is not None:
        c = c.with_command(command)
    if volume is not None:
        c = c.with_volume_mapping(volume, "/data", "rw")
    return c.waiting_for(LogMessageWaitStrategy("Ready to accept connections")).start()


def url_of(c):
    return f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}/0"


@pytest.fixture(scope="session", params=list(SERVERS))
def server(request):
    """(redis URL, the source decisions must come from) of a running container."""
    image, command, source = SERVERS[request.param]
    c = start(image, command)
    try:
        yield url_of(c), source
    finally:
        c.stop()


@pytest.fixture(scope="session", params=["redis", "valkey"])
def module_server(request):
    c = start(TAGS[request.param])
    try:
        yield redis.Redis.from_url(url_of(c))
    finally:
        c.stop()
