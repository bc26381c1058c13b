// Two-tier leased limiter: each key has a local reservoir of tokens leased
// in batches from the shared limit (COST batch PARTIAL: pre-debited, so all
// instances together never exceed it); a decision the reservoir can answer
// takes no I/O. Refills run in the background, one per key at a time. Idle
// or evicted keys give their unused tokens back with REFUND.
import { performance } from 'node:perf_hooks';
import { isPolicy, isConcurrency, notARate, checkInt } from './policy.js';
import { UnavailableError, makeDecision, decodeSingle, EMPTY } from './decision.js';
import { Deadline, PanicBuckets, toPanic } from './breaker.js';

// The promise's outcome (true/false, or {error} when it rejected), or
// undefined when `ms` pass first. (Judged when the event loop gets to it,
// like the call's own timeout: a lease reply that came in time wins.)
function within(promise, ms) {
  const timer = new Deadline(Math.max(0, ms), false);
  return Promise.race([promise.then((v) => v, (error) => ({ error })), timer.promise]).finally(() => timer.clear());
}

class Entry {
  constructor(now) {
    this.tokens = 0; // units leased and not yet spent
    this.lastUse = now;
    this.ref = true; // used since the eviction hand last passed (CLOCK)
    this.inflight = null; // the one lease call in flight
    this.shared = null; // the last shared reply {granted, limit, remaining, retryAfterMs, resetAfterMs}
    this.sharedAt = 0;
    this.attemptAt = -Infinity; // when the last lease was started
    this.dead = false; // evicted or idle: tokens arriving now go back
    this.lastFailed = false; // the last lease found Redis unavailable
    this.asked = 0; // units the last lease asked for
  }
}

export class LeasedLimiter {
  constructor(rl, policy, { batch = 50, lowWater = 0.2, maxKeys = 10000, idleMs = 5000, recheckMs = 250, panic } = {}) {
    if (isConcurrency(policy)) throw notARate('leased()', policy);
    if (!isPolicy(policy)) throw new RangeError('leased() takes a single policy (allOf leases are not supported)');
    this.rl = rl;
    this.policy = policy;
    checkInt('batch', batch);
    this.batch = Math.min(batch, policy.limit); // a lease never asks for more than the limit
    if (typeof lowWater !== 'number' || !(lowWater >= 0 && lowWater <= 1)) throw new RangeError('lowWater must be in 0..1');
    this.lowMark = lowWater * this.batch;
    this.maxKeys = checkInt('maxKeys', maxKeys);
    this.idleMs = checkInt('idleMs', idleMs);
    if (typeof recheckMs !== 'number' || !(recheckMs >= 0)) throw new RangeError('recheckMs must be a number ≥ 0');
    this.recheckMs = recheckMs;
    this.map = new Map();
    this.panics = new PanicBuckets(policy, toPanic(panic), maxKeys);
    this.pending = new Set(); // background calls, awaited by close()
    this.closed = false;
    this.sweeper = setInterval(() => this.sweep(), Math.max(5, Math.min(1000, Math.floor(idleMs / 4))));
    this.sweeper.unref();
  }

  /** await limit(key, {cost = 1}) -> Decision. Local when the reservoir can answer. */
  limit(key, opts) {
    const cost = opts === undefined || opts.cost === undefined ? 1 : opts.cost;
    const e = this.map.get(key);
    if (e !== undefined && e.tokens >= cost && cost >= 1 && (cost === 1 || Number.isSafeInteger(cost))) {
      // the hot path: no I/O, no allocation but the decision
      const now = performance.now();
      e.tokens -= cost;
      e.lastUse = now;
      e.ref = true;
      if (e.tokens < this.lowMark && e.inflight === null && this.rl.breaker.state === 'closed') this.refill(key, e);
      return Promise.resolve(this.rl.count(this.localDecision(e, cost, now)));
    }
    return this.slow(key, e, cost);
  }

  localDecision(e, cost, now) {
    const s = e.shared;
    const p = this.policy;
    const since = now - e.sharedAt;
    const reset = s.resetAfterMs - since;
    return makeDecision(true, cost, p.limit, e.tokens + s.remaining, 0, reset > 0 ? Math.ceil(reset) : 0,
      p.name, p.name, 'local', EMPTY, p);
  }

