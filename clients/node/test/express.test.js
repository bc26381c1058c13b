// Express middleware in a real HTTP server against a real Redis.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { createHash } from 'node:crypto';
import express from 'express';
import { startServer } from './harness.js';
import { connect } from './clients.js';
import { RateLimit, tokenBucket, slidingLog, expressRateLimit } from '../src/index.js';

let server;
let conn;
let app;
let web;
let port;
let rl;

before(async () => {
  server = await startServer();
  conn = await connect('ioredis', server.port);
  rl = new RateLimit(conn.client, { timeoutMs: 1000 });
  app = express();
  app.use('/api', expressRateLimit(rl.limiter(tokenBucket('api', 2, 1, 3600000))));
  app.use('/leased', expressRateLimit(rl.leased(slidingLog('leased', 3, 60000), { batch: 2 }), {
    key: (req) => `rl:{${req.get('x-tenant')}}:leased`,
  }));
  app.use('/heavy', expressRateLimit(rl.limiter(tokenBucket('heavy', 10, 1, 3600000)), { cost: (req) => Number(req.query.cost) }));
  app.get('/*splat', (req, res) => res.json({ ok: true, path: req.path }));
  web = http.createServer(app);
  await new Promise((r) => web.listen(0, '127.0.0.1', r));
  port = web.address().port;
});

after(async () => {
  await new Promise((r) => web.close(r));
  await conn.close();
  await server.close();
});

function get(path, headers = {}) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port, path, headers, agent: false }, (res) => {
      let body = '';
      res.on('data', (c) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    }).on('error', reject);
  });
}

test('passes with headers, then 429 with problem+json and Retry-After', async () => {
  let r = await get('/api/items', { 'X-Api-Key': 'alice' });
  assert.equal(r.status, 200);
  assert.deepEqual(JSON.parse(r.body), { ok: true, path: '/api/items' });
  assert.equal(r.headers['ratelimit-policy'], '"api";q=2;w=7200');
  assert.equal(r.headers.ratelimit, '"api";r=1;t=3600');
  assert.equal(r.headers['x-ratelimit-limit'], '2');
  assert.equal(r.headers['x-ratelimit-remaining'], '1');
  assert.equal(r.headers['x-ratelimit-reset'], '3600');
  assert.equal(r.headers['retry-after'], undefined);
  r = await get('/api/items', { 'X-Api-Key': 'alice' });
  assert.equal(r.status, 200);
  assert.equal(r.headers.ratelimit, '"api";r=0;t=7200');
  r = await get('/api/items?x=1', { 'X-Api-Key': 'alice' });
  assert.equal(r.status, 429);
  assert.equal(r.headers['content-type'], 'application/problem+json');
  assert.equal(r.headers['retry-after'], '3600');
  assert.equal(r.headers['x-ratelimit-remaining'], '0');
  assert.deepEqual(JSON.parse(r.body), {
    type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
    title: 'Request cannot be satisfied as assigned quota has been exceeded',
    status: 429,
    detail: 'Rate limit "api" exceeded; retry in 3600 s.',
    'violated-policies': ['api'],
    instance: '/api/items',
  });
  // the key: the API key hashed, in the hash tag; another caller has its own budget
  const hashed = createHash('sha256').update('alice').digest('hex').slice(0, 32);
  assert.equal(server.cli('EXISTS', `rl:{key:${hashed}}:api`), '1');
  assert.equal((await get('/api/items', { 'X-Api-Key': 'bob' })).status, 200);
  assert.equal((await get('/api/items')).status, 200);
  assert.equal(server.cli('EXISTS', 'rl:{ip:127.0.0.1}:api'), '1');
  // unlimited paths get no headers
  r = await get('/other');
  assert.equal(r.status, 200);
  assert.equal(r.headers['x-ratelimit-limit'], undefined);
});

test('a leased limiter and a custom key behind the middleware', async () => {
  const statuses = [];
  for (let i = 0; i < 5; i++) statuses.push((await get('/leased/x', { 'X-Tenant': 't1' })).status);
  assert.deepEqual(statuses, [200, 200, 200, 429, 429]);
  assert.equal((await get('/leased/x', { 'X-Tenant': 't2' })).status, 200);
});

test('a request that costs more than the limit: 429 without Retry-After', async () => {
  const r = await get('/heavy/x?cost=11');
  assert.equal(r.status, 429);
  assert.equal(r.headers['retry-after'], undefined);
  assert.equal(JSON.parse(r.body).detail, 'Request costs more than the "heavy" limit allows.');
  assert.equal((await get('/heavy/x?cost=4')).headers['x-ratelimit-remaining'], '6');
});
