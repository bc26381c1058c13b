package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.TimeoutOptions;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * "A decision within its timeout, whatever the driver does" on Lettuce, against a real server SIGSTOPped
 * and killed (the first server of the matrix, with the module): Lettuce's own command timeout (60 s by
 * default), its reconnect, and its request queue while disconnected (disconnectedBehavior,
 * requestQueueSize). The bound asserted: under two timeouts.
 */
class LettuceOutageTest {
    static final long TIMEOUT = 100;
    // the bound asserted: under two timeouts. A second wait (a retry, a reconnect, a queued replay)
    // takes at least one more timeout, which load only lengthens, so a wrong client cannot pass;
    // scheduling on a loaded machine fits in the other (54 ms over a 30 ms timeout was seen here)
    static final long BOUND = 2 * TIMEOUT;

    TestServer s;
    Clients.Lettuce c;

    @BeforeEach
    void start() {
        Map.Entry<String, String> f = TestServer.first();
        s = new TestServer(f.getKey(), f.getValue(), true, 0);
    }

    @AfterEach
    void stop() {
        if (c != null) {
            c.close();
        }
        s.close();
    }

    static Breaker breaker(int failures, long openMs) {
        return new Breaker(failures, 10_000, 1000, 64, openMs);
    }

    static long timed(Limiter lim, String key, Decision[] out) {
        long t0 = System.nanoTime();
        out[0] = lim.limit(key);
        return Poll.ms(t0);
    }

    /** JIT and connection warm: the bound is about Redis, not the first class loads. */
    static void warm(Limiter lim) {
        for (int i = 0; i < 200; i++) {
            assertEquals(Source.MODULE, lim.limit("warm").source());
        }
    }

