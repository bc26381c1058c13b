// What a gateway does with the Node client library (clients/node), against
// each image and against the Redis image started without the module (the
// library then runs the Lua twins): a token bucket per request with the
// HTTP headers and the 429 body, RL.MULTI through allOf, leases taken with
// PARTIAL by three gateway instances, and REFUND (an explicit one and the
// leases given back on close). The same calls as container/tests/test_gateway.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { GenericContainer, Wait } from 'testcontainers';
import Redis from 'ioredis';
import {
  RateLimit, allOf, headers, makeKey, problem, slidingCounter, slidingLog, tokenBucket,
} from 'redis-ratelimit';

const version = readFileSync(new URL('../../../Cargo.toml', import.meta.url), 'utf8')
  .match(/\[workspace\.package\][^[]*?\nversion = "([^"]+)"/)[1];
const SERVERS = [
  ['redis', `redis-ratelimit:${version}-redis`, null, 'module'],
  ['valkey', `redis-ratelimit:${version}-valkey`, null, 'module'],
  ['redis-without-module', `redis-ratelimit:${version}-redis`, ['--protected-mode', 'no'], 'lua'],
];

for (const [name, image, command, source] of SERVERS) {
  test(`gateway calls (${name})`, async () => {
    let c = new GenericContainer(image).withExposedPorts(6379)
      .withWaitStrategy(Wait.forLogMessage('Ready to accept connections'));
    if (command) c = c.withCommand(command);
    const server = await c.start();
    const clients = [];
    const client = () => {
      const r = new Redis(server.getMappedPort(6379), server.getHost());
      clients.push(r);
      return new RateLimit(r, { timeoutMs: 1000 });
    };
    try {
      const rl = client();

      // A token bucket per request: 5, refilled at 5 a minute (one per 12 s).
      const api = rl.limiter(tokenBucket('api', 5, 5, 60000));
      const key = makeKey('alice', 'api');
      const ds = [];
      for (let i = 0; i < 6; i++) ds.push(await api.limit(key));
      assert.deepEqual(ds.map((d) => d.allowed), [true, true, true, true, true, false]);
      assert.deepEqual([...new Set(ds.map((d) => d.source))], [source]);
      const h = headers(ds[0]);
      assert.equal(h['RateLimit-Policy'], '"api";q=5;w=60');
      assert.deepEqual([h['X-RateLimit-Limit'], h['X-RateLimit-Remaining']], ['5', '4']);
      assert.equal(h.RateLimit, `"api";r=4;t=${h['X-RateLimit-Reset']}`);
      assert.equal(h['Retry-After'], undefined);
      assert.ok(ds[0].resetAfterMs > 0 && ds[0].resetAfterMs <= 12000);
      const denied = ds[5];
      assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 12000);
      assert.equal(headers(denied)['Retry-After'], String(Math.ceil(denied.retryAfterMs / 1000)));
      const body = problem(denied, '/v1/items');
      assert.deepEqual([body.status, body['violated-policies'], body.instance], [429, ['api'], '/v1/items']);
      // The request was not served after all: REFUND gives its unit back.
      assert.equal((await api.refund(key, 1)).granted, 1);
      assert.equal((await api.limit(key)).allowed, true);
      assert.equal((await api.limit(key)).allowed, false);

      // RL.MULTI: a burst limit and an hourly one, all or nothing.
      const login = rl.limiter(allOf([tokenBucket('burst', 3, 1, 60000),
        slidingLog('hour', 10, 3600000)], { name: 'login' }));
      const lkey = makeKey('bob', 'login');
      const ls = [];
      for (let i = 0; i < 4; i++) ls.push(await login.limit(lkey));
      assert.deepEqual(ls.map((d) => d.allowed), [true, true, true, false]);
      assert.deepEqual([...new Set(ls.map((d) => d.source))], [source]);
      assert.equal(ls[3].binding, 'burst');
      assert.deepEqual(ls[3].parts.map((p) => p.policy), ['burst', 'hour']);
      const lh = headers(ls[3]);
      assert.equal(lh['RateLimit-Policy'], '"burst";q=3;w=180, "hour";q=10;w=3600');
      assert.ok(lh.RateLimit.startsWith('"burst";r=0;'), lh.RateLimit);
      // The refused call took nothing from the hourly limit: 7 units are
      // left (a DRYRUN of one answers what would remain after it: 6).
      const hour = rl.limiter(slidingLog('hour', 10, 3600000));
      assert.equal((await hour.limit(`${lkey}:hour`, { dryRun: true })).remaining, 6);

      // Three gateway instances lease 10 units each of a shared 25 a minute:
      // the third lease is PARTIAL and gets the last 5. Each spends 2 (the
      // first on the lease's reply, the second from its reservoir). Closing
      // them gives the unused units back (REFUND): only the 6 spent stay taken.
      const policy = slidingCounter('search', 25, 60000);
      const skey = makeKey('carol', 'search');
      const instances = [client(), client(), client()];
      const leased = instances.map((i) => i.leased(policy, { batch: 10 }));
      const first = [];
      for (const lim of leased) first.push(await lim.limit(skey));
      const second = [];
      for (const lim of leased) second.push(await lim.limit(skey));
      assert.ok([...first, ...second].every((d) => d.allowed));
      assert.deepEqual([...new Set(first.map((d) => d.source))], [source]);
      assert.deepEqual([...new Set(second.map((d) => d.source))], ['local']);
      assert.deepEqual(instances.map((i) => i.metrics().leaseTokens), [10, 10, 5]);
      assert.equal(second[2].remaining, 3);
      const shared = rl.limiter(policy);
      assert.equal((await shared.limit(skey, { dryRun: true })).allowed, false);
      for (const lim of leased) await lim.close();
      assert.deepEqual(instances.map((i) => i.metrics().refundTokens), [8, 8, 3]);
      assert.equal((await shared.limit(skey, { dryRun: true })).remaining, 19 - 1); // 19 left
    } finally {
      for (const r of clients) r.disconnect();
      await server.stop();
    }
  });
}
