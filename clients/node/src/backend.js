// One way to send rate-limit calls to Redis, chosen once per client: the
// module's RL.* commands when the server has them, else the project's Lua
// twins by EVALSHA (NOSCRIPT answered with EVAL, which also caches the
// script on that node). Works with ioredis (Redis, Cluster) and node-redis
// v4+ (createClient, createCluster). Every call is routed by its first key.
import { readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { keySlot } from './keys.js';

const LUA_DIR = new URL('../lua/', import.meta.url);
const SCRIPT_NAMES = ['tokenbucket', 'slidinglog', 'slidingcounter', 'multi'];

/** The Lua twins shipped in this package: {name: {text, sha}} (multi when present). */
export const SCRIPTS = {};
for (const name of SCRIPT_NAMES) {
  let text;
  try {
    text = readFileSync(new URL(`${name}.lua`, LUA_DIR), 'utf8');
  } catch (e) {
    if (e.code === 'ENOENT') continue;
    throw e;
  }
  SCRIPTS[name] = { text, sha: createHash('sha1').update(text).digest('hex') };
}

export class BackendError extends Error {
  constructor(msg, cause) { super(msg, cause ? { cause } : undefined); this.name = 'BackendError'; }
}

// ---------------------------------------------------------------- clients

function isIoredisCluster(c) { return c && c.isCluster === true && typeof c.sendCommand === 'function'; }
function isIoredis(c) { return c && typeof c.call === 'function' && typeof c.sendCommand === 'function' && 'options' in c; }
function isNodeRedisCluster(c) { return c && typeof c.getSlotRandomNode === 'function' && typeof c.sendCommand === 'function'; }
function isNodeRedis(c) { return c && typeof c.sendCommand === 'function' && 'isOpen' in c; }

/** send(firstKey, args: string[]) -> Promise<reply>, for any supported client. */
export function adapt(client) {
  if (isIoredisCluster(client)) {
    // ioredis does not know the RL.* commands' key position: give the slot
    // ourselves so the call goes to the right node without a MOVED.
    const Command = ioredisCommandClass(client);
    return {
      kind: 'ioredis-cluster',
      send(firstKey, args) {
        const cmd = new Command(args[0], args.slice(1));
        if (firstKey !== undefined) cmd.slot = keySlot(firstKey);
        return client.sendCommand(cmd);
      },
    };
  }
  if (isIoredis(client)) {
    return { kind: 'ioredis', send: (firstKey, args) => client.call(...args) };
  }
  if (isNodeRedisCluster(client)) {
    return { kind: 'node-redis-cluster', send: (firstKey, args) => client.sendCommand(firstKey, false, args) };
  }
  if (isNodeRedis(client)) {
    return { kind: 'node-redis', send: (firstKey, args) => client.sendCommand(args) };
  }
  throw new TypeError('unsupported Redis client: pass an ioredis Redis/Cluster or a node-redis client/cluster');
}

// ioredis builds every call as `this.sendCommand(new Command(...))`: call it
// on an object that inherits from the client but catches sendCommand, to
// learn the client's own Command class without importing ioredis here.
function ioredisCommandClass(client) {
  let cls = null;
  const probe = Object.create(client);
  probe.sendCommand = (cmd) => { cls = cmd.constructor; return Promise.resolve(null); };
  probe.call('PING');
  if (typeof cls !== 'function') throw new TypeError('cannot find the ioredis Command class of this client');
  return cls;
}

function errText(e) { return (e && e.message) || String(e); }

// ----------------------------------------------------------------- backend

/**
 * Backend: sends one decision (one policy, or several with RL.MULTI).
 * mode: 'auto' (module if RL.TOKENBUCKET exists, else Lua), 'module', 'lua'.
 */
export class Backend {
  constructor(client, { backend = 'auto' } = {}) {
    if (!['auto', 'module', 'lua'].includes(backend)) throw new TypeError(`backend must be auto, module or lua, not ${backend}`);
    this.client = client;
    this.io = adapt(client);
    this.wanted = backend;
    this.source = backend === 'auto' ? null : backend; // 'module' | 'lua' once known
    this.hasModuleMulti = null;
    this.detecting = null;
  }

  /** Resolve the backend once (one COMMAND INFO); later calls are free. */
  detect() {
    if (this.source !== null && (this.source === 'lua' || this.hasModuleMulti !== null)) return Promise.resolve(this.source);
    if (!this.detecting) {
      this.detecting = this.io.send(undefined, ['COMMAND', 'INFO', 'RL.TOKENBUCKET', 'RL.MULTI']).then((reply) => {
        const has = Array.isArray(reply) && reply.length === 2;
        const single = has && reply[0] != null;
        this.hasModuleMulti = has && reply[1] != null;
        if (this.wanted === 'module' && !single) {
          throw new BackendError('the redis-ratelimit module is not loaded on this server (RL.TOKENBUCKET unknown)');
        }
        if (this.source === null) this.source = single ? 'module' : 'lua';
        return this.source;
      }).finally(() => { this.detecting = null; });
    }
    return this.detecting;
  }

  /** Forget the backend (after an "unknown command": the server changed). */
  reset() {
    if (this.wanted === 'auto') this.source = null;
    this.hasModuleMulti = null;
  }

  async single(policy, key, opt) {
    if (this.source === null || (this.source === 'module' && this.hasModuleMulti === null)) await this.detect();
    const tail = optionArgs(opt);
    if (this.source === 'module') {
      return this.run(key, [policy.command, key, ...policy.args, ...tail]);
    }
    return this.script(policy.script, [key], [...policy.args, ...tail]);
  }

  async multi(policies, keys, weights, opt) {
    if (this.source === null || (this.source === 'module' && this.hasModuleMulti === null)) await this.detect();
    const limits = [];
    for (let i = 0; i < policies.length; i++) {
      limits.push(policies[i].multiName, ...policies[i].args);
      if (weights[i] !== 1) limits.push('WEIGHT', String(weights[i]));
    }
    const tail = optionArgs(opt);
    if (this.source === 'module') {
      if (!this.hasModuleMulti) throw new BackendError('this server\'s redis-ratelimit module has no RL.MULTI (allOf needs it)');
      return this.run(keys[0], ['RL.MULTI', String(keys.length), ...keys, ...limits, ...tail]);
    }
    if (!SCRIPTS.multi) throw new BackendError('this package ships no multi.lua: allOf needs the module');
    return this.script('multi', keys, [...limits, ...tail]);
  }

  async run(firstKey, args) {
    try {
      return await this.io.send(firstKey, args);
    } catch (e) {
      if (/unknown command/i.test(errText(e))) this.reset();
      throw e;
    }
  }

  async script(name, keys, args) {
    const s = SCRIPTS[name];
    const head = [String(keys.length), ...keys, ...args];
    try {
      return await this.io.send(keys[0], ['EVALSHA', s.sha, ...head]);
    } catch (e) {
      if (!/^NOSCRIPT/.test(errText(e))) throw e;
      return this.io.send(keys[0], ['EVAL', s.text, ...head]);
    }
  }
}

function optionArgs(opt) {
  const a = [];
  if (!opt) return a;
  if (opt.refund !== undefined) {
    a.push('REFUND', String(opt.refund));
    return a;
  }
  if (opt.cost !== undefined && opt.cost !== 1) a.push('COST', String(opt.cost));
  if (opt.partial) a.push('PARTIAL');
  if (opt.dryRun) a.push('DRYRUN');
  return a;
}
