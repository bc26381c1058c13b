// RateLimit: one Redis client, one backend (module or Lua twins), one
// circuit breaker; the limiters made from it share all three.
import { performance } from 'node:perf_hooks';
import { Backend, BackendError, strictWait } from './backend.js';
import { Breaker, Deadline, PanicBuckets, TIMEOUT, toPanic } from './breaker.js';
import { EMPTY, UnavailableError, UnsupportedError, makeDecision, decodeSingle } from './decision.js';
import { isPolicy, isAllOf, isConcurrency, notARate, checkInt } from './policy.js';
import { assertSameSlot } from './keys.js';
import { LeasedLimiter } from './leased.js';
import { InFlight } from './inflight.js';
import { Reservation } from './reserve.js';

const OPEN = new UnavailableError('circuit breaker open');
// Errors that mean "the server answered": not an availability failure,
// unless the answer says it cannot serve right now.
function isReplyError(e) {
  for (let p = e && Object.getPrototypeOf(e); p && p !== Error.prototype; p = Object.getPrototypeOf(p)) {
    const n = p.constructor && p.constructor.name;
    if (n === 'ReplyError' || n === 'ErrorReply') return true;
  }
  return false;
}
// Our own refusals and programming errors are not Redis failures either.
function isOurs(e) {
  return e instanceof BackendError || e instanceof UnsupportedError || e instanceof TypeError || e instanceof RangeError;
}
const UNAVAILABLE_REPLY = /^(BUSY|LOADING|MASTERDOWN|CLUSTERDOWN|TRYAGAIN|NOREPLICAS|READONLY)\b/;

export class RateLimit {
  constructor(client, { timeoutMs = 5, backend = 'auto', breaker, strict } = {}) {
    if (typeof timeoutMs !== 'number' || !(timeoutMs > 0)) throw new RangeError('timeoutMs must be a number > 0');
    this._backend = new Backend(client, { backend, strict: strictWait(strict, timeoutMs) });
    this.timeoutMs = timeoutMs;
    this.breaker = breaker instanceof Breaker ? breaker : new Breaker(breaker || {});
    this.m = {
      decisionsModule: 0, decisionsLua: 0, decisionsLocal: 0, decisionsPanic: 0, denied: 0,
      calls: 0, failures: 0, leases: 0, leaseTokens: 0, leaseWaits: 0, refunds: 0, refundTokens: 0,
    };
  }

  /** 'module' | 'lua' once known (after detect() or the first call), else null. */
  get backend() { return this._backend.source; }

  /** Find out which backend the server offers (one call, bounded by timeoutMs). */
  async detect() {
    return this.call(() => this._backend.detect());
  }

  limiter(policy, { panic, maxKeys = 10000 } = {}) { return new Limiter(this, policy, toPanic(panic), maxKeys); }

  leased(policy, opts = {}) { return new LeasedLimiter(this, policy, opts); }

  /** An in-flight limit on a concurrency policy: inflight(policy, {renewMs, panic}). */
  inflight(policy, { renewMs, panic } = {}) { return new InFlight(this, policy, renewMs, toPanic(panic)); }

  metrics() {
    const b = this.breaker;
    const be = this._backend;
    return { ...this.m, unreplicated: be.unreplicated, redetects: be.redetects, trips: b.trips, tripsFailures: b.tripsFailures, tripsLatency: b.tripsLatency, probesOk: b.probesOk, probesFailed: b.probesFailed, state: b.state };
  }

  count(d) {
    const m = this.m;
    if (d.source === 'local') m.decisionsLocal++;
    else if (d.source === 'module') m.decisionsModule++;
    else if (d.source === 'lua') m.decisionsLua++;
    else m.decisionsPanic++;
    if (!d.allowed) m.denied++;
    return d;
  }

