// Circuit breaker for the Redis calls of one RateLimit.
//
// closed -> open after `failures` consecutive failures, or when the p95 of
// the last `latencyWindow` call latencies stays above `latencyBudgetMs` for
// `latencyPeriodMs`. open: no calls. After `openMs`: half-open, exactly one
// probe (a real call); success closes the breaker, failure opens it again.
import { checkInt } from './policy.js';

export class Breaker {
  constructor({ failures = 5, latencyBudgetMs = 50, latencyPeriodMs = 1000, latencyWindow = 64, openMs = 1000 } = {}) {
    this.failuresToTrip = checkInt('failures', failures);
    this.latencyBudgetMs = latencyBudgetMs;
    this.latencyPeriodMs = latencyPeriodMs;
    this.latencyWindow = checkInt('latencyWindow', latencyWindow);
    this.openMs = openMs;
    for (const [k, v] of [['latencyBudgetMs', latencyBudgetMs], ['latencyPeriodMs', latencyPeriodMs], ['openMs', openMs]]) {
      if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v)) throw new RangeError(`${k} must be a number ≥ 0`);
    }
    this.state = 'closed'; // 'closed' | 'open' | 'halfOpen'
    this.consecutive = 0;
    this.samples = new Float64Array(this.latencyWindow);
    this.nSamples = 0;
    this.next = 0;
    this.aboveSince = -1;
    this.openedAt = 0;
    this.probing = false;
    this.lastTrip = null; // 'failures' | 'latency'
    this.trips = 0;
    this.tripsFailures = 0;
    this.tripsLatency = 0;
    this.probesOk = 0;
    this.probesFailed = 0;
    this.onChange = null;
  }

  /**
   * May a call go out now? Returns 0 (no), 1 (yes), 2 (yes, as the one
   * half-open probe: report it with success(…, true) / failure(true)).
   */
  acquire(now) {
    if (this.refuses(now)) return 0;
    if (this.state === 'closed') return 1;
    if (this.state === 'open') this.setState('halfOpen');
    this.probing = true;
    return 2;
  }

  /**
   * Would acquire(now) refuse? (No state change: open stays open here; an
   * open breaker never has a probe out, so its wait alone decides.)
   */
  refuses(now) {
    if (this.state === 'closed') return false;
    if (this.state === 'open' && now - this.openedAt < this.openMs) return true;
    return this.probing;
  }

  success(latencyMs, now, probe) {
    if (probe) {
      this.probing = false;
      this.probesOk++;
      this.consecutive = 0;
      this.nSamples = 0;
      this.next = 0;
      this.aboveSince = -1;
      this.setState('closed');
      return;
    }
    this.consecutive = 0;
    this.samples[this.next] = latencyMs;
    this.next = (this.next + 1) % this.latencyWindow;
    if (this.nSamples < this.latencyWindow) this.nSamples++;
    if (this.state !== 'closed') return;
    if (this.p95() > this.latencyBudgetMs) {
      if (this.aboveSince < 0) this.aboveSince = now;
      if (now - this.aboveSince >= this.latencyPeriodMs) this.trip(now, 'latency');
    } else {
      this.aboveSince = -1;
    }
  }

  failure(now, probe) {
    if (probe) {
      this.probing = false;
      this.probesFailed++;
      this.openedAt = now;
      this.setState('open');
      return;
    }
    this.consecutive++;
    if (this.state === 'closed' && this.consecutive >= this.failuresToTrip) this.trip(now, 'failures');
  }

  /** The 95th percentile (nearest rank) of the recorded latencies. */
  p95() {
    const n = this.nSamples;
    if (n === 0) return 0;
    const a = Array.from(this.samples.subarray(0, n)).sort((x, y) => x - y);
    return a[Math.min(n - 1, Math.ceil(0.95 * n) - 1)];
  }

  trip(now, why) {
    this.trips++;
    if (why === 'latency') this.tripsLatency++;
    else this.tripsFailures++;
    this.lastTrip = why;
    this.openedAt = now;
    this.consecutive = 0;
    this.aboveSince = -1;
    this.setState('open');
  }

  setState(s) {
    if (this.state === s) return;
    this.state = s;
    if (this.onChange) this.onChange(s);
  }
}

