// Decisions and the errors a call ends in: built by ratelimit.js (one call
// per decision) and leased.js (the local tier) alike, so they live here and
// neither imports the other for them.

export const EMPTY = Object.freeze([]);

/** Redis did not answer in time, is down, or the breaker is open. */
export class UnavailableError extends Error {
  constructor(msg, cause) { super(msg, cause ? { cause } : undefined); this.name = 'UnavailableError'; }
}

/** A feature the server's backend does not have (e.g. allOf without RL.MULTI). */
export class UnsupportedError extends Error {
  constructor(msg) { super(msg); this.name = 'UnsupportedError'; }
}

export function makeDecision(allowed, granted, limit, remaining, retryAfterMs, resetAfterMs, policy, binding, source, parts, rule) {
  return Object.freeze({ allowed, granted, limit, remaining, retryAfterMs, resetAfterMs, policy, binding, source, parts, rule });
}

export function decodeSingle(r, cost, partial) {
  if (!Array.isArray(r) || r.length !== 5) throw new Error(`unexpected reply from Redis: ${JSON.stringify(r)}`);
  const a = Number(r[0]);
  return { granted: partial ? a : a === 1 ? cost : 0, limit: Number(r[1]), remaining: Number(r[2]), retryAfterMs: Number(r[3]), resetAfterMs: Number(r[4]) };
}
