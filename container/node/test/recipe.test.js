import { test } from 'node:test';
import assert from 'node:assert/strict';
import { GenericContainer, Wait } from 'testcontainers';
import Redis from 'ioredis';
import { RateLimit, tokenBucket, makeKey, headers } from 'redis-ratelimit';

for (const image of ['redis-ratelimit:0.2.0-redis', 'redis-ratelimit:0.2.0-valkey']) {
  test(`the eleventh call is refused (${image})`, async () => {
    const server = await new GenericContainer(image)
      .withExposedPorts(6379)
      .withWaitStrategy(Wait.forLogMessage('Ready to accept connections'))
      .start();
    const redis = new Redis(server.getMappedPort(6379), server.getHost());
    try {
      const rl = new RateLimit(redis, { timeoutMs: 1000 });
      const api = rl.limiter(tokenBucket('api', 10, 10, 60000));
      const key = makeKey('alice', 'api');
      const allowed = [];
      for (let i = 0; i < 11; i++) allowed.push((await api.limit(key)).allowed);
      assert.deepEqual(allowed, [...Array(10).fill(true), false]);
      const d = await api.limit(key);
      assert.ok(d.source === 'module' && d.retryAfterMs > 0);
      assert.equal(headers(d)['RateLimit-Policy'], '"api";q=10;w=60');
    } finally {
      redis.disconnect();
      await server.stop();
    }
  });
}