    @Test
    void sigstopWithLettuceDefaultsEveryDecisionUnderTwoTimeouts() {
        // Lettuce's defaults: a 60 s command timeout, auto-reconnect, an unbounded request queue
        c = Clients.lettuce(s);
        RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(TIMEOUT).breaker(breaker(1000, 1000)));
        Limiter lim = rl.limiter(Policy.tokenBucket("api", 100, 100, 1000));
        warm(lim);
        s.signal("STOP");
        long slowest = 0;
        Decision[] d = new Decision[1];
        for (int i = 0; i < 10; i++) {
            long ms = timed(lim, "k", d);
            assertEquals(Source.PANIC, d[0].source());
            assertTrue(d[0].allowed());
            slowest = Math.max(slowest, ms);
        }
        s.signal("CONT");
        System.out.println("Lettuce defaults, SIGSTOP: slowest decision " + slowest + " ms (timeout " + TIMEOUT + " ms)");
        assertTrue(slowest < BOUND, "slowest decision " + slowest + " ms");
        assertTrue(slowest >= TIMEOUT - 1, "the calls did wait for Redis: " + slowest + " ms");
        Map<String, Object> m = rl.metrics();
        assertEquals(10L, m.get("failures"));
        assertEquals(10L, m.get("decisionsPanic"));
        Poll.until(10, "a module decision again", () -> lim.limit("k").source() == Source.MODULE);
    }

    /**
     * Killed, then restarted on the same port. Lettuce's default disconnectedBehavior queues commands while
     * it reconnects (with backoff), and replays after a reconnect the ones in flight: no decision waits for
     * that (each at most the timeout, then the breaker opens), and the calls the library gave up on are
     * cancelled, so Lettuce never sends them later: the first decision after the restart finds the limit
     * untouched.
     */
    @Test
    void killAndRestartNoDecisionWaitsForTheReconnectAndNothingIsReplayed() {
        c = Clients.lettuce(s);
        RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(TIMEOUT).breaker(breaker(3, 200)));
        Limiter lim = rl.limiter(Policy.slidingLog("api", 1000, 600_000));
        warm(lim);
        s.stop();
        long slowest = 0;
        Decision[] d = new Decision[1];
        for (int i = 0; i < 10; i++) {
            long ms = timed(lim, "k", d);
            assertEquals(Source.PANIC, d[0].source());
            slowest = Math.max(slowest, ms);
        }
        Map<String, Object> m = rl.metrics();
        assertEquals(1L, m.get("trips"), m.toString());
        assertEquals(3L, m.get("failures"), m.toString());
        long callsBefore = (Long) rl.metrics().get("calls");
        s.start();
        long t0 = System.nanoTime();
        Decision back = null;
        while (Poll.ms(t0) < 20_000) {
            long ms = timed(lim, "k", d);
            slowest = Math.max(slowest, ms);
            if (d[0].source() == Source.MODULE) {
                back = d[0];
                break;
            }
        }
        assertTrue(back != null, "no module decision 20 s after the restart: " + rl.metrics());
        System.out.println("killed: back after " + Poll.ms(t0) + " ms; slowest decision " + slowest + " ms");
        assertTrue(slowest < BOUND, "slowest decision " + slowest + " ms");
        // every call made since the restart may have reached the new server (one that timed out during
        // the reconnect still ran there: 998 in 2 of 5 runs); the ones given up on while it was down
        // must not: without the cancel they were (996 after 1 call)
        long since = (Long) rl.metrics().get("calls") - callsBefore;
        assertTrue(back.remaining() >= 1000 - since, "a call given up on was sent after the reconnect: " + back
                + ", " + since + " calls since the restart");
        assertEquals("closed", rl.metrics().get("state"));
    }

    /** disconnectedBehavior REJECT_COMMANDS: while disconnected a call fails at once, not after the timeout. */
    @Test
    void rejectCommandsWhileDisconnectedFailsAtOnce() {
        c = new Clients.Lettuce(s, b -> b.disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS));
        RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(1000).breaker(breaker(1000, 1000)));
        Limiter lim = rl.limiter(Policy.slidingLog("api", 1000, 600_000));
        warm(lim);
        s.stop();
        Poll.until(10, "Lettuce to see the connection closed", () -> !c.conn.isOpen());
        Decision[] d = new Decision[1];
        long slowest = 0;
        for (int i = 0; i < 10; i++) {
            slowest = Math.max(slowest, timed(lim, "k", d));
            assertEquals(Source.PANIC, d[0].source());
        }
        // a 1 s timeout, and no decision waited for it
        assertTrue(slowest < 500, "slowest " + slowest + " ms");
        assertEquals(10L, rl.metrics().get("failures"));
    }

    /**
     * A bounded request queue (requestQueueSize 2) on a SIGSTOPped server: the calls past it fail at once
     * (Lettuce: "Request queue size exceeded"), the others at the timeout; none waits longer, none raises.
     */
    @Test
    void fullRequestQueueOnSigstopDecidesWithinTheBound() {
        c = new Clients.Lettuce(s, b -> b.requestQueueSize(2));
        RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(TIMEOUT).breaker(breaker(1000, 1000)));
        Limiter lim = rl.limiter(Policy.tokenBucket("api", 100, 100, 1000));
        warm(lim);
        s.signal("STOP");
        long t0 = System.nanoTime();
        List<CompletableFuture<Decision>> fs = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            fs.add(lim.limitAsync("k" + i));
        }
        CompletableFuture.allOf(fs.toArray(new CompletableFuture[0])).join();
        long ms = Poll.ms(t0);
        s.signal("CONT");
        for (CompletableFuture<Decision> f : fs) {
            assertEquals(Source.PANIC, f.join().source());
        }
        assertTrue(ms < BOUND, "20 decisions took " + ms + " ms");
        assertEquals(20L, rl.metrics().get("failures"));
    }

    /** Lettuce's own command timeout (TimeoutOptions) shorter or longer than ours: ours bounds the decision. */
    @Test
    void lettuceCommandTimeoutLongerThanOursDoesNotDelayADecision() {
        c = new Clients.Lettuce(s, b -> b.timeoutOptions(TimeoutOptions.enabled(Duration.ofSeconds(10))));
        RateLimit rl = RateLimit.lettuce(c.conn, RateLimit.options().timeoutMs(TIMEOUT).breaker(breaker(1000, 1000)));
        Limiter lim = rl.limiter(Policy.tokenBucket("api", 100, 100, 1000));
        warm(lim);
        s.signal("STOP");
        Decision[] d = new Decision[1];
        long slowest = 0;
        for (int i = 0; i < 5; i++) {
            slowest = Math.max(slowest, timed(lim, "k", d));
            assertEquals(Source.PANIC, d[0].source());
        }
        s.signal("CONT");
        assertTrue(slowest < BOUND, "slowest " + slowest + " ms");
    }

    /** A connection that would never reconnect is refused, naming the setting. */
    @Test
    void refusesAConnectionWithoutAutoReconnect() {
        c = new Clients.Lettuce(s, b -> b.autoReconnect(false));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> RateLimit.lettuce(c.conn, RateLimit.options()));
        assertTrue(e.getMessage().contains("autoReconnect"), e.getMessage());
    }
}
