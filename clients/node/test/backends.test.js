// Differential: the module backend and the Lua twins give the same
// Decisions for the same sequence of calls, with each client kind,
// standalone and cluster. Also: backend detection, NOSCRIPT recovery,
// error replies surfacing as errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { startServer, Server, Cluster, ServerClock } from './harness.js';
import { connect, KINDS } from './clients.js';
import { RateLimit, tokenBucket, slidingLog, slidingCounter, makeKey, UnavailableError } from '../src/index.js';

const POLICIES = [
  tokenBucket('tb', 10, 1, 60000),
  slidingLog('log', 10, 60000),
  // an hour's counter, its window aligned to the epoch: each differential
  // starts with 30 s of the hour left (ServerClock.room), so the module's call
  // and its twin's never fall on two sides of a boundary
  slidingCounter('ctr', 10, 3600000),
];
const OPS = [
  {}, { cost: 3 }, { cost: 0 }, { cost: 5, dryRun: true }, { cost: 5, partial: true }, { cost: 4 },
  { cost: 2, partial: true }, { cost: 11 }, { cost: 11, partial: true }, {}, { cost: 1, dryRun: true }, { cost: 10, partial: true },
  { refund: 4 }, { cost: 5 }, { refund: 100 }, { cost: 10 },
];

// Durations depend on the microsecond each call ran at: equal in kind (0,
// -1 or positive) and apart by no more than how far apart the two keys'
// calls ran, now and in their history (the largest gap of an earlier pair),
// plus 1 ms of rounding each; everything else exactly equal.
function sameDecision(a, b, what, apartMs) {
  for (const f of ['allowed', 'granted', 'limit', 'remaining', 'policy', 'binding']) assert.equal(a[f], b[f], `${what}: ${f}`);
  for (const f of ['retryAfterMs', 'resetAfterMs']) {
    assert.equal(Math.sign(a[f]), Math.sign(b[f]), `${what}: ${f} ${a[f]} vs ${b[f]}`);
    assert.ok(Math.abs(a[f] - b[f]) <= apartMs + 2, `${what}: ${f} ${a[f]} vs ${b[f]} (calls ${apartMs.toFixed(1)} ms apart)`);
  }
  assert.equal(a.source, 'module');
  assert.equal(b.source, 'lua');
}

async function differential(client, tags) {
  const clock = await ServerClock.open(server.port);
  try { await clock.room(3600000, 30000); } finally { clock.close(); }
  const mod = new RateLimit(client, { timeoutMs: 2000, backend: 'module' });
  const lua = new RateLimit(client, { timeoutMs: 2000, backend: 'lua' });
  let n = 0;
  for (const tag of tags) {
    for (const p of POLICIES) {
      const lm = mod.limiter(p);
      const ll = lua.limiter(p);
      let history = 0; // the largest gap between a module call and its Lua twin so far
      for (const [i, op] of OPS.entries()) {
        const call = (lim, k) => (op.refund !== undefined ? lim.refund(k, op.refund) : lim.limit(k, op));
        const t0 = performance.now();
        const a = await call(lm, makeKey(tag, 'm', p.name));
        const b = await call(ll, makeKey(tag, 'l', p.name));
        const gap = performance.now() - t0;
        sameDecision(a, b, `${tag} ${p.name} op ${i} ${JSON.stringify(op)}`, gap + history);
        history = Math.max(history, gap);
        n++;
      }
    }
  }
  const nRefunds = 2 * tags.length * POLICIES.length;
  assert.equal(mod.metrics().decisionsModule + mod.metrics().refunds, n);
  assert.equal(lua.metrics().decisionsLua + lua.metrics().refunds, n);
  assert.equal(mod.metrics().refunds, nRefunds);
  assert.equal(mod.metrics().failures + lua.metrics().failures, 0);
  return n;
}

let server;
before(async () => {
  server = await startServer();
});
after(async () => { await server.close(); });

for (const kind of KINDS) {
  test(`module and Lua give identical decisions (${kind}, standalone)`, async () => {
    const { client, close } = await connect(kind, server.port);
    try {
      const n = await differential(client, [`${kind}-a`, `${kind}-b`]);
      assert.equal(n, 2 * POLICIES.length * OPS.length);
    } finally { await close(); }
  });
}

test(`module and Lua give identical decisions on a cluster (${KINDS.join(', ')})`, async () => {
  const cluster = await Cluster.start(3);
  try {
    // tags spread over the three nodes: every call must reach its key's node
    const tags = ['t0', 't1', 't2', 't3', 't4', 't5'];
    for (const kind of KINDS) {
      const { client, close } = await connect(kind, cluster.nodes.map((s) => s.port), { cluster: true });
      try {
        await differential(client, tags.map((t) => `${kind}-${t}`));
      } finally { await close(); }
    }
    // the keys are where the slot map says: each node holds some of them
    const counts = cluster.nodes.map((s) => Number(s.cli('DBSIZE')));
    assert.equal(counts.reduce((a, b) => a + b), KINDS.length * 6 * 2 * POLICIES.length);
    assert.ok(counts.every((c) => c > 0), `keys per node ${counts}`);
    // … and every call went straight to its key's node: none was redirected
    const moved = cluster.nodes.map((s) => Number(/errorstat_MOVED:count=(\d+)/.exec(s.cli('INFO', 'errorstats'))?.[1] || 0));
    assert.deepEqual(moved, [0, 0, 0], `MOVED replies per node ${moved}`);
  } finally { await cluster.close(); }
});

