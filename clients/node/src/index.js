export { tokenBucket, slidingLog, slidingCounter, allOf } from './policy.js';
export { makeKey, keySlot, assertSameSlot, CrossSlotError } from './keys.js';
export { RateLimit, Limiter } from './ratelimit.js';
export { UnavailableError, UnsupportedError } from './decision.js';
export { LeasedLimiter } from './leased.js';
export { Breaker, Panic } from './breaker.js';
export { headers, problem } from './headers.js';
export { SCRIPTS, BackendError } from './backend.js';
export { expressRateLimit, callerId } from './express.js';
