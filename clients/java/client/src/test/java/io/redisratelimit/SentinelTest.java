package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.codec.StringCodec;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * Strict mode through Sentinel, on real processes: a primary and two replicas with the module, three
 * sentinels of the same build, and a Lettuce connection that finds the primary through the sentinels.
 * Every grant is acknowledged by a replica (WAIT 1) before it counts; the primary is SIGKILLed, the
 * sentinels promote a replica, the connection follows, and the promoted primary still holds every
 * grant made before the kill (strict mode's promise: a grant survives a failover).
 */
class SentinelTest {
    private static final String MASTER = "rlmaster";

    /** A sentinel process of the server build, on a free port, watching {@code primaryPort}. */
    private static final class Sentinel implements AutoCloseable {
        final int port = TestServer.freePort();
        final Process proc;

        Sentinel(String binary, int primaryPort) throws IOException {
            Path dir = Files.createTempDirectory("rl-java-sentinel-");
            Path conf = dir.resolve("sentinel.conf");
            Files.writeString(conf, String.join("\n",
                    "port " + port, "bind 127.0.0.1", "protected-mode no", "dir " + dir,
                    "sentinel monitor " + MASTER + " 127.0.0.1 " + primaryPort + " 2",
                    "sentinel down-after-milliseconds " + MASTER + " 1000",
                    "sentinel failover-timeout " + MASTER + " 5000",
                    "sentinel parallel-syncs " + MASTER + " 1", ""));
            proc = new ProcessBuilder(binary, conf.toString(), "--sentinel").directory(dir.toFile())
                    .redirectErrorStream(true).redirectOutput(dir.resolve("sentinel.log").toFile()).start();
        }

        @Override
        public void close() {
            proc.destroyForcibly();
        }
    }

    @Test
    void strictGrantsSurviveAFailoverThroughSentinel() throws Exception {
        Map.Entry<String, String> f = TestServer.first();
        List<AutoCloseable> open = new ArrayList<>();
        TestServer primary = new TestServer(f.getKey(), f.getValue(), true, 0);
        open.add(primary);
        try {
            List<TestServer> replicas = new ArrayList<>();
            for (int i = 0; i < 2; i++) {
                TestServer r = new TestServer(f.getKey(), f.getValue(), true, 0);
                open.add(r);
                r.cmd("REPLICAOF", "127.0.0.1", Integer.toString(primary.port));
                replicas.add(r);
            }
            Poll.until(30, "both replicas in sync", () -> primary.cmd("WAIT", "2", "10").equals(":2"));
            List<Sentinel> sentinels = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                Sentinel s = new Sentinel(f.getValue(), primary.port);
                open.add(s);
                sentinels.add(s);
            }
            RedisURI.Builder b = RedisURI.Builder.sentinel("127.0.0.1", sentinels.get(0).port, MASTER);
            for (Sentinel s : sentinels.subList(1, 3)) {
                b.withSentinel("127.0.0.1", s.port);
            }
            RedisClient client = RedisClient.create(Clients.RESOURCES, b.withTimeout(Duration.ofSeconds(2)).build());
            var conn = client.connect(StringCodec.UTF8, b.build());
            try {
                RateLimit rl = RateLimit.lettuce(conn, RateLimit.options().timeoutMs(500).strict(1, 200)
                        .breaker(new Breaker(1000, 10_000, 1000, 64, 100)));
                Limiter lim = rl.limiter(Policy.slidingLog("api", 100, 3_600_000));
                for (int i = 0; i < 5; i++) {
                    Decision d = lim.limit("k");
                    assertEquals(Source.MODULE, d.source(), d + " " + rl.metrics());
                    assertEquals(100 - 1 - i, d.remaining(), d.toString());
                }
                assertEquals(0L, rl.metrics().get("unreplicated"));

                primary.signal("KILL");
                // the sentinels promote a replica and the connection follows them: a dry run
                // (no WAIT) reads the promoted primary's state, which holds the five grants
                Decision[] seen = new Decision[1];
                Poll.until(60, "a dry run answered by the promoted primary", () -> {
                    seen[0] = lim.limit("k", 1, false, true);
                    return seen[0].source() == Source.MODULE;
                });
                // (a dry run's remaining is after its would-be unit: 100 - 5 - 1)
                assertEquals(100 - 5 - 1, seen[0].remaining(), "no grant lost in the failover: " + seen[0]);
                // a grant counts once the other replica, pointed at the new primary by the
                // sentinels, acknowledges it (until then strict mode answers from the panic limits)
                Poll.until(60, "a grant acknowledged by the new primary's replica", () -> {
                    seen[0] = lim.limit("k");
                    return seen[0].source() == Source.MODULE;
                });
                assertTrue(seen[0].allowed(), seen[0].toString());
                assertTrue(seen[0].remaining() <= 100 - 6, seen[0].toString());
            } finally {
                conn.close();
                client.shutdown();
            }
        } finally {
            for (int i = open.size() - 1; i >= 0; i--) {
                try {
                    open.get(i).close();
                } catch (Exception e) {
                    // already stopped (the killed primary)
                }
            }
        }
    }
}
