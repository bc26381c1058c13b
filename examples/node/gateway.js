#!/usr/bin/env node
// A small rate-limiting HTTP gateway in front of one upstream.
//
// Node's http module plus ioredis (`npm ci`). One RL.* call per request;
// state is shared by every gateway instance (Python or Node) through Redis.
//
//   node gateway.js --port 8080 --upstream http://127.0.0.1:9000 \
//       --redis redis://127.0.0.1:6379/0 --rules ../rules.json
//
// * Caller: the X-Api-Key header (hashed before it goes into a Redis key), or
//   the client's address when there is none. The gateway only identifies
//   callers; authenticate them in front of it or upstream.
// * Policy: the first route in the rules file whose "match" prefix fits the
//   path (and whose "methods", if given, include the method). Paths that no
//   route matches are forwarded unlimited. The file is re-read when it
//   changes; a file that does not parse or validate is ignored (the previous
//   rules stay) and counted in the stats.
// * Granted: forwarded; the response carries X-RateLimit-Limit,
//   X-RateLimit-Remaining, RateLimit and RateLimit-Policy.
// * Denied: 429 with Retry-After and an application/problem+json body.
// * Redis down or slower than --redis-timeout-ms: the request is decided by a
//   local in-process token bucket holding the route's limit divided by the
//   number of gateway instances ("instances" in the rules file), counted as a
//   fallback. Redis is tried again --redis-retry-ms after the failure; when it
//   answers, the gateway is back on the shared limit.
// * GET /_gateway/stats: counters as JSON (not forwarded, not limited).
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const http = require("http");
const path = require("path");
const Redis = require("ioredis");

const COMMANDS = {
  tokenbucket: "RL.TOKENBUCKET",
  slidinglog: "RL.SLIDINGLOG",
  slidingcounter: "RL.SLIDINGCOUNTER",
};
const NAME_RE = /^[A-Za-z0-9._-]{1,64}$/;
const HOP_BY_HOP = new Set([
  "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
  "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
]);
const STATS_PATH = "/_gateway/stats";

function log(msg) {
  process.stderr.write(`gateway[${process.pid}]: ${msg}\n`);
}

// ⌈a / b⌉ for non-negative safe integers, exact.
function ceilDiv(a, b) {
  return Number((BigInt(a) + BigInt(b) - 1n) / BigInt(b));
}

// ------------------------------------------------------------------ rules

function parseRoute(d) {
  const name = d && d.name;
  const integer = (field) => {
    const v = d[field];
    if (!Number.isSafeInteger(v) || v < 1) {
      throw new Error(`route ${JSON.stringify(name)}: ${field} must be an integer from 1 to 2^53-1`);
    }
    return v;
  };
  if (typeof name !== "string" || !NAME_RE.test(name)) {
    throw new Error(`route name ${JSON.stringify(name)}: 1-64 of A-Z a-z 0-9 . _ -`);
  }
  if (typeof d.match !== "string" || !d.match.startsWith("/")) {
    throw new Error(`route "${name}": match must be a path starting with /`);
  }
  if (d.methods !== undefined &&
      (!Array.isArray(d.methods) || !d.methods.every((m) => typeof m === "string"))) {
    throw new Error(`route "${name}": methods must be a list of strings`);
  }
  if (!Object.prototype.hasOwnProperty.call(COMMANDS, d.algorithm)) {
    throw new Error(`route "${name}": algorithm must be one of ${Object.keys(COMMANDS).join(", ")}`);
  }
  const r = {
    name,
    match: d.match,
    methods: d.methods === undefined ? null : new Set(d.methods.map((m) => m.toUpperCase())),
    algorithm: d.algorithm,
  };
  if (d.algorithm === "tokenbucket") {
    r.limit = integer("capacity");
    r.rate = integer("rate");
    r.periodMs = integer("period_ms");
    r.args = [r.limit, r.rate, r.periodMs];
    // Time for an empty bucket to fill: the policy's window.
    r.windowMs = Number((BigInt(r.limit) * BigInt(r.periodMs) + BigInt(r.rate) - 1n) / BigInt(r.rate));
  } else {
    r.limit = integer("limit");
    r.windowMs = integer("window_ms");
    r.rate = r.limit;
    r.periodMs = r.windowMs;
    r.args = [r.limit, r.windowMs];
  }
  r.cost = d.cost === undefined ? 1 : integer("cost");
  if (r.cost > r.limit) throw new Error(`route "${name}": cost is above the limit`);
  return r;
}

