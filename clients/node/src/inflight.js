// In-flight limits (RL.CONCURRENCY, twin concurrency.lua): a guard that
// holds units while its body runs, renews its lease on a timer and releases
// on every exit path; under the breaker, a local in-flight limit. See
// clients/DESIGN.md, "In-flight limits: the guard".
import { randomBytes } from 'node:crypto';
import { EMPTY, UnavailableError, makeDecision } from './decision.js';
import { isConcurrency, checkInt } from './policy.js';

// a hold's life: not entered, held (on the server or locally), released
const NEW = 0;
const HELD = 1;
const DONE = 2;
const ACQUIRING = 3; // the ACQUIRE is out

/** One hold: what inflight.run(key, fn) passes to fn. */
export class Hold {
  constructor(inflight, key, cost) {
    this.inflight = inflight;
    this.key = key;
    this.cost = cost;
    /** the id the lease is held under: 128 random bits, one per hold */
    this.id = randomBytes(16).toString('hex');
    this.decision = null;
    /** a renewal found the lease lapsed: the work is no longer counted */
    this.lost = false;
    /** renewals the server answered 1 */
    this.renewals = 0;
    this._state = NEW;
    this._local = false;
    this._timer = null;
    this._released = null;
  }

  /** The units are held (false before the acquire and after a denial). */
  get allowed() { return this.decision !== null && this.decision.allowed; }

  /** Held now: acquired, granted, not yet released. */
  get held() { return this._state === HELD; }

  /** Release now (once; run() does it on exit otherwise). */
  release() {
    if (this._released === null) this._released = this.inflight._release(this);
    return this._released;
  }
}

export class InFlight {
  constructor(rl, policy, renewMs, panic) {
    if (!isConcurrency(policy)) throw new TypeError('inflight() takes a concurrency policy (concurrency(name, limit, leaseMs))');
    const leaseMs = policy.windowMs;
    if (renewMs === undefined || renewMs === null) {
      renewMs = Math.max(1, Math.floor(leaseMs / 3));
    } else if (!Number.isSafeInteger(renewMs) || renewMs < 1 || renewMs >= Math.max(2, leaseMs)) {
      throw new RangeError(`renewMs must be an integer from 1 to leaseMs - 1, not ${renewMs}`);
    }
    this.rl = rl;
    this.policy = policy;
    this.leaseMs = leaseMs;
    this.renewMs = renewMs;
    /** the local in-flight limit under the breaker (per key, this process) */
    this.localCap = panic.capacity(policy);
    this._local = new Map();
  }

  /** A hold of `cost` units on `key`, not yet acquired (run() is the usual way). */
  hold(key, { cost = 1 } = {}) {
    checkInt('cost', cost);
    if (typeof key !== 'string') throw new TypeError(`key must be a string, not ${typeof key}`);
    return new Hold(this, key, cost);
  }

  /**
   * await run(key, async (h) => ..., {cost, signal}): acquires, runs fn(h)
   * (also when denied: check h.allowed), and releases on every exit: fn's
   * return, a throw or rejection, or `signal` aborting (then run rejects
   * with signal.reason at once; fn should stop on the same signal). fn's
   * result or error is run's.
   */
  async run(key, fn, { cost = 1, signal } = {}) {
    if (typeof fn !== 'function') throw new TypeError('run(key, fn): fn must be a function');
    const h = this.hold(key, { cost });
    if (signal) signal.throwIfAborted();
    await this.acquire(h);
    try {
      if (!signal) return await fn(h);
      if (signal.aborted) throw signal.reason;
      let onAbort;
      const aborted = new Promise((resolve, reject) => {
        onAbort = () => reject(signal.reason);
        signal.addEventListener('abort', onAbort, { once: true });
      });
      const work = Promise.resolve().then(() => fn(h));
      work.catch(() => {}); // after an abort its outcome is nobody's
      try {
        return await Promise.race([work, aborted]);
      } finally {
        signal.removeEventListener('abort', onAbort);
      }
    } finally {
      await h.release();
    }
  }

