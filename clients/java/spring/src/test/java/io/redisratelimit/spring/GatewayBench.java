package io.redisratelimit.spring;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import com.sun.net.httpserver.HttpServer;
import org.junit.jupiter.api.Test;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.ConfigurableApplicationContext;

/**
 * make bench-java: latency added by the gateway's limiter at a fixed offered
 * load, in one run: no limiter, Spring's RedisRateLimiter, the starter's
 * RlRateLimiter (same route arguments, every request granted). Each tick
 * sends one request to each of the three routes, so all three see the same
 * machine; latency is measured from the tick's scheduled time (no
 * coordinated omission). Redis time per decision from INFO commandstats.
 * Not a test of the suite (its name does not end in Test): run by name.
 */
class GatewayBench {
    static final String PREFIX = "spring.cloud.gateway.server.webflux.routes";

    @Test
    void bench() throws Exception {
        int rate = Integer.getInteger("rl.bench.rate", 200);
        int seconds = Integer.getInteger("rl.bench.seconds", 30);
        int warmup = Integer.getInteger("rl.bench.warmup", 5);
        try (Procs.Redis redis = new Procs.Redis()) {
            HttpServer upstream = Procs.upstream();
            Map<String, Object> p = new LinkedHashMap<>();
            String up = "http://127.0.0.1:" + upstream.getAddress().getPort();
            String[] ids = {"none", "spring", "rl"};
            for (int i = 0; i < ids.length; i++) {
                String r = PREFIX + "[" + i + "]";
                p.put(r + ".id", ids[i]);
                p.put(r + ".uri", up);
                p.put(r + ".predicates[0]", "Path=/" + ids[i] + "/**");
                if (i > 0) {
                    p.put(r + ".filters[0].name", "RequestRateLimiter");
                    p.put(r + ".filters[0].args[key-resolver]", "#{@hdrKey}");
                    p.put(r + ".filters[0].args[redis-rate-limiter.replenishRate]", "100000");
                    p.put(r + ".filters[0].args[redis-rate-limiter.burstCapacity]", "100000");
                    if (ids[i].equals("spring")) {
                        p.put(r + ".filters[0].args[rate-limiter]", "#{@redisRateLimiter}");
                    }
                }
            }
            p.put("server.port", "0");
            p.put("server.shutdown", "immediate");
            p.put("spring.data.redis.host", "127.0.0.1");
            p.put("spring.data.redis.port", Integer.toString(redis.port));
            p.put("ratelimit.redis-uri", redis.uri());
            p.put("ratelimit.timeout", "1s");
            p.put("logging.level.root", "WARN");
            try (ConfigurableApplicationContext ctx = new SpringApplicationBuilder(TestGateway.class).properties(p).run()) {
                String base = "http://127.0.0.1:" + ctx.getEnvironment().getProperty("local.server.port");
                HttpClient http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                    .executor(Executors.newFixedThreadPool(4)).build();
                run(http, base, ids, rate, warmup, null);
                redis.command("CONFIG", "RESETSTAT");
                Map<String, List<Long>> lat = new LinkedHashMap<>();
                for (String id : ids) {
                    lat.put(id, new ArrayList<>());
                }
                int errors = run(http, base, ids, rate, seconds, lat);
                String stats = redis.command("INFO", "commandstats");
                upstream.stop(0);
                StringBuilder out = new StringBuilder();
                out.append("gateway ").append(System.getProperty("rl.generation")).append(", ").append(rate)
                    .append(" requests/s to each route for ").append(seconds).append(" s (after ").append(warmup)
                    .append(" s of warm-up), ").append(errors).append(" errors\n\n");
                out.append("| limiter | p50 ms | p99 ms | added p50 ms | added p99 ms | Redis µs per decision |\n");
                out.append("|---|---:|---:|---:|---:|---|\n");
                double[] none = pct(lat.get("none"));
                for (String id : ids) {
                    double[] q = pct(lat.get(id));
                    String label = Map.of("none", "no limiter", "spring", "Spring's RedisRateLimiter (EVALSHA)",
                        "rl", "starter's RlRateLimiter (RL.TOKENBUCKET)").get(id);
                    String redisUs = id.equals("none") ? "–" : id.equals("spring")
                        ? usec(stats, "evalsha") : usec(stats, "rl.tokenbucket");
                    out.append(String.format("| %s | %.2f | %.2f | %s | %s | %s |%n", label, q[0], q[1],
                        id.equals("none") ? "–" : String.format("%+.2f", q[0] - none[0]),
                        id.equals("none") ? "–" : String.format("%+.2f", q[1] - none[1]), redisUs));
                }
                System.out.println(out);
                Path file = Path.of("target", "bench-java-" + System.getProperty("rl.generation") + ".md");
                Files.writeString(file, out.toString());
            }
        }
    }

    /** INFO commandstats' usec_per_call of one command, with its calls. */
    static String usec(String stats, String cmd) {
        for (String line : stats.split("\r?\n")) {
            if (line.toLowerCase().startsWith("cmdstat_" + cmd + ":")) {
                Map<String, String> f = new LinkedHashMap<>();
                for (String kv : line.substring(line.indexOf(':') + 1).split(",")) {
                    String[] a = kv.split("=", 2);
                    f.put(a[0], a[1]);
                }
                return f.get("usec_per_call") + " (" + f.get("calls") + " calls)";
            }
        }
        return "not called";
    }

    static double[] pct(List<Long> nanos) {
        long[] a = nanos.stream().mapToLong(Long::longValue).toArray();
        Arrays.sort(a);
        return new double[] {a[(int) (a.length * 0.50)] / 1e6, a[Math.min(a.length - 1, (int) (a.length * 0.99))] / 1e6};
    }

    /** Open loop: every 1/rate s, one request to each route; latency from the scheduled time. */
    static int run(HttpClient http, String base, String[] ids, int rate, int seconds,
                   Map<String, List<Long>> lat) throws Exception {
        ScheduledExecutorService tick = Executors.newSingleThreadScheduledExecutor();
        ConcurrentLinkedQueue<CompletableFuture<?>> pending = new ConcurrentLinkedQueue<>();
        AtomicInteger errors = new AtomicInteger();
        AtomicInteger n = new AtomicInteger();
        long periodNs = 1_000_000_000L / rate;
        long start = System.nanoTime();
        int total = rate * seconds;
        CompletableFuture<Void> done = new CompletableFuture<>();
        tick.scheduleAtFixedRate(() -> {
            int i = n.getAndIncrement();
            if (i >= total) {
                done.complete(null);
                return;
            }
            long scheduled = start + i * periodNs;
            for (String id : ids) {
                HttpRequest req = HttpRequest.newBuilder(URI.create(base + "/" + id + "/x"))
                    .header("X-Key", "tenant-" + (i % 1000)).timeout(Duration.ofSeconds(10)).build();
                pending.add(http.sendAsync(req, HttpResponse.BodyHandlers.discarding()).whenComplete((r, e) -> {
                    if (e != null || r.statusCode() != 200) {
                        errors.incrementAndGet();
                    } else if (lat != null) {
                        synchronized (lat) {
                            lat.get(id).add(System.nanoTime() - scheduled);
                        }
                    }
                }));
            }
        }, 0, periodNs, TimeUnit.NANOSECONDS);
        done.get();
        tick.shutdownNow();
        CompletableFuture.allOf(pending.toArray(new CompletableFuture[0])).exceptionally(e -> null).join();
        return errors.get();
    }
}