function parseRules(doc) {
  if (!doc || typeof doc !== "object" || !Array.isArray(doc.routes)) {
    throw new Error('the rules file must be an object with a "routes" list');
  }
  const instances = doc.instances === undefined ? 1 : doc.instances;
  if (!Number.isSafeInteger(instances) || instances < 1 || instances > 10000) {
    throw new Error("instances must be an integer from 1 to 10000");
  }
  const routes = doc.routes.map(parseRoute);
  if (new Set(routes.map((r) => r.name)).size !== routes.length) {
    throw new Error("route names must be unique");
  }
  return { instances, routes };
}

function routeFits(r, method, p) {
  if (r.methods && !r.methods.has(method)) return false;
  return p === r.match || p.startsWith(r.match.endsWith("/") ? r.match : r.match + "/");
}

class RulesFile {
  constructor(file, stats, pollMs = 200) {
    this.file = file;
    this.stats = stats;
    this.sig = null;
    this.badSig = null;
    this.rules = null;
    this.reload(true);
    setInterval(() => this.reload(false), pollMs);
  }

  reload(initial) {
    let sig;
    let rules;
    try {
      const st = fs.statSync(this.file, { bigint: true });
      sig = `${st.mtimeNs}:${st.size}:${st.ino}`;
      if (sig === this.sig || sig === this.badSig) return;
      rules = parseRules(JSON.parse(fs.readFileSync(this.file, "utf8")));
    } catch (e) {
      if (initial) {
        log(`rules file ${this.file}: ${e.message}`);
        process.exit(2);
      }
      if (e.code === undefined) { // not a file-system error: a bad version
        this.badSig = sig; // report each bad version once
        this.stats.rules_errors += 1;
        log(`rules file ${this.file} ignored, keeping the previous rules: ${e.message}`);
      }
      return;
    }
    this.sig = sig;
    this.rules = rules;
    this.stats.rules_loads += 1;
    log(`rules loaded: ${rules.routes.map((r) => r.name).join(", ")} (instances ${rules.instances})`);
  }

  routeFor(method, p) {
    return this.rules.routes.find((r) => routeFits(r, method, p)) || null;
  }
}

// --------------------------------------------------------------- limiters

// In-process fallback: one token bucket per key holding 1/instances of the
// route's limit, refilled at 1/instances of its rate. Only approximate (a
// window limit becomes a bucket), but it keeps the whole fleet near the
// shared limit while Redis is away.
class LocalLimiter {
  constructor(maxKeys = 100000) {
    this.buckets = new Map(); // key -> {tokens, last}
    this.maxKeys = maxKeys;
  }

  decide(key, route, instances) {
    const cap = Math.max(1, Math.floor(route.limit / instances));
    const msPerToken = (route.periodMs * instances) / route.rate;
    const now = performance.now();
    const b = this.buckets.get(key) || { tokens: cap, last: now };
    this.buckets.delete(key); // re-inserted below: the Map stays in last-use order
    let tokens = Math.min(cap, b.tokens + (now - b.last) / msPerToken);
    const cost = Math.min(route.cost, cap);
    const allowed = tokens >= cost;
    if (allowed) tokens -= cost;
    if (this.buckets.size >= this.maxKeys) {
      this.buckets.delete(this.buckets.keys().next().value);
    }
    this.buckets.set(key, { tokens, last: now });
    return {
      allowed,
      limit: cap,
      remaining: Math.floor(tokens),
      retryMs: allowed ? 0 : Math.ceil((cost - tokens) * msPerToken),
      resetMs: Math.ceil((cap - tokens) * msPerToken),
      source: "local",
    };
  }
}

