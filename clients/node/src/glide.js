// Valkey GLIDE (@valkey/valkey-glide 2.x) for the library: a GlideClient or
// a GlideClusterClient, seen as the `{kind, send, pipe}` of backend.js.
//
// - Every call is one customCommand (RL.* or EVALSHA/EVAL, the same
//   commands as with the other drivers); on a cluster it is routed to the
//   primary of its first key's slot (`primarySlotKey`), since GLIDE does not
//   know where the RL.* commands keep their keys.
// - Strict mode (GlideClient only): the grant and WAIT in one non-atomic
//   Batch, which GLIDE sends on the one connection it holds to the primary.
// - The bound: GLIDE's requestTimeout (250 ms by default), its reconnect
//   backoff and its in-flight limit all sit behind the library's own timer
//   (ratelimit.js races every call against timeoutMs), so none of them can
//   lengthen a decision. A call the timer gave up on stays in GLIDE until
//   its reply or GLIDE's own timeout; each request has its own callback
//   slot, so its late reply cannot answer a later call.
// - GLIDE reports a server's error reply as a RequestError whose message is
//   redis-rs's rendering ("An error was signalled by the server: -
//   NoScriptError: No matching script…", "WRONGTYPE: Operation…"), and a
//   timeout, a lost connection or a closed client as other classes. The
//   replies become ReplyErrors in Redis's own form ("NOSCRIPT No matching
//   script…"), so the library tells "it answered" (an error for the caller)
//   from "it is unavailable" (a failure the breaker counts) as with ioredis;
//   everything else is left as GLIDE raised it: a failure.

// redis-rs's names for the error codes it knows; any other code (WRONGTYPE,
// BUSY, NOREPLICAS, …) it keeps as the server sent it.
const KIND_CODES = {
  ResponseError: 'ERR', ExecAbortError: 'EXECABORT', BusyLoadingError: 'LOADING', NoScriptError: 'NOSCRIPT',
  Moved: 'MOVED', Ask: 'ASK', TryAgain: 'TRYAGAIN', ClusterDown: 'CLUSTERDOWN', CrossSlot: 'CROSSSLOT',
  MasterDown: 'MASTERDOWN', ReadOnly: 'READONLY', NotBusy: 'NOTBUSY',
};
const SIGNALLED = /^An error was signalled by the server:? - ([A-Za-z]+): ([\s\S]*)$/;
const EXTENSION = /^([A-Z][A-Z0-9_-]*): ([\s\S]*)$/;

/** An error reply from the server, in Redis's form: "CODE message". */
export class ReplyError extends Error {
  constructor(message, cause) { super(message, { cause }); this.name = 'ReplyError'; }
}

function className(e) { return e && e.constructor && e.constructor.name; }

/** GLIDE's error, as the library takes errors: a server reply becomes a ReplyError. */
export function glideError(e) {
  // Only a plain RequestError (not TimeoutError, ConnectionError, …) can be
  // a reply; a batch's replies are napi Errors named RequestError.
  if (!(e instanceof Error) || (className(e) !== 'RequestError' && e.name !== 'RequestError')) return e;
  let m = SIGNALLED.exec(e.message);
  if (m) {
    const code = KIND_CODES[m[1]];
    if (!code) return e; // a client-side kind (IoError, ClientError, …): not the server's answer
    return new ReplyError(`${code} ${m[2]}`, e);
  }
  m = EXTENSION.exec(e.message);
  if (m) return new ReplyError(`${m[1]} ${m[2]}`, e);
  return e;
}

function chain(c) {
  const names = [];
  for (let p = c && Object.getPrototypeOf(c); p && p !== Object.prototype; p = Object.getPrototypeOf(p)) {
    names.push(p.constructor && p.constructor.name);
  }
  return names;
}

/** 'GlideClusterClient' | 'GlideClient' for a GLIDE client, else null. */
export function glideKind(c) {
  if (!c || typeof c.customCommand !== 'function' || typeof c.exec !== 'function') return null;
  const names = chain(c);
  if (names.includes('GlideClusterClient')) return 'GlideClusterClient';
  if (names.includes('GlideClient')) return 'GlideClient';
  return null;
}

// The Batch class for strict mode, from the package the client came from
// (GLIDE's clients do not expose it); loaded only when strict mode is used.
let batchClass = null;
function loadBatch() {
  if (!batchClass) {
    batchClass = import('@valkey/valkey-glide').then((m) => m.Batch || (m.default && m.default.Batch), (e) => {
      batchClass = null;
      throw new TypeError(`strict mode on a GlideClient needs @valkey/valkey-glide importable from redis-ratelimit (${e.message})`);
    });
  }
  return batchClass;
}

const rethrow = (e) => { throw glideError(e); };

/** The backend's view of a GLIDE client: {kind, send, pipe?, prepare?}. */
export function glideAdapter(client, kind) {
  if (client.isClosed === true) throw new TypeError('this GLIDE client is closed: pass an open GlideClient / GlideClusterClient');
  if (kind === 'GlideClusterClient') {
    return {
      kind: 'glide-cluster',
      send(firstKey, args) {
        const route = firstKey === undefined ? 'randomNode' : { type: 'primarySlotKey', key: firstKey };
        return client.customCommand(args, { route }).catch(rethrow);
      },
    };
  }
  return {
    kind: 'glide',
    send: (firstKey, args) => client.customCommand(args).catch(rethrow),
    // strict mode: load Batch when the RateLimit is made, not in its first call
    prepare: () => { loadBatch().catch(() => {}); },
    async pipe(firstKey, cmds) {
      const Batch = await loadBatch();
      const b = new Batch(false);
      for (const a of cmds) b.customCommand(a);
      const out = await client.exec(b, false).catch(rethrow);
      if (!Array.isArray(out)) throw new Error(`unexpected reply to a GLIDE batch: ${out}`);
      return out.map((r) => (r instanceof Error ? glideError(r) : r));
    },
  };
}
