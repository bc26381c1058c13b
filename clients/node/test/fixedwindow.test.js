// fixedWindow (RL.FIXEDWINDOW and fixedwindow.lua) on the module and on the
// Lua twin: the limit per window, the boundary burst, fromFirst, headers,
// allOf with fixed windows (RL.MULTI's FIXEDWINDOW kind), leases.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, waitUntil, ServerClock } from './harness.js';
import { connect, KINDS } from './clients.js';
import { RateLimit, fixedWindow, tokenBucket, slidingLog, allOf, headers } from '../src/index.js';

const HOUR = 3600000;
// hour windows aligned to the epoch: a test starts with this much of one
// left (ServerClock.room), so no boundary falls among its calls
const ROOM = 30000;
const BACKENDS = ['module', 'lua'];
// RL.MULTI's FIXEDWINDOW kind: in the module and in the Lua twin.
const MULTI_BACKENDS = ['module', 'lua'];
let server;
let clock;
before(async () => { server = await startServer(); clock = await ServerClock.open(server.port); });
after(async () => { clock.close(); await server.close(); });

test('fixedWindow: arguments checked before any call', () => {
  for (const bad of [[0, 1000], [1, 0], [2 ** 53, 1000], [1.5, 1000], ['3', 1000]]) {
    assert.throws(() => fixedWindow('fw', ...bad), RangeError);
  }
  assert.throws(() => fixedWindow('fw', 1, 1000, { fromFirst: 1 }), TypeError);
  const p = fixedWindow('fw', 5, 1000, { fromFirst: true });
  assert.deepEqual([p.kind, p.command, p.script, p.limit, p.windowMs, p.fromFirst, p.args],
    ['fixedWindow', 'RL.FIXEDWINDOW', 'fixedwindow', 5, 1000, true, ['5', '1000', 'FROMFIRST']]);
  assert.deepEqual(fixedWindow('fw', 5, 1000).args, ['5', '1000']);
  const w = p.weighted(3);
  assert.equal(w.fromFirst, true);
  assert.deepEqual([w.multiArgs, w.flags, w.weight], [['5', '1000'], ['FROMFIRST'], 3]);
});

test('a module without RL.FIXEDWINDOW refuses fixedWindow before any call', async () => {
  const { client, close } = await connect(KINDS[0], server.port);
  try {
    for (const backend of ['auto', 'module']) {
      const rl = new RateLimit(client, { timeoutMs: 2000, backend });
      assert.equal(await rl.detect(), 'module');
      assert.equal(rl._backend.hasModuleFixedWindow, true); // this module has it
      // what the detection of a module older than RL.FIXEDWINDOW leaves
      rl._backend.hasModuleFixedWindow = false;
      for (const pol of [fixedWindow('f', 1, HOUR), allOf([fixedWindow('f', 1, HOUR), slidingLog('l', 5, HOUR)])]) {
        await assert.rejects(rl.limiter(pol).limit('rl:{old}:k'), (e) => e.name === 'BackendError' && /RL\.FIXEDWINDOW/.test(e.message));
      }
      assert.equal((await rl.limiter(slidingLog('l', 5, HOUR)).limit(`rl:{old}:${backend}`)).allowed, true);
      const m = rl.metrics();
      assert.deepEqual([m.failures, m.redetects, m.state], [0, 0, 'closed']);
      assert.equal(server.cli('EXISTS', 'rl:{old}:k').trim(), '0');
    }
  } finally { await close(); }
});

