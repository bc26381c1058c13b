#!/usr/bin/env python3
"""A trivial upstream for the gateway: answers every request with a small
JSON echo of what it received.  python3 upstream.py --port 9000"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and the body go out in two writes: with Nagle's algorithm the
    # body waits for the client's delayed ACK of the head, 40 ms on Linux, on
    # every keep-alive request after the first.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        doc = {
            "upstream": "python",
            "method": self.command,
            "path": self.path,
            "body_bytes": len(body),
            "x_forwarded_for": self.headers.get("X-Forwarded-For"),
            "api_key_seen": self.headers.get("X-Api-Key") is not None,
        }
        out = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Upstream", "python")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = answer


class Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: a burst of new connections
    # overflows it and the kernel drops their SYNs, which the clients resend
    # after 1 s (then 3 s).
    request_queue_size = 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9000)
    opts = ap.parse_args()
    server = Server((opts.host, opts.port), Echo)
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
