// Valkey GLIDE specifics (src/glide.js), in a run with a GLIDE line
// (RL_NODE_DRIVERS=...,glide2): its error replies taken as Redis's, a call
// the library gave up on that cannot answer a later one, the decoder and
// protocol settings, a closed client refused. The shared suites (bound,
// breaker, backends, leased, sentinel's strict mode) run GLIDE too.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, waitUntil } from './harness.js';
import { connect, KINDS, family } from './clients.js';
import { RateLimit, tokenBucket, slidingLog, Panic, SCRIPTS } from '../src/index.js';
import { glideError, ReplyError } from '../src/glide.js';

const GLIDE = KINDS.find((k) => family(k) === 'glide');
const skip = GLIDE ? false : 'no GLIDE line in this run (RL_NODE_DRIVERS)';
const glide = GLIDE ? await import('@valkey/valkey-glide') : null;

let server;
before(async () => { if (GLIDE) server = await startServer(); });
after(async () => { if (server) await server.close(); });

test('GLIDE errors: a server reply becomes a ReplyError in Redis\'s form, anything else stays', { skip }, () => {
  const { RequestError, TimeoutError, ConnectionError, ClosingError } = glide;
  const reply = (m) => { const e = glideError(new RequestError(m)); assert.ok(e instanceof ReplyError, m); return e.message; };
  assert.equal(reply('An error was signalled by the server: - NoScriptError: No matching script. Please use EVAL.'),
    'NOSCRIPT No matching script. Please use EVAL.');
  assert.equal(reply("An error was signalled by the server: - ResponseError: unknown command 'RL.X'"), "ERR unknown command 'RL.X'");
  assert.equal(reply('An error was signalled by the server: - ReadOnly: You can\'t write against a read only replica.'),
    'READONLY You can\'t write against a read only replica.');
  assert.equal(reply('An error was signalled by the server: - BusyLoadingError: Redis is loading'), 'LOADING Redis is loading');
  assert.equal(reply('WRONGTYPE: Operation against a key holding the wrong kind of value'),
    'WRONGTYPE Operation against a key holding the wrong kind of value');
  assert.equal(reply('NOREPLICAS: Not enough good replicas to write.'), 'NOREPLICAS Not enough good replicas to write.');
  // not the server's answer: left as GLIDE raised it (a failure the breaker counts)
  for (const e of [new TimeoutError('timed out'), new ConnectionError('An error was signalled by the server: - ResponseError: x'),
    new ClosingError('closed'), new RequestError('An error was signalled by the server: - IoError: broken pipe'),
    new RequestError('Reached maximum inflight requests')]) {
    assert.equal(glideError(e), e, e.message);
  }
});

test('GLIDE error replies: an answer is the caller\'s error, an unavailable answer a failure; NOSCRIPT resends the script', { skip }, async (t) => {
  const { client, close } = await connect(GLIDE, server.port);
  t.after(close);
  const admin = await connect('ioredis', server.port);
  t.after(admin.close);
  const panic = new Panic({ limit: 5, windowMs: 1e9 });
  const rl = new RateLimit(client, { timeoutMs: 2000, breaker: { failures: 100 } });
  const lim = rl.limiter(tokenBucket('e', 100, 1, 1e9), { panic });
  await admin.client.call('SET', 'rl:{e}:str', 'x');
  await assert.rejects(lim.limit('rl:{e}:str'), (e) => e instanceof ReplyError && /^WRONGTYPE /.test(e.message));
  assert.equal(rl.metrics().failures, 0); // it answered: not a failure
  await admin.client.call('CONFIG', 'SET', 'min-replicas-to-write', '1');
  try {
    const d = await lim.limit('rl:{e}:k');
    assert.equal(d.source, 'panic', JSON.stringify(d)); // NOREPLICAS: it cannot serve now
    assert.equal(rl.metrics().failures, 1);
  } finally { await admin.client.call('CONFIG', 'SET', 'min-replicas-to-write', '0'); }
  const lua = new RateLimit(client, { timeoutMs: 2000, backend: 'lua' });
  const ll = lua.limiter(slidingLog('n', 10, 60000));
  assert.equal((await ll.limit('rl:{n}:k')).remaining, 9);
  await admin.client.call('SCRIPT', 'FLUSH');
  const d = await ll.limit('rl:{n}:k');
  assert.equal(d.source, 'lua');
  assert.equal(d.remaining, 8);
  assert.equal(lua.metrics().failures, 0);
  assert.ok(await admin.client.call('SCRIPT', 'EXISTS', SCRIPTS.slidinglog.sha).then((r) => r[0] === 1));
});

