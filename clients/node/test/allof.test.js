// allOf (RL.MULTI and multi.lua) and refunds (REFUND), on the module and on
// the Lua twins: both must have them (a build without them fails here).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { startServer, Cluster, ServerClock } from './harness.js';
import { connect, KINDS } from './clients.js';
import {
  RateLimit, tokenBucket, slidingLog, slidingCounter, allOf, makeKey, headers, problem, CrossSlotError,
  SCRIPTS,
} from '../src/index.js';

let server;
let has;
before(async () => {
  server = await startServer();
  has = {
    multi: /RL\.MULTI|rl\.multi/i.test(server.cli('COMMAND', 'INFO', 'RL.MULTI')),
    refund: !/ERR/.test(server.cli('RL.TOKENBUCKET', 'rl:{probe}:r', 1, 1, 1000, 'REFUND', 1)),
    luaMulti: Boolean(SCRIPTS.multi),
  };
  has.luaRefund = !/ERR/.test(server.cli('EVAL', SCRIPTS.tokenbucket.text, 1, 'rl:{probe}:l', 1, 1, 1000, 'REFUND', 1));
  assert.deepEqual(has, { multi: true, refund: true, luaMulti: true, luaRefund: true }, 'RL.MULTI and REFUND on both backends');
});
after(async () => { await server.close(); });

// 5 an hour (a token every 12 min): no token comes back between the calls
// of a sequence however slow the machine is (it was 5 a second: a stall of
// 200 ms refilled one)
const perSecond = tokenBucket('s', 5, 5, 3600000);
const perDay = slidingLog('day', 8, 86400000);
// an hour's counter, its window aligned to the epoch: each sequence starts
// with 30 s of the hour left (ServerClock.room)
const bytes = slidingCounter('bytes', 1000, 3600000).weighted(100);

test('allOf keys that cannot share a cluster slot: CrossSlotError before any call', async () => {
  const { client, close } = await connect('ioredis', server.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 2000 });
    const lim = rl.limiter(allOf([perSecond, perDay]));
    await assert.rejects(lim.limit(['rl:{a}:s', 'rl:{b}:day']), CrossSlotError);
    await assert.rejects(lim.limit(['rl:{a}:s', 'rl:{a}:s']), RangeError);
    assert.equal(rl.metrics().calls, 0);
  } finally { await close(); }
});

async function allOrNothing(t, backend, kind = 'ioredis', ports = server.port, cluster = false) {
  const { client, close } = await connect(kind, ports, { cluster });
  try {
    const rl = new RateLimit(client, { timeoutMs: 2000, backend });
    const clock = await ServerClock.open(server.port);
    try { await clock.room(3600000, 30000); } finally { clock.close(); }
    const rule = allOf([perSecond, perDay, bytes], { name: 'api' });
    const lim = rl.limiter(rule);
    const key = makeKey(`all-${backend}-${kind}`, 'u1');
    const out = [];
    for (let i = 0; i < 7; i++) out.push(await lim.limit(key));
    // the bucket (5) binds first: 5 grants, then denials that take nothing
    assert.deepEqual(out.map((d) => d.allowed), [true, true, true, true, true, false, false]);
    assert.equal(out[0].source, backend);
    assert.equal(out[0].policy, 'api');
    assert.deepEqual(out[0].parts.map((p) => [p.policy, p.granted, p.limit, p.remaining]),
      [['s', 1, 5, 4], ['day', 1, 8, 7], ['bytes', 100, 1000, 900]]);
    // granted: the binding part has the fewest whole requests left (bytes: 9, s: 4)
    assert.equal(out[0].binding, 's');
    assert.equal(out[4].binding, 's');
    assert.equal(out[4].remaining, 0);
    const denied = out[5];
    assert.equal(denied.binding, 's');
    // a token's interval (12 min) less the sequence's time, up to a minute of it
    assert.ok(denied.retryAfterMs > 720000 - 60000 && denied.retryAfterMs <= 720000, `${denied.retryAfterMs}`);
    assert.ok(denied.resetAfterMs > 3600000 - 60000 && denied.resetAfterMs <= 3600000, `${denied.resetAfterMs}`);
    assert.deepEqual(denied.parts.map((p) => p.granted), [0, 0, 0]);
    assert.deepEqual(problem(denied)['violated-policies'], ['s']);
    const h = headers(denied);
    assert.equal(h['RateLimit-Policy'], '"s";q=5;w=3600, "day";q=8;w=86400, "bytes";q=1000;w=3600');
    assert.equal(h.RateLimit, `"s";r=0;t=${Math.ceil(denied.resetAfterMs / 1000)}`);
    assert.equal(h['Retry-After'], String(Math.ceil(denied.retryAfterMs / 1000)));
    // nothing was taken by the denials: the day log holds exactly 5
    const day = await rl.limiter(perDay).limit(`${key}:day`, { cost: 0 });
    assert.equal(day.remaining, 3);
    // partial: as many whole requests as every part allows
    const p = await lim.limit(makeKey(`partial-${backend}-${kind}`, 'u'), { cost: 20, partial: true });
    assert.equal(p.granted, 5);
    assert.equal(p.allowed, false);
    t.diagnostic(`${backend}/${kind}: ${JSON.stringify(out.map((d) => [d.allowed, d.binding, d.remaining]))}`);
    return out;
  } finally { await close(); }
}

test('allOf on the module: all or nothing, binding part, headers', async (t) => {
  await allOrNothing(t, 'module');
});

