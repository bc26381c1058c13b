// A primary, its replicas and 3 sentinels on real processes (free ports,
// temp dirs), the REDIS_SERVER binary in sentinel mode: a primary is down
// after 200 ms, so a failover takes about a second.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REDIS_SERVER, Server, freePort, waitUntil } from './harness.js';

export const SERVICE = 'rl';

class Sentinel {
  async start(primaryPort) {
    this.port = await freePort();
    this.dir = mkdtempSync(join(tmpdir(), 'rl-node-sentinel-'));
    const conf = join(this.dir, 'sentinel.conf');
    writeFileSync(conf, `port ${this.port}\nbind 127.0.0.1\nprotected-mode no\ndir ${this.dir}\nlogfile sentinel.log\n`
      + `sentinel monitor ${SERVICE} 127.0.0.1 ${primaryPort} 2\nsentinel down-after-milliseconds ${SERVICE} 200\n`
      + `sentinel failover-timeout ${SERVICE} 2000\n`);
    this.proc = spawn(REDIS_SERVER, [conf, '--sentinel'], { cwd: this.dir, stdio: 'ignore' });
    this.exited = new Promise((resolve) => this.proc.once('exit', resolve));
    this.cliServer = Object.assign(Object.create(Server.prototype), { port: this.port });
    await waitUntil(() => this.cli('PING') === 'PONG', { what: `sentinel on ${this.port}` });
    return this;
  }

  cli(...args) { return this.cliServer.cli(...args); }

  master() {
    const l = this.cli('SENTINEL', 'MASTER', SERVICE).split('\n');
    const o = {};
    for (let i = 0; i + 1 < l.length; i += 2) o[l[i]] = l[i + 1];
    return o;
  }

  primaryPort() { return Number(this.cli('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', SERVICE).split('\n')[1]); }

  async close() {
    if (this.proc && this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGKILL');
      await this.exited;
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Settle the primary: it counts a fresh replica (for WAIT) only from its first ACK. */
export async function settled(primary) {
  primary.cli('SET', 'settle', '1');
  await waitUntil(() => Number(primary.cli('WAIT', '1', '1000')) >= 1, { what: 'the replica acknowledged' });
  primary.cli('DEL', 'settle');
}

export async function startReplica(primary, { module = true, args = [] } = {}) {
  primary.cli('CONFIG', 'SET', 'repl-diskless-sync-delay', '0');
  const r = await new Server({ module, args: ['--replicaof', '127.0.0.1', String(primary.port), ...args] }).start();
  await waitUntil(() => /master_link_status:up/.test(r.cli('INFO', 'replication')), { what: 'replica link up' });
  return r;
}

export class Deployment {
  static async start({ replicaModule = true } = {}) {
    const d = new Deployment();
    d.primary = await new Server().start();
    d.replicas = [await startReplica(d.primary, { module: replicaModule })];
    d.sentinels = [];
    try {
      for (let i = 0; i < 3; i++) d.sentinels.push(await new Sentinel().start(d.primary.port));
      await waitUntil(() => d.sentinels.every((s) => {
        const m = s.master();
        return Number(m['num-other-sentinels']) >= 2 && Number(m['num-slaves']) >= d.replicas.length;
      }), { what: 'the sentinels know each other and the replica' });
      await settled(d.primary);
    } catch (e) {
      await d.close();
      throw e;
    }
    return d;
  }

  get ports() { return this.sentinels.map((s) => s.port); }

  async waitPromoted() {
    const old = this.primary.port;
    return waitUntil(() => {
      const ports = new Set(this.sentinels.map((s) => s.primaryPort()));
      if (ports.size !== 1 || ports.has(old)) return false;
      const [port] = ports;
      const r = this.replicas.find((x) => x.port === port);
      return /role:master/.test(r.cli('INFO', 'replication')) ? r : false;
    }, { what: 'a replica promoted by the sentinels' });
  }

  async close() {
    for (const s of this.sentinels) await s.close();
    await this.primary.close();
    for (const r of this.replicas) await r.close();
  }
}