// SIGSTOP: three calls time out (the library's 30 ms); some time after
// SIGCONT, a call on another key gets its own reply, not one of theirs, and
// the key they were for shows each of them ran once, late. With GLIDE's
// default requestTimeout (250 ms, shorter than the 400 ms stall: GLIDE gave
// up on them too) and with a minute (still in flight at SIGCONT).
for (const requestTimeout of [undefined, 60000]) {
  test(`a GLIDE call the library gave up on answers no later call (requestTimeout ${requestTimeout ?? 'default'})`, { skip }, async (t) => {
    const { client, close } = await connect(GLIDE, server.port, { glideOpts: { requestTimeout } });
    t.after(close);
    const rl = new RateLimit(client, { timeoutMs: 30, breaker: { failures: 100 } });
    const lim = rl.limiter(tokenBucket('late', 100, 1, 1e12));
    const a = `rl:{late-${requestTimeout}}:a`;
    const b = `rl:{late-${requestTimeout}}:b`;
    await waitUntil(async () => (await lim.limit(a)).source === 'module', { what: 'a first decision in time' });
    const before = (await lim.limit(a, { cost: 0 })).remaining;
    server.signal('SIGSTOP');
    const stalled = [];
    try {
      for (let i = 0; i < 3; i++) stalled.push((await lim.limit(a)).source);
      await new Promise((r) => setTimeout(r, 400));
    } finally { server.signal('SIGCONT'); }
    assert.deepEqual(stalled, ['panic', 'panic', 'panic']);
    const f0 = rl.metrics().failures;
    const db = await waitUntil(async () => { const d = await lim.limit(b); return d.source === 'module' && d; }, { what: 'the module again' });
    assert.equal(db.remaining, 99, JSON.stringify(db)); // b's first grant: its own reply
    const da = await lim.limit(a);
    assert.equal(da.source, 'module');
    assert.equal(da.remaining, before - 3 - 1, JSON.stringify(da)); // the three late calls ran, once each
    assert.equal(rl.metrics().failures, f0);
  });
}

test('a GLIDE client with the Bytes decoder and RESP2 decides the same', { skip }, async (t) => {
  const { client, close } = await connect(GLIDE, server.port, { glideOpts: { defaultDecoder: glide.Decoder.Bytes, protocol: glide.ProtocolVersion.RESP2 } });
  t.after(close);
  for (const backend of ['module', 'lua']) {
    const rl = new RateLimit(client, { timeoutMs: 2000, backend });
    const lim = rl.limiter(tokenBucket('dec', 10, 1, 1e9));
    const d1 = await lim.limit(`rl:{dec-${backend}}:k`, { cost: 3 });
    const d2 = await lim.limit(`rl:{dec-${backend}}:k`, { cost: 8, partial: true });
    assert.deepEqual([d1.source, d1.allowed, d1.remaining, d2.granted, d2.remaining], [backend, true, 7, 7, 0]);
  }
  assert.equal(await new RateLimit(client, { timeoutMs: 2000 }).detect(), 'module');
});

test('a closed GLIDE client is refused', { skip }, async () => {
  const { client, close } = await connect(GLIDE, server.port);
  await close();
  assert.throws(() => new RateLimit(client), /GLIDE client is closed/);
});

test('strict mode on a GlideClusterClient is refused (WAIT would not follow the grant on its node)', () => {
  class GlideClusterClient { customCommand() {} exec() {} }
  assert.throws(() => new RateLimit(new GlideClusterClient(), { timeoutMs: 50, strict: true }), /strict mode is not supported on a glide-cluster client/);
  assert.equal(new RateLimit(new GlideClusterClient(), { timeoutMs: 50 })._backend.io.kind, 'glide-cluster');
});
