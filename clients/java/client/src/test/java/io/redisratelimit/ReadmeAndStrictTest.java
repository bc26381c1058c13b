package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The README's Java lines, and strict mode (WAIT after each grant) on a primary with and without a replica. */
class ReadmeAndStrictTest {
    @Test
    void readmeJavaLines() {
        Map.Entry<String, String> f = TestServer.first();
        try (TestServer s = new TestServer(f.getKey(), f.getValue(), true, 0)) {
            RedisClient client = RedisClient.create(Clients.RESOURCES, s.url());
            // the README's lines, its URL and print aside
            var conn = client.connect();
            RateLimit rl = RateLimit.lettuce(conn, RateLimit.options().timeoutMs(50));
            Limiter api = rl.limiter(Policy.tokenBucket("api", 20, 10, 1000));
            Decision d = api.limit(Keys.make("alice", "api"));
            assertEquals(Map.of("RateLimit-Policy", "\"api\";q=20;w=2", "RateLimit", "\"api\";r=19;t=1",
                    "X-RateLimit-Limit", "20", "X-RateLimit-Remaining", "19", "X-RateLimit-Reset", "1"), Headers.of(d));
            assertTrue(d.allowed());
            conn.close();
            client.shutdown();
        }
    }

    @Test
    void strictModeCountsAGrantOnlyOnceAReplicaHasIt() {
        Map.Entry<String, String> f = TestServer.first();
        try (TestServer primary = new TestServer(f.getKey(), f.getValue(), true, 0)) {
            Policy p = Policy.slidingLog("api", 100, 3_600_000);
            try (Clients.Lettuce c = Clients.lettuce(primary)) {
                assertThrows(IllegalArgumentException.class,
                        () -> RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(5).strict(1, 5)),
                        "WAIT's timeout must be shorter than the call's");
                // no replica: WAIT 1 answers 0, so a grant is a failure and the panic limits decide
                RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(500).strict(1, 50)
                        .breaker(new Breaker(1000, 10_000, 1000, 64, 1000)));
                Limiter lim = rl.limiter(p);
                Decision d = lim.limit("k");
                assertEquals(Source.PANIC, d.source(), d.toString());
                assertEquals(1L, rl.metrics().get("unreplicated"));
                // a replica: the grant counts
                try (TestServer replica = new TestServer(f.getKey(), f.getValue(), true, 0)) {
                    replica.cmd("REPLICAOF", "127.0.0.1", Integer.toString(primary.port));
                    Poll.until(20, "the replica in sync", () -> primary.cmd("WAIT", "1", "10").equals(":1"));
                    Decision ok = lim.limit("k2");
                    assertEquals(Source.MODULE, ok.source(), ok.toString() + " " + rl.metrics());
                    assertTrue(ok.allowed());
                    // a denial needs no acknowledgement, and a dry run sends no WAIT
                    assertEquals(List.of(Source.MODULE, Source.MODULE), List.of(lim.limit("k2", 1000).source(),
                            lim.limit("k2", 1, false, true).source()));
                    assertEquals(1L, rl.metrics().get("unreplicated"));
                }
            }
        }
    }
}
