package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Two-tier leased limiters and the breaker with its panic limits (clients/DESIGN.md), through Lettuce. */
class LeasedTest {
    TestServer s;
    Clients.Lettuce c;

    @BeforeEach
    void start() {
        Map.Entry<String, String> f = TestServer.first();
        s = new TestServer(f.getKey(), f.getValue(), true, 0);
        c = Clients.lettuce(s);
    }

    @AfterEach
    void stop() {
        c.close();
        s.close();
    }

    RateLimit rl(long timeoutMs, Breaker b) {
        return RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(timeoutMs).breaker(b));
    }

    /**
     * The DESIGN's case: 4 concurrent callers on a new key with batch 2: 2 granted, 2 denied (retry 1 ms),
     * 1 lease. The server is SIGSTOPped while the 4 calls are made, so all 4 find the first one's lease in
     * flight (threads alone race it: a lease that lands before the last caller arrives lets that one lease
     * again), then SIGCONT lands it within the timeout.
     */
    @Test
    void fourConcurrentCallersOnANewKeyWithBatchTwo() throws Exception {
        RateLimit rl = rl(5000, new Breaker());
        try (LeasedLimiter lim = rl.leased(Policy.tokenBucket("api", 100, 1, 3_600_000), RateLimit.lease().batch(2))) {
            rl.detect();
            s.signal("STOP");
            List<CompletableFuture<Decision>> fs = new ArrayList<>();
            for (int i = 0; i < 4; i++) {
                fs.add(lim.limitAsync("k"));
            }
            s.signal("CONT");
            int granted = 0;
            for (CompletableFuture<Decision> f : fs) {
                Decision d = f.get();
                if (d.allowed()) {
                    granted++;
                } else {
                    assertEquals(1, d.retryAfterMs(), d.toString());
                }
            }
            assertEquals(2, granted);
            assertEquals(1L, rl.metrics().get("leases"));
            assertEquals(3L, rl.metrics().get("leaseWaits"));
        }
    }

    @Test
    void localDecisionsAndRefillsNeverExceedTheSharedLimitAndCloseGivesBack() {
        RateLimit rl = rl(2000, new Breaker());
        Policy p = Policy.slidingLog("api", 30, 3_600_000);
        LeasedLimiter a = rl.leased(p, RateLimit.lease().batch(10));
        LeasedLimiter b = rl.leased(p, RateLimit.lease().batch(10));
        int granted = 0;
        for (int i = 0; i < 100; i++) {
            Decision d = (i % 2 == 0 ? a : b).limit("k");
            granted += d.allowed() ? 1 : 0;
        }
        assertTrue(granted <= 30, "granted " + granted);
        Map<String, Object> m = rl.metrics();
        assertTrue((Long) m.get("decisionsLocal") > 0, m.toString());
        long stranded = a.stranded() + b.stranded();
        a.close();
        b.close();
        assertEquals(0, a.stranded() + b.stranded());
        // what the reservoirs held went back: a plain limiter sees it
        Decision d = rl.limiter(p).limit("k", 1, false, true);
        assertEquals(30 - granted, d.remaining(), "stranded " + stranded + ", " + rl.metrics());
    }

    /** Breaker: 3 failures open it, panic limits decide (limit // instances), the probe closes it again. */
    @Test
    void breakerAndPanicCounts() {
        RateLimit rl = rl(30, new Breaker(3, 10_000, 1000, 64, 300));
        Limiter lim = rl.limiter(Policy.tokenBucket("p", 10, 10, 60_000), Panic.instances(2));
        rl.detect();
        s.signal("STOP");
        long granted = 0;
        for (int i = 0; i < 20; i++) {
            Decision d = lim.limit("k");
            assertEquals(Source.PANIC, d.source());
            assertEquals(5, d.limit(), "the panic limit: 10 // 2 instances");
            granted += d.granted();
        }
        assertEquals(5, granted, "never more than the panic limit");
        Map<String, Object> m = rl.metrics();
        assertEquals(List.of(3L, 3L, 1L, 20L, 15L, "open"), List.of(m.get("calls"), m.get("failures"), m.get("trips"),
                m.get("decisionsPanic"), m.get("denied"), m.get("state")), m.toString());
        s.signal("CONT");
        Poll.until(10, "the probe to close the breaker", () -> {
            lim.limit("k");
            return "closed".equals(rl.metrics().get("state"));
        });
        assertEquals(Source.MODULE, lim.limit("k").source());
        assertTrue((Long) rl.metrics().get("probesOk") >= 1);
    }
}