for (const kind of KINDS) {
  for (const backend of BACKENDS) {
    test(`fixedWindow on ${backend} (${kind}): limit per window, headers, refund`, async () => {
      const { client, close } = await connect(kind, server.port);
      try {
        const rl = new RateLimit(client, { timeoutMs: 2000, backend });
        const lim = rl.limiter(fixedWindow('api', 3, HOUR));
        const key = `rl:{${backend}-${kind}}:api`;
        const t0 = await clock.room(HOUR, ROOM);
        const ds = [];
        for (let i = 0; i < 4; i++) ds.push(await lim.limit(key));
        const t1 = await clock.ms();
        const end = t0 - (t0 % HOUR) + HOUR;
        assert.deepEqual(ds.map((d) => [d.allowed, d.remaining]), [[true, 2], [true, 1], [true, 0], [false, 0]]);
        assert.equal(ds[0].source, backend);
        const d = ds[3];
        assert.equal(d.retryAfterMs, d.resetAfterMs);
        assert.ok(end - t1 <= d.retryAfterMs && d.retryAfterMs <= end - t0, `${d.retryAfterMs} within ${end - t1}..${end - t0}`);
        const secs = Math.ceil(d.resetAfterMs / 1000);
        assert.deepEqual(headers(d), {
          'RateLimit-Policy': '"api";q=3;w=3600', RateLimit: `"api";r=0;t=${secs}`, 'X-RateLimit-Limit': '3',
          'X-RateLimit-Remaining': '0', 'X-RateLimit-Reset': String(secs), 'Retry-After': String(secs),
        });
        // the key expires exactly at the window's end
        assert.equal(Number(server.cli('PEXPIRETIME', key).trim()), end);
        // COST above the limit: never (-1); an empty window answers fresh
        const never = await lim.limit(`${key}:fresh`, { cost: 4 });
        assert.deepEqual([never.allowed, never.remaining, never.retryAfterMs, never.resetAfterMs], [false, 3, -1, 0]);
        assert.equal(headers(never)['Retry-After'], undefined);
        const r = await lim.refund(key, 2);
        assert.deepEqual([r.granted, r.remaining, r.source], [2, 2, backend]);
      } finally { await close(); }
    });
  }
}

