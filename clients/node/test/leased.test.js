// Leases: exactness across processes, background refills, idle refunds.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fork } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { startServer, waitUntil } from './harness.js';
import { connect } from './clients.js';
import { RateLimit, tokenBucket, slidingLog } from '../src/index.js';

let server;
let refundSupported;
before(async () => {
  server = await startServer();
  refundSupported = !/syntax error|ERR/i.test(server.cli('RL.TOKENBUCKET', 'rl:{probe}:r', 1, 1, 1000, 'REFUND', 1));
});
after(async () => { await server.close(); });

function serverUsed(key, limit, windowMs) {
  // COST 0: reports the state and writes nothing
  const [, , remaining] = server.cli('RL.SLIDINGLOG', key, limit, windowMs, 'COST', 0).split('\n').map(Number);
  return limit - remaining;
}

test('4 processes × 2 leased limiters never grant more than the shared limit; ≥ 95% of it under high demand', async (t) => {
  const LIMIT = 1000;
  const WINDOW = 10000;
  const key = 'rl:{exact}:shared';
  const kids = [];
  const last = [];
  for (let i = 0; i < 4; i++) {
    const kind = i % 2 === 0 ? 'ioredis' : 'node-redis5';
    const child = fork(new URL('./fixtures/hammer.js', import.meta.url), [String(server.port), kind, key, String(LIMIT), String(WINDOW), '50']);
    kids.push(child);
    child.on('message', (m) => { last[i] = m; });
  }
  try {
    await waitUntil(() => last.filter((m) => m).length === 4, { what: 'children ready' });
    const t0 = performance.now();
    for (const c of kids) c.send('go');
    const total = () => last.reduce((s, m) => s + m.granted.a + m.granted.b, 0);
    const held = (n) => last.reduce((s, m) => s + m.stranded[n], 0);
    // the shared limit is all leased out
    await waitUntil(() => serverUsed(key, LIMIT, WINDOW) === LIMIT, { what: 'the shared limit leased out' });
    if (refundSupported) {
      // half the limiters go idle: their reservoirs come back with REFUND
      for (const c of kids) c.send('idle-b');
      await waitUntil(() => held('b') === 0 && last.every((m) => m.metrics.refunds > 0), { what: 'idle reservoirs refunded' });
    } else {
      t.diagnostic('this module build has no REFUND: idle refunds not exercised');
    }
    // the active ones drain the rest
    await waitUntil(() => held('a') === 0 && held('b') === 0 && serverUsed(key, LIMIT, WINDOW) === LIMIT,
      { what: 'every leased unit spent' });
    for (const c of kids) c.send('stop');
    await waitUntil(() => last.every((m) => m.type === 'final'), { what: 'children finished' });
    const elapsed = performance.now() - t0;
    const granted = total();
    const used = serverUsed(key, LIMIT, WINDOW);
    const m = last.map((x) => x.metrics);
    const leased = m.reduce((s, x) => s + x.leaseTokens, 0);
    const refunded = m.reduce((s, x) => s + x.refundTokens, 0);
    t.diagnostic(`granted at the callers ${granted} (per process ${last.map((x) => x.granted.a + x.granted.b).join(', ')}), ` +
      `on the server ${used}, leased ${leased}, refunded ${refunded}, ` +
      `shared calls ${m.reduce((s, x) => s + x.calls, 0)}, local decisions ${m.reduce((s, x) => s + x.decisionsLocal, 0)}, ` +
      `${Math.round(elapsed)} ms`);
    assert.ok(elapsed < WINDOW, 'the run must fit in one window for the counts to be per window');
    assert.ok(granted <= LIMIT, `granted ${granted} > ${LIMIT}`);
    assert.ok(granted >= 0.95 * LIMIT, `granted ${granted} < 95% of ${LIMIT}`);
    // every unit the server counts was granted at a caller, once all reservoirs are back
    assert.equal(used, granted);
    assert.equal(leased - refunded, granted);
    assert.ok(m.every((x) => x.failures === 0 && x.decisionsPanic === 0));
  } finally {
    for (const c of kids) if (c.exitCode === null) c.kill('SIGKILL');
  }
});
