// No server: keys and slots, policies, headers and the 429 body as exact
// strings, and the packaged Lua scripts equal to the project's lua/.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import {
  makeKey, keySlot, assertSameSlot, CrossSlotError, tokenBucket, slidingLog, slidingCounter, allOf,
  headers, problem, RateLimit, Panic, SCRIPTS,
} from '../src/index.js';
import { makeDecision, EMPTY } from '../src/decision.js';

test('keySlot matches Redis Cluster (CRC16/XMODEM, hash tags)', () => {
  // values from Redis' own CLUSTER KEYSLOT
  assert.equal(keySlot('foo'), 12182);
  assert.equal(keySlot('123456789'), 12739);
  assert.equal(keySlot('{user1000}.following'), keySlot('user1000'));
  assert.equal(keySlot('user1000'), 3443);
  assert.equal(keySlot('foo{}{bar}'), keySlot('foo{}{bar}')); // empty tag: whole key
  assert.notEqual(keySlot('foo{}{bar}'), keySlot('bar'));
  assert.equal(keySlot('foo{{bar}}zap'), keySlot('{bar'));
  assert.equal(keySlot(Buffer.from('foo')), 12182);
});

test('makeKey puts the tag in braces and refuses braces elsewhere', () => {
  assert.equal(makeKey('tenant42', 'user7'), 'rl:{tenant42}:user7');
  assert.equal(makeKey('t', 'a', 'b', { prefix: 'x' }), 'x:{t}:a:b');
  assert.equal(makeKey('t'), 'rl:{t}');
  assert.throws(() => makeKey('a{b', 'c'), RangeError);
  assert.throws(() => makeKey('a', 'c}'), RangeError);
  assert.throws(() => makeKey('', 'c'), RangeError);
  assert.equal(keySlot(makeKey('tenant42', 'user7')), keySlot(makeKey('tenant42', 'other')));
});

test('assertSameSlot refuses keys of different slots before any call', () => {
  assertSameSlot(['rl:{a}:x', 'rl:{a}:y']);
  assert.throws(() => assertSameSlot(['rl:{a}:x', 'rl:{b}:y']), CrossSlotError);
});

test('policies validate their numbers and names', () => {
  const tb = tokenBucket('api', 100, 10, 1000);
  assert.equal(tb.limit, 100);
  assert.equal(tb.windowMs, 10000);
  assert.equal(tokenBucket('x', 3, 2, 1000).windowMs, 1500);
  assert.equal(tokenBucket('x', 1, 3, 1000).windowMs, 334); // rounded up
  assert.equal(slidingLog('l', 5, 60000).windowMs, 60000);
  assert.throws(() => tokenBucket('api', 0, 1, 1), RangeError);
  assert.throws(() => slidingLog('l', 1, 2 ** 53), RangeError);
  assert.throws(() => slidingCounter('bad name', 1, 1), RangeError);
  assert.throws(() => slidingCounter('x'.repeat(65), 1, 1), RangeError);
  assert.equal(tb.weighted(3).weight, 3);
  assert.equal(tb.weight, 1);
  const a = allOf([tb, slidingLog('day', 1000, 86400000)]);
  // the default all_of name joins the part names with '.', an allowed name
  // character; the name rule holds for all_of names too
  assert.equal(a.name, 'api.day');
  assert.match(a.name, /^[A-Za-z0-9._-]{1,64}$/);
  assert.throws(() => allOf([tb], { name: 'api+day' }), RangeError);
  const long = (c) => slidingLog(c.repeat(40), 1, 1);
  assert.throws(() => allOf([long('a'), long('b')]), /longer than 64 characters/);
  assert.equal(allOf([long('a'), long('b')], { name: 'ab' }).name, 'ab');
  assert.equal(allOf([tb], { name: 'one' }).name, 'one');
  assert.throws(() => allOf([tb, tb]), RangeError);
  assert.throws(() => allOf([]), RangeError);
  assert.throws(() => allOf(Array.from({ length: 17 }, (_, i) => slidingLog(`p${i}`, 1, 1))), RangeError);
  assert.throws(() => new Panic({ instances: 0 }), RangeError);
  assert.throws(() => new RateLimit({}), TypeError);
});

const api = tokenBucket('api', 100, 100, 60000);