class Limiter {
  constructor(url, timeoutMs, retryMs, stats) {
    this.redis = new Redis(url, {
      commandTimeout: timeoutMs, // a strict timeout on every call
      connectTimeout: Math.max(timeoutMs, 500),
      enableOfflineQueue: false, // fail at once while disconnected, never queue
      maxRetriesPerRequest: 0,
      retryStrategy: (times) => Math.min(times * 50, retryMs), // keep reconnecting
    });
    this.redisErrorLogged = false;
    this.redis.on("error", (e) => {
      if (!this.redisErrorLogged) log(`redis: ${e.message}`);
      this.redisErrorLogged = true;
    });
    this.redis.on("ready", () => {
      this.redisErrorLogged = false;
    });
    this.retryMs = retryMs;
    this.downUntil = 0; // performance.now() ms; while in the future, skip Redis
    this.local = new LocalLimiter();
    this.stats = stats;
  }

  redisUp() {
    return performance.now() >= this.downUntil;
  }

  async decide(key, route, instances) {
    if (this.redisUp()) {
      try {
        const reply = await this.redis.call(COMMANDS[route.algorithm], key, ...route.args, "COST", route.cost);
        if (!Array.isArray(reply) || reply.length !== 5) throw new Error("unexpected reply");
        const [allowed, limit, remaining, retryMs, resetMs] = reply.map(Number);
        this.stats.redis_decisions += 1;
        return { allowed: allowed === 1, limit, remaining, retryMs, resetMs, source: "redis" };
      } catch (e) {
        // Down, slow (timeout), or answering errors (module not loaded,
        // wrong type): fail open to the local limiter for a while.
        this.downUntil = performance.now() + this.retryMs;
        this.stats.redis_errors += 1;
        log(`redis call failed (${e.message}); local limits for ${this.retryMs} ms`);
      }
    }
    this.stats.fallbacks += 1;
    return this.local.decide(key, route, instances);
  }
}

// ------------------------------------------------------------------- HTTP

function callerId(req) {
  const apiKey = req.headers["x-api-key"];
  if (apiKey) {
    return "key:" + crypto.createHash("sha256").update(apiKey, "utf8").digest("hex").slice(0, 32);
  }
  return "ip:" + clientAddress(req);
}

function clientAddress(req) {
  const a = req.socket.remoteAddress || "unknown";
  return a.startsWith("::ffff:") ? a.slice(7) : a; // IPv4-mapped: plain IPv4
}

function rateLimitHeaders(route, d) {
  return {
    "X-RateLimit-Limit": String(d.limit),
    "X-RateLimit-Remaining": String(d.remaining),
    RateLimit: `"${route.name}";r=${d.remaining};t=${ceilDiv(d.resetMs, 1000)}`,
    "RateLimit-Policy": `"${route.name}";q=${d.limit};w=${ceilDiv(route.windowMs, 1000)}`,
  };
}

function sendJson(res, status, type, doc, headers = {}) {
  const body = Buffer.from(JSON.stringify(doc));
  res.writeHead(status, { ...headers, "Content-Type": type, "Content-Length": body.length });
  res.end(body);
}

function problem(req, res, status, title, detail, headers = {}, ext = {}) {
  const doc = { type: "about:blank", title, status, detail, instance: req.url.split("?")[0], ...ext };
  sendJson(res, status, "application/problem+json", doc, headers);
}

function denied(req, res, route, d, extra) {
  const headers = { ...extra };
  let detail;
  if (d.retryMs >= 0) {
    headers["Retry-After"] = String(ceilDiv(d.retryMs, 1000));
    detail = `Rate limit '${route.name}' exceeded (${d.limit} per ${route.windowMs / 1000} s); ` +
      `retry in ${ceilDiv(d.retryMs, 1000)} s.`;
  } else {
    detail = `This request costs more than the '${route.name}' limit allows.`;
  }
  req.resume(); // discard any request body
  problem(req, res, 429, "Too Many Requests", detail, headers,
    { policy: route.name, limit: d.limit, remaining: d.remaining, retry_after_ms: d.retryMs });
}

