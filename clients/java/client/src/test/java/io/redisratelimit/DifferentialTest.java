package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;
import redis.clients.jedis.UnifiedJedis;

/**
 * Cross-client agreement: one scripted sequence through this library and the Python one (a subprocess,
 * src/test/resources/worker.py, the repo's .venv) against one server, each on keys of its own, the two
 * calls of a step back to back: equal decisions (the times within what elapsed between them), equal
 * headers, and the Python library's headers and 429 body of each Java decision equal to ours. On every
 * server of the matrix, with the module and without it (the Lua twins), through Lettuce and Jedis.
 */
class DifferentialTest {
    static final long HOUR = 3_600_000;
    static final int STEPS = 200;
    static final String INSTANCE = "/v1/\"q\"\\\n\u0001é";

    static Map<String, Rule> rules() {
        Map<String, Rule> r = new LinkedHashMap<>();
        r.put("tb", Policy.tokenBucket("tb", 5, 1, HOUR));
        r.put("log", Policy.slidingLog("log", 4, HOUR));
        // windows aligned to the epoch are 2^40 ms long: no boundary between the two calls of a step
        r.put("ctr", Policy.slidingCounter("ctr", 6, 1L << 40));
        r.put("all", Policy.allOf("all", Policy.tokenBucket("a", 3, 1, HOUR),
                Policy.slidingLog("b", 10, HOUR).weighted(2)));
        r.put("fw", Policy.fixedWindow("fw", 4, HOUR, true));
        r.put("allfw", Policy.allOf("allfw", Policy.fixedWindow("f", 6, 1L << 40), Policy.tokenBucket("t", 4, 1, HOUR)));
        return r;
    }

    /** The Python worker. */
    static final class Worker implements AutoCloseable {
        final Process p;
        final Writer in;
        final BufferedReader out;

        Worker(String url) throws IOException {
            String py = System.getenv().getOrDefault("RL_PYTHON",
                    Path.of("../../../.venv/bin/python").toAbsolutePath().normalize().toString());
            String script = Path.of("src/test/resources/worker.py").toAbsolutePath().toString();
            p = new ProcessBuilder(py, script, url).redirectError(ProcessBuilder.Redirect.INHERIT).start();
            in = new java.io.OutputStreamWriter(p.getOutputStream(), StandardCharsets.UTF_8);
            out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
        }

        String[] ask(String json) throws IOException {
            in.write(json + "\n");
            in.flush();
            String line = out.readLine();
            if (line == null) {
                throw new IOException("the Python worker exited");
            }
            return line.split("\t", -1);
        }

        @Override
        public void close() {
            p.destroyForcibly();
        }
    }

    /** Our decision as the worker prints one: fields, then the headers. */
    static String[] fields(Decision d, String extra) {
        List<String> parts = new ArrayList<>();
        for (Decision.Part p : d.parts()) {
            parts.add(p.policy() + "," + p.granted() + "," + p.limit() + "," + p.remaining() + "," + p.retryAfterMs()
                    + "," + p.resetAfterMs());
        }
        List<String> h = new ArrayList<>();
        Headers.of(d).forEach((k, v) -> h.add(k + ": " + v));
        List<String> f = new ArrayList<>(List.of(d.allowed() ? "1" : "0", "" + d.granted(), "" + d.limit(),
                "" + d.remaining(), "" + d.retryAfterMs(), "" + d.resetAfterMs(), d.policy(), d.binding(),
                d.source().toString(), String.join(";", parts), String.join("\u001f", h)));
        if (extra != null) {
            f.add(extra);
        }
        return f.toArray(new String[0]);
    }

    static String json(Decision d) {
        StringBuilder parts = new StringBuilder("[");
        for (int i = 0; i < d.parts().size(); i++) {
            Decision.Part p = d.parts().get(i);
            parts.append(i > 0 ? "," : "").append("[").append(Headers.json(p.policy())).append(",").append(p.granted())
                    .append(",").append(p.limit()).append(",").append(p.remaining()).append(",").append(p.retryAfterMs())
                    .append(",").append(p.resetAfterMs()).append("]");
        }
        parts.append("]");
        return "{\"allowed\":" + d.allowed() + ",\"granted\":" + d.granted() + ",\"limit\":" + d.limit()
                + ",\"remaining\":" + d.remaining() + ",\"retry_after_ms\":" + d.retryAfterMs() + ",\"reset_after_ms\":"
                + d.resetAfterMs() + ",\"policy\":" + Headers.json(d.policy()) + ",\"binding\":"
                + Headers.json(d.binding()) + ",\"source\":\"" + d.source() + "\",\"parts\":" + parts + "}";
    }

    /** Everything but the times (which moved between the two calls): the units and names. */
    static String units(String[] f) {
        StringBuilder b = new StringBuilder();
        b.append(f[0]).append(' ').append(f[1]).append(' ').append(f[2]).append(' ').append(f[3]).append(' ')
                .append(f[6]).append(' ').append(f[7]).append(' ').append(f[8]);
        if (!f[9].isEmpty()) {
            for (String p : f[9].split(";")) {
                String[] x = p.split(",");
                b.append(" [").append(x[0]).append(' ').append(x[1]).append(' ').append(x[2]).append(' ').append(x[3])
                        .append(']');
            }
        }
        return b.toString();
    }

    static List<long[]> times(String[] f) {
        List<long[]> t = new ArrayList<>();
        t.add(new long[] {Long.parseLong(f[4]), Long.parseLong(f[5])});
        if (!f[9].isEmpty()) {
            for (String p : f[9].split(";")) {
                String[] x = p.split(",");
                t.add(new long[] {Long.parseLong(x[4]), Long.parseLong(x[5])});
            }
        }
        return t;
    }

