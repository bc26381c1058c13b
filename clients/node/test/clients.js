// The client kinds the library supports, made the same way for tests: one
// per driver line (ioredis 5 and 6, node-redis 4, 5 and 6, and Valkey's own:
// iovalkey, the ioredis fork, and GLIDE 2; each the newest release of its
// line, pinned in package-lock.json, under an npm alias where a library has
// several lines).
// RL_NODE_DRIVERS picks the lines of a run (comma-separated; `make
// test-clients-node` runs every line, see the Makefile); the default is the
// newest of each library. Tests that loop over KINDS run once per line;
// connect('ioredis' | 'node-redis' | 'glide', ...) uses the run's line of
// that library (iovalkey is of the ioredis family: its API is ioredis's).
const LINES = {
  ioredis5: { family: 'ioredis', pkg: 'ioredis' },
  ioredis6: { family: 'ioredis', pkg: 'ioredis6' },
  iovalkey: { family: 'ioredis', pkg: 'iovalkey' },
  glide2: { family: 'glide', pkg: '@valkey/valkey-glide' },
  'node-redis4': { family: 'node-redis', pkg: 'redis4' },
  'node-redis5': { family: 'node-redis', pkg: 'redis' },
  'node-redis6': { family: 'node-redis', pkg: 'redis6' },
  // whatever `npm install ioredis redis` put in node_modules (the
  // unpinned install test, make test-clients-fresh)
  'ioredis-npm': { family: 'ioredis', pkg: 'ioredis' },
  'node-redis-npm': { family: 'node-redis', pkg: 'redis' },
  // `npm install iovalkey @valkey/valkey-glide` (the same test)
  'iovalkey-npm': { family: 'ioredis', pkg: 'iovalkey' },
  'glide-npm': { family: 'glide', pkg: '@valkey/valkey-glide' },
};
// The line a test that names a library gets when the run has no line of it
// (a GLIDE line is loaded only by a run that names one).
const NEWEST = { ioredis: 'ioredis6', 'node-redis': 'node-redis6' };
const FAMILY_NEWEST = { ...NEWEST, glide: 'glide2' };

export const KINDS = (process.env.RL_NODE_DRIVERS || 'ioredis6,node-redis6').split(',').map((s) => s.trim()).filter(Boolean);
for (const k of KINDS) {
  if (!LINES[k]) throw new Error(`RL_NODE_DRIVERS: unknown driver line ${k} (known: ${Object.keys(LINES).join(', ')})`);
}

// Load only the lines a run uses (and the newest of a library no line of
// the run names): an install without the aliases loads none of them.
const wanted = new Set(KINDS);
for (const fam of Object.keys(NEWEST)) if (!KINDS.some((k) => LINES[k].family === fam)) wanted.add(NEWEST[fam]);
const LIBS = {};
for (const k of wanted) {
  let m;
  try {
    m = await import(LINES[k].pkg);
  } catch (e) {
    // a library no line of the run names, not installed here (the unpinned
    // install test's Valkey run has no node-redis alias): connect() says so
    if (KINDS.includes(k) || e.code !== 'ERR_MODULE_NOT_FOUND') throw e;
    continue;
  }
  LIBS[k] = LINES[k].family === 'ioredis' ? m.default : m;
  // GLIDE logs every error reply at WARN to the console: only errors here
  if (LINES[k].family === 'glide') m.Logger.setLoggerConfig('error');
}

/** The driver line a test asks for: a line by name, or the run's line of a library. */
export function line(kind) {
  if (FAMILY_NEWEST[kind]) return KINDS.find((k) => LINES[k].family === kind) || FAMILY_NEWEST[kind];
  if (LINES[kind]) return kind;
  throw new Error(`unknown client kind ${kind}`);
}

/** The family ('ioredis' | 'node-redis' | 'glide') of a kind. */
export function family(kind) { return LINES[line(kind)].family; }

/** The libraries of the run's lines, each once ('ioredis', 'node-redis', 'glide'): kinds for connect(). */
export const FAMILIES = [...new Set(KINDS.map((k) => LINES[k].family))];

/** A connected client of `kind` to a standalone server (port) or a cluster (ports). */
export async function connect(kind, ports, { cluster = false, ioredisOpts = {}, nodeRedisOpts = {}, glideOpts = {} } = {}) {
  const first = Array.isArray(ports) ? ports[0] : ports;
  const k = line(kind);
  const fam = LINES[k].family;
  const lib = LIBS[k];
  if (!lib) throw new Error(`driver line ${k} is not loaded in this run (RL_NODE_DRIVERS)`);
  if (fam === 'glide') {
    const addresses = (Array.isArray(ports) ? ports : [ports]).map((port) => ({ host: '127.0.0.1', port }));
    const Client = cluster ? lib.GlideClusterClient : lib.GlideClient;
    const c = await Client.createClient({ addresses, ...glideOpts });
    return { client: c, close: () => c.close() };
  }
  if (fam === 'ioredis') {
    if (cluster) {
      const c = new lib.Cluster([{ host: '127.0.0.1', port: first }], { redisOptions: ioredisOpts });
      await new Promise((resolve, reject) => { c.once('ready', resolve); c.once('error', reject); });
      return { client: c, close: () => c.disconnect() };
    }
    const c = new lib(first, '127.0.0.1', { lazyConnect: true, ...ioredisOpts });
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  }
  if (cluster) {
    const c = lib.createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${first}` }] });
    c.on('error', () => {});
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  }
  const c = lib.createClient({ url: `redis://127.0.0.1:${first}`, ...nodeRedisOpts });
  c.on('error', () => {});
  await c.connect();
  return { client: c, close: () => c.disconnect() };
}

/** A client of `kind` on the primary that the sentinels (ports) name for `name`. */
export async function connectSentinel(kind, sentinelPorts, name) {
  const k = line(kind);
  const lib = LIBS[k];
  if (!lib) throw new Error(`driver line ${k} is not loaded in this run (RL_NODE_DRIVERS)`);
  if (LINES[k].family === 'glide') return null; // GLIDE has no Sentinel client
  const nodes = sentinelPorts.map((port) => ({ host: '127.0.0.1', port }));
  if (LINES[k].family === 'ioredis') {
    const c = new lib({ sentinels: nodes, name, lazyConnect: true });
    await c.connect();
    return { client: c, close: () => c.disconnect() };
  }
  if (typeof lib.createSentinel !== 'function') return null; // node-redis 4: no sentinel client
  const c = lib.createSentinel({ name, sentinelRootNodes: nodes });
  c.on('error', () => {});
  await c.connect();
  return { client: c, close: () => c.destroy() };
}
