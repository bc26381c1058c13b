// Policies: what a limit is (algorithm, numbers, name). A policy object is
// immutable and holds the arguments it sends, prepared once.

const NAME_RE = /^[A-Za-z0-9._-]{1,64}$/;
const MAX = Number.MAX_SAFE_INTEGER; // 2^53 - 1

function checkName(name) {
  if (typeof name !== 'string' || !NAME_RE.test(name)) {
    throw new RangeError(`policy name ${JSON.stringify(name)}: 1-64 of A-Z a-z 0-9 . _ -`);
  }
  return name;
}

export function checkInt(what, v, lo = 1) {
  if (!Number.isSafeInteger(v) || v < lo || v > MAX) {
    throw new RangeError(`${what} must be an integer from ${lo} to 2^53-1, not ${v}`);
  }
  return v;
}

// ⌈a·b/c⌉ exactly, for safe integers.
function ceilMulDiv(a, b, c) {
  return Number((BigInt(a) * BigInt(b) + BigInt(c) - 1n) / BigInt(c));
}

class Policy {
  constructor(kind, name, limit, windowMs, args, weight = 1, fromFirst = false) {
    this.kind = kind; // 'tokenBucket' | 'slidingLog' | 'slidingCounter' | 'fixedWindow' | 'concurrency'
    this.name = name;
    this.limit = limit;
    this.windowMs = windowMs;
    this.weight = weight;
    this.fromFirst = fromFirst; // fixed windows: each starts at its first grant (FROMFIRST)
    this.params = args; // numbers, as given
    this.flags = fromFirst ? ['FROMFIRST'] : []; // after WEIGHT in RL.MULTI
    this.multiArgs = args.map(String); // as sent in RL.MULTI, before WEIGHT
    this.args = [...this.multiArgs, ...this.flags]; // as sent after the key
    this.command = COMMAND[kind];
    this.multiName = MULTI_NAME[kind];
    this.script = SCRIPT[kind];
    this.fixed = kind === 'fixedWindow'; // the module must have RL.FIXEDWINDOW
    this.parts = null;
    Object.freeze(this);
  }

  /** The same policy with RL.MULTI's WEIGHT w (only matters inside allOf). */
  weighted(w) {
    checkInt('weight', w);
    return new Policy(this.kind, this.name, this.limit, this.windowMs, this.params, w, this.fromFirst);
  }
}

const COMMAND = {
  tokenBucket: 'RL.TOKENBUCKET', slidingLog: 'RL.SLIDINGLOG', slidingCounter: 'RL.SLIDINGCOUNTER', fixedWindow: 'RL.FIXEDWINDOW',
  concurrency: 'RL.CONCURRENCY',
};
const MULTI_NAME = {
  tokenBucket: 'TOKENBUCKET', slidingLog: 'SLIDINGLOG', slidingCounter: 'SLIDINGCOUNTER', fixedWindow: 'FIXEDWINDOW', concurrency: 'CONCURRENCY',
};
const SCRIPT = {
  tokenBucket: 'tokenbucket', slidingLog: 'slidinglog', slidingCounter: 'slidingcounter', fixedWindow: 'fixedwindow', concurrency: 'concurrency',
};

/** A token bucket: at most `capacity`, regains `rate` tokens every `periodMs`. */
export function tokenBucket(name, capacity, rate, periodMs) {
  checkName(name);
  checkInt('capacity', capacity);
  checkInt('rate', rate);
  checkInt('periodMs', periodMs);
  // The window for headers: the time an empty bucket takes to fill.
  return new Policy('tokenBucket', name, capacity, ceilMulDiv(capacity, periodMs, rate), [capacity, rate, periodMs]);
}

/** Exact: at most `limit` units in any `windowMs`. */
export function slidingLog(name, limit, windowMs) {
  checkName(name);
  checkInt('limit', limit);
  checkInt('windowMs', windowMs);
  return new Policy('slidingLog', name, limit, windowMs, [limit, windowMs]);
}

/** Cloudflare's approximation of a sliding window, two counters. */
export function slidingCounter(name, limit, windowMs) {
  checkName(name);
  checkInt('limit', limit);
  checkInt('windowMs', windowMs);
  return new Policy('slidingCounter', name, limit, windowMs, [limit, windowMs]);
}

/**
 * At most `limit` units per fixed window of `windowMs`: windows on the
 * epoch's multiples of windowMs (envoyproxy/ratelimit's), or with
 * { fromFirst: true } each starting at its first grant (INCR + PEXPIRE NX).
 * Up to 2 x limit can pass across one boundary.
 */
export function fixedWindow(name, limit, windowMs, { fromFirst = false } = {}) {
  checkName(name);
  checkInt('limit', limit);
  checkInt('windowMs', windowMs);
  if (typeof fromFirst !== 'boolean') throw new TypeError(`fromFirst must be true or false, not ${fromFirst}`);
  return new Policy('fixedWindow', name, limit, windowMs, [limit, windowMs], 1, fromFirst);
}

/**
 * An in-flight limit (RL.CONCURRENCY, twin concurrency.lua): at most
 * `limit` units held at once on a key, each hold a lease of `leaseMs` on the
 * server's clock. Not a rate: use it with rl.inflight(policy); limiter(),
 * leased() and allOf refuse it. Its windowMs (for headers) is leaseMs.
 */
export function concurrency(name, limit, leaseMs) {
  checkName(name);
  checkInt('limit', limit);
  checkInt('leaseMs', leaseMs);
  return new Policy('concurrency', name, limit, leaseMs, [limit, leaseMs]);
}

class AllOf {
  constructor(parts, name) {
    this.kind = 'allOf';
    this.parts = parts;
    this.name = name;
    Object.freeze(this);
  }
}

/** Several policies, all or nothing (RL.MULTI). allOf([p1, p2], {name}). */
export function allOf(parts, { name } = {}) {
  if (!Array.isArray(parts) || parts.length < 1 || parts.length > 16) {
    throw new RangeError('allOf takes an array of 1 to 16 policies');
  }
  for (const p of parts) {
    if (p instanceof Policy && p.kind === 'concurrency') throw notARate('allOf', p);
    if (!(p instanceof Policy)) throw new TypeError('allOf parts must be tokenBucket / slidingLog / slidingCounter / fixedWindow policies');
  }
  if (new Set(parts.map((p) => p.name)).size !== parts.length) throw new RangeError('allOf parts need distinct names');
  // The default name must be a valid name too (it goes into headers and the
  // 429 body): the part names joined by '.', at most 64 characters.
  if (name === undefined) {
    name = parts.map((p) => p.name).join('.');
    if (name.length > 64) throw new RangeError(`allOf: the default name ${JSON.stringify(name)} is longer than 64 characters; give allOf a {name}`);
  }
  return new AllOf(Object.freeze([...parts]), checkName(name));
}

export function isPolicy(p) { return p instanceof Policy; }
/** A rate policy (not concurrency): what limiter(), leased() and allOf take. */
export function isRate(p) { return p instanceof Policy && p.kind !== 'concurrency'; }
export function isConcurrency(p) { return p instanceof Policy && p.kind === 'concurrency'; }
/** The TypeError for a concurrency policy given where a rate is expected. */
export function notARate(what, p) {
  return new TypeError(`${what} takes rates; concurrency "${p.name}" is an in-flight limit: use rl.inflight(policy)`);
}
export function isAllOf(p) { return p instanceof AllOf; }
