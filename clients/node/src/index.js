export { tokenBucket, slidingLog, slidingCounter, allOf } from './policy.js';
export { makeKey, keySlot, assertSameSlot, CrossSlotError } from './keys.js';
export { RateLimit, Limiter, Panic, UnavailableError, UnsupportedError } from './ratelimit.js';
export { LeasedLimiter } from './leased.js';
export { Breaker } from './breaker.js';
export { headers, problem } from './headers.js';
export { SCRIPTS, BackendError } from './backend.js';
export { expressRateLimit, callerId } from './express.js';
