#!/usr/bin/env node
// A trivial upstream for the gateway: answers every request with a small
// JSON echo of what it received.  node upstream.js --port 9000
import http from "node:http";

const args = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : dflt;
};

const server = http.createServer((req, res) => {
  let bytes = 0;
  req.on("data", (c) => { bytes += c.length; });
  req.on("end", () => {
    const body = Buffer.from(JSON.stringify({
      upstream: "node",
      method: req.method,
      path: req.url,
      body_bytes: bytes,
      x_forwarded_for: req.headers["x-forwarded-for"] || null,
      api_key_seen: req.headers["x-api-key"] !== undefined,
    }));
    res.writeHead(200, { "Content-Type": "application/json", "X-Upstream": "node", "Content-Length": body.length });
    res.end(req.method === "HEAD" ? undefined : body);
  });
});
server.listen(Number(opt("port", 9000)), opt("host", "127.0.0.1"));
process.on("SIGTERM", () => process.exit(0));