  /**
   * One Redis call through the breaker, bounded by timeoutMs. Throws
   * UnavailableError when the breaker is open, on a timeout or a lost
   * connection; rethrows error replies (WRONGTYPE, ERR …) as they are.
   * `onLate(reply)` gets a reply that arrived after the timeout.
   */
  call(fn, onLate) {
    const t0 = performance.now();
    const ok = this.breaker.acquire(t0);
    if (ok === 0) return Promise.reject(OPEN);
    const probe = ok === 2;
    this.m.calls++;
    let p;
    try {
      p = Promise.resolve(fn());
    } catch (e) {
      p = Promise.reject(e);
    }
    const timer = new Deadline(this.timeoutMs, true);
    return Promise.race([p, timer.promise]).then((reply) => {
      timer.clear();
      const t1 = performance.now();
      this.breaker.success(t1 - t0, t1, probe);
      return reply;
    }, (e) => {
      timer.clear();
      const t1 = performance.now();
      if (e !== TIMEOUT && ((isReplyError(e) && !UNAVAILABLE_REPLY.test(e.message)) || isOurs(e))) {
        this.breaker.success(t1 - t0, t1, probe); // it answered: it is up
        throw e;
      }
      this.m.failures++;
      this.breaker.failure(t1, probe);
      if (e === TIMEOUT) {
        if (onLate) {
          p.then((r) => {
            try { onLate(r); } catch { /* a malformed late reply: dropped */ }
          }, () => {});
        }
        throw new UnavailableError(`no reply from Redis within ${this.timeoutMs} ms`);
      }
      throw new UnavailableError(`Redis call failed: ${e && e.message}`, e);
    });
  }
}

/** Decides every call on Redis (one call per decision); panic limits while it is unavailable. */
export class Limiter {
  constructor(rl, policy, panic, maxKeys) {
    if (isConcurrency(policy)) throw notARate('limiter()', policy);
    if (!isPolicy(policy) && !isAllOf(policy)) throw new TypeError('limiter needs a policy (tokenBucket, slidingLog, slidingCounter, fixedWindow or allOf)');
    this.rl = rl;
    this.policy = policy;
    this.multi = isAllOf(policy);
    this.panicCfg = panic;
    const parts = this.multi ? policy.parts : [policy];
    this.panics = parts.map((p) => new PanicBuckets(p, panic, maxKeys));
  }

  keysFor(key) {
    const parts = this.policy.parts;
    let keys;
    if (Array.isArray(key)) {
      if (key.length !== parts.length) throw new RangeError(`allOf "${this.policy.name}" needs ${parts.length} keys, got ${key.length}`);
      keys = key.map(String);
    } else {
      keys = parts.map((p) => `${key}:${p.name}`);
    }
    if (new Set(keys).size !== keys.length) throw new RangeError('allOf keys must be distinct');
    assertSameSlot(keys);
    return keys;
  }

  /** await limit(key, {cost = 1, partial = false, dryRun = false}) -> Decision */
  async limit(key, { cost = 1, partial = false, dryRun = false } = {}) {
    checkInt('cost', cost, 0);
    const rl = this.rl;
    const be = rl._backend;
    const opt = { cost, partial, dryRun };
    if (!this.multi) {
      const p = this.policy;
      let r;
      try {
        r = await rl.call(() => be.single(p, key, opt));
      } catch (e) {
        if (e instanceof UnavailableError) return rl.count(this.panic([String(key)], cost, partial, dryRun));
        throw e;
      }
      const x = decodeSingle(r, cost, partial);
      return rl.count(makeDecision(x.granted === cost, x.granted, x.limit, x.remaining, x.retryAfterMs, x.resetAfterMs,
        p.name, p.name, be.source, EMPTY, p));
    }
    const keys = this.keysFor(key);
    let r;
    try {
      r = await rl.call(() => this.multiCall(keys, opt));
    } catch (e) {
      if (e instanceof UnavailableError) return rl.count(this.panic(keys, cost, partial, dryRun));
      throw e;
    }
    return rl.count(this.decodeMulti(r, cost, partial, be.source));
  }

  multiCall(keys, opt) {
    const be = this.rl._backend;
    const parts = this.policy.parts;
    return be.multi(parts, keys, parts.map((p) => p.weight), opt).catch((e) => {
      if (e && /has no RL\.MULTI|ships no multi\.lua/.test(e.message)) throw new UnsupportedError(e.message);
      throw e;
    });
  }

  decodeMulti(r, cost, partial, source) {
    const rule = this.policy;
    if (!Array.isArray(r) || r.length !== 7 || !Array.isArray(r[6]) || r[6].length !== rule.parts.length) {
      throw new Error(`unexpected RL.MULTI reply: ${JSON.stringify(r)}`);
    }
    const a = Number(r[0]);
    const granted = partial ? a : a === 1 ? cost : 0;
    const parts = Object.freeze(r[6].map((p, i) => Object.freeze({
      policy: rule.parts[i].name, granted: Number(p[0]), limit: Number(p[1]), remaining: Number(p[2]),
      retryAfterMs: Number(p[3]), resetAfterMs: Number(p[4]),
    })));
    const bi = Number(r[5]);
    return makeDecision(granted === cost, granted, Number(r[1]), Number(r[2]), Number(r[3]), Number(r[4]),
      rule.name, rule.parts[bi].name, source, parts, rule);
  }