function forward(req, res, upstream, extra, stats) {
  const headers = {};
  for (const [k, v] of Object.entries(req.headers)) {
    if (!HOP_BY_HOP.has(k)) headers[k] = v;
  }
  const prior = req.headers["x-forwarded-for"];
  headers["x-forwarded-for"] = prior ? `${prior}, ${clientAddress(req)}` : clientAddress(req);
  if (req.headers.host) headers["x-forwarded-host"] = req.headers.host;
  const up = http.request(
    { host: upstream.hostname, port: upstream.port || 80, method: req.method, path: req.url, headers, timeout: 30000 },
    (ures) => {
      const out = {};
      for (const [k, v] of Object.entries(ures.headers)) {
        if (!HOP_BY_HOP.has(k)) out[k] = v;
      }
      res.writeHead(ures.statusCode, { ...out, ...extra });
      ures.pipe(res);
    },
  );
  up.on("timeout", () => up.destroy(new Error("upstream timeout")));
  up.on("error", (e) => {
    stats.upstream_errors += 1;
    if (res.headersSent) {
      res.destroy();
    } else {
      problem(req, res, 502, "Bad Gateway", `upstream failed: ${e.message}`, extra);
    }
  });
  req.pipe(up);
}

function parseArgs(argv) {
  const opts = {
    host: "127.0.0.1",
    port: 8080,
    upstream: "http://127.0.0.1:9000",
    redis: "redis://127.0.0.1:6379/0",
    rules: path.join(__dirname, "..", "rules.json"),
    "redis-timeout-ms": 50,
    "redis-retry-ms": 500,
  };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, "");
    if (!(k in opts) || argv[i + 1] === undefined) {
      log(`usage: node gateway.js [--host H] [--port N] [--upstream URL] [--redis URL] ` +
        `[--rules FILE] [--redis-timeout-ms N] [--redis-retry-ms N]`);
      process.exit(2);
    }
    opts[k] = argv[i + 1];
  }
  for (const k of ["port", "redis-timeout-ms", "redis-retry-ms"]) opts[k] = Number(opts[k]);
  return opts;
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const upstream = new URL(opts.upstream);
  if (upstream.protocol !== "http:") {
    log("--upstream must be http://host:port");
    process.exit(2);
  }
  const stats = {
    requests: 0, granted: 0, denied: 0, unlimited: 0, redis_decisions: 0, fallbacks: 0,
    redis_errors: 0, upstream_errors: 0, rules_loads: 0, rules_errors: 0,
  };
  const rulesFile = new RulesFile(opts.rules, stats);
  const limiter = new Limiter(opts.redis, opts["redis-timeout-ms"], opts["redis-retry-ms"], stats);

  const server = http.createServer((req, res) => {
    handle(req, res).catch((e) => {
      log(`request failed: ${e.stack || e}`);
      if (!res.headersSent) problem(req, res, 500, "Internal Server Error", "the gateway failed");
      else res.destroy();
    });
  });

  async function handle(req, res) {
    const p = req.url.split("?")[0] || "/";
    if (p === STATS_PATH && req.method === "GET") {
      const rules = rulesFile.rules;
      sendJson(res, 200, "application/json", {
        ...stats,
        redis: limiter.redisUp() ? "up" : "down",
        instances: rules.instances,
        routes: rules.routes.map((r) => ({
          name: r.name, match: r.match, algorithm: r.algorithm, limit: r.limit, window_ms: r.windowMs, cost: r.cost,
        })),
      });
      return;
    }
    stats.requests += 1;
    const rules = rulesFile.rules;
    const route = rulesFile.routeFor(req.method, p);
    let extra = {};
    if (route) {
      const key = `rl:{${callerId(req)}}:${route.name}`;
      const d = await limiter.decide(key, route, rules.instances);
      extra = rateLimitHeaders(route, d);
      if (!d.allowed) {
        stats.denied += 1;
        denied(req, res, route, d, extra);
        return;
      }
      stats.granted += 1;
    } else {
      stats.unlimited += 1;
    }
    forward(req, res, upstream, extra, stats);
  }

  // Give the first Redis connection a moment before taking traffic; if Redis
  // is down at start, serve anyway on the local limits.
  const ready = new Promise((resolve) => {
    limiter.redis.once("ready", resolve);
    setTimeout(resolve, 2000);
  });
  ready.then(() => server.listen(opts.port, opts.host, () => {
    log(`listening on http://${opts.host}:${server.address().port} -> ${opts.upstream}`);
  }));
  const stop = () => server.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main();
