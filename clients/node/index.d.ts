// Types for redis-ratelimit (hand-written; the code is plain ESM JavaScript).

/**
 * Any supported client: ioredis or iovalkey Redis / Cluster, node-redis v4+
 * client / cluster / sentinel, or a Valkey GLIDE GlideClient /
 * GlideClusterClient (@valkey/valkey-glide 2.x; see GlideLike).
 */
export type RedisLike = object;

/**
 * What the library calls on a Valkey GLIDE client (GlideClient,
 * GlideClusterClient): one customCommand per decision (routed by its first
 * key on a cluster), exec of a non-atomic Batch for strict mode (GlideClient).
 */
export interface GlideLike {
  customCommand(args: string[], options?: never): Promise<unknown>;
  exec(batch: never, raiseOnError: boolean): Promise<unknown>;
  close(): void;
}

/** An error reply from the server to a GLIDE call, in Redis's form ("WRONGTYPE Operation…"); `cause`: GLIDE's RequestError. */
export class GlideReplyError extends Error {}

export type Source = 'module' | 'lua' | 'local' | 'panic';

export interface Policy {
  readonly kind: 'tokenBucket' | 'slidingLog' | 'slidingCounter' | 'fixedWindow';
  readonly name: string;
  /** capacity or limit */
  readonly limit: number;
  /** the window for headers (token bucket: the time an empty bucket takes to fill) */
  readonly windowMs: number;
  /** RL.MULTI WEIGHT inside allOf (default 1) */
  readonly weight: number;
  /** fixedWindow only: each window starts at its first grant (FROMFIRST); false for the others */
  readonly fromFirst: boolean;
  /** the same policy with RL.MULTI's WEIGHT w */
  weighted(w: number): Policy;
}

export interface AllOf {
  readonly kind: 'allOf';
  readonly name: string;
  readonly parts: readonly Policy[];
}

export function tokenBucket(name: string, capacity: number, rate: number, periodMs: number): Policy;
export function slidingLog(name: string, limit: number, windowMs: number): Policy;
export function slidingCounter(name: string, limit: number, windowMs: number): Policy;
/** At most `limit` units per fixed window of `windowMs`, aligned on the epoch or (fromFirst) from the first grant; up to 2 x limit across one boundary. */
export function fixedWindow(name: string, limit: number, windowMs: number, opts?: { fromFirst?: boolean }): Policy;
/**
 * An in-flight limit (RL.CONCURRENCY, twin concurrency.lua): at most `limit`
 * units held at once on a key, each hold a lease of `leaseMs`. Not a rate:
 * rl.inflight(policy) takes it; limiter(), leased() and allOf refuse it
 * (TypeError).
 */
export function concurrency(name: string, limit: number, leaseMs: number): ConcurrencyPolicy;

export interface ConcurrencyPolicy {
  readonly kind: 'concurrency';
  readonly name: string;
  readonly limit: number;
  /** leaseMs (the window for headers) */
  readonly windowMs: number;
}

/** 1-16 distinct-named policies, all or nothing (RL.MULTI). Default name: the part names joined by '.' (RangeError when that is over 64 characters: give a name). */
export function allOf(parts: Policy[], opts?: { name?: string }): AllOf;

export interface Part {
  readonly policy: string;
  readonly granted: number;
  readonly limit: number;
  readonly remaining: number;
  readonly retryAfterMs: number;
  readonly resetAfterMs: number;
}

export interface Decision {
  /** all `cost` units were granted */
  readonly allowed: boolean;
  /** units granted (partial: 0..cost); for refund: units given back */
  readonly granted: number;
  readonly limit: number;
  readonly remaining: number;
  /** 0 when granted; else ms until the same call could be granted (≥ 1); -1 when it never can */
  readonly retryAfterMs: number;
  readonly resetAfterMs: number;
  /** the policy's name (allOf: its own name) */
  readonly policy: string;
  /** the binding policy's name */
  readonly binding: string;
  readonly source: Source;
  /** allOf: one Part per policy; empty for a single policy */
  readonly parts: readonly Part[];
  /** the policy object the decision was made for */
  readonly rule: Policy | AllOf | ConcurrencyPolicy;
}