test('auto picks the module when it is loaded, the Lua twins when not', async () => {
  const bare = await new Server({ module: false }).start();
  try {
    for (const kind of KINDS) {
      const a = await connect(kind, server.port);
      const b = await connect(kind, bare.port);
      try {
        const ra = new RateLimit(a.client, { timeoutMs: 2000 });
        const rb = new RateLimit(b.client, { timeoutMs: 2000 });
        assert.equal(ra.backend, null);
        assert.equal(await ra.detect(), 'module');
        assert.equal(await rb.detect(), 'lua');
        const d = await rb.limiter(slidingLog('x', 2, 60000)).limit('rl:{auto}:' + kind);
        assert.equal(d.source, 'lua');
        assert.equal(d.remaining, 1);
        // forcing the module where there is none is an error, not a silent fallback
        const forced = new RateLimit(b.client, { timeoutMs: 2000, backend: 'module' });
        await assert.rejects(forced.limiter(slidingLog('x', 2, 60000)).limit('rl:{f}:x'), /module is not loaded/);
      } finally { await a.close(); await b.close(); }
    }
  } finally { await bare.close(); }
});

test('NOSCRIPT after SCRIPT FLUSH: the script is sent again, once', async () => {
  const { client, close } = await connect('ioredis', server.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 2000, backend: 'lua' });
    const lim = rl.limiter(tokenBucket('ns', 5, 1, 60000));
    assert.equal((await lim.limit('rl:{ns}:a')).remaining, 4);
    await client.call('SCRIPT', 'FLUSH');
    await client.call('CONFIG', 'RESETSTAT');
    assert.equal((await lim.limit('rl:{ns}:a')).remaining, 3);
    assert.equal((await lim.limit('rl:{ns}:a')).remaining, 2);
    const stats = await client.info('commandstats');
    assert.match(stats, /cmdstat_eval:calls=1,/); // exactly one EVAL after the flush
    assert.match(stats, /cmdstat_evalsha:calls=2,.*failed_calls=1\r/); // one NOSCRIPT, then EVALSHA
  } finally { await close(); }
});

test('error replies surface as errors; they are not failures of Redis', async () => {
  const { client, close } = await connect('node-redis', server.port);
  try {
    await client.set('rl:{e}:str', 'x');
    for (const backend of ['module', 'lua']) {
      const rl = new RateLimit(client, { timeoutMs: 2000, backend });
      await assert.rejects(rl.limiter(tokenBucket('e', 5, 1, 1000)).limit('rl:{e}:str'), /WRONGTYPE/);
      assert.equal(rl.metrics().failures, 0);
      assert.equal(rl.metrics().state, 'closed');
    }
  } finally { await close(); }
});

test('a closed connection is a failure: panic decisions, never an exception', async () => {
  const { client, close } = await connect('ioredis', server.port, { ioredisOpts: { enableOfflineQueue: false, maxRetriesPerRequest: 0 } });
  await close();
  const rl = new RateLimit(client, { timeoutMs: 50 });
  const d = await rl.limiter(tokenBucket('c', 4, 1, 60000)).limit('rl:{c}:x');
  assert.equal(d.source, 'panic');
  assert.equal(d.limit, 4);
  assert.equal(d.remaining, 3);
  assert.equal(rl.metrics().failures, 1);
  assert.ok(UnavailableError);
});

test('leased: an error reply reaches the caller; nothing is left unhandled', async () => {
  const { client, close } = await connect('ioredis', server.port);
  const unhandled = [];
  const onUnhandled = (e) => unhandled.push(e);
  process.on('unhandledRejection', onUnhandled);
  try {
    await client.set('rl:{lw}:str', 'x');
    const rl = new RateLimit(client, { timeoutMs: 2000 });
    const lim = rl.leased(tokenBucket('lw', 100, 1, 1000), { batch: 10 });
    await assert.rejects(lim.limit('rl:{lw}:str'), /WRONGTYPE/);
    await assert.rejects(Promise.all([lim.limit('rl:{lw}:str'), lim.limit('rl:{lw}:str')]), /WRONGTYPE/);
    assert.equal(rl.metrics().failures, 0);
    await lim.close();
    await new Promise((r) => setTimeout(r, 20)); // give a stray rejection the chance to surface
    assert.deepEqual(unhandled, []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
    await close();
  }
});
