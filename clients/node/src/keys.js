// Redis keys for rate limits, and the Redis Cluster slot of a key.
//
// A key is `prefix:{tag}:rest`: the part inside the braces is the hash tag,
// the only part Redis Cluster hashes, so every key built with the same tag
// lands in the same slot. Limits that one RL.MULTI call decides together
// must share a slot; put what they share (a tenant, an API key) in the tag.

// CRC16/XMODEM (polynomial 0x1021), the hash Redis Cluster uses.
const TABLE = new Uint16Array(256);
for (let i = 0; i < 256; i++) {
  let c = i << 8;
  for (let j = 0; j < 8; j++) c = c & 0x8000 ? ((c << 1) ^ 0x1021) & 0xffff : (c << 1) & 0xffff;
  TABLE[i] = c;
}

function crc16(bytes, start, end) {
  let crc = 0;
  for (let i = start; i < end; i++) crc = ((crc << 8) & 0xffff) ^ TABLE[((crc >> 8) ^ bytes[i]) & 0xff];
  return crc;
}

/** The cluster slot (0..16383) of a key (string or Buffer), hash tags honoured. */
export function keySlot(key) {
  const b = typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
  const open = b.indexOf(0x7b); // {
  if (open >= 0) {
    const close = b.indexOf(0x7d, open + 1); // }
    if (close > open + 1) return crc16(b, open + 1, close) & 16383;
  }
  return crc16(b, 0, b.length) & 16383;
}

// A part of a key must not open or close a hash tag of its own.
function part(what, v) {
  const s = String(v);
  if (s.length === 0) throw new RangeError(`${what} must not be empty`);
  if (s.includes('{') || s.includes('}')) throw new RangeError(`${what} must not contain { or }: ${JSON.stringify(s)}`);
  return s;
}

/**
 * makeKey(tag, ...parts, {prefix = 'rl'}) -> `rl:{tag}:part:part`.
 * Every key built with the same tag shares a cluster slot.
 */
export function makeKey(tag, ...parts) {
  let prefix = 'rl';
  const last = parts[parts.length - 1];
  if (last !== null && typeof last === 'object') {
    parts.pop();
    if (last.prefix !== undefined) prefix = last.prefix;
  }
  let k = `${part('prefix', prefix)}:{${part('tag', tag)}}`;
  for (const p of parts) k += ':' + part('key part', p);
  return k;
}

/** Throws a CrossSlotError unless every key maps to the same cluster slot. */
export function assertSameSlot(keys) {
  if (keys.length < 2) return;
  const s0 = keySlot(keys[0]);
  for (let i = 1; i < keys.length; i++) {
    const s = keySlot(keys[i]);
    if (s !== s0) {
      throw new CrossSlotError(`keys ${JSON.stringify(keys[0])} (slot ${s0}) and ${JSON.stringify(keys[i])} (slot ${s}) ` +
        'cannot share a cluster slot; put the shared part in a hash tag, e.g. rl:{tenant42}:user7');
    }
  }
}

export class CrossSlotError extends Error {
  constructor(msg) { super(msg); this.name = 'CrossSlotError'; }
}
