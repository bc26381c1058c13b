package io.redisratelimit.spring;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.time.Duration;
import java.util.Map;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.boot.context.properties.source.MapConfigurationPropertySource;

/** The starter's calls on a real Redis with the module: the ratelimit.breaker.* settings reach the library. */
class RlCommandsTest {
    static Procs.Redis redis;

    @BeforeAll
    static void start() throws Exception {
        redis = new Procs.Redis();
    }

    @AfterAll
    static void stop() throws Exception {
        if (redis != null) {
            redis.close();
        }
    }

    static RlProperties bind(Map<String, String> p) {
        return new Binder(new MapConfigurationPropertySource(p)).bindOrCreate("ratelimit", RlProperties.class);
    }

    /** Up to 20 calls; the first refused (the breaker open: a panic decision), or null. */
    static Throwable call20(RlCommands c) {
        String key = "breaker-" + System.nanoTime();
        for (int i = 0; i < 20; i++) {
            try {
                c.tokenBucket(key, 1000, 1, 1000, 1, Duration.ofSeconds(5)).block();
            } catch (RuntimeException e) {
                return e;
            }
        }
        return null;
    }

    @Test
    void defaultsAreTheLibrarys() {
        RlProperties.Breaker b = bind(Map.of()).getBreaker();
        assertEquals(5, b.getFailures());
        assertEquals(Duration.ofMillis(50), b.getLatencyBudget());
        assertEquals(Duration.ofMillis(1000), b.getLatencyPeriod());
        assertEquals(64, b.getLatencyWindow());
        assertEquals(Duration.ofMillis(1000), b.getOpen());
    }

    /**
     * A latency budget of 0 ms over a period of 0 ms: every call is over budget, so the
     * breaker opens once it has its 5 samples and later calls are refused; with a budget
     * of an hour the same 20 calls are all answered. Before ratelimit.breaker.* the budget
     * was the library's 50 ms whatever ratelimit.timeout said (GatewayTest's 5,000
     * parallel requests, with a 5 s timeout, tripped it on a loaded machine).
     */
    @Test
    void breakerSettingsReachTheLibrary() throws Exception {
        RlProperties tight = bind(Map.of("ratelimit.breaker.latency-budget", "0ms",
            "ratelimit.breaker.latency-period", "0ms", "ratelimit.breaker.open", "1h"));
        try (RlCommands c = new RlCommands(redis.uri(), tight.getBreaker()::newBreaker)) {
            Throwable refused = call20(c);
            assertNotNull(refused, "a 0 ms latency budget opens the breaker");
            assertEquals(1L, c.libraryMetrics().get(5000L).get("tripsLatency"), c.libraryMetrics().toString());
        }
        RlProperties loose = bind(Map.of("ratelimit.breaker.latency-budget", "1h"));
        try (RlCommands c = new RlCommands(redis.uri(), loose.getBreaker()::newBreaker)) {
            assertNull(call20(c), "a budget of an hour: every call answered");
            assertEquals(0L, c.libraryMetrics().get(5000L).get("tripsLatency"), c.libraryMetrics().toString());
            Map<String, Object> m = c.libraryMetrics().get(5000L);
            assertEquals(0L, m.get("decisionsPanic"), m.toString());
            // the module's, or the Lua twins' on a server without it (rl.module=none)
            assertEquals(20L, (Long) m.get("decisionsModule") + (Long) m.get("decisionsLua"), m.toString());
        }
    }
}
