// The in-flight guard (RL.CONCURRENCY) and reservations (reserve, then
// settle), against a real server, on the module and on its Lua twin (issue
// 46, item 3; clients/DESIGN.md, "In-flight limits" and "Reservations").
//
// What each test would catch: a guard that does not release on some exit
// path (a return, a throw, a rejected promise, an AbortSignal, an explicit
// release then the exit), that does not renew (its lease lapses under a long
// stream and a competing holder gets in), that keeps renewing a lease the
// server lost, that holds more than the local limit while the breaker is
// open or forgets to release locally; holds that together pass the limit;
// a reservation that settles twice, or sends the wrong amount back.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { startServer, waitUntil } from './harness.js';
import { connect, KINDS } from './clients.js';
import { RateLimit, Panic, concurrency, fixedWindow, tokenBucket, allOf } from '../src/index.js';

const BACKENDS = ['module', 'lua'];
const LONG = 10 ** 12; // a fixed window no test run reaches the end of
// a test that hangs (a guard that never lets go of an aborted body) fails
const T = { timeout: 60000 };
let server;
before(async () => { server = await startServer(); });
after(async () => { await server.close(); });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Redis's decisions only: a loaded machine's latency must not open the
// breaker (then holds are local, beside the server's: a test of its own)
const newRl = (client, backend) => new RateLimit(client, { timeoutMs: 5000, backend, breaker: { latencyBudgetMs: 1e9, failures: 1000 } });
const del = (rl, key) => rl._backend.io.send(key, ['DEL', key]);

test('concurrency: arguments checked, and the rate limiters refuse it', T, async () => {
  const { client, close } = await connect(KINDS[0], server.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 2000 });
    for (const bad of [[0, 1000], [1, 0], [1.5, 1000], ['3', 1000]]) assert.throws(() => concurrency('c', ...bad), RangeError);
    const p = concurrency('jobs', 3, 30000);
    assert.deepEqual([p.kind, p.command, p.script, p.limit, p.windowMs, p.args], ['concurrency', 'RL.CONCURRENCY', 'concurrency', 3, 30000, ['3', '30000']]);
    assert.throws(() => rl.limiter(p), TypeError);
    assert.throws(() => rl.leased(p), TypeError);
    assert.throws(() => allOf([p, tokenBucket('tb', 5, 1, 1000)]), TypeError);
    assert.throws(() => rl.inflight(tokenBucket('tb', 5, 1, 1000)), TypeError);
    assert.equal(rl.inflight(p).renewMs, 10000); // leaseMs / 3
    assert.equal(rl.inflight(concurrency('c', 1, 2)).renewMs, 1);
    for (const renewMs of [0, 30000, 1.5]) assert.throws(() => rl.inflight(p, { renewMs }), RangeError);
    const inf = rl.inflight(p);
    const ids = new Set([inf.hold('k').id, inf.hold('k').id]);
    assert.equal(ids.size, 2);
    for (const id of ids) assert.match(id, /^[0-9a-f]{32}$/);
    await assert.rejects(inf.run('k', async () => {}, { cost: 0 }), RangeError);
    // an error reply is thrown, not taken for an outage: nothing held, the body never runs
    await rl._backend.io.send('rl:{wt}:s', ['SET', 'rl:{wt}:s', 'x']);
    const h = inf.hold('rl:{wt}:s');
    await assert.rejects(inf.run('rl:{wt}:s', async () => assert.fail('ran')), /WRONGTYPE/);
    await assert.rejects(inf.acquire(h), /WRONGTYPE/);
    assert.ok(!h.held && !h.allowed && inf.heldLocally('rl:{wt}:s') === 0);
  } finally { await close(); }
});

