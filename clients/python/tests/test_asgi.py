"""RateLimitMiddleware in a real HTTP server (uvicorn + Starlette)."""
import hashlib
import json
import os
import subprocess
import sys

import httpx
import pytest
from rltesting.proc import free_port, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def app(server):
    port = free_port()
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "asgi_app.py"), str(port),
                          str(server.port)], stderr=subprocess.PIPE, text=True)

    def up():
        assert p.poll() is None, p.stderr.read()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/free", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=30, what="uvicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(timeout=10)


def test_limits_headers_and_429(app, server):
    with httpx.Client(base_url=app, timeout=10) as c:
        for i in range(3):
            r = c.get("/api/items", headers={"X-Api-Key": "alice"})
            assert r.status_code == 200 and r.json() == {"path": "/api/items"}
            assert r.headers["x-ratelimit-limit"] == "3"
            assert r.headers["x-ratelimit-remaining"] == str(2 - i)
            assert r.headers["ratelimit-policy"] == '"api";q=3;w=10800'
            assert r.headers["ratelimit"] == f'"api";r={2 - i};t={3600 * (i + 1)}'
            assert "retry-after" not in r.headers
        r = c.get("/api/items", headers={"X-Api-Key": "alice"})
        assert r.status_code == 429
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["retry-after"] == "3600"
        assert r.headers["ratelimit"] == '"api";r=0;t=10800'
        body = r.json()
        assert body["type"].endswith("#quota-exceeded") and body["status"] == 429
        assert body["violated-policies"] == ["api"] and body["instance"] == "/api/items"
        # another caller has its own budget; the key is the API key hashed
        assert c.get("/api/items", headers={"X-Api-Key": "bob"}).status_code == 200
        keys = {k.decode() for k in server.client().keys("*")}
        h = hashlib.sha256(b"alice").hexdigest()[:32]
        assert f"rl:{{key:{h}}}:api" in keys
        # unlimited paths and methods pass without the headers
        r = c.get("/free")
        assert r.status_code == 200 and "ratelimit" not in r.headers
        r = c.get("/login")
        assert r.status_code == 200 and "ratelimit" not in r.headers
        # the leased route: 4 per hour shared, decided from a local reservoir
        codes = [c.post("/login").status_code for _ in range(6)]
        assert codes == [200] * 4 + [429] * 2
        r = c.post("/login")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert json.loads(r.text)["violated-policies"] == ["login"]
