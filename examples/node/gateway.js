#!/usr/bin/env node
// A small rate-limiting HTTP gateway in front of one upstream.
//
// Node's http module, ioredis and the project's client library
// redis-ratelimit (clients/node, linked by `npm ci`). One shared call per
// request (the module's RL.* commands, or its Lua twins where the module is
// not loaded); state is shared by every gateway instance (Python or Node)
// through Redis.
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
// * Granted: forwarded; the response carries the library's headers():
//   RateLimit-Policy, RateLimit, X-RateLimit-Limit/-Remaining/-Reset.
// * Denied: 429 with Retry-After and the library's problem+json body.
// * Redis down or slower than --redis-timeout-ms: the library's circuit
//   breaker opens and its panic limits decide: a local token bucket per
//   caller holding the route's limit divided by the number of gateway
//   instances ("instances" in the rules file), counted as a fallback. After
//   --redis-retry-ms one probe call goes to Redis; once it answers, the
//   gateway is back on the shared limit.
// * GET /_gateway/stats: counters as JSON (not forwarded, not limited).
import fs from "node:fs";
import http from "node:http";
import path from "node:path";
import { fileURLToPath } from "node:url";
import Redis from "ioredis";
import {
  RateLimit, Panic, tokenBucket, slidingLog, slidingCounter, makeKey, headers, problem,
} from "redis-ratelimit";
import { callerId } from "redis-ratelimit/express";

const POLICIES = {
  tokenbucket: (d, int) => tokenBucket(d.name, int("capacity"), int("rate"), int("period_ms")),
  slidinglog: (d, int) => slidingLog(d.name, int("limit"), int("window_ms")),
  slidingcounter: (d, int) => slidingCounter(d.name, int("limit"), int("window_ms")),
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
  if (!Object.prototype.hasOwnProperty.call(POLICIES, d.algorithm)) {
    throw new Error(`route "${name}": algorithm must be one of ${Object.keys(POLICIES).join(", ")}`);
  }
  const policy = POLICIES[d.algorithm](d, integer);
  const cost = d.cost === undefined ? 1 : integer("cost");
  if (cost > policy.limit) throw new Error(`route "${name}": cost is above the limit`);
  return {
    name,
    match: d.match,
    methods: d.methods === undefined ? null : new Set(d.methods.map((m) => m.toUpperCase())),
    algorithm: d.algorithm,
    policy,
    cost,
    limiter: null,
  };
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
  constructor(file, stats, makeLimiter, pollMs = 200) {
    this.file = file;
    this.makeLimiter = makeLimiter;
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
    for (const r of rules.routes) r.limiter = this.makeLimiter(r, rules.instances);
    this.sig = sig;
    this.rules = rules;
    this.stats.rules_loads += 1;
    log(`rules loaded: ${rules.routes.map((r) => r.name).join(", ")} (instances ${rules.instances})`);
  }

  routeFor(method, p) {
    return this.rules.routes.find((r) => routeFits(r, method, p)) || null;
  }
}

// ------------------------------------------------------------------- HTTP

function clientAddress(req) {
  const a = req.socket.remoteAddress || "unknown";
  return a.startsWith("::ffff:") ? a.slice(7) : a; // IPv4-mapped: plain IPv4
}

function sendJson(res, status, type, doc, headers = {}) {
  const body = Buffer.from(JSON.stringify(doc));
  res.writeHead(status, { ...headers, "Content-Type": type, "Content-Length": body.length });
  res.end(body);
}

function errorProblem(req, res, status, title, detail, headers = {}) {
  const doc = { type: "about:blank", title, status, detail, instance: req.url.split("?")[0] };
  sendJson(res, status, "application/problem+json", doc, headers);
}