    @TestFactory
    Stream<DynamicTest> javaAndPythonAgree() {
        List<DynamicTest> tests = new ArrayList<>();
        for (Map.Entry<String, String> s : TestServer.servers().entrySet()) {
            for (boolean module : new boolean[] {true, false}) {
                for (String driver : new String[] {"lettuce", "jedis"}) {
                    String name = s.getKey() + (module ? " module " : " lua ") + driver;
                    tests.add(DynamicTest.dynamicTest(name, () -> run(TestServer.shared(s.getKey(), s.getValue(),
                            module), driver)));
                }
            }
        }
        return tests.stream();
    }

    void run(TestServer s, String driver) throws Exception {
        Clients.Lettuce lc = null;
        UnifiedJedis jc = null;
        RateLimit rl;
        if (driver.equals("lettuce")) {
            lc = Clients.lettuce(s);
            rl = RateLimit.lettuce(lc.conn, RateLimit.options().timeoutMs(2000));
        } else {
            jc = Clients.boundedJedis(s, 2000);
            rl = RateLimit.jedis(jc, RateLimit.options().timeoutMs(2000));
        }
        String tag = driver.substring(0, 1) + System.nanoTime();
        try (Worker py = new Worker(s.url())) {
            Map<String, Rule> rules = rules();
            List<String> names = new ArrayList<>(rules.keySet());
            Map<String, Limiter> lims = new LinkedHashMap<>();
            rules.forEach((n, r) -> lims.put(n, rl.limiter(r)));
            long[] x = {0x9e3779b97f4a7c15L};
            java.util.function.LongUnaryOperator next = m -> {
                x[0] ^= x[0] << 13;
                x[0] ^= x[0] >>> 7;
                x[0] ^= x[0] << 17;
                return Long.remainderUnsigned(x[0], m);
            };
            int denied = 0;
            int partial = 0;
            int retries = 0;
            int refunds = 0;
            long worst = 0;
            for (int step = 0; step < STEPS; step++) {
                String name = names.get((int) next.applyAsLong(names.size()));
                Rule rule = rules.get(name);
                long t = next.applyAsLong(3);
                boolean refund = next.applyAsLong(6) == 0;
                long cost = next.applyAsLong(4);
                boolean part = next.applyAsLong(3) == 0;
                boolean dry = next.applyAsLong(8) == 0;
                long n = 1 + next.applyAsLong(2);
                java.util.function.Function<String, String> key = lib -> {
                    String base = "rl:{" + lib + tag + "-" + t + "}";
                    return name.startsWith("all") ? base : base + ":" + name;
                };
                java.util.function.Function<String, String> q = lib -> refund
                        ? "{\"op\":\"refund\",\"rule\":\"" + name + "\",\"key\":\"" + key.apply(lib) + "\",\"n\":" + n + "}"
                        : "{\"op\":\"limit\",\"rule\":\"" + name + "\",\"key\":\"" + key.apply(lib) + "\",\"cost\":" + cost
                                + ",\"partial\":" + (part ? "true" : "false") + ",\"dry_run\":" + (dry ? "true" : "false") + "}";
                long t0 = System.nanoTime();
                Decision d = refund ? lims.get(name).refund(key.apply("j"), n)
                        : lims.get(name).limit(key.apply("j"), cost, part, dry);
                String[] theirs = py.ask(q.apply("p"));
                worst = Math.max(worst, (System.nanoTime() - t0) / 1_000_000L);
                long tol = 2 * worst + 2;
                String[] mine = fields(d, null);
                String ctx = "step " + step + " " + name + " " + q.apply("j") + ": java " + d + " vs python "
                        + String.join(" | ", theirs);
                assertEquals(units(theirs), units(mine), ctx);
                List<long[]> tm = times(mine);
                List<long[]> tt = times(theirs);
                for (int i = 0; i < tm.size(); i++) {
                    assertTrue(Math.abs(tm.get(i)[0] - tt.get(i)[0]) <= tol
                            && Math.abs(tm.get(i)[1] - tt.get(i)[1]) <= tol, ctx + " (tolerance " + tol + " ms)");
                }
                // the Python library's headers and 429 body of our decision are ours
                String[] h = py.ask("{\"op\":\"headers\",\"rule\":\"" + name + "\",\"instance\":"
                        + Headers.json(INSTANCE) + ",\"decision\":" + json(d) + "}");
                assertEquals(mine[10], h[10], "step " + step + ": Python's headers of the Java decision " + d);
                if (!d.allowed()) {
                    assertEquals(h[11], Headers.problemJson(d, INSTANCE), "step " + step + ": 429 body of " + d);
                }
                denied += d.allowed() ? 0 : 1;
                partial += part && !refund && d.granted() > 0 && d.granted() < cost ? 1 : 0;
                retries += Headers.of(d).containsKey("Retry-After") ? 1 : 0;
                refunds += refund && d.granted() > 0 ? 1 : 0;
            }
            System.out.printf("%s %s: %d steps, %d denied, %d partial, %d with Retry-After, %d refunds (worst step %d ms)%n",
                    s.name + (s.module ? "+module" : "+lua"), driver, STEPS, denied, partial, retries, refunds, worst);
            assertTrue(denied > 10 && partial > 3 && retries > 10 && refunds > 5, "the sequence reached every kind of answer");
            assertEquals(s.module ? RateLimit.Backend.MODULE : RateLimit.Backend.LUA, rl.backend());
            Map<String, Object> m = rl.metrics();
            assertEquals((long) STEPS, (Long) m.get(s.module ? "decisionsModule" : "decisionsLua") + (Long) m.get("refunds"));
        } finally {
            if (lc != null) {
                lc.close();
            }
            if (jc != null) {
                jc.close();
            }
        }
    }
}
