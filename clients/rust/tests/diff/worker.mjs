// The Node library's side of the Rust client's differential test
// (tests/differential.rs): one JSON request a line on stdin, one JSON
// answer a line on stdout. The rules are the same as the Rust test's.
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import { RateLimit, allOf, fixedWindow, headers, problem, slidingCounter, slidingLog, tokenBucket } from '../../../node/src/index.js';

const require = createRequire(new URL('../../../node/package.json', import.meta.url));
const Redis = require('ioredis6');

const HOUR = 3600000;
const RULES = {
  tb: tokenBucket('tb', 5, 1, HOUR),
  log: slidingLog('log', 4, HOUR),
  ctr: slidingCounter('ctr', 6, 2 ** 40),
  all: allOf([tokenBucket('a', 3, 1, HOUR), slidingLog('b', 10, HOUR).weighted(2)], { name: 'all' }),
  fw: fixedWindow('fw', 4, HOUR, { fromFirst: true }),
  allfw: allOf([fixedWindow('f', 6, 2 ** 40), tokenBucket('t', 4, 1, HOUR)], { name: 'allfw' }),
};

function out(d) {
  return {
    allowed: d.allowed, granted: d.granted, limit: d.limit, remaining: d.remaining,
    retry_after_ms: d.retryAfterMs, reset_after_ms: d.resetAfterMs, policy: d.policy, binding: d.binding,
    source: d.source,
    parts: d.parts.map((p) => [p.policy, p.granted, p.limit, p.remaining, p.retryAfterMs, p.resetAfterMs]),
  };
}

const client = new Redis(process.argv[2]);
const rl = new RateLimit(client, { timeoutMs: 2000 });
const lims = Object.fromEntries(Object.entries(RULES).map(([n, r]) => [n, rl.limiter(r)]));

for await (const line of createInterface({ input: process.stdin })) {
  const q = JSON.parse(line);
  if (q.op === 'headers') {
    const x = q.decision;
    const d = {
      allowed: x.allowed, granted: x.granted, limit: x.limit, remaining: x.remaining,
      retryAfterMs: x.retry_after_ms, resetAfterMs: x.reset_after_ms, policy: x.policy, binding: x.binding,
      source: x.source, rule: RULES[q.rule],
      parts: x.parts.map(([policy, granted, limit, remaining, retryAfterMs, resetAfterMs]) =>
        ({ policy, granted, limit, remaining, retryAfterMs, resetAfterMs })),
    };
    process.stdout.write(JSON.stringify({ headers: Object.entries(headers(d)), problem: problem(d, q.instance) }) + '\n');
    continue;
  }
  const lim = lims[q.rule];
  const d = q.op === 'refund'
    ? await lim.refund(q.key, q.n)
    : await lim.limit(q.key, { cost: q.cost, partial: q.partial, dryRun: q.dry_run });
  process.stdout.write(JSON.stringify({ decision: out(d), headers: Object.entries(headers(d)) }) + '\n');
}
client.disconnect();
