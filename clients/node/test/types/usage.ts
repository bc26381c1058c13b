// Compiled by tsc --noEmit in types.test.js: the declarations describe the API as used.
import {
  RateLimit, tokenBucket, slidingLog, fixedWindow, concurrency, allOf, Panic, headers, problem, makeKey, keySlot, expressRateLimit,
  GlideReplyError, type Decision, type Metrics, type GlideLike, type Hold, type Reservation,
} from 'redis-ratelimit';
import { GlideClient, GlideClusterClient } from '@valkey/valkey-glide';
import { Redis as Valkey, Cluster as ValkeyCluster } from 'iovalkey';

declare const client: object;
const rl = new RateLimit(client, { timeoutMs: 5, backend: 'auto', breaker: { failures: 3, openMs: 500 } });
const strict = new RateLimit(client, { timeoutMs: 50, strict: { replicas: 1, timeoutMs: 40 } });
void strict; void new RateLimit(client, { strict: true });
const api = tokenBucket('api', 100, 100, 60000);
const perMin = fixedWindow('min', 60, 60000, { fromFirst: true });
const first: boolean = perMin.fromFirst && fixedWindow('sec', 5, 1000).fromFirst;
void first;
const both = allOf([api, slidingLog('day', 10000, 86400000).weighted(2), perMin.weighted(3)], { name: 'both' });
async function f(): Promise<void> {
  const d: Decision = await rl.limiter(both, { panic: new Panic({ instances: 4 }) }).limit(makeKey('t', 'u'), { cost: 2, partial: true });
  const h: Record<string, string> = headers(d);
  const body = problem(d, '/x');
  const lim = rl.leased(api, { batch: 50, lowWater: 0.2, maxKeys: 1000, idleMs: 5000, recheckMs: 250, panic: { limit: 10, windowMs: 1000 } });
  const l: Decision = await lim.limit('k', { cost: 1 });
  const s: number = lim.stranded() + keySlot('k') + body.status + l.remaining + Object.keys(h).length;
  const m: Metrics = rl.metrics();
  const mw = expressRateLimit(lim, { key: (req) => String(req.ip) });
  const u: number = m.unreplicated + m.redetects;
  void s; void m; void u; void mw; void (await lim.close());
  // @ts-expect-error: a leased limiter takes a single policy
  rl.leased(both);
  // in-flight limits and reservations (issue 46)
  const jobs = concurrency('jobs', 10, 30000);
  const inflight = rl.inflight(jobs, { renewMs: 5000, panic: { limit: 2 } });
  const out: string = await inflight.run('k', async (hd: Hold) => (hd.allowed && !hd.lost ? hd.id : 'busy'), { cost: 2, signal: new AbortController().signal });
  const r: Reservation = await rl.limiter(api).reserve('k', 600);
  const settled: Decision | null = await r.settle(100);
  void out; void settled; void inflight.heldLocally('k');
  // @ts-expect-error: a concurrency policy is not a rate
  rl.limiter(jobs);
  // @ts-expect-error: nor inside allOf
  allOf([jobs]);
}
void f;

// Valkey's clients: GLIDE's two clients have what the library calls on them
declare const glide: GlideClient;
declare const glideCluster: GlideClusterClient;
const asGlide: GlideLike[] = [glide, glideCluster];
void asGlide;
void new RateLimit(glide, { timeoutMs: 30, strict: true });
void new RateLimit(glideCluster, { timeoutMs: 30 });
void new RateLimit(new Valkey(6379, '127.0.0.1'), { timeoutMs: 30 });
void new RateLimit(new ValkeyCluster([{ host: '127.0.0.1', port: 7000 }]), { timeoutMs: 30 });
function replyCode(e: unknown): string | null { return e instanceof GlideReplyError ? e.message.split(' ')[0] : null; }
void replyCode;