  /** Acquire a hold from hold(): its decision (source 'panic' when decided locally). */
  async acquire(h) {
    if (h._state !== NEW) throw new Error('a hold is acquired once');
    h._state = ACQUIRING;
    const rl = this.rl;
    const be = rl._backend;
    const p = this.policy;
    let d;
    try {
      // An ACQUIRE that timed out may still be applied (a stalled server
      // reads it later): when its late reply says it holds, a RELEASE of
      // its id follows, so the units are freed as soon as Redis answers
      // rather than when the lease lapses.
      const r = await rl.call(() => be.concurrency(p, h.key, 'ACQUIRE', h.id, h.cost),
        (late) => { if (Number(late[0]) === 1) this._lateRelease(h); });
      if (!Array.isArray(r) || r.length !== 5) throw new Error(`unexpected RL.CONCURRENCY reply: ${JSON.stringify(r)}`);
      const ok = Number(r[0]) === 1;
      d = makeDecision(ok, ok ? h.cost : 0, Number(r[1]), Number(r[2]), Number(r[3]), Number(r[4]), p.name, p.name, be.source, EMPTY, p);
    } catch (e) {
      if (!(e instanceof UnavailableError)) {
        h._state = DONE; // an error reply (WRONGTYPE, …): nothing held
        throw e;
      }
      d = this._localAcquire(h);
    }
    h.decision = rl.count(d);
    if (!d.allowed) {
      h._state = DONE;
      return d;
    }
    h._state = HELD;
    if (h._released !== null) { // released while the ACQUIRE was out: release what it took
      h._released = this._release(h);
      await h._released;
      return d;
    }
    if (!h._local) this._schedule(h);
    return d;
  }

  /** Units held on `key` by the local in-flight limit (breaker open). */
  heldLocally(key) { return this._local.get(key) || 0; }

  // The local in-flight limit: at most localCap units per key in this process.
  _localAcquire(h) {
    const cap = this.localCap;
    let held = this._local.get(h.key) || 0;
    const ok = held + h.cost <= cap;
    if (ok) {
      held += h.cost;
      this._local.set(h.key, held);
      h._local = true;
    }
    const retry = ok ? 0 : h.cost > cap ? -1 : 1;
    const p = this.policy;
    return makeDecision(ok, ok ? h.cost : 0, cap, Math.max(0, cap - held), retry, 0, p.name, p.name, 'panic', EMPTY, p);
  }

  _schedule(h) {
    h._timer = setTimeout(() => { h._timer = null; this._renew(h); }, this.renewMs);
    h._timer.unref();
  }

  // One RENEW; the next is scheduled once it has answered, while the hold is held.
  async _renew(h) {
    if (h._state !== HELD) return;
    let again = true;
    try {
      const r = await this.rl.call(() => this.rl._backend.concurrency(this.policy, h.key, 'RENEW', h.id));
      if (h._state !== HELD) return; // released meanwhile
      if (Number(r[0]) === 1) {
        h.renewals++;
      } else {
        h.lost = true; // the lease lapsed (or the key is gone): no longer counted
        again = false;
      }
    } catch {
      // Redis away or slow (the breaker counted it): try again at the next tick
    }
    if (again && h._state === HELD) this._schedule(h);
  }

  // The RELEASE after a late ACQUIRE reply: sent at once, past the breaker
  // (the server has just answered; an open breaker would hold it back
  // until the lease lapsed), counted in calls and failures, not awaited.
  _lateRelease(h) {
    const m = this.rl.m;
    m.calls++;
    Promise.resolve()
      .then(() => this.rl._backend.concurrency(this.policy, h.key, 'RELEASE', h.id))
      .catch(() => { m.failures++; }); // not retried: the lease lapses
  }

  async _release(h) {
    if (h._timer !== null) { // renewals stop before the release is sent
      clearTimeout(h._timer);
      h._timer = null;
    }
    if (h._state !== HELD) {
      if (h._state !== ACQUIRING) h._state = DONE; // (acquire() releases once it knows)
      return;
    }
    h._state = DONE;
    if (h._local) {
      const left = (this._local.get(h.key) || 0) - h.cost;
      if (left > 0) this._local.set(h.key, left);
      else this._local.delete(h.key);
      return;
    }
    try {
      await this.rl.call(() => this.rl._backend.concurrency(this.policy, h.key, 'RELEASE', h.id));
    } catch (e) {
      // not retried: the lease lapses within leaseMs of its last renewal
      if (!(e instanceof UnavailableError)) throw e;
    }
  }
}
