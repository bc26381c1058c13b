// Real redis-server processes for the tests: free ports, temp dirs, killed
// when the test ends. RL_MODULE points at the module (.so); REDIS_SERVER and
// REDIS_CLI at the binaries (default: from PATH).
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import net from 'node:net';
import { fileURLToPath } from 'node:url';

const ROOT = process.env.RL_ROOT || join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const MODULE = process.env.RL_MODULE || join(ROOT, 'target', 'release', 'libredis_ratelimit.so');
export const REDIS_SERVER = process.env.REDIS_SERVER || 'redis-server';
export const REDIS_CLI = process.env.REDIS_CLI || 'redis-cli';
if (!existsSync(MODULE)) throw new Error(`module not built: ${MODULE} (cargo build --release, or set RL_MODULE)`);

function portFree(port) {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.once('error', () => resolve(false));
    s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
  });
}

/** A free port whose +10000 cluster bus port is free too (both ≤ 65535). */
export async function freePort() {
  for (let i = 0; i < 200; i++) {
    const port = await new Promise((resolve, reject) => {
      const s = net.createServer();
      s.once('error', reject);
      s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
    });
    if (port + 10000 <= 65535 && await portFree(port + 10000)) return port;
  }
  throw new Error('no free port');
}

export async function waitUntil(pred, { timeout = 30000, interval = 10, what = 'condition' } = {}) {
  const end = Date.now() + timeout;
  let last;
  while (Date.now() < end) {
    try {
      const v = await pred();
      if (v) return v;
    } catch (e) { last = e; }
    await new Promise((r) => setTimeout(r, interval));
  }
  throw new Error(`timed out waiting for ${what}${last ? ` (last error: ${last.message})` : ''}`);
}

function ping(port) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    let buf = '';
    s.setTimeout(1000, () => { s.destroy(); resolve(false); });
    s.on('error', () => resolve(false));
    s.on('connect', () => s.write('PING\r\n'));
    s.on('data', (d) => { buf += d; if (buf.includes('\r\n')) { s.destroy(); resolve(buf.startsWith('+PONG')); } });
  });
}

export class Server {
  constructor({ module = true, args = [] } = {}) {
    this.module = module;
    this.args = args;
    this.dir = mkdtempSync(join(tmpdir(), 'rl-node-'));
    this.proc = null;
    this.port = null;
  }

  async start() {
    if (this.port === null) this.port = await freePort();
    const argv = ['--port', String(this.port), '--bind', '127.0.0.1', '--dir', this.dir, '--logfile', 'redis.log',
      '--save', '', '--appendonly', 'no', '--enable-debug-command', 'yes', '--protected-mode', 'no'];
    if (this.module) argv.push('--loadmodule', MODULE);
    this.proc = spawn(REDIS_SERVER, [...argv, ...this.args], { cwd: this.dir, stdio: 'ignore' });
    this.exited = new Promise((resolve) => this.proc.once('exit', resolve));
    await waitUntil(async () => {
      if (this.proc.exitCode !== null) throw new Error(`redis-server exited: ${this.logTail()}`);
      return ping(this.port);
    }, { what: `redis-server on ${this.port}` });
    return this;
  }

  logTail() {
    try { return readFileSync(join(this.dir, 'redis.log'), 'utf8').split('\n').slice(-20).join('\n'); } catch { return ''; }
  }

  signal(sig) { if (this.alive()) this.proc.kill(sig); }
  alive() { return this.proc !== null && this.proc.exitCode === null && this.proc.signalCode === null; }

  async kill() {
    if (this.alive()) {
      this.proc.kill('SIGCONT');
      this.proc.kill('SIGKILL');
      await this.exited;
    }
  }

  async close() {
    await this.kill();
    rmSync(this.dir, { recursive: true, force: true });
  }

  cli(...args) {
    return execFileSync(REDIS_CLI, ['-p', String(this.port), ...args.map(String)], { encoding: 'utf8' }).trim();
  }
}

export async function startServer(opts) { return new Server(opts).start(); }

export class Cluster {
  constructor(nodes) { this.nodes = nodes; }

  static async start(n = 3, { module = true } = {}) {
    const args = ['--cluster-enabled', 'yes', '--cluster-config-file', 'nodes.conf', '--cluster-node-timeout', '5000'];
    const nodes = [];
    for (let i = 0; i < n; i++) nodes.push(await new Server({ module, args }).start());
    execFileSync(REDIS_CLI, ['--cluster', 'create', ...nodes.map((s) => `127.0.0.1:${s.port}`),
      '--cluster-replicas', '0', '--cluster-yes'], { encoding: 'utf8' });
    const c = new Cluster(nodes);
    await waitUntil(() => nodes.every((s) => /cluster_state:ok/.test(s.cli('CLUSTER', 'INFO')))
      && new Set(nodes.map((s) => s.cli('CLUSTER', 'SLOTS').split('\n').length)).size === 1,
    { timeout: 60000, what: 'cluster ok' });
    return c;
  }

