#!/usr/bin/env python3
"""A small rate-limiting HTTP gateway in front of one upstream.

Standard library plus the redis-ratelimit client library
(`pip install ./clients/python`, which brings redis-py; run from the repo it
is found without installing). One shared decision per request; state is
shared by every gateway instance through Redis (the module, or its Lua
twins where the module is not loaded).

  python3 gateway.py --port 8080 --upstream http://127.0.0.1:9000 \
      --redis redis://127.0.0.1:6379/0 --rules ../rules.json

* Caller: the X-Api-Key header (hashed before it goes into a Redis key), or
  the client's address when there is none. The gateway only identifies
  callers; authenticate them in front of it or upstream.
* Policy: the first route in the rules file whose "match" prefix fits the
  path (and whose "methods", if given, include the method). Paths that no
  route matches are forwarded unlimited. The file is re-read when it
  changes; a file that does not parse or validate is ignored (the previous
  rules stay) and counted in the stats.
* Granted: forwarded; the response carries the library's headers()
  (RateLimit, RateLimit-Policy, X-RateLimit-Limit/-Remaining/-Reset).
* Denied: 429 with Retry-After and the library's problem+json body.
* Redis down or slower than --redis-timeout-ms: the library's circuit
  breaker opens at the first failure and the request is decided by its
  panic limits: the route's limit divided by the number of gateway
  instances ("instances" in the rules file), counted as a fallback. After
  --redis-retry-ms the breaker lets one probe through; when it succeeds the
  gateway is back on the shared limit.
* GET /_gateway/stats: counters as JSON (not forwarded, not limited).
"""
import argparse
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import redis_ratelimit as rrl  # pip install ./clients/python (make venv installs it editable)

MAX_ARG = 2**53 - 1
ALGORITHMS = ("tokenbucket", "slidinglog", "slidingcounter")
NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
    "content-length",
}
STATS_PATH = "/_gateway/stats"
MAX_BODY = 16 * 1024 * 1024   # request bodies are read whole before forwarding


def log(msg):
    print(f"gateway[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- rules

class Route:
    def __init__(self, d):
        if not isinstance(d, dict):
            raise ValueError("each route must be an object")

        def integer(field, lo=1):
            v = d.get(field)
            if type(v) is not int or not lo <= v <= MAX_ARG:
                raise ValueError(f"route {d.get('name')!r}: {field} must be an integer "
                                 f"from {lo} to 2^53-1")
            return v

        self.name = d.get("name")
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            raise ValueError(f"route name {self.name!r}: 1-64 of A-Z a-z 0-9 . _ -")
        self.match = d.get("match")
        if not isinstance(self.match, str) or not self.match.startswith("/"):
            raise ValueError(f"route {self.name!r}: match must be a path starting with /")
        methods = d.get("methods")
        if methods is not None and (not isinstance(methods, list)
                                    or not all(isinstance(m, str) for m in methods)):
            raise ValueError(f"route {self.name!r}: methods must be a list of strings")
        self.methods = None if methods is None else {m.upper() for m in methods}
        self.algorithm = d.get("algorithm")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"route {self.name!r}: algorithm must be one of {list(ALGORITHMS)}")
        if self.algorithm == "tokenbucket":
            self.policy = rrl.token_bucket(self.name, integer("capacity"), integer("rate"),
                                           integer("period_ms"))
        elif self.algorithm == "slidinglog":
            self.policy = rrl.sliding_log(self.name, integer("limit"), integer("window_ms"))
        else:
            self.policy = rrl.sliding_counter(self.name, integer("limit"), integer("window_ms"))
        self.limit = self.policy.limit
        self.window_ms = self.policy.window_ms
        self.cost = integer("cost") if "cost" in d else 1
        if self.cost > self.limit:
            raise ValueError(f"route {self.name!r}: cost is above the limit")
        # what makes two versions of a route the same limiter
        self.signature = (self.algorithm, self.policy.params)

    def fits(self, method, path):
        if self.methods is not None and method not in self.methods:
            return False
        m = self.match
        return path == m or path.startswith(m if m.endswith("/") else m + "/")

    def describe(self):
        return {"name": self.name, "match": self.match, "algorithm": self.algorithm,
                "limit": self.limit, "window_ms": self.window_ms, "cost": self.cost}


class Rules:
    def __init__(self, doc):
        if not isinstance(doc, dict) or not isinstance(doc.get("routes"), list):
            raise ValueError('the rules file must be an object with a "routes" list')
        n = doc.get("instances", 1)
        if type(n) is not int or not 1 <= n <= 10000:
            raise ValueError("instances must be an integer from 1 to 10000")
        self.instances = n
        self.routes = [Route(d) for d in doc["routes"]]
        names = [r.name for r in self.routes]
        if len(set(names)) != len(names):
            raise ValueError("route names must be unique")

    def route_for(self, method, path):
        return next((r for r in self.routes if r.fits(method, path)), None)