export const TIMEOUT = Symbol('timeout');

/**
 * A call's timeout, judged when the event loop gets to it. Node runs due
 * timers before it polls the sockets, so a loop that was busy (other
 * requests' callbacks, GC) or a process the OS did not run for longer than
 * the timeout would see the timer first, and count as "no reply" a reply
 * that came in time and sits unread in the socket. So the due timer only
 * arms a setImmediate, which runs after the next poll: the replies that
 * arrived meanwhile are read (and win the race) first; a Redis that has
 * not answered still fails at once. `promise` rejects with TIMEOUT
 * (`reject`), else resolves with undefined.
 */
export class Deadline {
  constructor(ms, reject) {
    this.immediate = null;
    this.promise = new Promise((yes, no) => {
      const settle = reject ? () => no(TIMEOUT) : () => yes(undefined);
      this.timer = setTimeout(() => { this.immediate = setImmediate(settle); }, ms);
    });
  }

  clear() {
    clearTimeout(this.timer);
    if (this.immediate !== null) clearImmediate(this.immediate);
  }
}

// Panic limits, the breaker's fallback: what decides while it is open.

/** Panic limits: `new Panic({instances})` (limit // instances) or `new Panic({limit, windowMs})`. */
export class Panic {
  constructor({ instances, limit, windowMs } = {}) {
    if (limit !== undefined) {
      checkInt('panic limit', limit);
      if (instances !== undefined) throw new RangeError('panic: give instances or limit, not both');
    } else {
      checkInt('panic instances', instances === undefined ? (instances = 1) : instances);
    }
    if (windowMs !== undefined) checkInt('panic windowMs', windowMs);
    this.instances = instances;
    this.limit = limit;
    this.windowMs = windowMs;
    Object.freeze(this);
  }

  capacity(policy) { return this.limit !== undefined ? this.limit : Math.max(1, Math.floor(policy.limit / this.instances)); }
  window(policy) { return this.windowMs !== undefined ? this.windowMs : policy.windowMs; }
}

export function toPanic(p) {
  if (p === undefined || p === null) return new Panic({ instances: 1 });
  return p instanceof Panic ? p : new Panic(p);
}

/**
 * Local token buckets per key for one policy while Redis is unavailable:
 * capacity C, refilled C per window. Never grants more than that.
 */
export class PanicBuckets {
  constructor(policy, panic, maxKeys) {
    this.cap = panic.capacity(policy);
    this.windowMs = panic.window(policy);
    this.msPerToken = this.windowMs / this.cap;
    this.maxKeys = maxKeys;
    this.map = new Map();
  }

  state(key, now) {
    let b = this.map.get(key);
    if (b === undefined) {
      if (this.map.size >= this.maxKeys) this.map.delete(this.map.keys().next().value);
      b = { tokens: this.cap, at: now };
      this.map.set(key, b);
    } else if (now > b.at) {
      b.tokens = Math.min(this.cap, b.tokens + (now - b.at) / this.msPerToken);
      b.at = now;
    }
    return b;
  }

  /** The reply this part gives for `units` when `took` were taken and `left` remain. */
  view(left, units, took) {
    const whole = Math.floor(left + 1e-9);
    const retry = took === units || (took === 0 && units <= whole) ? 0
      : units > this.cap ? -1 : Math.max(1, Math.ceil((units - left) * this.msPerToken));
    return { limit: this.cap, remaining: whole, retryAfterMs: retry, resetAfterMs: Math.max(0, Math.ceil((this.cap - left) * this.msPerToken)) };
  }
}