  async slow(key, e, cost) {
    checkInt('cost', cost, 0);
    const rl = this.rl;
    const p = this.policy;
    let now = performance.now();
    if (e === undefined) e = this.insert(key, now);
    e.lastUse = now;
    e.ref = true;
    if (cost === 0 || cost > p.limit) {
      // nothing to take, or never grantable: report without a lease
      const s = e.shared;
      return rl.count(makeDecision(cost === 0, 0, p.limit, e.tokens + (s ? s.remaining : p.limit), cost === 0 ? 0 : -1,
        s ? Math.max(0, Math.ceil(s.resetAfterMs - (now - e.sharedAt))) : 0, p.name, p.name, 'local', EMPTY, p));
    }
    if (e.tokens >= cost) return this.take(key, e, cost, now, 'local');
    if (rl.breaker.state !== 'closed') {
      // Redis unavailable (the breaker open or half-open) and the reservoir
      // is short: the panic limits decide, at once; no caller waits on
      // Redis. When the breaker lets its half-open probe out, the probe is a
      // background lease for this key (not awaited): its success closes the
      // breaker and fills the reservoir, its failure opens it again.
      if (e.inflight === null && !rl.breaker.refuses(now)) this.refill(key, e, cost - e.tokens);
      return rl.count(this.panicDecision(key, cost, now));
    }
    if (e.shared !== null && e.inflight === null && rl.breaker.state === 'closed' && this.knownShort(e, now)) {
      // the shared limit was short a moment ago: no new lease until recheckMs
      return rl.count(this.localDenial(e, now));
    }
    // At most one lease per call, and the caller waits timeoutMs at most: a
    // lease of its own when none is in flight (bounded by the call's
    // timeout), else the one in flight. Then the reservoir decides. A caller
    // that waited for another caller's (or a background) lease takes no lease
    // of its own when that one left it short: a second round trip on the
    // caller's path, for every waiter of a burst, is what the reservoir is
    // there to avoid (DESIGN.md, "Two-tier leased limiter").
    let mine = false;
    let ok;
    if (e.inflight === null) {
      mine = true;
      ok = await this.refill(key, e, cost - e.tokens).then((v) => v, (error) => ({ error }));
    } else {
      rl.m.leaseWaits++; // a dry reservoir with a lease in flight: lowWater or batch too small for the load
      ok = await within(e.inflight, rl.timeoutMs);
    }
    if (ok !== undefined && ok.error !== undefined) throw ok.error; // WRONGTYPE and the like: not for panic limits
    now = performance.now();
    const source = mine && ok === true ? rl._backend.source : 'local';
    if (e.tokens >= cost) return this.take(key, e, cost, now, source);
    // short after the lease: no reply from it in time (Redis unavailable or
    // slow, the breaker open) → the panic limits; else a denial from the
    // shared reply it brought
    if (ok !== true) return rl.count(this.panicDecision(key, cost, now));
    const d = this.localDenial(e, now);
    if (source === 'local') return rl.count(d);
    return rl.count(makeDecision(false, 0, d.limit, d.remaining, d.retryAfterMs, d.resetAfterMs, p.name, p.name, source, EMPTY, p));
  }

  /** Spend `cost` from the reservoir (it holds enough) and decide. */
  take(key, e, cost, now, source) {
    const rl = this.rl;
    const p = this.policy;
    e.tokens -= cost;
    if (e.tokens < this.lowMark && e.inflight === null && rl.breaker.state === 'closed') this.refill(key, e);
    if (source === 'local') return rl.count(this.localDecision(e, cost, now));
    const s = e.shared;
    return rl.count(makeDecision(true, cost, p.limit, e.tokens + s.remaining, 0, s.resetAfterMs, p.name, p.name, source, EMPTY, p));
  }

  // The last lease got fewer units than it asked for, less than
  // min(its retry, recheckMs) ago: no new lease for this key yet.
  knownShort(e, now) {
    const s = e.shared;
    if (s === null || e.lastFailed || s.granted >= e.asked) return false;
    const wait = s.retryAfterMs < 0 ? this.recheckMs : Math.min(s.retryAfterMs, this.recheckMs);
    return now - e.sharedAt < wait;
  }

  localDenial(e, now) {
    const s = e.shared;
    const p = this.policy;
    const since = now - e.sharedAt;
    const retry = s.retryAfterMs < 0 ? -1 : Math.max(1, Math.ceil(s.retryAfterMs - since));
    return makeDecision(false, 0, p.limit, e.tokens + s.remaining, retry, Math.max(0, Math.ceil(s.resetAfterMs - since)),
      p.name, p.name, 'local', EMPTY, p);
  }

