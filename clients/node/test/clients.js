// The four client kinds the library supports, made the same way for tests.
import IORedis from 'ioredis';
import * as redis5 from 'redis';
import * as redis4 from 'redis4';

export const KINDS = ['ioredis', 'node-redis5', 'node-redis4'];

/** A connected client of `kind` to a standalone server (port) or a cluster (ports). */
export async function connect(kind, ports, { cluster = false, ioredisOpts = {} } = {}) {
  const first = Array.isArray(ports) ? ports[0] : ports;
  if (kind === 'ioredis') {
    if (cluster) {
      const c = new IORedis.Cluster([{ host: '127.0.0.1', port: first }], { redisOptions: ioredisOpts });
      await new Promise((resolve, reject) => { c.once('ready', resolve); c.once('error', reject); });
      return { client: c, close: () => c.disconnect() };
    }
    const c = new IORedis(first, '127.0.0.1', { lazyConnect: true, ...ioredisOpts });
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  }
  const mod = kind === 'node-redis4' ? redis4 : redis5;
  if (cluster) {
    const c = mod.createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${first}` }] });
    c.on('error', () => {});
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  }
  const c = mod.createClient({ url: `redis://127.0.0.1:${first}` });
  c.on('error', () => {});
  await c.connect();
  return { client: c, close: () => c.disconnect() };
}