for (const kind of KINDS) {
  for (const backend of BACKENDS) {
    test(`the guard releases on every exit path (${backend}, ${kind})`, T, async () => {
      const { client, close } = await connect(kind, server.port);
      try {
        const rl = newRl(client, backend);
        const inf = rl.inflight(concurrency('jobs', 2, 60000));
        const k = `rl:{if-${backend}-${kind}}:jobs`;
        // held inside, released after: a third holder gets in only once one left
        await inf.run(k, async (a) => {
          assert.ok(a.allowed && a.held);
          assert.deepEqual([a.decision.remaining, a.decision.source, a.decision.granted], [1, backend, 1]);
          await inf.run(k, async (b) => {
            assert.ok(b.allowed && b.decision.remaining === 0);
            await inf.run(k, async (c) => {
              assert.ok(!c.allowed && c.decision.retryAfterMs > 0 && !c.held);
            });
          });
          await inf.run(k, async (d) => assert.ok(d.allowed, "b's exit released its unit"));
        });
        // a return value comes back
        assert.equal(await inf.run(k, async (h) => h.allowed && 'done'), 'done');
        // a throw in a sync body, a rejection from an async one
        let held;
        await assert.rejects(inf.run(k, (h) => { held = h; throw new Error('sync'); }), /sync/);
        assert.ok(held.allowed && !held.held);
        await assert.rejects(inf.run(k, async (h) => { held = h; await sleep(1); throw new Error('async'); }), /async/);
        assert.ok(held.allowed && !held.held);
        await assert.rejects(inf.run(k, (h) => { held = h; return Promise.reject(new Error('rejected')); }), /rejected/);
        assert.ok(!held.held);
        // an AbortSignal: run rejects at once and the unit comes back while the body still waits
        const ac = new AbortController();
        let entered;
        const isIn = new Promise((r) => { entered = r; });
        const stream = inf.run(k, async (h) => { assert.ok(h.allowed); entered(); await new Promise(() => {}); }, { cost: 2, signal: ac.signal });
        await isIn;
        await inf.run(k, async (h) => assert.ok(!h.allowed, 'the stream holds both units'));
        ac.abort(new Error('client went away'));
        await assert.rejects(stream, /client went away/);
        await inf.run(k, async (h) => assert.ok(h.allowed && h.decision.remaining === 0, 'the aborted stream released'), { cost: 2 });
        // an aborted signal before the acquire: nothing taken
        await assert.rejects(inf.run(k, async () => assert.fail('ran'), { signal: ac.signal }), /client went away/);
        // an explicit release, then the exit: one RELEASE, nothing freed twice
        await inf.run(k, async (f) => {
          await inf.run(k, async (g) => {
            assert.ok(f.allowed && g.allowed);
            await f.release();
            await inf.run(k, async (h) => {
              assert.ok(h.allowed, 'f released early');
              await inf.run(k, async (i) => assert.ok(!i.allowed, "f's exit freed nothing more"));
            });
          });
        });
        await inf.run(k, async (j) => assert.ok(j.allowed && j.decision.remaining === 0, 'every unit came back'), { cost: 2 });
        await inf.run(k, async (big) => assert.ok(!big.allowed && big.decision.retryAfterMs === -1), { cost: 3 });
        // released while its ACQUIRE was out: the units it took go back once it answers
        const early = inf.hold(k, { cost: 2 });
        const acquiring = inf.acquire(early);
        await early.release();
        assert.ok((await acquiring).allowed && !early.held);
        await assert.rejects(inf.acquire(early), /acquired once/);
        assert.equal(Number(await rl._backend.io.send(k, ['EXISTS', k])), 0, 'the last release deleted the key');
        const m = rl.metrics();
        assert.equal(m.failures, 0);
        // 18 acquires (the pre-aborted run sent none), 4 denied
        assert.deepEqual([m[backend === 'module' ? 'decisionsModule' : 'decisionsLua'], m.denied], [18, 4]);
      } finally { await close(); }
    });
  }
}