export interface LimitOptions { cost?: number; partial?: boolean; dryRun?: boolean }

export interface BreakerOptions {
  /** consecutive failures that open the breaker (default 5) */
  failures?: number;
  /** p95 latency budget (default 50 ms) ... */
  latencyBudgetMs?: number;
  /** ... exceeded for this long opens the breaker (default 1000 ms) */
  latencyPeriodMs?: number;
  /** latencies the p95 is taken over (default 64) */
  latencyWindow?: number;
  /** open this long before one half-open probe (default 1000 ms) */
  openMs?: number;
}

export class Breaker {
  constructor(opts?: BreakerOptions);
  readonly state: 'closed' | 'open' | 'halfOpen';
  readonly lastTrip: 'failures' | 'latency' | null;
  /** called on every state change */
  onChange: ((state: 'closed' | 'open' | 'halfOpen') => void) | null;
  p95(): number;
}

export interface PanicOptions { instances?: number; limit?: number; windowMs?: number }
/** Panic limits: limit // instances per key (default instances 1), or a fixed limit per windowMs. */
export class Panic {
  constructor(opts?: PanicOptions);
}

export interface Metrics {
  decisionsModule: number; decisionsLua: number; decisionsLocal: number; decisionsPanic: number;
  denied: number; calls: number; failures: number;
  leases: number; leaseTokens: number;
  /** callers that found their reservoir dry with a lease in flight and waited for it */
  leaseWaits: number;
  refunds: number; refundTokens: number;
  trips: number; tripsFailures: number; tripsLatency: number;
  probesOk: number; probesFailed: number;
  /** strict mode: grants WAIT did not see copied to enough replicas (failures, never grants) */
  unreplicated: number;
  /** times the module's commands became unknown (a failover to a server without it): backend detected again */
  redetects: number;
  state: 'closed' | 'open' | 'halfOpen';
}

export interface RateLimitOptions {
  /** every Redis call's timeout (default 5) */
  timeoutMs?: number;
  backend?: 'auto' | 'module' | 'lua';
  breaker?: Breaker | BreakerOptions;
  /**
   * Strict mode: each grant is followed by `WAIT replicas timeoutMs` in the
   * same pipeline and counts only when acknowledged; otherwise a failure
   * (panic limits decide). true = {replicas: 1, timeoutMs: 80% of timeoutMs}.
   */
  strict?: boolean | StrictOptions;
}

export interface StrictOptions { replicas?: number; timeoutMs?: number }

export class RateLimit {
  constructor(client: RedisLike, opts?: RateLimitOptions);
  /** 'module' | 'lua' once known, else null */
  readonly backend: 'module' | 'lua' | null;
  readonly breaker: Breaker;
  readonly timeoutMs: number;
  detect(): Promise<'module' | 'lua'>;
  limiter(policy: Policy | AllOf, opts?: { panic?: Panic | PanicOptions; maxKeys?: number }): Limiter;
  leased(policy: Policy, opts?: LeasedOptions): LeasedLimiter;
  /** An in-flight limit: holds renewed every renewMs (default max(1, floor(leaseMs / 3))); panic: the local limit under the breaker. */
  inflight(policy: ConcurrencyPolicy, opts?: { renewMs?: number; panic?: Panic | PanicOptions }): InFlight;
  metrics(): Metrics;
}

/** One hold of an in-flight limit: what run() passes to its body. */
export class Hold {
  /** 32 lowercase hex: 128 random bits, one per hold */
  readonly id: string;
  readonly key: string;
  readonly cost: number;
  /** the ACQUIRE's decision (source 'panic' when decided locally); null before it */
  readonly decision: Decision | null;
  /** the units are held (false after a denial) */
  readonly allowed: boolean;
  /** held now: acquired, granted, not yet released */
  readonly held: boolean;
  /** a renewal found the lease lapsed: the work is no longer counted, renewals stopped */
  readonly lost: boolean;
  /** renewals the server answered 1 */
  readonly renewals: number;
  /** release now (once; run() does it on exit otherwise) */
  release(): Promise<void>;
}