  async close() { for (const s of this.nodes) await s.close(); }
}

// Time in tests (docs/testing.md, "Time in tests"): every window a test
// relies on is placed against the server's clock (TIME, the clock the
// module and the Lua twins read), never against where the wall clock falls.
// A fixed window not started FROMFIRST, and a sliding counter's current
// window, end at the next multiple of their length on the server's clock.
// ServerClock reads TIME over one connection of its own (no driver, no
// redis-cli process per read) and places a test's calls against those
// boundaries; testing/rltesting/clock.py is the same for the Python suites.
const POLL_MS = 20;
export const POLL_SLACK_MS = 60;

/** The first multiple of windowMs after tMs: where the aligned window holding tMs ends. */
export const boundaryAfter = (tMs, windowMs) => tMs - (tMs % windowMs) + windowMs;

export class ServerClock {
  static async open(port) {
    const c = new ServerClock();
    c.sock = net.connect(port, '127.0.0.1');
    c.buf = '';
    c.waiters = [];
    c.sock.setNoDelay(true);
    c.sock.on('data', (d) => {
      c.buf += d;
      // TIME answers *2\r\n$N\r\nsecs\r\n$M\r\nmicros\r\n
      for (;;) {
        const m = /^\*2\r\n\$\d+\r\n(\d+)\r\n\$\d+\r\n(\d+)\r\n/.exec(c.buf);
        if (!m) break;
        c.buf = c.buf.slice(m[0].length);
        c.waiters.shift().resolve(Number(m[1]) * 1000 + Math.floor(Number(m[2]) / 1000));
      }
    });
    c.sock.on('error', (e) => { for (const w of c.waiters.splice(0)) w.reject(e); });
    await new Promise((resolve, reject) => { c.sock.once('connect', resolve); c.sock.once('error', reject); });
    return c;
  }

  /** The server's clock in ms. */
  ms() {
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject });
      this.sock.write('*1\r\n$4\r\nTIME\r\n');
    });
  }

  /** Resolve once the server's clock reads tMs or later; the time read. */
  async past(tMs) {
    for (;;) {
      const now = await this.ms();
      if (now >= tMs) return now;
      await sleep(Math.min(tMs - now, POLL_MS));
    }
  }

  /** The server's time once the aligned window of windowMs has at least
   * needMs left (waiting for the next window if it has less; needMs is at
   * most half the window, so the wait is at most needMs). */
  async room(windowMs, needMs) {
    if (!(needMs > 0 && needMs <= windowMs / 2)) throw new RangeError(`needMs ${needMs} for a window of ${windowMs}`);
    const now = await this.ms();
    const end = boundaryAfter(now, windowMs);
    return end - now >= needMs ? now : this.past(end);
  }

  /** The next aligned boundary of windowMs, once it is between
   * leadMs - POLL_SLACK_MS and leadMs ahead of the server's clock. */
  async beforeBoundary(windowMs, leadMs) {
    if (!(leadMs > POLL_SLACK_MS && leadMs < windowMs)) throw new RangeError(`leadMs ${leadMs} for a window of ${windowMs}`);
    for (;;) {
      const now = await this.ms();
      const end = boundaryAfter(now, windowMs);
      const left = end - now;
      if (left <= leadMs && left >= leadMs - POLL_SLACK_MS) return end;
      const ahead = left > leadMs ? left - leadMs : left + windowMs - leadMs;
      await sleep(Math.max(1, Math.min(ahead, POLL_MS)));
    }
  }

  /** Run `run(attempt)` (calls on fresh keys named by the attempt) inside one
   * aligned window of windowMs: started with needMs of it left, checked on
   * the server's clock to have ended in the same window, run again (up to
   * `attempts` times) if it straddled a boundary. Returns run's result. */
  async oneWindow(windowMs, needMs, run, attempts = 3) {
    let took = 0;
    for (let attempt = 0; attempt < attempts; attempt++) {
      const t0 = await this.room(windowMs, needMs);
      const out = await run(attempt);
      const t1 = await this.ms();
      if (Math.floor(t0 / windowMs) === Math.floor(t1 / windowMs)) return out;
      took = t1 - t0;
    }
    throw new Error(`no run fitted in one window of ${windowMs} ms in ${attempts} tries (the last took ${took} ms)`);
  }

  close() { this.sock.destroy(); }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export { ROOT };