for (const backend of BACKENDS) {
  test(`a hold longer than twice its lease keeps its unit by renewals (${backend})`, T, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = newRl(client, backend);
      const leaseMs = 1500;
      const inf = rl.inflight(concurrency('long', 1, leaseMs), { renewMs: 100 });
      const k = `rl:{long-${backend}}:s`;
      await inf.run(k, async (h) => {
        assert.ok(h.allowed);
        const t0 = performance.now();
        // held well past two leases: only the renewals keep it
        await waitUntil(() => performance.now() - t0 > 2 * leaseMs && h.renewals >= 3, { what: 'two leases and renewals' });
        await inf.run(k, async (other) => assert.ok(!other.allowed, `the lease lapsed under a renewed hold (${h.renewals} renewals)`));
        assert.ok(!h.lost);
      });
      await inf.run(k, async (after) => assert.ok(after.allowed));
    } finally { await close(); }
  });

  test(`a lease the server lost sets lost and stops renewing (${backend})`, T, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = newRl(client, backend);
      const inf = rl.inflight(concurrency('lost', 1, 60000), { renewMs: 50 });
      const k = `rl:{lost-${backend}}:s`;
      await inf.run(k, async (h) => {
        assert.ok(h.allowed);
        await waitUntil(() => h.renewals >= 1, { what: 'a renewal' });
        await del(rl, k); // the server forgets the lease (a flush, a failover)
        await waitUntil(() => h.lost, { what: 'lost' });
        const renewals = h.renewals;
        const calls = rl.metrics().calls;
        await sleep(300); // a window in which a renewer that went on would call 6 times
        assert.equal(rl.metrics().calls, calls, 'renewals stopped');
        assert.equal(h.renewals, renewals);
        assert.ok(h.held, 'the work goes on: the guard does not abort it');
      });
    } finally { await close(); }
  });

  test(`concurrent holds never pass the limit (${backend})`, T, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = newRl(client, backend);
      const inf = rl.inflight(concurrency('pool', 3, 60000));
      const k = `rl:{pool-${backend}}:s`;
      let held = 0;
      let peak = 0;
      let granted = 0;
      const worker = async () => {
        for (let i = 0; i < 30; i++) {
          await inf.run(k, async (h) => {
            if (!h.allowed) return;
            assert.equal(h.decision.source, backend);
            held++;
            granted++;
            peak = Math.max(peak, held);
            await sleep(1); // others acquire meanwhile
            held--;
          });
        }
      };
      await Promise.all(Array.from({ length: 8 }, worker));
      assert.ok(peak <= 3, `peak ${peak}`);
      assert.ok(granted >= 3 && peak === 3, `granted ${granted}, peak ${peak}`);
      await inf.run(k, async (h) => assert.ok(h.allowed, 'every unit came back'), { cost: 3 });
    } finally { await close(); }
  });
}

test('with the breaker open, holds are local, bounded and released', T, async () => {
  const own = await startServer();
  const { client, close } = await connect(KINDS[0], own.port);
  try {
    const rl = new RateLimit(client, { timeoutMs: 50, breaker: { failures: 1, openMs: 60000 } });
    const inf = rl.inflight(concurrency('jobs', 10, 60000), { panic: new Panic({ limit: 2 }) });
    const k = 'rl:{panic}:jobs';
    await inf.run(k, async (remote) => assert.equal(remote.decision.source, 'module'));
    own.signal('SIGSTOP');
    try {
      await inf.run(k, async (a) => {
        await inf.run(k, async (b) => {
          await inf.run(k, async (c) => {
            assert.deepEqual([a.allowed, b.allowed, c.allowed], [true, true, false]);
            assert.deepEqual([a.decision.source, b.decision.source, c.decision.source], ['panic', 'panic', 'panic']);
            assert.equal(c.decision.retryAfterMs, 1);
            assert.equal(inf.heldLocally(k), 2);
          });
        });
        assert.equal(inf.heldLocally(k), 1, "b's exit released locally");
      });
      assert.equal(inf.heldLocally(k), 0, 'local holds released on exit');
      await assert.rejects(inf.run(k, async () => { throw new Error('x'); }), /x/);
      assert.equal(inf.heldLocally(k), 0);
      await inf.run(k, async (big) => assert.ok(!big.allowed && big.decision.retryAfterMs === -1), { cost: 3 });
      const m = rl.metrics();
      assert.equal(m.state, 'open');
      assert.ok(m.decisionsPanic >= 5);
    } finally { own.signal('SIGCONT'); }
  } finally {
    await close();
    await own.close();
  }
});