export class InFlight {
  readonly policy: ConcurrencyPolicy;
  readonly leaseMs: number;
  readonly renewMs: number;
  /**
   * Acquire `cost` units on `key`, run fn(h) (also when denied: check
   * h.allowed), release on every exit: return, throw, rejection, or
   * `signal` aborting (run then rejects with signal.reason at once).
   */
  run<T>(key: string, fn: (h: Hold) => T | Promise<T>, opts?: { cost?: number; signal?: AbortSignal }): Promise<T>;
  /** a hold not yet acquired (acquire it, release it yourself) */
  hold(key: string, opts?: { cost?: number }): Hold;
  acquire(h: Hold): Promise<Decision>;
  /** units held on `key` by the local in-flight limit (breaker open) */
  heldLocally(key: string): number;
}

/** Limiter.reserve's handle: settle(actual) once. */
export class Reservation {
  readonly key: string | string[];
  readonly estimate: number;
  /** the decision on limit(key, {cost: estimate}) */
  readonly decision: Decision;
  readonly allowed: boolean;
  /** settle() was called */
  readonly settled: boolean;
  /**
   * REFUND (estimate - actual), COST (actual - estimate) FORCE, or nothing
   * (null; also for a denied or panic-decided reservation). A second call
   * throws and sends nothing.
   */
  settle(actual: number): Promise<Decision | null>;
}

export class Limiter {
  readonly policy: Policy | AllOf;
  /** allOf: one key (each part uses `${key}:${part.name}`) or one key per part */
  limit(key: string | string[], opts?: LimitOptions): Promise<Decision>;
  refund(key: string | string[], n: number): Promise<Decision>;
  /** limit(key, {cost: estimate}) as a handle to settle with the real cost */
  reserve(key: string | string[], estimate: number): Promise<Reservation>;
  /** COST n FORCE: taken even past the limit (a debt later calls wait out) */
  debit(key: string | string[], n: number): Promise<Decision>;
}

export interface LeasedOptions {
  /** units per lease (default 50, at most the policy's limit) */
  batch?: number;
  /** refill in the background below lowWater × batch (default 0.2) */
  lowWater?: number;
  /** keys kept (LRU, default 10000) */
  maxKeys?: number;
  /** a key unused this long gives its units back with REFUND (default 5000) */
  idleMs?: number;
  /** after a short lease, no new lease for min(retry, recheckMs) (default 250) */
  recheckMs?: number;
  panic?: Panic | PanicOptions;
}

export class LeasedLimiter {
  readonly policy: Policy;
  limit(key: string, opts?: { cost?: number }): Promise<Decision>;
  /** back into the local reservoir (capped at batch); no I/O */
  refund(key: string, n: number): Decision;
  /** units held in this instance's reservoirs */
  stranded(): number;
  /** give every reservoir back (REFUND) and stop */
  close(): Promise<void>;
}

export function makeKey(tag: string, ...parts: Array<string | number | { prefix?: string }>): string;
export function keySlot(key: string | Uint8Array): number;
export function assertSameSlot(keys: string[]): void;
export class CrossSlotError extends Error {}
export class UnavailableError extends Error {}
export class UnsupportedError extends Error {}
export class BackendError extends Error {}
export const SCRIPTS: Record<string, { text: string; sha: string }>;

export function headers(d: Decision): Record<string, string>;
export function problem(d: Decision, instance?: string): {
  type: string; title: string; status: 429; detail: string; 'violated-policies': string[]; instance?: string;
};

/** Express / connect middleware: headers on every limited response, 429 + problem+json on denial. */
export function expressRateLimit(
  limiter: Limiter | LeasedLimiter,
  opts?: { key?: (req: any) => string | string[]; cost?: (req: any) => number },
): (req: any, res: any, next: (err?: unknown) => void) => void;
/** `key:<sha256(X-Api-Key), 32 hex>`, else `ip:<client address>` */
export function callerId(req: any): string;
