// Express (or any connect-style) middleware: one limiter per route.
//
//   app.use('/api', expressRateLimit(rl.leased(tokenBucket('api', 100, 100, 60000))));
//
// Every limited response carries headers(decision); a denial is a 429 with
// problem(decision) as application/problem+json. Redis failures never fail
// a request: the limiter's panic limits decide then.
import { createHash } from 'node:crypto';
import { headers, problem } from './headers.js';
import { makeKey } from './keys.js';

/** The caller: `key:<sha256(X-Api-Key), 32 hex>`, else `ip:<client address>`. */
export function callerId(req) {
  const apiKey = req.headers['x-api-key'];
  if (apiKey) return 'key:' + createHash('sha256').update(String(apiKey), 'utf8').digest('hex').slice(0, 32);
  let a = (req.socket && req.socket.remoteAddress) || 'unknown';
  if (a.startsWith('::ffff:')) a = a.slice(7);
  return 'ip:' + a;
}

/**
 * expressRateLimit(limiter, {key, cost}) -> middleware.
 * key(req) -> the Redis key (default rl:{<caller>}:<policy name>);
 * cost(req) -> units this request takes (default 1).
 */
export function expressRateLimit(limiter, { key, cost } = {}) {
  const name = limiter.policy.name;
  const keyOf = key || ((req) => makeKey(callerId(req), name));
  return function rateLimit(req, res, next) {
    let k;
    let c;
    try {
      k = keyOf(req);
      c = cost ? cost(req) : 1;
    } catch (e) {
      next(e);
      return;
    }
    limiter.limit(k, { cost: c }).then((d) => {
      res.rateLimit = d;
      const h = headers(d);
      for (const f in h) res.setHeader(f, h[f]);
      if (d.allowed) {
        next();
        return;
      }
      const body = JSON.stringify(problem(d, req.originalUrl ? req.originalUrl.split('?')[0] : undefined));
      res.statusCode = 429;
      res.setHeader('Content-Type', 'application/problem+json');
      res.setHeader('Content-Length', Buffer.byteLength(body));
      res.end(body);
    }, next);
  };
}