for (const backend of BACKENDS) {
  // An ACQUIRE sent to a stopped server times out (the hold is decided
  // locally) but is applied when the server wakes: without a RELEASE of its
  // id its unit stays held for the whole lease (60 s here). The library
  // sends that RELEASE when the late reply comes, though the breaker is open.
  test(`an unanswered ACQUIRE is released when its late reply comes (${backend})`, T, async () => {
    const own = await startServer();
    const { client, close } = await connect(KINDS[0], own.port);
    try {
      // 100 ms: a stopped server's ACQUIRE times out; a loaded machine's
      // answer may too, so the warm-up goes on until one comes in time
      const rl = new RateLimit(client, { timeoutMs: 100, backend, breaker: { failures: 1, openMs: 100 } });
      const inf = rl.inflight(concurrency('one', 1, 60000));
      const k = 'rl:{late}:one';
      // (the twin's script cached: the stalled EVALSHA applies)
      const answered = () => inf.run(k, async (h) => h.allowed && h.decision.source === backend);
      await waitUntil(answered, { timeout: 30000, interval: 20, what: 'an answered hold' });
      own.signal('SIGSTOP');
      try {
        await inf.run(k, async (a) => assert.equal(a.decision.source, 'panic'));
      } finally { own.signal('SIGCONT'); }
      // the unit is free once the late RELEASE went out (without it: denied for 60 s)
      await waitUntil(answered, { timeout: 30000, interval: 20, what: 'the stalled ACQUIRE released' });
    } finally {
      await close();
      await own.close();
    }
  });
}

for (const backend of BACKENDS) {
  test(`a reservation gives back what it did not use, once (${backend})`, T, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = newRl(client, backend);
      const lim = rl.limiter(fixedWindow('tpm', 1000, LONG));
      const k = `rl:{res-${backend}}:tpm`;
      const r = await lim.reserve(k, 600);
      assert.ok(r.allowed && r.decision.remaining === 400);
      const d = await r.settle(100); // REFUND 500
      assert.ok(d !== null && d.remaining === 900, '500 given back');
      const calls = rl.metrics().calls;
      await assert.rejects(r.settle(100), /settled already/);
      assert.equal(rl.metrics().calls, calls, 'the second settle sent nothing');
      assert.equal((await lim.limit(k, { cost: 0 })).remaining, 900);
      // the estimate exactly: nothing sent
      const exact = await lim.reserve(k, 300);
      assert.equal(await exact.settle(300), null);
      assert.equal((await lim.limit(k, { cost: 0 })).remaining, 600);
      // denied: nothing was taken, nothing to settle
      const denied = await lim.reserve(k, 700);
      assert.ok(!denied.allowed);
      assert.equal(await denied.settle(0), null);
      assert.equal((await lim.limit(k, { cost: 0 })).remaining, 600);
      // abandoned: stays charged at its estimate
      await lim.reserve(k, 200);
      assert.equal((await lim.limit(k, { cost: 0 })).remaining, 400);
      await assert.rejects(lim.reserve(k, 0), RangeError);
    } finally { await close(); }
  });

  test(`a reservation takes what it used beyond the estimate, even past the limit (${backend})`, T, async () => {
    const { client, close } = await connect(KINDS[0], server.port);
    try {
      const rl = newRl(client, backend);
      const lim = rl.limiter(fixedWindow('tpm', 1000, LONG));
      const k = `rl:{debit-${backend}}:tpm`;
      let d = await (await lim.reserve(k, 600)).settle(900); // COST 300 FORCE
      assert.ok(d !== null && d.allowed && d.granted === 300 && d.remaining === 100);
      const r = await lim.reserve(k, 100);
      assert.ok(r.allowed && r.decision.remaining === 0);
      d = await r.settle(500); // 400 past the limit: a debt
      assert.ok(d !== null && d.allowed && d.granted === 400 && d.remaining === 0);
      const next = await lim.limit(k);
      assert.ok(!next.allowed && next.retryAfterMs > 0, 'later calls wait the debt out');
      // a refund repays the debt first: 400 back leaves the window exactly full
      assert.equal((await lim.refund(k, 400)).remaining, 0);
      assert.ok(!(await lim.limit(k)).allowed);
      assert.equal((await lim.refund(k, 1)).remaining, 1);
      // allOf: the debit goes to every part (RL.MULTI ... COST n FORCE)
      const both = rl.limiter(allOf([fixedWindow('a', 100, LONG), tokenBucket('b', 50, 1, 86400000)]));
      const kb = `rl:{debit-${backend}}:both`;
      const rb = await both.reserve(kb, 40);
      d = await rb.settle(70);
      assert.ok(d.allowed && d.granted === 30);
      assert.deepEqual(d.parts.map((p) => p.remaining), [30, 0]);
      assert.ok(!(await both.limit(kb)).allowed, 'the bucket is in debt');
    } finally { await close(); }
  });
}