test('headers: a granted decision', () => {
  const d = makeDecision(true, 1, 100, 99, 0, 600, 'api', 'api', 'module', EMPTY, api);
  assert.deepEqual(headers(d), {
    'RateLimit-Policy': '"api";q=100;w=60',
    RateLimit: '"api";r=99;t=1',
    'X-RateLimit-Limit': '100',
    'X-RateLimit-Remaining': '99',
    'X-RateLimit-Reset': '1',
  });
  assert.deepEqual(Object.keys(headers(d)), ['RateLimit-Policy', 'RateLimit', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset']);
});

test('headers: a denied decision; Retry-After rounds up and is never 0', () => {
  const d = makeDecision(false, 0, 100, 0, 2001, 60000, 'api', 'api', 'lua', EMPTY, api);
  assert.deepEqual(headers(d), {
    'RateLimit-Policy': '"api";q=100;w=60',
    RateLimit: '"api";r=0;t=60',
    'X-RateLimit-Limit': '100',
    'X-RateLimit-Remaining': '0',
    'X-RateLimit-Reset': '60',
    'Retry-After': '3',
  });
  for (const retry of [1, 999, 1000]) {
    assert.equal(headers(makeDecision(false, 0, 100, 0, retry, 5, 'api', 'api', 'lua', EMPTY, api))['Retry-After'], '1');
  }
  // a denial whose retry is 0 (a local guess) still says 1, never 0
  assert.equal(headers(makeDecision(false, 0, 100, 0, 0, 0, 'api', 'api', 'local', EMPTY, api))['Retry-After'], '1');
  // never grantable: no Retry-After, and the body says why
  const never = makeDecision(false, 0, 100, 100, -1, 0, 'api', 'api', 'module', EMPTY, api);
  assert.equal(headers(never)['Retry-After'], undefined);
  assert.equal(problem(never).detail, 'Request costs more than the "api" limit allows.');
  assert.deepEqual(problem(d, '/v1/x'), {
    type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
    title: 'Request cannot be satisfied as assigned quota has been exceeded',
    status: 429,
    detail: 'Rate limit "api" exceeded; retry in 3 s.',
    'violated-policies': ['api'],
    instance: '/v1/x',
  });
});

test('headers: allOf lists every policy, describes the binding one', () => {
  const day = slidingLog('day', 1000, 86400000);
  const rule = allOf([api, day]);
  const parts = [
    { policy: 'api', granted: 0, limit: 100, remaining: 40, retryAfterMs: 0, resetAfterMs: 36000 },
    { policy: 'day', granted: 0, limit: 1000, remaining: 0, retryAfterMs: 5000, resetAfterMs: 86400000 },
  ];
  const d = makeDecision(false, 0, 1000, 0, 5000, 86400000, 'api.day', 'day', 'module', parts, rule);
  assert.deepEqual(headers(d), {
    'RateLimit-Policy': '"api";q=100;w=60, "day";q=1000;w=86400',
    RateLimit: '"day";r=0;t=86400',
    'X-RateLimit-Limit': '1000',
    'X-RateLimit-Remaining': '0',
    'X-RateLimit-Reset': '86400',
    'Retry-After': '5',
  });
  assert.deepEqual(problem(d)['violated-policies'], ['day']);
  assert.equal(problem(d).detail, 'Rate limit "day" exceeded; retry in 5 s.');
});

test('headers: a panic decision shows the panic limit and the policy window', () => {
  const d = makeDecision(false, 0, 25, 0, 2400, 60000, 'api', 'api', 'panic', EMPTY, api);
  assert.deepEqual(headers(d), {
    'RateLimit-Policy': '"api";q=25;w=60',
    RateLimit: '"api";r=0;t=60',
    'X-RateLimit-Limit': '25',
    'X-RateLimit-Remaining': '0',
    'X-RateLimit-Reset': '60',
    'Retry-After': '3',
  });
});

test('the packaged Lua scripts are the project\'s lua/ (python3 lua/build.py writes both)', () => {
  const src = new URL('../../../lua/', import.meta.url);
  const want = readdirSync(src).filter((f) => f.endsWith('.lua') && f !== 'library.lua').sort(); // not the Functions library
  const have = readdirSync(new URL('../lua/', import.meta.url)).filter((f) => f.endsWith('.lua')).sort();
  assert.deepEqual(have, want);
  for (const f of want) {
    assert.equal(readFileSync(new URL(`../lua/${f}`, import.meta.url), 'utf8'), readFileSync(new URL(f, src), 'utf8'), f);
    // every script is loaded (RL.CONCURRENCY's twin too: the in-flight guard)
    assert.ok(SCRIPTS[f.replace('.lua', '')].sha.match(/^[0-9a-f]{40}$/), f);
  }
  assert.deepEqual(Object.keys(SCRIPTS).sort(), want.map((f) => f.replace('.lua', '')).sort());
});

test('src/ has no import cycle (decisions and errors in decision.js, Panic beside the breaker)', () => {
  const dir = new URL('../src/', import.meta.url);
  const deps = {};
  for (const f of readdirSync(dir).filter((x) => x.endsWith('.js'))) {
    const text = readFileSync(new URL(f, dir), 'utf8');
    deps[f] = [...text.matchAll(/^(?:import|export)\s[^;]*?from '\.\/([\w.-]+\.js)'/gms)].map((m) => m[1]);
  }
  assert.ok(deps['leased.js'].length > 0 && deps['ratelimit.js'].includes('leased.js'));
  const state = {};
  const visit = (f, path) => {
    if (state[f] === 'done') return;
    assert.notEqual(state[f], 'open', `import cycle: ${[...path, f].join(' -> ')}`);
    state[f] = 'open';
    for (const d of deps[f] || []) visit(d, [...path, f]);
    state[f] = 'done';
  };
  for (const f of Object.keys(deps)) visit(f, []);
});
