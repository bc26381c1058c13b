// Leases: exactness across processes, background refills, idle refunds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { startServer, waitUntil } from './harness.js';
import { connect } from './clients.js';
import { RateLimit, slidingLog } from '../src/index.js';

let server;
let probeConn;
before(async () => {
  server = await startServer();
  probeConn = await connect('ioredis', server.port);
});
after(async () => { await probeConn.close(); await server.close(); });

for (const backend of ['module', 'lua']) test(`4 processes × 2 leased limiters (${backend}) never grant more than the shared limit; ≥ 95% of it under high demand, idle refunds included`, async (t) => {
  const LIMIT = 1000;
  const WINDOW = 10000;
  const key = `rl:{exact-${backend}}:shared`;
  const probe = new RateLimit(probeConn.client, { timeoutMs: 5000, backend });
  // units the server counts in the window (COST 0: reports, writes nothing)
  const serverUsed = async () => LIMIT - (await probe.limiter(slidingLog('shared', LIMIT, WINDOW)).limit(key, { cost: 0 })).remaining;
  const kids = [];
  const last = [];
  for (let i = 0; i < 4; i++) {
    const kind = i % 2 === 0 ? 'ioredis' : 'node-redis5';
    const child = fork(new URL('./fixtures/hammer.js', import.meta.url), [String(server.port), kind, key, String(LIMIT), String(WINDOW), '50', backend, '40']);
    kids.push(child);
    child.on('message', (m) => { last[i] = m; });
  }
  try {
    await waitUntil(() => last.filter((m) => m).length === 4, { what: 'children ready' });
    const t0 = performance.now();
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
    const elapsed = performance.now() - t0;
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
