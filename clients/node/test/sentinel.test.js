// Sentinel and strict mode on real processes (issue 25): a primary, a
// replica and 3 sentinels; the primary is SIGKILLed, the sentinels promote
// the replica and decisions continue there (the module, or the Lua twins
// when the new primary lacks it); strict mode grants only what a replica
// acknowledged. Each test takes seconds, so only the newest line of each
// library runs them (node-redis: createSentinel, 5+; ioredis and iovalkey:
// `sentinels`; GLIDE has no Sentinel client: strict mode only).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { monitorEventLoopDelay, performance } from 'node:perf_hooks';
import { Server, waitUntil } from './harness.js';
import { KINDS, connect, connectSentinel, family, line } from './clients.js';
import { Deployment, SERVICE, settled, startReplica } from './sentinels.js';
import { RateLimit, tokenBucket, Panic } from '../src/index.js';

const TIMEOUT_MS = 100; // loaded CI machines: generous
const SLACK_MS = 250;
const BUCKET = tokenBucket('tb', 1000, 1, 1e9); // never refills while a test runs
const NEWEST = new Set(['ioredis6', 'node-redis6', 'iovalkey', 'glide2']);
const RUN = KINDS.filter((k) => NEWEST.has(line(k)));

function limiter(client, opts = {}) {
  const rl = new RateLimit(client, { timeoutMs: TIMEOUT_MS, breaker: { failures: 2, openMs: 50 }, ...opts });
  return { rl, lim: rl.limiter(BUCKET, { panic: new Panic({ limit: 5, windowMs: 1e9 }) }) };
}

// Grant 10, SIGKILL the primary, decide until the promoted replica answers
// with `want`: every decision within the timeout + slack, panic meanwhile.
async function failover(d, lim, want) {
  for (let i = 0; i < 10; i++) assert.equal((await lim.limit('k')).source, 'module');
  await settled(d.primary);
  await d.primary.kill();
  let worst = 0;
  const sources = new Set();
  const end = Date.now() + 30000;
  let dec;
  // How long this process itself could not run (its event loop blocked or
  // the process descheduled): no decision can come back meanwhile. On a
  // quiet machine every decision here takes the 100 ms timeout; ci16 saw
  // one take 589 ms on a loaded one.
  const stalls = monitorEventLoopDelay({ resolution: 10 });
  stalls.enable();
  for (;;) {
    const t0 = performance.now();
    dec = await lim.limit('k');
    worst = Math.max(worst, performance.now() - t0);
    sources.add(dec.source);
    if (dec.source === want) break;
    assert.equal(dec.source, 'panic', JSON.stringify(dec));
    assert.ok(Date.now() < end, 'no decision from the new primary');
    await new Promise((r) => setTimeout(r, 5));
  }
  stalls.disable();
  const stalled = stalls.max / 1e6;
  const promoted = await d.waitPromoted();
  assert.ok(worst <= TIMEOUT_MS + SLACK_MS + stalled,
    `slowest decision ${worst} ms (the process stalled at most ${stalled} ms)`);
  assert.ok(sources.has('panic'));
  return { dec, promoted };
}

