// Leases: exactness across processes, background refills, idle refunds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { startServer, waitUntil, ServerClock } from './harness.js';
import { connect, FAMILIES } from './clients.js';
import { RateLimit, slidingLog } from '../src/index.js';

let server;
let probeConn;
let clock;
before(async () => {
  server = await startServer();
  probeConn = await connect('ioredis', server.port);
  clock = await ServerClock.open(server.port);
});
after(async () => { clock.close(); await probeConn.close(); await server.close(); });

for (const backend of ['module', 'lua']) test(`4 processes × 2 leased limiters (${backend}) never grant more than the shared limit; ≥ 95% of it under high demand, idle refunds included`, async (t) => {
  const LIMIT = 1000;
  // A sliding log starts no window of its own: its grants leave it WINDOW
  // after they were made. The counts are per window only if the whole run
  // fits in one, so WINDOW is an hour, beyond any run (the test's waits give
  // up after 30 s each); the run is timed on the server's clock.
  const WINDOW = 3600000;
  const key = `rl:{exact-${backend}}:shared`;
  const probe = new RateLimit(probeConn.client, { timeoutMs: 5000, backend });
  // units the server counts in the window (COST 0: reports, writes nothing)
  const serverUsed = async () => LIMIT - (await probe.limiter(slidingLog('shared', LIMIT, WINDOW)).limit(key, { cost: 0 })).remaining;
  const kids = [];
  const last = [];
  for (let i = 0; i < 4; i++) {
    // the run's libraries in turn (ioredis and node-redis by default)
    const fams = FAMILIES.length > 1 ? FAMILIES : ['ioredis', 'node-redis'];
    const kind = fams[i % fams.length];
    const child = fork(new URL('./fixtures/hammer.js', import.meta.url), [String(server.port), kind, key, String(LIMIT), String(WINDOW), '50', backend, '40']);
    kids.push(child);
    child.on('message', (m) => { last[i] = m; });
  }
  try {
    await waitUntil(() => last.filter((m) => m).length === 4, { what: 'children ready' });
    const t0 = await clock.ms();
    for (const c of kids) c.send('go');
    const total = () => last.reduce((s, m) => s + m.granted.a + m.granted.b, 0);
    const held = (n) => last.reduce((s, m) => s + m.stranded[n], 0);
    // fresh counts from every child
    const poll = async () => {
      const n = last.map((m) => m.seq || 0);
      for (const c of kids) c.send('report');
      await waitUntil(() => last.every((m, i) => (m.seq || 0) > n[i]), { what: 'reports' });
    };
    // b goes idle with units in its reservoir: they come back by REFUND and
    // the a limiters, still hammering, pick them up; in the end every unit is
    // spent and no reservoir holds any
    await waitUntil(async () => {
      await poll();
      return last.every((m) => !m.active.b && m.pending === 0) && held('a') === 0 && held('b') === 0
        && (await serverUsed()) === LIMIT;
    }, { what: 'every leased unit spent', interval: 20 });
    for (const c of kids) c.send('stop');
    await waitUntil(() => last.every((m) => m.type === 'final'), { what: 'children finished' });
    const elapsed = (await clock.ms()) - t0;
    const granted = total();
    const used = await serverUsed();
    const m = last.map((x) => x.metrics);
    const leased = m.reduce((s, x) => s + x.leaseTokens, 0);
    const refunded = m.reduce((s, x) => s + x.refundTokens, 0);
    t.diagnostic(`backend ${backend}; granted at the callers ${granted} (per process ${last.map((x) => x.granted.a + x.granted.b).join(', ')}), ` +
      `on the server ${used}, leased ${leased}, refunded ${refunded}, ` +
      `shared calls ${m.reduce((s, x) => s + x.calls, 0)}, local decisions ${m.reduce((s, x) => s + x.decisionsLocal, 0)}, ` +
      `${Math.round(elapsed)} ms`);
    assert.ok(elapsed < WINDOW, 'the run must fit in one window for the counts to be per window');
    assert.ok(granted <= LIMIT, `granted ${granted} > ${LIMIT}`);
    assert.ok(granted >= 0.95 * LIMIT, `granted ${granted} < 95% of ${LIMIT}`);
    // every unit the server counts was granted at a caller, once all reservoirs are back
    assert.equal(used, granted);
    assert.equal(leased - refunded, granted);
    assert.ok(refunded > 0, 'idle reservoirs gave units back');
    assert.ok(m.every((x) => x.failures === 0 && x.decisionsPanic === 0));
  } finally {
    for (const c of kids) if (c.exitCode === null) c.kill('SIGKILL');
  }
});

test('a cost above the batch leases what it needs in one call', async () => {
  const rl = new RateLimit(probeConn.client, { timeoutMs: 5000 });
  const lim = rl.leased(slidingLog('big', 100, 60000), { batch: 5 });
  const d = await lim.limit('rl:{big}:x', { cost: 30 });
  assert.equal(d.allowed, true);
  assert.equal(d.source, 'module');
  assert.equal(rl.metrics().leases, 1);
  assert.equal(rl.metrics().leaseTokens, 30);
  assert.equal((await lim.limit('rl:{big}:x', { cost: 71 })).allowed, false); // 70 left on the server
  assert.equal((await lim.limit('rl:{big}:x', { cost: 70 })).allowed, true);
  await lim.close();
});