class RulesFile:
    """Holds the current rules; a thread re-reads the file when it changes."""

    def __init__(self, path, stats, poll_s=0.2):
        self.path = path
        self.stats = stats
        self.sig = None
        self.bad_sig = None
        self.rules = None
        self.reload(initial=True)
        t = threading.Thread(target=self._watch, args=(poll_s,), daemon=True)
        t.start()

    def _signature(self):
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, initial=False):
        try:
            sig = self._signature()
            if sig in (self.sig, self.bad_sig):
                return
            with open(self.path, encoding="utf-8") as f:
                rules = Rules(json.load(f))
        except (OSError, ValueError, RecursionError) as e:
            if initial:
                raise SystemExit(f"rules file {self.path}: {e}") from e
            if not isinstance(e, OSError):
                self.bad_sig = sig          # report each bad version once
                self.stats.incr("rules_errors")
                log(f"rules file {self.path} ignored, keeping the previous rules: {e}")
            return
        self.sig = sig
        self.rules = rules
        self.stats.incr("rules_loads")
        log(f"rules loaded: {', '.join(r.name for r in rules.routes)} "
            f"(instances {rules.instances})")

    def _watch(self, poll_s):
        while True:
            time.sleep(poll_s)
            try:
                self.reload()
            except Exception as e:   # never let the watcher die
                log(f"rules watcher: {type(e).__name__}: {e}")


# -------------------------------------------------------------- limiters

class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {k: 0 for k in ("requests", "granted", "denied", "unlimited",
                                 "redis_decisions", "fallbacks", "redis_errors",
                                 "upstream_errors", "rules_loads", "rules_errors")}

    def incr(self, k, n=1):
        with self.lock:
            self.c[k] = self.c.get(k, 0) + n

    def snapshot(self):
        with self.lock:
            return dict(self.c)


class Limiter:
    """The library's RateLimit (backend chosen once, breaker, panic limits)
    and one limiter per route version."""

    def __init__(self, url, timeout_ms, retry_ms, stats, backend="auto", lease_batch=0):
        self.rl = rrl.RateLimit.from_url(
            url, timeout_ms=timeout_ms, backend=backend,
            breaker=rrl.Breaker(failures=1, open_ms=retry_ms))
        self.lease_batch = lease_batch
        self.stats = stats
        self.lock = threading.Lock()
        self.limiters = {}    # (route name, signature, instances) -> Limiter

    def redis_up(self):
        return self.rl.breaker.state == "closed"

    def decide(self, key, route, instances):
        k = (route.name, route.signature, instances)
        lim = self.limiters.get(k)
        if lim is None:
            with self.lock:
                if len(self.limiters) > 1000:    # rules changed many times
                    self.limiters.clear()
                panic = rrl.Panic(instances=instances)
                lim = self.limiters.get(k)
                if lim is None:
                    lim = self.limiters[k] = (
                        self.rl.leased(route.policy, batch=self.lease_batch, panic=panic)
                        if self.lease_batch else self.rl.limiter(route.policy, panic=panic))
        before = self.rl.breaker.state
        d = lim.limit(key, cost=route.cost)
        if d.source == "panic":
            self.stats.incr("fallbacks")
            if before == "closed":
                log(f"redis unavailable; panic limits for {self.rl.breaker.open_s * 1000:.0f} ms")
        else:
            self.stats.incr("redis_decisions")
        return d


# ------------------------------------------------------------------- HTTP