for (const kind of RUN) {
  const sentinel = { skip: family(kind) === 'glide' ? 'GLIDE has no Sentinel client' : false };
  test(`failover through Sentinel: decisions continue from the new primary (${kind})`, sentinel, async (t) => {
    const d = await Deployment.start();
    t.after(() => d.close());
    const c = await connectSentinel(kind, d.ports, SERVICE);
    t.after(() => c.close());
    const { rl, lim } = limiter(c.client);
    const { dec } = await failover(d, lim, 'module');
    assert.ok(dec.allowed && dec.remaining <= 1000 - 11, JSON.stringify(dec)); // the replica had the grants
    assert.ok(rl.metrics().trips >= 1);
  });

  test(`failover to a primary without the module: the Lua twins, NOSCRIPT answered (${kind})`, sentinel, async (t) => {
    const d = await Deployment.start({ replicaModule: false });
    t.after(() => d.close());
    const c = await connectSentinel(kind, d.ports, SERVICE);
    t.after(() => c.close());
    const { rl, lim } = limiter(c.client);
    const { promoted } = await failover(d, lim, 'lua');
    assert.equal(rl.backend, 'lua');
    assert.equal(rl.metrics().redetects, 1);
    promoted.cli('SCRIPT', 'FLUSH');
    assert.equal((await lim.limit('k')).source, 'lua');
  });

  for (const backend of ['module', 'lua']) {
    test(`strict mode: with the replica stopped a grant is a failure, never a grant (${kind}, ${backend})`, async (t) => {
      // hz 100: WAIT's timeout is checked at the server's cron resolution (1000/hz ms)
      const primary = await new Server({ module: backend === 'module', args: ['--hz', '100'] }).start();
      t.after(() => primary.close());
      const rep = await startReplica(primary, { module: backend === 'module' });
      t.after(() => rep.close());
      await settled(primary);
      const c = await connect(kind, primary.port);
      t.after(() => c.close());
      // a fresh RateLimit until its first grant was acknowledged: a freshly
      // synced replica's first acknowledgement can come late
      let rl;
      let lim;
      for (let i = 0; ; i++) {
        rl = new RateLimit(c.client, { timeoutMs: 200, breaker: { failures: 3, openMs: 50 }, strict: { replicas: 1, timeoutMs: 50 } });
        lim = rl.limiter(BUCKET, { panic: new Panic({ limit: 2, windowMs: 1e9 }) });
        if ((await lim.limit('k')).source === backend) break;
        assert.ok(i < 50, 'no acknowledged grant in 50 tries');
      }
      for (let i = 0; i < 3; i++) {
        const dec = await lim.limit('k');
        assert.ok(dec.allowed && dec.source === backend, JSON.stringify(dec));
      }
      assert.equal((await lim.limit('k', { dryRun: true })).source, backend); // no write: no WAIT
      rep.signal('SIGSTOP');
      try {
        const m0 = rl.metrics();
        for (let i = 0; i < 6; i++) {
          const t0 = performance.now();
          const dec = await lim.limit('k');
          assert.ok(performance.now() - t0 <= 200 + SLACK_MS);
          assert.equal(dec.source, 'panic', JSON.stringify(dec)); // never the shared grant without a copy
        }
        const m = rl.metrics();
        assert.equal(m.failures - m0.failures, 3);
        assert.equal(m.trips, 1);
        assert.ok(m.unreplicated - m0.unreplicated >= 1);
        // a lease is a grant: unacknowledged, it puts nothing in a reservoir
        await new Promise((r) => setTimeout(r, 60)); // the breaker half-opens after openMs
        const leased = rl.leased(BUCKET, { batch: 10 });
        const dl = await leased.limit('lease');
        assert.equal(dl.source, 'panic', JSON.stringify(dl));
        assert.equal(leased.stranded(), 0);
        await leased.close();
      } finally {
        rep.signal('SIGCONT');
      }
      await waitUntil(async () => (await lim.limit('k')).source === backend, { what: 'strict grants after SIGCONT' });
      assert.equal(rl.metrics().state, 'closed');
    });
  }
}

// The same switch without a failover's timing: the connection moves from a
// server with the module to one without (as to a promoted replica), and
// the first call there, answered in time with "unknown command", must be a
// failure (panic), not an error for the caller; the next call detects Lua.
for (const kind of RUN.filter((k) => family(k) === 'ioredis')) {
  test(`a primary that loses the module: a failure, then the backend detected again (${kind})`, async (t) => {
    const a = await new Server().start();
    t.after(() => a.close());
    const b = await new Server({ module: false }).start();
    t.after(() => b.close());
    const c = await connect(kind, a.port);
    t.after(() => c.close());
    const { rl, lim } = limiter(c.client);
    assert.equal((await lim.limit('k')).source, 'module');
    c.client.options.port = b.port;
    c.client.disconnect(true);
    await waitUntil(async () => (await c.client.call('COMMAND', 'INFO', 'RL.TOKENBUCKET'))[0] === null,
      { what: 'reconnected to the server without the module' });
    assert.equal((await lim.limit('k')).source, 'panic');
    assert.equal(rl.metrics().redetects, 1);
    assert.equal((await lim.limit('k')).source, 'lua');
  });
}

test('strict mode: the WAIT timeout must fit inside the call timeout', () => {
  const fake = { sendCommand() {}, isOpen: true, multi() {} };
  assert.throws(() => new RateLimit(fake, { timeoutMs: 5, strict: { timeoutMs: 5 } }), /strict\.timeoutMs.*timeoutMs/);
  assert.equal(new RateLimit(fake, { timeoutMs: 5, strict: true })._backend.strict.waitMs, 4);
  assert.throws(() => new RateLimit(fake, { timeoutMs: 1, strict: true }), RangeError);
});
