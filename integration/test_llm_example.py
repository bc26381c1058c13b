"""The LLM-style streaming example (examples/python/llm.py), over real HTTP
on a real server: a tenant's streams are capped while they run and freed
when they end (the client hanging up included), and its tokens-per-minute
budget is charged by what each stream really produced: the unused part of
the reservation comes back, an overrun is a debt the next request waits
out. The budget is a token bucket of 1,000 a minute: it refills 1 token
every 60 ms, so the tests allow for what refilled while they ran, and
assert only what a wrong implementation would get wrong by hundreds."""
import http.client
import json
import os
import socket
import sys
import time

import pytest

from rltesting.proc import ROOT, wait_until
from test_examples import http_request, start_listening

LLM = os.path.join(ROOT, "examples", "python", "llm.py")
TPM = 1000


@pytest.fixture
def llm(server, tmp_path):
    p, port = start_listening(
        lambda port: [sys.executable, LLM, "--port", str(port), "--redis", f"redis://127.0.0.1:{server.port}/0",
                      "--streams", "2", "--tokens-per-minute", str(TPM), "--token-delay-ms", "2"],
        lambda port: str(tmp_path / f"llm-{port}.log"), "the LLM example")
    try:
        yield port
    finally:
        p.close()


def complete(port, key, max_tokens, tokens):
    """One whole completion: (status, reason header, tokens streamed)."""
    st, h, body = http_request(port, f"/v1/completions?max_tokens={max_tokens}&tokens={tokens}",
                               headers={"X-Api-Key": key})
    return st, h.get("x-ratelimit-reason"), body.count(b"data: tok")


def usage(port, key):
    st, _, body = http_request(port, "/v1/usage", headers={"X-Api-Key": key})
    assert st == 200
    return json.loads(body)["tokens_left"]


def open_stream(port, key):
    """A completion whose body is left unread after its first token: the
    stream holds its slot until the connection ends."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/v1/completions?max_tokens=10&tokens=100000", headers={"X-Api-Key": key})
    r = c.getresponse()
    assert r.status == 200
    assert r.fp.readline()  # the first chunk's size line: the stream is running
    return c


def test_streams_in_flight_are_capped_and_freed(llm):
    a, b = open_stream(llm, "t1"), open_stream(llm, "t1")
    st, reason, _ = complete(llm, "t1", 5, 5)
    assert (st, reason) == (429, "streams"), "a third stream while two run"
    assert complete(llm, "other", 5, 5)[0] == 200, "another tenant has its own slots"
    # the client hangs up: the server's next write fails, the guard releases
    a.sock.shutdown(socket.SHUT_RDWR)
    a.close()
    wait_until(lambda: complete(llm, "t1", 5, 5)[0] == 200, timeout=30)
    b.close()


def test_the_budget_is_charged_what_was_used(llm):
    assert usage(llm, "t2") == TPM
    # reserve 600, use 100: 500 come back
    t0 = time.monotonic()
    assert complete(llm, "t2", 600, 100) == (200, None, 100)
    left = usage(llm, "t2")
    refilled = int((time.monotonic() - t0) / 0.06) + 1
    assert TPM - 100 <= left <= TPM - 100 + refilled, left
    # 900 reserved fits, and 950 used: 50 past the estimate is taken, past the budget
    assert complete(llm, "t2", 800, 950)[0] == 200
    assert usage(llm, "t2") <= 100, "the overrun was charged"
    st, reason, _ = complete(llm, "t2", 200, 1)
    assert (st, reason) == (429, "tokens"), "the next request waits for the budget"