for (const backend of BACKENDS) {
  test(`fixedWindow on ${backend}: the boundary burst (2 x limit across one boundary)`, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      // A 3 s window, the first burst started 1.44-1.5 s before a boundary
      // (read from the server's clock) and the second right after it: each
      // burst has about 1.5 s to land on its side, 8 grants fall within one
      // window_ms. A burst that did not land on its side (a client stalled
      // for over a second) runs again on a fresh key at a later boundary, up
      // to 5 times.
      const W = 3000;
      const lim = new RateLimit(client, { timeoutMs: 2000, backend }).limiter(fixedWindow('burst', 4, W));
      let first, second, t0, t1;
      for (let attempt = 0; ; attempt++) {
        assert.ok(attempt < 5, 'no burst landed on its side of a boundary in 5 tries');
        const key = `rl:{${backend}}:burst:${attempt}`;
        const end = await clock.beforeBoundary(W, W / 2);
        t0 = await clock.ms();
        first = [];
        for (let i = 0; i < 5; i++) first.push((await lim.limit(key)).allowed);
        const ta = await clock.ms();
        await clock.past(end);
        second = [];
        for (let i = 0; i < 5; i++) second.push((await lim.limit(key)).allowed);
        t1 = await clock.ms();
        if (ta < end && t1 - t0 < W) break;
      }
      assert.deepEqual(first, [true, true, true, true, false]);
      assert.deepEqual(second, [true, true, true, true, false]);
      assert.ok(t1 - t0 < W, `8 granted within ${t1 - t0} ms`);
    } finally { await close(); }
  });

  test(`fixedWindow on ${backend}: fromFirst starts the window at the first grant`, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      // The first three calls must fall inside the window the first began:
      // a run whose third call came after it ended (a stall of W) runs
      // again on a fresh key, up to 3 times.
      const W = 1000;
      const lim = new RateLimit(client, { timeoutMs: 2000, backend }).limiter(fixedWindow('ff', 2, W, { fromFirst: true }));
      let key, exp;
      for (let attempt = 0; ; attempt++) {
        assert.ok(attempt < 3, `no three calls within ${W} ms of the first in 3 tries`);
        key = `rl:{${backend}}:ff:${attempt}`;
        const t0 = await clock.ms();
        const d = await lim.limit(key);
        const t1 = await clock.ms();
        assert.ok(d.allowed && d.resetAfterMs === W);
        exp = Number(server.cli('PEXPIRETIME', key).trim());
        assert.ok(t0 + W <= exp && exp <= t1 + W, `${exp} in ${t0 + W}..${t1 + W}`);
        const more = [(await lim.limit(key)).allowed, (await lim.limit(key)).allowed];
        if (await clock.ms() >= exp) continue;
        assert.deepEqual(more, [true, false]);
        break;
      }
      await waitUntil(() => server.cli('EXISTS', key).trim() === '0', { timeout: 5000, what: 'the window to end' });
      assert.equal((await lim.limit(key)).resetAfterMs, W);
      assert.ok(Number(server.cli('PEXPIRETIME', key).trim()) >= exp + W);
    } finally { await close(); }
  });

  if (MULTI_BACKENDS.includes(backend)) test(`allOf with fixed windows on ${backend} (RL.MULTI's FIXEDWINDOW)`, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = new RateLimit(client, { timeoutMs: 2000, backend });
      const rule = allOf([tokenBucket('tb', 100, 1, HOUR), fixedWindow('sec', 3, HOUR),
        fixedWindow('hour', 10, HOUR, { fromFirst: true }).weighted(2)], { name: 'fw' });
      const lim = rl.limiter(rule);
      const key = `rl:{${backend}}:m`;
      await clock.room(HOUR, ROOM);
      const ds = [];
      for (let i = 0; i < 4; i++) ds.push(await lim.limit(key));
      assert.deepEqual(ds.map((d) => d.allowed), [true, true, true, false]);
      // fromFirst: its window began at the first grant, a whole hour ahead
      assert.equal(ds[0].parts[2].resetAfterMs, HOUR);
      const d = ds[3];
      assert.equal(d.binding, 'sec');
      assert.deepEqual(d.parts.map((p) => [p.granted, p.remaining]), [[0, 97], [0, 0], [0, 4]]);
      const p = await lim.limit(`rl:{${backend}}:n`, { cost: 6, partial: true });
      assert.deepEqual([p.granted, ...p.parts.map((x) => x.granted)], [3, 3, 3, 6]);
      const g = await lim.limit(`rl:{${backend}}:o`, { cost: 2 });
      assert.ok(g.allowed);
      assert.deepEqual(g.parts.map((x) => x.remaining), [98, 1, 6]);
      assert.equal(headers(g)['RateLimit-Policy'], '"tb";q=100;w=360000, "sec";q=3;w=3600, "hour";q=10;w=3600');
      const r = await lim.refund(`rl:{${backend}}:o`, 1);
      assert.deepEqual([r.granted, ...r.parts.map((x) => x.granted)], [1, 1, 1, 2]);
      const m = rl.limiter(allOf([fixedWindow('x', 1, HOUR), slidingLog('y', 5, HOUR)]));
      assert.equal((await m.limit(`rl:{${backend}}:xy`)).allowed, true);
      const no = await m.limit(`rl:{${backend}}:xy`);
      assert.deepEqual([no.allowed, no.binding], [false, 'x']);
    } finally { await close(); }
  });

  test(`leased fixedWindow on ${backend}: batches never exceed the window's limit`, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = new RateLimit(client, { timeoutMs: 2000, backend });
      const lim = rl.leased(fixedWindow('lease', 25, HOUR), { batch: 10, lowWater: 0.2 });
      const key = `rl:{${backend}}:lease`;
      await clock.room(HOUR, ROOM);
      const ds = [];
      for (let i = 0; i < 40; i++) ds.push(await lim.limit(key));
      assert.equal(ds.filter((d) => d.allowed).length, 25);
      assert.ok(ds.slice(25).every((d) => !d.allowed) && ds[39].retryAfterMs > 0);
      await lim.close();
      const left = await rl.limiter(fixedWindow('lease', 25, HOUR)).limit(key, { cost: 0 });
      assert.equal(left.remaining, 0);
    } finally { await close(); }
  });
}