  panicDecision(key, cost, now) {
    const pb = this.panics;
    const b = pb.state(key, now);
    const g = cost <= Math.floor(b.tokens + 1e-9) ? cost : 0;
    b.tokens -= g;
    const v = pb.view(b.tokens, cost, g);
    const p = this.policy;
    return makeDecision(g === cost, g, v.limit, v.remaining, v.retryAfterMs, v.resetAfterMs, p.name, p.name, 'panic', EMPTY, p);
  }

  insert(key, now) {
    if (this.map.size >= this.maxKeys) this.evictOne();
    const e = new Entry(now);
    this.map.set(key, e);
    return e;
  }

  // CLOCK: the first entry not used since the hand last passed goes.
  evictOne() {
    for (let i = 0, n = this.map.size; i <= n; i++) {
      const [k, e] = this.map.entries().next().value;
      this.map.delete(k);
      if (e.ref && i < n) {
        e.ref = false;
        this.map.set(k, e);
        continue;
      }
      this.retire(k, e);
      return;
    }
  }

  /** The key leaves the table: its unused tokens go back (now, or when its lease lands). */
  retire(key, e) {
    e.dead = true;
    if (e.inflight === null && e.tokens >= 1) this.giveBack(key, e);
  }

  giveBack(key, e) {
    const n = Math.floor(e.tokens);
    e.tokens -= n;
    if (n < 1) return;
    const rl = this.rl;
    const t = rl.call(() => rl._backend.single(this.policy, key, { refund: n })).then((r) => {
      rl.m.refunds++;
      rl.m.refundTokens += Number(r[0]);
    }, () => { /* unavailable: the tokens come back when the window slides */ });
    this.track(t);
  }

  track(t) {
    this.pending.add(t);
    const done = () => { this.pending.delete(t); };
    t.then(done, done);
  }

  /**
   * One lease for `key` (single flight). Resolves true when Redis answered,
   * false when it was unavailable; other errors reject.
   */
  refill(key, e, need = 0) {
    if (e.inflight !== null) return e.inflight;
    const rl = this.rl;
    const batch = Math.max(this.batch, need); // a caller's cost above the batch gets what it needs
    e.asked = batch;
    e.attemptAt = performance.now();
    const land = (r) => {
      const x = decodeSingle(r, batch, true);
      rl.m.leases++;
      rl.m.leaseTokens += x.granted;
      e.tokens += x.granted;
      e.shared = x;
      e.sharedAt = performance.now();
      e.lastFailed = false;
      if (e.dead || this.closed) this.giveBack(key, e);
    };
    const t = rl.call(() => rl._backend.single(this.policy, key, { cost: batch, partial: true }), land)
      .then((r) => { land(r); return true; }, (err) => {
        e.lastFailed = true;
        if (err instanceof UnavailableError) return false;
        this.lastError = err;
        throw err;
      })
      .finally(() => { e.inflight = null; });
    e.inflight = t;
    t.catch(() => {}); // background refills report through the next caller
    this.track(t);
    return t;
  }

  /** Give `n` unused units back to the local reservoir (capped at batch); no I/O. */
  refund(key, n) {
    checkInt('refund', n);
    const e = this.map.get(key);
    const p = this.policy;
    let back = 0;
    if (e !== undefined) {
      back = Math.max(0, Math.min(n, this.batch - e.tokens));
      e.tokens += back;
    }
    const s = e && e.shared;
    return makeDecision(true, back, p.limit, (e ? e.tokens : 0) + (s ? s.remaining : 0), 0, 0, p.name, p.name, 'local', EMPTY, p);
  }

  sweep() {
    const now = performance.now();
    for (const [k, e] of this.map) {
      if (now - e.lastUse >= this.idleMs && e.inflight === null) {
        this.map.delete(k);
        this.retire(k, e);
      }
    }
  }

  /** Units held in this instance's reservoirs right now (leased, not yet spent). */
  stranded() {
    let n = 0;
    for (const e of this.map.values()) n += e.tokens;
    return n;
  }

  /** Stop the sweeper and give every reservoir back (REFUND). */
  async close() {
    this.closed = true;
    clearInterval(this.sweeper);
    for (const [k, e] of this.map) this.retire(k, e);
    this.map.clear();
    while (this.pending.size > 0) await Promise.allSettled([...this.pending]);
  }
}