// DESIGN.md: a caller that waited for the lease in flight and is still short
// is denied from the last shared reply; it takes no lease of its own (the
// refill stays off the caller's path). Python's leased limiters do the same
// (clients/python/tests/test_leased.py, test_waiter_still_short_is_denied).
test('a caller that waited for a lease in flight and is still short is denied locally, without a lease of its own', async () => {
  const rl = new RateLimit(probeConn.client, { timeoutMs: 5000 });
  const lim = rl.leased(slidingLog('burst', 100000, 3600000), { batch: 2, lowWater: 0 });
  const key = 'rl:{burst}:x';
  // the first caller takes the key's first lease on its path; three more
  // arrive while it is in flight and wait for it: it brings 2 units for 4
  const ds = await Promise.all([0, 1, 2, 3].map(() => lim.limit(key)));
  assert.deepEqual(ds.map((d) => [d.allowed, d.source]),
    [[true, 'module'], [true, 'local'], [false, 'local'], [false, 'local']]);
  for (const d of ds.slice(2)) {
    assert.equal(d.retryAfterMs, 1); // the last reply granted all it asked: retry at once (≥ 1)
    assert.equal(d.remaining, 100000 - 2); // reservoir 0 + the shared remaining
  }
  let m = rl.metrics();
  assert.equal(m.leases, 1);
  assert.equal(m.leaseWaits, 3);
  assert.equal(m.calls, 1); // the one lease, on the first caller's path
  // the denial is not sticky: the next caller finds no lease in flight and takes one
  const next = await lim.limit(key);
  assert.equal(next.allowed, true);
  assert.equal(next.source, 'module');
  m = rl.metrics();
  assert.equal(m.leases, 2);
  await lim.close();
});

// DESIGN.md: a waiter whose lease brought no reply in time gets the panic
// limits, as the caller that sent it does (not a local denial), whether a
// shared reply for the key is known from before or not.
// Python: test_waiter_after_a_failed_lease_gets_the_panic_limits.
test('a caller that waited for a lease that failed gets the panic limits', async () => {
  const server2 = await startServer();
  const { client, close } = await connect('ioredis', server2.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 100, breaker: { failures: 100 } });
    const lim = rl.leased(slidingLog('fail', 100000, 3600000), { batch: 1, lowWater: 0, panic: { limit: 5, windowMs: 3600000 } });
    assert.equal((await lim.limit('rl:{known}:x')).source, 'module'); // a shared reply known; reservoir empty
    server2.signal('SIGSTOP');
    // per key: the first caller's lease times out, the second waits for it
    const ds = await Promise.all(['rl:{known}:x', 'rl:{known}:x', 'rl:{fresh}:x', 'rl:{fresh}:x'].map((k) => lim.limit(k)));
    assert.deepEqual(ds.map((d) => [d.source, d.allowed, d.limit]), Array(4).fill(['panic', true, 5]));
    assert.equal(rl.metrics().leaseWaits, 2);
  } finally {
    server2.signal('SIGCONT');
    await close();
    await server2.close();
  }
});

// Redis stopped, the breaker open and half-open: no limit() waits on Redis.
// Each half-open probe is a background lease: when the caller that let it
// out gets its decision (the panic limits), the probe is still in flight;
// after SIGCONT a probe closes the breaker and Redis decides again.
// Python: test_leased_probes_from_the_worker_never_the_request.
test('while the breaker is open or half-open, a caller never waits for the probe', async () => {
  const server2 = await startServer();
  const { client, close } = await connect('ioredis', server2.port);
  try {
    const TIMEOUT_MS = 100;
    const rl = new RateLimit(client, { timeoutMs: TIMEOUT_MS, breaker: { failures: 1, openMs: 100 } });
    const lim = rl.leased(slidingLog('probe', 100000, 3600000), { batch: 1, lowWater: 0, panic: { limit: 1000000, windowMs: 3600000 } });
    assert.equal((await lim.limit('rl:{u}:p')).source, 'module');
    const br = rl.breaker;
    const acquire = br.acquire.bind(br);
    let probes = 0;
    let letOut = false;
    br.acquire = (now) => {
      const ok = acquire(now);
      if (ok === 2) { probes++; letOut = true; }
      return ok;
    };
    server2.signal('SIGSTOP');
    let awaited = 0; // probes a caller's decision waited for
    let n = 0;
    let worst = 0;
    const end = performance.now() + 30000;
    try {
      while (br.probesFailed < 3) {
        assert.ok(performance.now() < end, 'no probe failed in 30 s');
        letOut = false;
        const t0 = performance.now();
        const d = await lim.limit(`rl:{k${n % 7}}:p`);
        worst = Math.max(worst, performance.now() - t0);
        if (n > 0) assert.equal(d.source, 'panic'); // the first one opens the breaker
        if (letOut && !br.probing) awaited++; // the probe was over when its caller got its decision
        n++;
        await new Promise((r) => setImmediate(r));
      }
      assert.equal(awaited, 0, `${awaited} of ${probes} probes awaited by a caller`);
      assert.ok(probes >= 3 && br.trips === 1);
      assert.ok(worst < TIMEOUT_MS + 1000, `slowest decision ${worst} ms`);
    } finally {
      server2.signal('SIGCONT');
    }
    await waitUntil(async () => (await lim.limit('rl:{k1}:p')).source === 'module', { timeout: 30000, interval: 5, what: 'a decision from Redis again' });
    assert.equal(rl.metrics().state, 'closed');
    assert.equal(br.probesOk, 1);
    assert.equal(probes, br.probesFailed + 1);
    await lim.close();
  } finally {
    server2.signal('SIGCONT');
    await close();
    await server2.close();
  }
});