test('allOf on the Lua twins (multi.lua): the same', async (t) => {
  await allOrNothing(t, 'lua');
});

test(`allOf on a cluster (${KINDS.join(', ')}), module and Lua`, async (t) => {
  const backends = ['module', 'lua'];
  const cluster = await Cluster.start(3);
  try {
    const ports = cluster.nodes.map((s) => s.port);
    for (const kind of KINDS) {
      for (const backend of backends) await allOrNothing(t, backend, kind, ports, true);
    }
  } finally { await cluster.close(); }
});

test('allOf panic decisions: every part\'s panic bucket, all or nothing', async () => {
  const { client, close } = await connect('ioredis', server.port, { ioredisOpts: { enableOfflineQueue: false } });
  await close(); // unavailable: every call fails at once
  const rl = new RateLimit(client, { timeoutMs: 50 });
  const lim = rl.limiter(allOf([perSecond, perDay]), { panic: { instances: 2 } }); // 2 an hour, 4 a day
  const out = [];
  for (let i = 0; i < 4; i++) out.push(await lim.limit(makeKey('p', 'u')));
  assert.deepEqual(out.map((d) => [d.source, d.allowed]), [['panic', true], ['panic', true], ['panic', false], ['panic', false]]);
  assert.deepEqual(out[1].parts.map((p) => [p.policy, p.limit, p.remaining]), [['s', 2, 0], ['day', 4, 2]]);
  assert.equal(out[2].binding, 's');
  assert.deepEqual(out[2].parts.map((p) => p.granted), [0, 0]);
  assert.equal(headers(out[2])['RateLimit-Policy'], '"s";q=2;w=3600, "day";q=4;w=86400');
  // a panic token every 30 min, less the calls' time (up to a minute of it)
  assert.ok(out[2].retryAfterMs > 1800000 - 60000 && out[2].retryAfterMs <= 1800000, `${out[2].retryAfterMs}`);
  assert.equal(headers(out[2])['Retry-After'], String(Math.ceil(out[2].retryAfterMs / 1000)));
});

test('refund gives units back (module and Lua, single and allOf)', async () => {
  const { client, close } = await connect('node-redis', server.port);
  try {
    for (const backend of ['module', 'lua']) {
      const rl = new RateLimit(client, { timeoutMs: 2000, backend });
      const lim = rl.limiter(perDay);
      const key = makeKey(`refund-${backend}`, 'u');
      await lim.limit(key, { cost: 8 });
      assert.equal((await lim.limit(key)).allowed, false);
      const r = await lim.refund(key, 3);
      assert.equal(r.granted, 3);
      assert.equal(r.remaining, 3);
      assert.equal(r.source, backend);
      assert.equal((await lim.limit(key, { cost: 3 })).allowed, true);
      assert.equal(rl.metrics().refundTokens, 3);
      {
        const all = rl.limiter(allOf([perSecond, perDay]));
        const k2 = makeKey(`refund-all-${backend}`, 'u');
        await all.limit(k2, { cost: 4 });
        const rr = await all.refund(k2, 2);
        assert.equal(rr.granted, 2);
        assert.deepEqual(rr.parts.map((p) => [p.policy, p.granted]), [['s', 2], ['day', 2]]);
      }
    }
  } finally { await close(); }
});

for (const backend of ['module', 'lua']) test(`leased (${backend}): an idle key gives its unused units back; close() gives back the rest`, async () => {
  const { client, close } = await connect('ioredis', server.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 2000, backend });
    const policy = slidingLog(`idle${backend}`, 1000, 3600000);
    const lim = rl.leased(policy, { batch: 100, idleMs: 50 });
    const probe = rl.limiter(policy);
    const counted = async (k) => 1000 - (await probe.limit(k, { cost: 0 })).remaining;
    const a = `rl:{idle-${backend}}:a`;
    const b = `rl:{idle-${backend}}:b`;
    await lim.limit(a, { cost: 3 });
    assert.equal(await counted(a), 100);
    assert.equal(lim.stranded(), 97);
    const { waitUntil } = await import('./harness.js');
    await waitUntil(async () => (await counted(a)) === 3, { what: 'the idle refund' });
    assert.equal(lim.stranded(), 0);
    await lim.limit(b);
    await lim.close();
    assert.equal(await counted(b), 1);
    assert.equal(rl.metrics().refundTokens, 97 + 99);
  } finally { await close(); }
});

test('allOf: the module and the Lua twins give the same decisions', async (t) => {
  let t0 = performance.now();
  const a = await allOrNothing(t, 'module', 'node-redis');
  const apartA = performance.now() - t0;
  t0 = performance.now();
  const b = await allOrNothing(t, 'lua', 'node-redis');
  // durations differ by at most how much longer one sequence's gaps were
  const apart = Math.max(apartA, performance.now() - t0) + 2;
  const shape = (d) => [d.allowed, d.granted, d.limit, d.remaining, d.binding, Math.sign(d.retryAfterMs),
    d.parts.map((p) => [p.policy, p.granted, p.limit, p.remaining, Math.sign(p.retryAfterMs)])];
  assert.deepEqual(a.map(shape), b.map(shape));
  for (let i = 0; i < a.length; i++) {
    assert.ok(Math.abs(a[i].retryAfterMs - b[i].retryAfterMs) <= apart);
    assert.ok(Math.abs(a[i].resetAfterMs - b[i].resetAfterMs) <= apart);
  }
});
