// One way to send rate-limit calls to Redis, chosen once per client: the
// module's RL.* commands when the server has them, else the project's Lua
// twins by EVALSHA (NOSCRIPT answered with EVAL, which also caches the
// script on that node). Works with ioredis and iovalkey (Redis, Cluster),
// node-redis v4+ (createClient, createCluster) and Valkey GLIDE
// (GlideClient, GlideClusterClient: glide.js). Every call is routed by its
// first key.
import { readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { keySlot } from './keys.js';
import { glideAdapter, glideKind } from './glide.js';

const LUA_DIR = new URL('../lua/', import.meta.url);
const SCRIPT_NAMES = ['tokenbucket', 'slidinglog', 'slidingcounter', 'fixedwindow', 'multi', 'concurrency'];

/** The Lua twins shipped in this package: {name: {text, sha}} (multi when present). */
export const SCRIPTS = {};
const NO_FIXED_WINDOW = 'this server\'s redis-ratelimit module has no RL.FIXEDWINDOW (fixedWindow needs it: upgrade the module, or backend: \'lua\')';
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
function isNodeRedisSentinel(c) { return c && typeof c.getMasterNode === 'function' && typeof c.getSentinelNode === 'function' && typeof c.sendCommand === 'function'; }
function isNodeRedisCluster(c) { return c && typeof c.getSlotRandomNode === 'function' && typeof c.sendCommand === 'function'; }
function isNodeRedis(c) { return c && typeof c.sendCommand === 'function' && 'isOpen' in c; }

// pipe(firstKey, [args, ...]) -> Promise<[reply or Error, ...]>: the commands
// in one pipeline on one connection (strict mode's grant + WAIT).
function nodeRedisPipe(client, sentinel) {
  return async (firstKey, cmds) => {
    const m = client.multi();
    for (const a of cmds) {
      if (sentinel) m.addCommand(false, a);
      else m.addCommand(a);
    }
    try {
      return await m.execAsPipeline();
    } catch (e) {
      if (e && Array.isArray(e.replies)) return e.replies; // MultiErrorReply: some replies are errors
      // node-redis 6 rejects with the first error reply itself
      if (/^NOSCRIPT/.test(errText(e))) return [e, null];
      throw e;
    }
  };
}

/** send(firstKey, args: string[]) -> Promise<reply>, for any supported client. */
export function adapt(client) {
  const glide = glideKind(client);
  if (glide) return glideAdapter(client, glide);
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
    return {
      kind: client.options && Array.isArray(client.options.sentinels) ? 'ioredis-sentinel' : 'ioredis',
      send: (firstKey, args) => client.call(...args),
      async pipe(firstKey, cmds) {
        const p = client.pipeline();
        for (const a of cmds) p.call(...a);
        const out = await p.exec();
        return out.map(([err, reply]) => err || reply);
      },
    };
  }
  if (isNodeRedisSentinel(client)) {
    // node-redis 5+ createSentinel: commands go to the primary it tracks
    return { kind: 'node-redis-sentinel', send: (firstKey, args) => client.sendCommand(false, args), pipe: nodeRedisPipe(client, true) };
  }
  if (isNodeRedisCluster(client)) {
    return { kind: 'node-redis-cluster', send: (firstKey, args) => client.sendCommand(firstKey, false, args) };
  }
  if (isNodeRedis(client)) {
    return { kind: 'node-redis', send: (firstKey, args) => client.sendCommand(args), pipe: nodeRedisPipe(client, false) };
  }
  throw new TypeError('unsupported Redis client: pass an ioredis / iovalkey Redis or Cluster, a node-redis client or cluster, '
    + 'or a Valkey GLIDE GlideClient or GlideClusterClient');
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
/**
 * Strict mode's WAIT: {replicas, waitMs} from the `strict` option (true, or
 * {replicas = 1, timeoutMs}), or null. WAIT's timeout (whole ms >= 1) must
 * be shorter than the call's timeout; default 80% of it, rounded down.
 */
export function strictWait(strict, callTimeoutMs) {
  if (strict === undefined || strict === null || strict === false) return null;
  const o = strict === true ? {} : strict;
  if (typeof o !== 'object') throw new TypeError('strict must be true, false or {replicas, timeoutMs}');
  const replicas = o.replicas === undefined ? 1 : o.replicas;
  if (!Number.isInteger(replicas) || replicas < 1) throw new RangeError('strict.replicas must be an integer >= 1');
  const ms = o.timeoutMs === undefined ? Math.floor(callTimeoutMs * 0.8) : o.timeoutMs;
  if (!Number.isInteger(ms) || ms < 1 || ms >= callTimeoutMs) {
    throw new RangeError(`strict mode's WAIT timeout (${ms} ms: strict.timeoutMs) must be an integer of at least 1 ms `
      + `and shorter than the call's timeout (${callTimeoutMs} ms: timeoutMs), so that the decision stays bounded`);
  }
  return { replicas, waitMs: ms };
}

/** A grant strict mode could not see copied: a failure (the breaker counts it), never a grant. */
export class NotReplicatedError extends Error {
  constructor(acked, wanted) { super(`grant acknowledged by ${acked} of ${wanted} replicas (strict mode)`); this.name = 'NotReplicatedError'; }
}

export class Backend {
  constructor(client, { backend = 'auto', strict = null } = {}) {
    if (!['auto', 'module', 'lua'].includes(backend)) throw new TypeError(`backend must be auto, module or lua, not ${backend}`);
    this.client = client;
    this.io = adapt(client);
    if (strict && !this.io.pipe) throw new TypeError(`strict mode is not supported on a ${this.io.kind} client (WAIT must follow the grant on the same node's connection)`);
    if (strict && this.io.prepare) this.io.prepare();
    this.strict = strict;
    this.unreplicated = 0;
    this.redetects = 0;
    this.wanted = backend;
    this.source = backend === 'auto' ? null : backend; // 'module' | 'lua' once known
    this.hasModuleMulti = null;
    this.hasModuleFixedWindow = null;
    this.detecting = null;
  }

  /** Resolve the backend once (one COMMAND INFO); later calls are free. */
  detect() {
    if (this.source !== null && (this.source === 'lua' || this.hasModuleMulti !== null)) return Promise.resolve(this.source);
    if (!this.detecting) {
      this.detecting = this.io.send(undefined, ['COMMAND', 'INFO', 'RL.TOKENBUCKET', 'RL.MULTI', 'RL.FIXEDWINDOW']).then((reply) => {
        const has = Array.isArray(reply) && reply.length === 3;
        const single = has && reply[0] != null;
        this.hasModuleMulti = has && reply[1] != null;
        this.hasModuleFixedWindow = has && reply[2] != null;
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
    this.hasModuleFixedWindow = null;
  }

  async single(policy, key, opt) {
    if (this.source === null || (this.source === 'module' && this.hasModuleMulti === null)) await this.detect();
    const tail = optionArgs(opt);
    if (this.source === 'module') {
      // (a module older than RL.FIXEDWINDOW: refused before any call, not an
      // unknown command taken for a lost backend)
      if (policy.fixed && !this.hasModuleFixedWindow) throw new BackendError(NO_FIXED_WINDOW);
      return this.run(key, [policy.command, key, ...policy.args, ...tail], grants(opt));
    }
    return this.script(policy.script, [key], [...policy.args, ...tail], grants(opt));
  }

  async multi(policies, keys, weights, opt) {
    if (this.source === null || (this.source === 'module' && this.hasModuleMulti === null)) await this.detect();
    const limits = [];
    for (let i = 0; i < policies.length; i++) {
      limits.push(policies[i].multiName, ...policies[i].multiArgs);
      if (weights[i] !== 1) limits.push('WEIGHT', String(weights[i]));
      limits.push(...policies[i].flags);
    }
    const tail = optionArgs(opt);
    if (this.source === 'module') {
      if (!this.hasModuleMulti) throw new BackendError('this server\'s redis-ratelimit module has no RL.MULTI (allOf needs it)');
      if (!this.hasModuleFixedWindow && policies.some((p) => p.fixed)) throw new BackendError(NO_FIXED_WINDOW);
      return this.run(keys[0], ['RL.MULTI', String(keys.length), ...keys, ...limits, ...tail], grants(opt));
    }
    if (!SCRIPTS.multi) throw new BackendError('this package ships no multi.lua: allOf needs the module');
    return this.script('multi', keys, [...limits, ...tail], grants(opt));
  }

  /**
   * RL.CONCURRENCY (twin concurrency.lua): `action` ACQUIRE | RENEW |
   * RELEASE for `id`, ACQUIRE with COST `cost` when not 1. An ACQUIRE is a
   * grant (strict mode waits for its copy).
   */
  async concurrency(policy, key, action, id, cost = 1) {
    if (this.source === null || (this.source === 'module' && this.hasModuleMulti === null)) await this.detect();
    const args = [...policy.args, action, id];
    if (cost !== 1) args.push('COST', String(cost));
    const grant = action === 'ACQUIRE';
    if (this.source === 'module') return this.run(key, [policy.command, key, ...args], grant);
    if (!SCRIPTS.concurrency) throw new BackendError('this package ships no concurrency.lua: inflight() needs the module');
    return this.script('concurrency', [key], args, grant);
  }

  async run(firstKey, args, grant) {
    try {
      if (grant && this.strict) return await this.waited(firstKey, [args]);
      return await this.io.send(firstKey, args);
    } catch (e) {
      if (/unknown command/i.test(errText(e))) {
        if (this.wanted === 'auto') {
          // The module was found, and now its command is unknown: the
          // primary changed (a failover to a server without it). A failure
          // the breaker counts; the next call detects the backend again
          // (unless a call that answered later already did).
          if (this.source === 'module') {
            this.reset();
            this.redetects++;
          }
          throw new Error(`the server no longer has the module (${errText(e)}): backend detected again`, { cause: e });
        }
        this.reset();
      }
      throw e;
    }
  }

  async script(name, keys, args, grant) {
    const s = SCRIPTS[name];
    const head = [String(keys.length), ...keys, ...args];
    if (grant && this.strict) return this.waited(keys[0], [['EVALSHA', s.sha, ...head], ['EVAL', s.text, ...head]]);
    try {
      return await this.io.send(keys[0], ['EVALSHA', s.sha, ...head]);
    } catch (e) {
      if (!/^NOSCRIPT/.test(errText(e))) throw e;
      return this.io.send(keys[0], ['EVAL', s.text, ...head]);
    }
  }

  // Strict mode: the call and WAIT in one pipeline; the reply counts only
  // when it granted nothing or enough replicas acknowledged it. `tries`:
  // the call, then (Lua) the call that answers NOSCRIPT.
  async waited(firstKey, tries) {
    const { replicas, waitMs } = this.strict;
    let reply;
    for (const args of tries) {
      const out = await this.io.pipe(firstKey, [args, ['WAIT', String(replicas), String(waitMs)]]);
      reply = out[0];
      if (reply instanceof Error && /^NOSCRIPT/.test(errText(reply))) continue;
      if (reply instanceof Error) throw reply;
      if (out[1] instanceof Error) throw out[1];
      const acked = Number(out[1]);
      if (Number(reply[0]) !== 0 && !(acked >= replicas)) {
        this.unreplicated++;
        throw new NotReplicatedError(acked, replicas);
      }
      return reply;
    }
    throw reply;
  }
}

// A call that can grant (strict mode waits for its copy): not a refund, not a dry run.
function grants(opt) { return !!opt && opt.refund === undefined && !opt.dryRun; }

function optionArgs(opt) {
  const a = [];
  if (!opt) return a;
  if (opt.refund !== undefined) {
    a.push('REFUND', String(opt.refund));
    return a;
  }
  if (opt.cost !== undefined && (opt.cost !== 1 || opt.force)) a.push('COST', String(opt.cost));
  if (opt.partial) a.push('PARTIAL');
  if (opt.force) a.push('FORCE'); // a debit: taken even past the limit
  if (opt.dryRun) a.push('DRYRUN');
  return a;
}
