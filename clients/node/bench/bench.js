// Benchmarks of the Node client, each a ratio or a count measured in one run
// against a redis-server this script starts (module loaded):
//   1. local decision cost per call of a leased limiter (median, p99);
//   2. shared calls per decision at steady load, batch 10 / 50 / 200;
//   3. decisions per second and Redis CPU per decision, leased vs one call
//      per decision (the ratio is the result);
//   4. stranded tokens at idle instances before and after their refunds.
//   node bench/bench.js [--quick] [--out FILE.md]
import { performance } from 'node:perf_hooks';
import { writeFileSync } from 'node:fs';
import IORedis from 'ioredis';
import { startServer, waitUntil } from '../test/harness.js';
import { RateLimit, tokenBucket, slidingLog, SCRIPTS } from '../src/index.js';

const args = process.argv.slice(2);
const QUICK = args.includes('--quick');
const OUT = args.includes('--out') ? args[args.indexOf('--out') + 1] : null;
const BIG = 1e12; // a limit no benchmark reaches
const lines = [];
const say = (s = '') => { lines.push(s); console.log(s); };

function pct(sorted, p) { return sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)]; }

async function cpuUs(c) {
  const info = await c.info('cpu');
  const f = (k) => Number(new RegExp(`${k}:([0-9.]+)`).exec(info)[1]);
  return (f('used_cpu_user') + f('used_cpu_sys')) * 1e6;
}

