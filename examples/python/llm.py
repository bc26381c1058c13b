#!/usr/bin/env python3
"""An LLM-style endpoint that streams its answer, with two limits per
tenant: at most N streams in flight (RL.CONCURRENCY, through the client's
in-flight guard) and a tokens-per-minute budget (a token bucket), charged by
reserving an estimate before the model runs and settling the real count
once the stream ends (clients/DESIGN.md, "In-flight limits" and
"Reservations").

  python3 llm.py --port 8090 --redis redis://127.0.0.1:6379/0 \\
      --streams 2 --tokens-per-minute 10000

* POST or GET /v1/completions?max_tokens=N: the tenant is the X-Api-Key
  header (hashed into the key), else the client's address. The reply is a
  text/event-stream, one `data:` line per token, then `data: [DONE]`.
  The model here is a stand-in: it emits `tokens` tokens (a query
  parameter, default max_tokens; a real model's count includes the prompt's
  and may pass max_tokens), `--token-delay-ms` apart.
* Order: the stream slot first (429, `X-RateLimit-Reason: streams`, when
  the tenant has N streams running), then the tokens: `reserve(max_tokens)`
  (429, reason `tokens`, when the budget has not that many left). After the
  stream, before its `[DONE]`, `settle(actual)`: the unused part goes back (REFUND), an overrun
  is taken past the budget (COST n FORCE), so the tenant's next request
  waits the debt out. The slot is released on every exit, the client
  hanging up included.
* GET /v1/usage: this tenant's tokens left and streams free, as JSON.
* Redis down: the client's breaker opens and the local limits decide
  (panic): streams per process, the budget divided by --instances.
"""
import argparse
import hashlib
import json
import os
import sys
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import redis_ratelimit as rrl  # pip install ./clients/python (make venv installs it editable)


def log(msg):
    print(f"llm[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


class Limits:
    def __init__(self, opts):
        client = redis.Redis.from_url(opts.redis, socket_timeout=opts.redis_timeout_ms / 1000,
                                      socket_connect_timeout=opts.redis_timeout_ms / 1000,
                                      retry=Retry(NoBackoff(), 0))
        self.rl = rrl.RateLimit(client, breaker=rrl.Breaker(failures=1, open_ms=opts.redis_retry_ms))
        panic = rrl.Panic(instances=opts.instances)
        self.streams = self.rl.inflight(rrl.concurrency("streams", opts.streams, opts.lease_ms), panic=panic)
        tpm = opts.tokens_per_minute
        self.tokens = self.rl.limiter(rrl.token_bucket("tpm", tpm, tpm, 60_000), panic=panic)

    @staticmethod
    def tenant(handler):
        """The tenant's two keys (one slot on a cluster): streams, tokens."""
        key = handler.headers.get("X-Api-Key")
        who = "k:" + hashlib.sha256(key.encode()).hexdigest()[:32] if key else "a:" + handler.client_address[0]
        return rrl.make_key(who, "streams"), rrl.make_key(who, "tpm")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    limits: Limits
    delay_s = 0.0

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def denied(self, reason, d):
        hdrs = [("X-RateLimit-Reason", reason)] + list(rrl.headers(d).items())
        self.reply(429, {"error": f"too many {reason}", "retry_after_ms": d.retry_after_ms}, hdrs)

    def do_GET(self):
        self.route()

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        self.route()

    def route(self):
        url = urllib.parse.urlsplit(self.path)
        q = dict(urllib.parse.parse_qsl(url.query))
        skey, tkey = Limits.tenant(self)
        if url.path == "/v1/usage":
            left = self.limits.tokens.limit(tkey, cost=0)
            self.reply(200, {"tokens_left": left.remaining, "retry_after_ms": left.retry_after_ms})
            return
        if url.path != "/v1/completions":
            self.reply(404, {"error": "not found"})
            return
        try:
            max_tokens = int(q.get("max_tokens", "256"))
            tokens = int(q.get("tokens", str(max_tokens)))
            if not 1 <= max_tokens <= 2**53 - 1 or not 0 <= tokens <= 100_000:
                raise ValueError
        except ValueError:
            self.reply(400, {"error": "max_tokens 1 to 2^53-1, tokens 0 to 100000"})
            return
        with self.limits.streams.hold(skey) as slot:
            if not slot.allowed:
                self.denied("streams", slot.decision)
                return
            r = self.limits.tokens.reserve(tkey, max_tokens)
            if not r.allowed:
                self.denied("tokens", r.decision)
                return
            sent = 0
            try:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                for k, v in rrl.headers(r.decision).items():
                    self.send_header(k, v)
                self.end_headers()
                for i in range(tokens):
                    self.chunk(f"data: tok{i}\n\n")
                    sent += 1
                    if self.delay_s:
                        time.sleep(self.delay_s)
                # settled before [DONE]: a client that saw the end sees its usage
                r.settle(sent)
                self.chunk("data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            finally:
                # what the model produced is spent, whether or not the client read it
                if not r.settled:
                    r.settle(sent)

    def chunk(self, text):
        b = text.encode()
        self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
        self.wfile.flush()


class Server(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


def main():
    ap = argparse.ArgumentParser(description="An LLM-style streaming endpoint (redis-ratelimit example)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8090)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--streams", type=int, default=2, help="streams in flight per tenant (default 2)")
    ap.add_argument("--lease-ms", type=int, default=30_000,
                    help="a stream's lease, renewed while it runs (default 30000)")
    ap.add_argument("--tokens-per-minute", type=int, default=10_000, help="per tenant (default 10000)")
    ap.add_argument("--token-delay-ms", type=float, default=0.0, help="the stand-in model's pace")
    ap.add_argument("--instances", type=int, default=1, help="processes sharing the limits (panic mode)")
    ap.add_argument("--redis-timeout-ms", type=int, default=50)
    ap.add_argument("--redis-retry-ms", type=int, default=500)
    opts = ap.parse_args()
    Handler.limits = Limits(opts)
    Handler.delay_s = opts.token_delay_ms / 1000
    server = Server((opts.host, opts.port), Handler)
    log(f"listening on http://{opts.host}:{server.server_address[1]}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