  /** A decision from the panic limits (all parts, all or nothing). */
  panic(keys, cost, partial, dryRun) {
    const now = performance.now();
    const rule = this.policy;
    const pp = this.multi ? rule.parts : [rule];
    const states = keys.map((k, i) => this.panics[i].state(k, now));
    // the largest g <= cost that every part can take (g·weight units)
    let g = cost;
    for (let i = 0; i < pp.length; i++) {
      const w = pp[i].weight;
      const whole = Math.floor(states[i].tokens + 1e-9);
      const can = Math.floor(whole / w);
      if (can < g) g = can;
    }
    if (!partial && g < cost) g = 0;
    if (g > 0 && !dryRun) for (let i = 0; i < pp.length; i++) states[i].tokens -= g * pp[i].weight;
    const views = states.map((b, i) => {
      const took = g * pp[i].weight;
      return this.panics[i].view(dryRun ? b.tokens - took : b.tokens, cost * pp[i].weight, took);
    });
    const allowed = g === cost;
    // binding: granted -> fewest whole requests left; denied -> longest wait
    let bi = 0;
    for (let i = 1; i < pp.length; i++) {
      if (allowed) {
        if (Math.floor(views[i].remaining / pp[i].weight) < Math.floor(views[bi].remaining / pp[bi].weight)) bi = i;
      } else {
        const wi = views[i].retryAfterMs < 0 ? Infinity : views[i].retryAfterMs;
        const wb = views[bi].retryAfterMs < 0 ? Infinity : views[bi].retryAfterMs;
        if (wi > wb) bi = i;
      }
    }
    const b = views[bi];
    let retry = 0;
    if (!allowed) {
      retry = 0;
      for (const v of views) {
        if (v.retryAfterMs < 0) { retry = -1; break; }
        if (v.retryAfterMs > retry) retry = v.retryAfterMs;
      }
    }
    const parts = this.multi
      ? Object.freeze(views.map((v, i) => Object.freeze({ policy: pp[i].name, granted: g * pp[i].weight, limit: v.limit,
        remaining: v.remaining, retryAfterMs: v.retryAfterMs, resetAfterMs: v.resetAfterMs })))
      : EMPTY;
    return makeDecision(allowed, g, b.limit, b.remaining, retry, b.resetAfterMs, rule.name, pp[bi].name, 'panic', parts, rule);
  }

  /**
   * await reserve(key, estimate) -> Reservation: limit(key, {cost:
   * estimate}), then settle(actual) once with the real cost.
   */
  async reserve(key, estimate) {
    checkInt('estimate', estimate);
    return new Reservation(this, key, estimate, await this.limit(key, { cost: estimate }));
  }

  /** COST n FORCE (a reservation's settle): taken even past the limit. Throws UnavailableError when Redis is. */
  async debit(key, n) {
    checkInt('debit', n);
    const rl = this.rl;
    const be = rl._backend;
    const opt = { cost: n, force: true };
    if (!this.multi) {
      const p = this.policy;
      const x = decodeSingle(await rl.call(() => be.single(p, key, opt)), n, false);
      return makeDecision(x.granted === n, x.granted, x.limit, x.remaining, x.retryAfterMs, x.resetAfterMs, p.name, p.name, be.source, EMPTY, p);
    }
    const keys = this.keysFor(key);
    return this.decodeMulti(await rl.call(() => this.multiCall(keys, opt)), n, false, be.source);
  }

  /** await refund(key, n) -> Decision with granted = units given back. */
  async refund(key, n) {
    checkInt('refund', n);
    const rl = this.rl;
    const be = rl._backend;
    if (!this.multi) {
      const p = this.policy;
      const r = await rl.call(() => be.single(p, key, { refund: n }));
      const x = decodeSingle(r, n, true);
      rl.m.refunds++;
      rl.m.refundTokens += x.granted;
      return makeDecision(true, x.granted, x.limit, x.remaining, x.retryAfterMs, x.resetAfterMs, p.name, p.name, be.source, EMPTY, p);
    }
    const keys = this.keysFor(key);
    const r = await rl.call(() => this.multiCall(keys, { refund: n }));
    const d = this.decodeMulti(r, n, true, be.source);
    rl.m.refunds++;
    rl.m.refundTokens += d.granted;
    return makeDecision(true, d.granted, d.limit, d.remaining, d.retryAfterMs, d.resetAfterMs, d.policy, d.binding, d.source, d.parts, d.rule);
  }
}
