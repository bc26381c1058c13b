#!/usr/bin/env node
// Open-loop HTTP load at a fixed rate, for the edge bench (bench/edge/edge.py).
//
// Request i is due at t0 + i/rate whatever happened to the earlier ones, and
// its latency is measured from that due time, not from when a socket was free
// to send it: a stall of the server shows up in every request that was due
// during it (no coordinated omission). A request finds an idle keep-alive
// connection or opens a new one (up to --max-sockets; beyond that it waits in
// the agent's queue, and the wait counts in its latency).
//
//   node load.js --url http://127.0.0.1:8080 --rate 800 --duration 10 --out recs.csv
//   node load.js --url ... --closed 16 --duration 3     (closed loop: capacity)
//
// Traffic: --tenants N callers drawn from a Zipf(s = --zipf) law, sent as
// X-Api-Key "t<rank>", plus one abusive caller "abuser" getting exactly
// --abuse-rate of the requests per second. --path is the request path; with
// --control-every K, every K-th request of the mix goes to --control-path
// instead (one no rule limits: the same gateway at the same moments, without
// the limiter, to compare against).
// --out: one line per request "due_ms,latency_ms,status,kind,limit,lag_ms" (kind 0
// the mix, 1 the abusive tenant, 2 control; status
// 0: no answer within --timeout-ms of its due time; -1: connection error; limit: the
// X-RateLimit-Limit header, which tells panic decisions apart when the panic
// limit differs from the shared one; lag: how late the generator itself sent
// it, its own share of the latency). stdout: a JSON summary.
import fs from "node:fs";
import http from "node:http";
import { performance } from "node:perf_hooks";

function args(argv) {
  const o = {
    url: "http://127.0.0.1:8080", path: "/api/items", rate: 500, duration: 10, closed: 0,
    tenants: 10000, zipf: 1.0, "abuse-rate": 0, "timeout-ms": 2000, "max-sockets": 256,
    out: "", seed: 1, "control-path": "", "control-every": 0,
  };
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, "");
    if (!(k in o) || argv[i + 1] === undefined) throw new Error(`unknown or empty option ${argv[i]}`);
    o[k] = typeof o[k] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  return o;
}

// A small deterministic PRNG (mulberry32): the same seed, the same tenants.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function zipfSampler(n, s, rand) {
  const cdf = new Float64Array(n);
  let acc = 0;
  for (let k = 1; k <= n; k++) { acc += 1 / Math.pow(k, s); cdf[k - 1] = acc; }
  return () => {
    const x = rand() * acc;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo + 1;
  };
}

const o = args(process.argv.slice(2));
const base = new URL(o.url);
const agent = new http.Agent({ keepAlive: true, maxSockets: o["max-sockets"] });
const rand = rng(o.seed);
const zipf = zipfSampler(o.tenants, o.zipf, rand);
const lines = [];
let T0 = 0; // performance.now() at the start: due times are written relative to it
let inflight = 0;
let done = 0;
const counts = { ok: 0, denied: 0, s5xx: 0, other: 0, timeouts: 0, errors: 0 };

// kind: 0 a tenant of the Zipf mix, 1 the abusive tenant, 2 a control request
// (a tenant of the mix on --control-path, which no rule limits)
function fire(due, kind, cb) {
  inflight += 1;
  const lag = performance.now() - due; // how late this generator sent it (its own lag)
  let finished = false;
  let timer = null;
  const finish = (status, limit) => {
    if (finished) return;
    finished = true;
    if (timer !== null) clearTimeout(timer);
    inflight -= 1;
    done += 1;
    const lat = performance.now() - due;
    if (status === 200) counts.ok += 1;
    else if (status === 429) counts.denied += 1;
    else if (status >= 500) counts.s5xx += 1;
    else if (status === 0) counts.timeouts += 1;
    else if (status === -1) counts.errors += 1;
    else counts.other += 1;
    if (o.out) lines.push(`${(due - T0).toFixed(3)},${lat.toFixed(3)},${status},${kind},${limit || ""},${lag.toFixed(3)}`);
    if (cb) cb();
  };
  const key = kind === 1 ? "abuser" : `t${zipf()}`;
  const req = http.request({
    host: base.hostname, port: base.port, path: kind === 2 ? o["control-path"] : o.path, method: "GET", agent,
    headers: { "X-Api-Key": key },
  }, (res) => {
    res.on("data", () => {});
    res.on("end", () => finish(res.statusCode, res.headers["x-ratelimit-limit"]));
    res.on("error", () => finish(-1));
  });
  // the deadline counts from the due time: a request still waiting for a
  // socket in the agent's queue times out too
  timer = setTimeout(() => { finish(0); req.destroy(); }, Math.max(0, o["timeout-ms"] - (performance.now() - due)));
  req.on("error", () => finish(-1));
  req.end();
}

function summary(t0, extra) {
  const wall = (performance.now() - t0) / 1000;
  process.stdout.write(JSON.stringify({ ...counts, done, wall_s: wall, rps: done / wall, ...extra }) + "\n");
}

function writeOut(t0) {
  if (!o.out) return;
  fs.writeFileSync(o.out, `# t0_epoch_ms=${(performance.timeOrigin + t0).toFixed(3)}\n` +
    lines.join("\n") + "\n");
}

function openLoop() {
  const total = Math.round(o.rate * o.duration);
  const abuseEvery = o["abuse-rate"] / o.rate; // fraction of requests, spread evenly
  const t0 = performance.now();
  T0 = t0;
  process.stderr.write(`started ${(performance.timeOrigin + t0).toFixed(3)}\n`);
  let sent = 0;
  const tick = () => {
    const now = performance.now();
    const due = Math.min(total, Math.floor(((now - t0) * o.rate) / 1000) + 1);
    while (sent < due) {
      const abusive = Math.floor((sent + 1) * abuseEvery) > Math.floor(sent * abuseEvery);
      const control = !abusive && o["control-every"] > 0 && sent % o["control-every"] === 0;
      fire(t0 + (sent * 1000) / o.rate, abusive ? 1 : control ? 2 : 0, null);
      sent += 1;
    }
    if (sent < total) setTimeout(tick, 1);
    else waitDone();
  };
  const waitDone = () => {
    if (inflight > 0) { setTimeout(waitDone, 5); return; }
    writeOut(t0);
    summary(t0, { rate: o.rate, sockets: Object.values(agent.sockets).reduce((n, a) => n + a.length, 0) });
    agent.destroy();
  };
  tick();
}

function closedLoop() {
  const t0 = performance.now();
  T0 = t0;
  const end = t0 + o.duration * 1000;
  let workers = o.closed;
  let n = 0;
  const abuseEvery = o["abuse-rate"] > 0 && o.rate > 0 ? o["abuse-rate"] / o.rate : 0;
  const next = () => {
    if (performance.now() >= end) {
      workers -= 1;
      if (workers === 0) { summary(t0, { closed: o.closed }); agent.destroy(); }
      return;
    }
    const abusive = Math.floor((n + 1) * abuseEvery) > Math.floor(n * abuseEvery);
    n += 1;
    fire(performance.now(), abusive ? 1 : 0, next);
  };
  for (let i = 0; i < o.closed; i++) next();
}

if (o.closed > 0) closedLoop(); else openLoop();