const server = await startServer();
const redis = new IORedis(server.port, '127.0.0.1');
try {
  say(`# Node client benchmarks${QUICK ? ' (--quick: tiny counts, numbers not meaningful)' : ''}`);
  say();
  say(`node ${process.version}, redis-server on 127.0.0.1 with the module, ioredis; one run of \`node bench/bench.js\`.`);
  say();

  // 1. Local decision cost ------------------------------------------------
  {
    const rl = new RateLimit(redis, { timeoutMs: 1000 });
    const lim = rl.leased(tokenBucket('local', BIG, BIG, 1000), { batch: 1e9, lowWater: 0 });
    await lim.limit('rl:{bench}:local'); // the one lease
    const CHUNK = 1000;
    const CHUNKS = QUICK ? 50 : 2000;
    const per = [];
    for (let w = 0; w < 2; w++) {
      per.length = 0;
      for (let c = 0; c < CHUNKS; c++) {
        const t0 = process.hrtime.bigint();
        for (let i = 0; i < CHUNK; i++) await lim.limit('rl:{bench}:local');
        per.push(Number(process.hrtime.bigint() - t0) / CHUNK);
      }
    }
    per.sort((a, b) => a - b);
    const m = rl.metrics();
    say('## Local decision cost (leased limiter, reservoir not empty)');
    say();
    say(`\`await lim.limit(key)\` in chunks of ${CHUNK} calls, ${CHUNKS} chunks after one warm-up pass: ` +
      `**median ${(pct(per, 0.5) / 1000).toFixed(3)} µs, p99 ${(pct(per, 0.99) / 1000).toFixed(3)} µs per call** ` +
      `(goal ≤ 0.3 µs). Redis calls during the run: ${m.calls} for ${m.decisionsLocal + m.decisionsModule} decisions.`);
    say();
    await lim.close();
  }

  // 2. Shared calls per decision --------------------------------------------
  say('## Shared calls per decision at steady load');
  say();
  say('One key, a limit no run reaches, 16 callers at once, each calling again as soon as it has its decision; lowWater 0.2. ' +
    'A caller that waited for the lease in flight and still finds the reservoir short is denied (it takes no lease of its own): ' +
    'those denials are counted apart, and calls are per granted decision.');
  say();
  say('| batch | granted | denied | Redis calls | calls per granted decision | granted per call | lease waits |');
  say('|---:|---:|---:|---:|---:|---:|---:|');
  const N = QUICK ? 2000 : 200000;
  for (const batch of [10, 50, 200]) {
    const rl = new RateLimit(redis, { timeoutMs: 1000 });
    const lim = rl.leased(tokenBucket(`steady${batch}`, BIG, BIG, 1000), { batch });
    let granted = 0;
    const caller = async () => {
      while (granted < N) if ((await lim.limit(`rl:{bench}:steady${batch}`)).allowed) granted++;
    };
    await Promise.all(Array.from({ length: 16 }, caller));
    const m = rl.metrics();
    const g = m.decisionsLocal + m.decisionsModule - m.denied;
    say(`| ${batch} | ${g} | ${m.denied} | ${m.calls} | 1/${(g / m.calls).toFixed(1)} | ${(g / m.calls).toFixed(1)} | ${m.leaseWaits} |`);
    await lim.close();
  }
  say();

  // 3. Throughput and Redis CPU: leased vs one call per decision -------------
  say('## Leased vs one call per decision');
  say();
  // alternating rounds, the median of each (the machine is shared: a single
  // long run of each mode would compare different background loads)
  const ROUNDS = QUICK ? 1 : 7;
  const ROUND_MS = QUICK ? 200 : 600;
  const C = 64;
  const modes = ['one call per decision', 'leased, batch 50'];
  const runs = { [modes[0]]: [], [modes[1]]: [] };
  const ratios = { rate: [], cpu: [] };
  let keyGen = 0;
  for (let r = 0; r < ROUNDS; r++) {
    const got = {};
    for (const mode of modes) {
      const rl = new RateLimit(redis, { timeoutMs: 1000 });
      const policy = tokenBucket('tput', BIG, BIG, 1000);
      const lim = mode.startsWith('leased') ? rl.leased(policy, { batch: 50 }) : rl.limiter(policy);
      const gen = keyGen++;
      const keys = Array.from({ length: 100 }, (_, i) => `rl:{t${gen}-${i}}:tput`);
      for (const k of keys) await lim.limit(k); // first leases outside the measurement
      const calls0 = rl.metrics().calls;
      const cpu0 = await cpuUs(redis);
      const t0 = performance.now();
      let n = 0; // granted decisions: a denial (burst past a lease) is not counted as work done
      let denied = 0;
      const end = t0 + ROUND_MS;
      const caller = async (j) => {
        let i = j;
        while (performance.now() < end) {
          if ((await lim.limit(keys[i++ % keys.length])).allowed) n++;
          else denied++;
        }
      };
      await Promise.all(Array.from({ length: C }, (_, j) => caller(j)));
      const secs = (performance.now() - t0) / 1000;
      const cpu = (await cpuUs(redis)) - cpu0;
      got[mode] = { rate: n / secs, cpuPer: cpu / n, calls: rl.metrics().calls - calls0, n, denied };
      runs[mode].push(got[mode]);
      if (lim.close) await lim.close();
    }
    ratios.rate.push(got[modes[1]].rate / got[modes[0]].rate);
    ratios.cpu.push(got[modes[0]].cpuPer / got[modes[1]].cpuPer);
  }
  const med = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
  say(`${C} callers in this one process, 100 keys, ${ROUNDS} rounds of ${ROUND_MS} ms per mode, alternating; ` +
    'medians. Redis CPU from INFO cpu (user + sys).');
  say();
  say('| mode | granted decisions/s | denied (all rounds) | Redis calls per decision | Redis CPU per decision | decisions per Redis core-second |');
  say('|---|---:|---:|---:|---:|---:|');
  for (const mode of modes) {
    const rs = runs[mode];
    const cpuPer = med(rs.map((x) => x.cpuPer));
    say(`| ${mode} | ${Math.round(med(rs.map((x) => x.rate)))} | ${rs.reduce((a, x) => a + x.denied, 0)} | ${med(rs.map((x) => x.calls / x.n)).toFixed(3)} | ` +
      `${cpuPer.toFixed(3)} µs | ${Math.round(1e6 / cpuPer)} |`);
  }
  say();
  say(`**Ratio leased / one call per decision (median of the rounds' ratios): ${med(ratios.rate).toFixed(1)}× decisions/s ` +
    `in this process, ${med(ratios.cpu).toFixed(1)}× decisions per Redis core-second** ` +
    `(rounds: ${ratios.cpu.map((x) => x.toFixed(1)).join(', ')}).`);
  say();

  // 4. Stranded tokens at idle instances ------------------------------------
  say('## Stranded tokens at idle instances');
  say();
  // REFUND on the module, else on the Lua twins (the same sliding log semantics)
  const modRefund = !/ERR/.test(server.cli('RL.SLIDINGLOG', 'rl:{probe}:r', 1, 1000, 'REFUND', 1));
  const luaRefund = !/ERR/.test(server.cli('EVAL', SCRIPTS.slidinglog.text, 1, 'rl:{probe}:l', 1, 1000, 'REFUND', 1));
  const refund = modRefund || luaRefund;
  const backend = modRefund || !luaRefund ? 'module' : 'lua';
  const INST = 4;
  const KEYS = 25;
  say(`${INST} instances (leased limiters), ${KEYS} keys each, one decision per key, then idle; ` +
    `sliding log of 1,000,000 per hour per key, idleMs 200, on the ${backend === 'module' ? 'module' : 'Lua twins (this module build has no REFUND)'}. ` +
    '"Stranded": leased by an instance, not used.');
  say();
  say('| batch | used | stranded at idle | stranded after refunds | server units counted before / after |');
  say('|---:|---:|---:|---:|---|');
  for (const batch of [10, 50, 200]) {
    const rl = new RateLimit(redis, { timeoutMs: 1000, backend });
    const policy = slidingLog(`idle${batch}`, 1000000, 3600000);
    const lims = Array.from({ length: INST }, () => rl.leased(policy, { batch, idleMs: 200 }));
    const keys = Array.from({ length: KEYS }, (_, i) => `rl:{idle${batch}-${i}}:x`);
    for (const l of lims) for (const k of keys) await l.limit(k);
    const stranded = lims.reduce((s, l) => s + l.stranded(), 0);
    const probe = rl.limiter(policy);
    const counted = async () => {
      let n = 0;
      for (const k of keys) n += 1000000 - (await probe.limit(k, { cost: 0 })).remaining;
      return n;
    };
    const before = await counted();
    let after = '-';
    let strandedAfter = 'no REFUND in this module build';
    if (refund) {
      await waitUntil(() => lims.every((l) => l.stranded() === 0 && l.map.size === 0 && l.pending.size === 0), { what: 'idle refunds' });
      strandedAfter = String(lims.reduce((s, l) => s + l.stranded(), 0));
      after = String(await counted());
    }
    say(`| ${batch} | ${INST * KEYS} | ${stranded} | ${strandedAfter} | ${before} / ${after} |`);
    for (const l of lims) await l.close();
  }
  say();
} finally {
  redis.disconnect();
  await server.close();
}
if (OUT) writeFileSync(OUT, lines.join('\n') + '\n');