def caller_id(headers, client_addr):
    api_key = headers.get("X-Api-Key")
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode("utf-8", "replace")).hexdigest()[:32]
    return "ip:" + client_addr


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rl-gateway-py"
    # The head and the body go out in two writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK of the head, 40 ms on Linux, on
    # every keep-alive request after the first.
    disable_nagle_algorithm = True
    timeout = 60   # seconds a client connection may sit idle
    # set by main(): rules, limiter, stats, upstream (host, port)

    def log_message(self, fmt, *args):   # no access log
        pass

    def send(self, status, headers, body):
        self.send_response_only(status)
        names = {k.lower() for k, _ in headers}
        if "date" not in names:          # keep the upstream's Date and Server
            self.send_header("Date", self.date_time_string())
        if "server" not in names:
            self.send_header("Server", self.server_version)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self):
        path = urllib.parse.urlsplit(self.path).path or "/"
        if path == STATS_PATH and self.command == "GET":
            return self.stats_page()
        self.stats.incr("requests")
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return self.problem(411, "Length Required", "send a Content-Length body")
        try:
            n = int(length or 0)
            if n < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            return self.problem(400, "Bad Request", "bad Content-Length")
        if n > MAX_BODY:
            self.close_connection = True
            return self.problem(413, "Content Too Large", f"at most {MAX_BODY} bytes")
        body = self.rfile.read(n)

        rules = self.rules.rules
        route = rules.route_for(self.command, path)
        extra = []
        if route is not None:
            key = f"rl:{{{caller_id(self.headers, self.client_address[0])}}}:{route.name}"
            d = self.limiter.decide(key, route, rules.instances)
            extra = list(rrl.headers(d).items())
            if not d.allowed:
                self.stats.incr("denied")
                return self.denied(route, d, extra)
            self.stats.incr("granted")
        else:
            self.stats.incr("unlimited")
        self.forward(body, extra)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any

    def forward(self, body, extra):
        host, port = self.upstream
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        prior = self.headers.get("X-Forwarded-For")
        client = self.client_address[0]
        headers["X-Forwarded-For"] = f"{prior}, {client}" if prior else client
        if self.headers.get("Host"):
            headers["X-Forwarded-Host"] = self.headers["Host"]
        conn = http.client.HTTPConnection(host, port, timeout=30)
        try:
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
        except (OSError, http.client.HTTPException) as e:
            self.stats.incr("upstream_errors")
            return self.problem(502, "Bad Gateway", f"upstream failed: {type(e).__name__}",
                                extra)
        finally:
            conn.close()
        self.send(resp.status, out + extra, data)

    def denied(self, route, d, extra):
        doc = rrl.problem(d, instance=urllib.parse.urlsplit(self.path).path)
        doc.update({"policy": route.name, "limit": d.limit, "remaining": d.remaining,
                    "retry_after_ms": d.retry_after_ms})
        self.send(429, [("Content-Type", "application/problem+json"), *extra],
                  json.dumps(doc).encode())

    def problem(self, status, title, detail, headers=(), ext=None):
        doc = {"type": "about:blank", "title": title, "status": status,
               "detail": detail, "instance": urllib.parse.urlsplit(self.path).path}
        doc.update(ext or {})
        body = json.dumps(doc).encode()
        self.send(status, [("Content-Type", "application/problem+json"), *headers], body)

    def stats_page(self):
        doc = self.stats.snapshot()
        doc["redis_errors"] = self.limiter.rl.metrics()["failures"]
        doc["limiter"] = self.limiter.rl.metrics()   # the client library's counters
        rules = self.rules.rules
        doc.update({
            "redis": "up" if self.limiter.redis_up() else "down",
            "instances": rules.instances,
            "routes": [r.describe() for r in rules.routes],
        })
        self.send(200, [("Content-Type", "application/json")], json.dumps(doc).encode())


class Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a burst of new connections
    # overflows it and the kernel drops their SYNs, which the clients resend
    # after 1 s (then 3 s).
    request_queue_size = 1024


def main():
    ap = argparse.ArgumentParser(description="Rate-limiting HTTP gateway (redis-ratelimit example)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--upstream", default="http://127.0.0.1:9000")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--rules", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "..", "rules.json"))
    ap.add_argument("--redis-timeout-ms", type=int, default=50,
                    help="give up on a Redis call after this long (default 50)")
    ap.add_argument("--redis-retry-ms", type=int, default=500,
                    help="after a failure, use local limits this long before trying Redis "
                         "again (default 500)")
    ap.add_argument("--backend", choices=("auto", "module", "lua"), default="auto",
                    help="the module's RL.* commands, their Lua twins (EVALSHA), or whichever "
                         "the server has (default auto)")
    ap.add_argument("--lease-batch", type=int, default=0,
                    help="decide from local reservoirs leased this many units at a time "
                         "(the library's leased limiter); 0: one shared call per request "
                         "(default 0)")
    opts = ap.parse_args()
    if opts.lease_batch < 0:
        raise SystemExit("--lease-batch must be 0 or more")

    up = urllib.parse.urlsplit(opts.upstream)
    if up.scheme != "http" or not up.hostname:
        raise SystemExit("--upstream must be http://host:port")
    stats = Stats()
    Handler.stats = stats
    Handler.rules = RulesFile(opts.rules, stats)
    Handler.limiter = Limiter(opts.redis, opts.redis_timeout_ms, opts.redis_retry_ms, stats,
                              opts.backend, opts.lease_batch)
    Handler.upstream = (up.hostname, up.port or 80)
    server = Server((opts.host, opts.port), Handler)
    server.daemon_threads = True
    log(f"listening on http://{opts.host}:{server.server_address[1]} -> {opts.upstream}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