function denied(req, res, d, extra) {
  req.resume(); // discard any request body
  const doc = {
    ...problem(d, req.url.split("?")[0]),
    policy: d.policy, limit: d.limit, remaining: d.remaining, retry_after_ms: d.retryAfterMs,
  };
  sendJson(res, 429, "application/problem+json", doc, extra);
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
      errorProblem(req, res, 502, "Bad Gateway", `upstream failed: ${e.message}`, extra);
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
    rules: path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "rules.json"),
    "redis-timeout-ms": 50,
    "redis-retry-ms": 500,
    backend: "auto", // auto | module | lua (EVALSHA of the Lua twins)
    "lease-batch": 0, // > 0: the library's leased limiter with batches of this many units
  };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, "");
    if (!(k in opts) || argv[i + 1] === undefined) {
      log(`usage: node gateway.js [--host H] [--port N] [--upstream URL] [--redis URL] ` +
        `[--rules FILE] [--redis-timeout-ms N] [--redis-retry-ms N] [--backend auto|module|lua] ` +
        `[--lease-batch N]`);
      process.exit(2);
    }
    opts[k] = argv[i + 1];
  }
  for (const k of ["port", "redis-timeout-ms", "redis-retry-ms", "lease-batch"]) opts[k] = Number(opts[k]);
  if (!["auto", "module", "lua"].includes(opts.backend) ||
      !Number.isSafeInteger(opts["lease-batch"]) || opts["lease-batch"] < 0) {
    log("--backend is auto, module or lua; --lease-batch an integer >= 0");
    process.exit(2);
  }
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
  const timeoutMs = opts["redis-timeout-ms"];
  const redis = new Redis(opts.redis, {
    connectTimeout: Math.max(timeoutMs, 500),
    enableOfflineQueue: false, // fail at once while disconnected, never queue
    maxRetriesPerRequest: 0,
    retryStrategy: (times) => Math.min(times * 50, opts["redis-retry-ms"]), // keep reconnecting
  });
  let redisErrorLogged = false;
  redis.on("error", (e) => {
    if (!redisErrorLogged) log(`redis: ${e.message}`);
    redisErrorLogged = true;
  });
  redis.on("ready", () => { redisErrorLogged = false; });
  // Every call bounded by the timeout; one failure opens the breaker for
  // --redis-retry-ms, then one probe decides whether Redis is back.
  const rl = new RateLimit(redis, {
    timeoutMs,
    backend: opts.backend,
    breaker: { failures: 1, openMs: opts["redis-retry-ms"], latencyBudgetMs: timeoutMs },
  });
  rl.breaker.onChange = (state) => {
    if (state === "open") log(`redis unavailable; panic limits for ${opts["redis-retry-ms"]} ms`);
    else if (state === "closed") log("redis answers again: shared limits");
  };
  const batch = opts["lease-batch"];
  const rulesFile = new RulesFile(opts.rules, stats, (route, instances) => (batch > 0
    ? rl.leased(route.policy, { batch, panic: new Panic({ instances }) })
    : rl.limiter(route.policy, { panic: new Panic({ instances }) })));

  const server = http.createServer((req, res) => {
    handle(req, res).catch((e) => {
      log(`request failed: ${e.stack || e}`);
      if (!res.headersSent) errorProblem(req, res, 500, "Internal Server Error", "the gateway failed");
      else res.destroy();
    });
  });

  async function handle(req, res) {
    const p = req.url.split("?")[0] || "/";
    if (p === STATS_PATH && req.method === "GET") {
      const rules = rulesFile.rules;
      sendJson(res, 200, "application/json", {
        ...stats,
        redis_errors: rl.metrics().failures,
        limiter: rl.metrics(), // the client library's counters (DESIGN.md, "Metrics")
        redis: rl.breaker.state === "closed" ? "up" : "down",
        backend: rl.backend,
        instances: rules.instances,
        routes: rules.routes.map((r) => ({
          name: r.name, match: r.match, algorithm: r.algorithm, limit: r.policy.limit,
          window_ms: r.policy.windowMs, cost: r.cost,
        })),
      });
      return;
    }
    stats.requests += 1;
    const route = rulesFile.routeFor(req.method, p);
    let extra = {};
    if (route) {
      const d = await route.limiter.limit(makeKey(callerId(req), route.name), { cost: route.cost });
      if (d.source === "panic") stats.fallbacks += 1;
      else stats.redis_decisions += 1;
      extra = headers(d);
      if (!d.allowed) {
        stats.denied += 1;
        denied(req, res, d, extra);
        return;
      }
      stats.granted += 1;
    } else {
      stats.unlimited += 1;
    }
    forward(req, res, upstream, extra, stats);
  }

  // Give the first Redis connection a moment before taking traffic; if Redis
  // is down at start, serve anyway on the panic limits.
  const ready = new Promise((resolve) => {
    redis.once("ready", resolve);
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
