"""The client packages ship their Lua scripts although the repository does not
commit them (docs/architecture.md, "Generated files"): from a fresh
`git clone` of this repository (its committed HEAD), `pip install
./clients/python`, `npm pack` and `npm install ./clients/node` each build the
scripts, and the installed packages find them and run them on a real server.

make test-packaging runs it (one plain redis-server; no module needed: the
scripts are the Lua twins).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time

import pytest
import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["concurrency.lua", "fixedwindow.lua", "multi.lua", "slidingcounter.lua", "slidinglog.lua", "tokenbucket.lua"]
NPM = shutil.which("npm")
NODE = shutil.which("node")


def run(argv, cwd=None, env=None, timeout=300):
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{argv} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    repo = tmp_path_factory.mktemp("clone") / "redis-ratelimit"
    run(["git", "clone", "-q", "--no-hardlinks", ROOT, str(repo)])
    for d in ("clients/python/redis_ratelimit/lua", "clients/node/lua"):
        assert not (repo / d).exists(), f"{d} is committed: it must be generated"
    return repo


def project_scripts(repo):
    return {n: (repo / "lua" / n).read_text() for n in SCRIPTS}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A plain redis-server on a free port of 127.0.0.1."""
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = tmp_path_factory.mktemp("server")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                             "--save", "", "--appendonly", "no", "--logfile", "server.log"])
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
    yield port
    proc.terminate()
    proc.wait(timeout=30)


def fresh_bucket(port, text, key):
    """The token bucket script on a fresh key: granted, 19 of 20 left."""
    reply = redis.Redis(port=port).eval(text, 1, key, 20, 10, 1000)
    assert reply[:4] == [1, 20, 19, 0], reply


def test_pip_install_ships_the_scripts(clone, server, tmp_path):
    target = tmp_path / "site"
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--target", str(target), str(clone / "clients" / "python")])
    code = ("import json, redis_ratelimit.core as c; "
            "print(json.dumps({n: c.script_text(n[:-4]) for n in %r}))" % SCRIPTS)
    env = dict(os.environ, PYTHONPATH=str(target))
    found = json.loads(run([sys.executable, "-c", code], cwd=tmp_path, env=env))
    assert found == project_scripts(clone)
    fresh_bucket(server, found["tokenbucket.lua"], "py:{a}")


@pytest.mark.skipif(not (NPM and NODE), reason="node and npm are needed (make deps installs them)")
def test_npm_pack_and_install_ship_the_scripts(clone, server, tmp_path):
    pkg = clone / "clients" / "node"
    out = run([NPM, "pack", "--silent", "--pack-destination", str(tmp_path)], cwd=pkg)
    (tgz,) = [tmp_path / line for line in out.split() if line.endswith(".tgz")]
    with tarfile.open(tgz) as t:
        packed = {n: t.extractfile("package/lua/" + n).read().decode() for n in SCRIPTS}
    assert packed == project_scripts(clone)
    # From the tarball and from the path: the installed package's own loader
    # (SCRIPTS, what its Lua backend sends) finds every script.
    code = ("import { SCRIPTS } from 'redis-ratelimit'; "
            "console.log(JSON.stringify(Object.fromEntries("
            "Object.entries(SCRIPTS).map(([n, s]) => [n + '.lua', s.text]))));")
    for name, source in (("from-tarball", tgz), ("from-path", pkg)):
        if source == pkg:  # what npm pack generated: the path install must make its own
            shutil.rmtree(pkg / "lua")
        app = tmp_path / name
        app.mkdir()
        (app / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
        run([NPM, "install", "--offline", "--no-audit", "--no-fund", "--silent", str(source)], cwd=app)
        found = json.loads(run([NODE, "--input-type=module", "-e", code], cwd=app))
        assert found == project_scripts(clone), name
        fresh_bucket(server, found["tokenbucket.lua"], "node:{%s}" % name)
