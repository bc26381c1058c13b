package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicContainer;
import org.junit.jupiter.api.DynamicNode;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;
import org.junit.jupiter.api.function.Executable;
import redis.clients.jedis.UnifiedJedis;

/**
 * The in-flight guard (RL.CONCURRENCY, twin concurrency.lua) and reserve/settle (COST n FORCE, REFUND):
 * clients/DESIGN.md, "In-flight limits: the guard" and "Reservations". Real servers started here: every
 * server of the matrix, with the module and without it (the Lua twins), through Lettuce and Jedis; the
 * breaker case on the first, on a server of its own, SIGSTOPped.
 */
class InFlightTest {
    /** The timeout of the SIGSTOP tests: a decision under two of them (LettuceOutageTest says why). */
    static final long TIMEOUT = 100;

    /** A RateLimit on one driver; closes the driver's client. */
    static final class Env implements AutoCloseable {
        final TestServer s;
        final RateLimit rl;
        private final Clients.Lettuce lc;
        private final UnifiedJedis jc;

        Env(TestServer s, String driver, long timeoutMs, Breaker breaker) {
            this.s = s;
            RateLimit.Options o = RateLimit.options().timeoutMs(timeoutMs);
            if (breaker != null) {
                o.breaker(breaker);
            }
            if (driver.equals("lettuce")) {
                lc = Clients.lettuce(s);
                jc = null;
                rl = RateLimit.lettuce(lc.conn, o);
            } else {
                lc = null;
                jc = Clients.boundedJedis(s, (int) timeoutMs);
                rl = RateLimit.jedis(jc, o);
            }
        }

        Source source() {
            return s.module ? Source.MODULE : Source.LUA;
        }

        long calls() {
            return (Long) rl.metrics().get("calls");
        }

        @Override
        public void close() {
            if (lc != null) {
                lc.close();
            }
            if (jc != null) {
                jc.close();
            }
        }
    }

    interface Scenario {
        void run(Env e, String key) throws Exception;
    }

    static String key(String what) {
        return "rl:{if-" + what + "-" + System.nanoTime() + "}";
    }

    @TestFactory
    Stream<DynamicNode> onEveryBackendAndDriver() {
        List<DynamicNode> out = new ArrayList<>();
        for (Map.Entry<String, String> f : TestServer.servers().entrySet()) {
            onOneServer(f, f.getKey().equals(TestServer.first().getKey()), out);
        }
        return out.stream();
    }

    /** Every scenario; the SIGSTOP one (a server of its own) on the first server only. */
    static void onOneServer(Map.Entry<String, String> f, boolean first, List<DynamicNode> out) {
        for (boolean module : new boolean[] {true, false}) {
            for (String driver : new String[] {"lettuce", "jedis"}) {
                String name = f.getKey() + (module ? " module " : " lua ") + driver;
                List<DynamicNode> tests = new ArrayList<>();
                Map<String, Scenario> scenarios = new java.util.LinkedHashMap<>();
                scenarios.put("limit honoured across holds", InFlightTest::limitAcrossHolds);
                scenarios.put("release on close and on exception", InFlightTest::releaseOnEveryExit);
                scenarios.put("renewal keeps a hold past its lease", InFlightTest::renewalKeepsTheHold);
                scenarios.put("lost when the key is deleted", InFlightTest::lostWhenDeleted);
                scenarios.put("a dropped hold stops renewing", InFlightTest::droppedHoldLapses);
                scenarios.put("reserve then settle: refund", InFlightTest::settleRefund);
                scenarios.put("reserve then settle: debit past the limit", InFlightTest::settleDebit);
                scenarios.put("settle once; denied settles to nothing", InFlightTest::settleOnce);
                scenarios.forEach((n, sc) -> tests.add(DynamicTest.dynamicTest(n, shared(f, module, driver, sc, n))));
                if (first) {
                    tests.add(DynamicTest.dynamicTest("breaker open on SIGSTOP: the local in-flight limit",
                            () -> breakerLocalLimit(f, module, driver)));
                    tests.add(DynamicTest.dynamicTest("an unanswered ACQUIRE is released once Redis answers",
                            () -> unansweredAcquireReleased(f, module, driver)));
                }
                out.add(DynamicContainer.dynamicContainer(name, tests));
            }
        }
    }

    static Executable shared(Map.Entry<String, String> f, boolean module, String driver, Scenario sc, String n) {
        return () -> {
            TestServer s = TestServer.shared(f.getKey(), f.getValue(), module);
            try (Env e = new Env(s, driver, 2000, null)) {
                sc.run(e, key(n.substring(0, 6).replace(' ', '_')));
                assertEquals(s.module ? RateLimit.Backend.MODULE : RateLimit.Backend.LUA, e.rl.backend());
            }
        };
    }

    /** limit 3: holds of 2 and 1 fit, the next is denied until one is closed; cost > limit never fits. */
    static void limitAcrossHolds(Env e, String key) {
        InFlight inf = e.rl.inflight(Policy.concurrency("streams", 3, 60_000));
        Set<String> ids = new HashSet<>();
        try (Hold a = inf.hold(key, 2); Hold b = inf.hold(key)) {
            assertTrue(a.allowed() && b.allowed(), a + " " + b);
            assertEquals(e.source(), a.decision().source());
            assertEquals(1, a.decision().remaining(), a.decision().toString());
            assertEquals(0, b.decision().remaining(), b.decision().toString());
            assertEquals(2, a.decision().granted());
            for (Hold h : List.of(a, b)) {
                assertTrue(h.id().matches("[0-9a-f]{32}"), h.id());
                ids.add(h.id());
            }
            try (Hold c = inf.hold(key)) {
                assertFalse(c.allowed(), c.toString());
                Decision d = c.decision();
                assertEquals(0, d.granted());
                assertEquals(3, d.limit());
                // until the earliest lease lapses: within the lease
                assertTrue(d.retryAfterMs() > 0 && d.retryAfterMs() <= 60_000, d.toString());
                ids.add(c.id());
            }
            try (Hold big = inf.hold(key, 4)) {
                assertFalse(big.allowed());
                assertEquals(-1, big.decision().retryAfterMs(), "cost 4 > limit 3 never fits");
            }
            b.close();
            try (Hold c = inf.hold(key)) {
                assertTrue(c.allowed(), "a closed hold's unit is free again: " + c.decision());
                ids.add(c.id());
            }
        }
        assertEquals(4, ids.size(), "an id per hold");
        Map<String, Object> m = e.rl.metrics();
        assertEquals(5L, m.get(e.s.module ? "decisionsModule" : "decisionsLua"), m.toString());
        assertEquals(2L, m.get("denied"), m.toString());
        assertEquals(":0", e.s.cmd("EXISTS", key), "the last release deletes the key");
    }

    /** limit 1: a block left by an exception releases; close twice sends once; a denied close sends nothing. */
    static void releaseOnEveryExit(Env e, String key) {
        InFlight inf = e.rl.inflight(Policy.concurrency("jobs", 1, 60_000));
        Hold[] seen = new Hold[1];
        RuntimeException boom = new RuntimeException("the work failed");
        RuntimeException got = assertThrows(RuntimeException.class, () -> {
            try (Hold h = inf.hold(key)) {
                seen[0] = h;
                assertTrue(h.allowed());
                assertEquals(":1", e.s.cmd("EXISTS", key));
                throw boom;
            }
        });
        assertEquals(boom, got);
        assertFalse(seen[0].held());
        assertEquals(":0", e.s.cmd("EXISTS", key), "released by the exception's exit");
        long calls = e.calls();
        seen[0].close();
        assertEquals(calls, e.calls(), "a second close sends nothing");
        try (Hold h = inf.hold(key)) {
            assertTrue(h.allowed(), h.decision().toString());
            Hold denied = inf.hold(key);
            assertFalse(denied.allowed());
            calls = e.calls();
            denied.close();
            assertEquals(calls, e.calls(), "a denied hold's close sends nothing");
        }
        assertEquals(":0", e.s.cmd("EXISTS", key), "released by the normal exit");
    }

    /**
     * lease 600 ms, renewed every 100 ms: held for more than two leases, at least 3 renewals, the server
     * still counts it (limit 1: another hold is denied by the server, not locally).
     */
    static void renewalKeepsTheHold(Env e, String key) {
        InFlight inf = e.rl.inflight(Policy.concurrency("long", 1, 600), InFlight.options().renewMs(100));
        try (Hold h = inf.hold(key)) {
            long t0 = System.nanoTime();
            assertTrue(h.allowed());
            Poll.until(30, "3 renewals and two leases", () -> h.renewals() >= 3 && Poll.ms(t0) > 1200);
            try (Hold other = inf.hold(key)) {
                assertFalse(other.allowed(), "the renewed hold still counts: " + other.decision() + ", " + h);
                assertEquals(e.source(), other.decision().source());
            }
            assertFalse(h.lost());
        }
        assertEquals(":0", e.s.cmd("EXISTS", key));
    }

    /** The key deleted under a hold: the next RENEW answers 0, lost() is set and renewals stop. */
    static void lostWhenDeleted(Env e, String key) {
        InFlight inf = e.rl.inflight(Policy.concurrency("lost", 2, 60_000), InFlight.options().renewMs(50));
        try (Hold h = inf.hold(key)) {
            assertTrue(h.allowed());
            Poll.until(30, "a renewal", () -> h.renewals() >= 1);
            assertEquals(":1", e.s.cmd("DEL", key));
            Poll.until(30, "lost()", h::lost);
            long renewals = h.renewals();
            long calls = e.calls();
            // two renewal periods at least: nothing more is sent for it
            long t0 = System.nanoTime();
            Poll.until(30, "150 ms", () -> Poll.ms(t0) >= 150);
            assertEquals(calls, e.calls(), "renewals stop once lost");
            assertEquals(renewals, h.renewals());
            assertTrue(h.held(), "the work goes on; the guard does not abort it");
        }
    }

    /** A hold never closed and dropped: the renewer holds it weakly, so its lease lapses and the key goes. */
    static void droppedHoldLapses(Env e, String key) {
        InFlight inf = e.rl.inflight(Policy.concurrency("drop", 1, 400), InFlight.options().renewMs(50));
        long[] renewed = new long[1];
        acquireAndDrop(inf, key, renewed);
        assertTrue(renewed[0] >= 1);
        // the lease lapses within 400 ms of the last renewal once the hold is collected; a hold kept
        // alive by the renewer is renewed for ever
        Poll.until(30, "the dropped hold's key to expire", () -> {
            System.gc();
            return e.s.cmd("EXISTS", key).equals(":0");
        });
        try (Hold h = inf.hold(key)) {
            assertTrue(h.allowed(), h.decision().toString());
        }
    }

    private static void acquireAndDrop(InFlight inf, String key, long[] renewed) {
        Hold h = inf.hold(key);
        assertTrue(h.allowed());
        Poll.until(30, "a renewal", () -> h.renewals() >= 1);
        renewed[0] = h.renewals();
    }

    /**
     * The breaker open with the server SIGSTOPped: holds are decided by the local in-flight limit
     * (Panic.instances(4) of 10: 2 per key), never sent; after SIGCONT nothing is left held.
     */
    static void breakerLocalLimit(Map.Entry<String, String> f, boolean module, String driver) {
        try (TestServer s = new TestServer(f.getKey(), f.getValue(), module, 0);
             Env e = new Env(s, driver, TIMEOUT, new Breaker(2, 10_000, 1000, 64, 200))) {
            String key = key("panic");
            InFlight inf = e.rl.inflight(Policy.concurrency("p", 10, 2000), InFlight.options().panic(Panic.instances(4)));
            Limiter lim = e.rl.limiter(Policy.tokenBucket("tb", 10, 1, 3_600_000));
            assertEquals(2, inf.localCap());
            Hold server = inf.hold(key);
            assertEquals(e.source(), server.decision().source());
            s.signal("STOP");
            List<Hold> local = new ArrayList<>();
            long slowest = 0;
            try {
                for (int i = 0; i < 2; i++) {
                    long t0 = System.nanoTime();
                    Hold h = inf.hold(key);
                    slowest = Math.max(slowest, Poll.ms(t0));
                    assertTrue(h.allowed(), h.decision().toString());
                    assertEquals(Source.PANIC, h.decision().source());
                    assertEquals(2, h.decision().limit());
                    local.add(h);
                }
                assertEquals(0, local.get(1).decision().remaining());
                // the ACQUIREs met the stopped server: each decided in under two timeouts, the bound
                // LettuceOutageTest and JedisBoundTest hold the other calls to (no second wait)
                System.out.println(s.name + (module ? "+module " : "+lua ") + driver + ", SIGSTOP: slowest hold "
                        + slowest + " ms (timeout " + TIMEOUT + " ms)");
                assertTrue(slowest < 2 * TIMEOUT, "slowest hold " + slowest + " ms for a " + TIMEOUT + " ms timeout");
                assertEquals(2, inf.heldLocally(key));
                Poll.until(10, "the breaker to open", () -> "open".equals(e.rl.metrics().get("state")));
                long calls = e.calls();
                Hold third = inf.hold(key);
                assertFalse(third.allowed());
                assertEquals(Source.PANIC, third.decision().source());
                assertEquals(1, third.decision().retryAfterMs(), "a local release may come any time");
                Hold big = inf.hold(key, 3);
                assertEquals(-1, big.decision().retryAfterMs(), "cost 3 > the local limit 2");
                // a reservation decided by the panic limits settles to nothing sent
                Reservation r = lim.reserve(key + ":tb", 4);
                assertEquals(Source.PANIC, r.decision().source());
                assertNull(r.settle(9));
                local.get(0).close();
                assertEquals(1, inf.heldLocally(key));
                Hold again = inf.hold(key);
                assertTrue(again.allowed());
                local.add(again);
                for (Hold h : local) {
                    h.close();
                }
                assertEquals(0, inf.heldLocally(key), "local holds give their units back on close");
                assertEquals(calls, e.calls(), "local holds are never sent, renewed or released on Redis");
            } finally {
                s.signal("CONT");
            }
            server.close();
            // what the server counts: the outage's ACQUIREs that reached it lapse within their lease;
            // then all 10 units are free on the server again
            Poll.until(30, "all 10 units free on the server", () -> {
                try (Hold all = inf.hold(key, 10)) {
                    return all.allowed() && all.decision().source() == e.source();
                }
            });
            assertEquals(0, inf.heldLocally(key));
        }
    }

    /**
     * An ACQUIRE sent to a stopped server times out (the hold is decided locally) but is applied when the
     * server wakes: without a RELEASE of its id its unit stays held for the whole lease (60 s here). The
     * library sends that RELEASE once the breaker has closed again. A 100 ms timeout: a loaded machine's
     * answer may exceed it too, so the warm-up goes on until a hold is answered in time.
     */
    static void unansweredAcquireReleased(Map.Entry<String, String> f, boolean module, String driver) {
        try (TestServer s = new TestServer(f.getKey(), f.getValue(), module, 0);
             Env e = new Env(s, driver, 100, new Breaker(1, 10_000, 1000, 64, 100))) {
            String key = key("late");
            InFlight inf = e.rl.inflight(Policy.concurrency("one", 1, 60_000), InFlight.options().renewMs(50));
            java.util.function.BooleanSupplier answered = () -> {
                try (Hold h = inf.hold(key)) { // (the twin's script cached: the stalled EVALSHA applies)
                    return h.allowed() && h.decision().source() == e.source() && inf.lateReleases() == 0;
                }
            };
            Poll.until(30, "an answered hold", answered);
            s.signal("STOP");
            try {
                try (Hold a = inf.hold(key)) {
                    assertEquals(Source.PANIC, a.decision().source());
                }
                assertEquals(1, inf.lateReleases());
            } finally {
                s.signal("CONT");
            }
            // the first hold after openMs is the probe; the unit is free once the RELEASE went out
            Poll.until(30, "the stalled ACQUIRE released", answered);
        }
    }

    // ---- reserve / settle ----

    /** capacity 10, no refill to speak of: reserve 6, settle 2: REFUND 4 (remaining 4 -> 8). */
    static void settleRefund(Env e, String key) {
        Limiter lim = e.rl.limiter(Policy.tokenBucket("tpm", 10, 1, 3_600_000));
        Reservation r = lim.reserve(key, 6);
        assertTrue(r.allowed());
        assertEquals(4, r.decision().remaining());
        Decision d = r.settle(2);
        assertEquals(4, d.granted(), "4 units given back: " + d);
        assertEquals(8, d.remaining(), d.toString());
        assertTrue(r.settled());
        Decision eight = lim.limit(key, 8);
        assertTrue(eight.allowed(), "8 fit again: " + eight);
        assertEquals(0, eight.remaining());
        assertFalse(lim.limit(key).allowed());
        // allOf: the refund goes to every part
        Limiter all = e.rl.limiter(Policy.allOf("both", Policy.tokenBucket("a", 10, 1, 3_600_000),
                Policy.slidingLog("b", 20, 3_600_000)));
        Reservation ra = all.reserve(key, 5);
        Decision da = ra.settle(1);
        assertEquals(List.of(4L, 4L), da.parts().stream().map(Decision.Part::granted).toList(), da.toString());
        assertEquals(9, all.limit(key, 0, false, false).remaining(), "10 - 5 + 4");
    }

    /**
     * capacity 10, 1 token a minute: reserve 6 (4 left), settle 15: COST 9 FORCE takes the bucket to -5.
     * The next call of 1 waits for 6 tokens: 6 minutes (less the refill since the debit), denied.
     */
    static void settleDebit(Env e, String key) {
        Limiter lim = e.rl.limiter(Policy.tokenBucket("tpm", 10, 1, 60_000));
        long t0 = System.nanoTime(); // the bucket refills from the reserve on: at most this long
        Reservation r = lim.reserve(key, 6);
        assertTrue(r.allowed());
        assertEquals(4, r.decision().remaining());
        Decision d = r.settle(15);
        long settled = Poll.ms(t0);
        assertTrue(d.allowed(), "a settle is never denied by its own limit: " + d);
        assertEquals(9, d.granted(), d.toString());
        assertEquals(0, d.remaining(), d.toString());
        // one unit after the debt: 6 tokens at 1 a minute
        assertTrue(d.retryAfterMs() <= 360_000 && d.retryAfterMs() >= 360_000 - settled - 1, d + " after "
                + settled + " ms");
        Decision next = lim.limit(key);
        long elapsed = Poll.ms(t0);
        assertFalse(next.allowed(), "the debt is waited out: " + next);
        assertTrue(next.retryAfterMs() <= 360_000 && next.retryAfterMs() >= 360_000 - elapsed - 1, next
                + " after " + elapsed + " ms");
        // allOf: every part takes the debit
        Limiter all = e.rl.limiter(Policy.allOf("both", Policy.tokenBucket("a", 10, 1, 60_000),
                Policy.fixedWindow("b", 5, 1L << 40)));
        Reservation ra = all.reserve(key, 2);
        Decision da = ra.settle(7);
        assertTrue(da.allowed());
        assertFalse(all.limit(key).allowed(), "fixed window 5: 7 counted");
    }

    /** Equal: nothing sent; a second settle throws and sends nothing; a denied reservation sends nothing. */
    static void settleOnce(Env e, String key) {
        Limiter lim = e.rl.limiter(Policy.slidingLog("log", 10, 3_600_000));
        Reservation r = lim.reserve(key, 3);
        long calls = e.calls();
        assertNull(r.settle(3));
        assertEquals(calls, e.calls(), "actual = estimate: nothing sent");
        assertThrows(IllegalStateException.class, () -> r.settle(1));
        assertThrows(IllegalStateException.class, () -> r.settle(5));
        assertEquals(calls, e.calls(), "a second settle sends nothing");
        Reservation r2 = lim.reserve(key, 2);
        assertEquals(2, r2.settle(0).granted());
        assertThrows(IllegalStateException.class, () -> r2.settle(0));
        assertEquals(7, lim.limit(key, 0, false, false).remaining(), "3 taken, 2 reserved and given back");
        Reservation denied = lim.reserve(key, 11);
        assertFalse(denied.allowed());
        calls = e.calls();
        assertNull(denied.settle(20));
        assertEquals(calls, e.calls(), "a denied reservation settles to nothing");
        assertThrows(IllegalArgumentException.class, () -> lim.reserve(key, 0));
        assertThrows(IllegalArgumentException.class, () -> lim.reserve(key, 1).settle(-1));
    }

    // ---- refusals ----

    @Test
    void concurrencyIsNotARateAndInflightTakesOnlyIt() {
        Map.Entry<String, String> f = TestServer.first();
        try (Env e = new Env(TestServer.shared(f.getKey(), f.getValue(), true), "lettuce", 2000, null)) {
            Policy c = Policy.concurrency("c", 5, 3000);
            assertEquals(3000, c.windowMs());
            assertEquals("RL.CONCURRENCY", c.command());
            assertThrows(IllegalArgumentException.class, () -> e.rl.limiter(c));
            assertThrows(IllegalArgumentException.class, () -> e.rl.leased(c, RateLimit.lease()));
            assertThrows(IllegalArgumentException.class, () -> Policy.allOf(c, Policy.slidingLog("l", 1, 1)));
            assertThrows(IllegalArgumentException.class, () -> e.rl.inflight(Policy.slidingLog("l", 1, 1)));
            assertThrows(IllegalArgumentException.class, () -> e.rl.inflight(c, InFlight.options().renewMs(3000)));
            assertThrows(IllegalArgumentException.class, () -> Policy.concurrency("c", 0, 1));
            assertEquals(1000, e.rl.inflight(c).renewMs(), "max(1, leaseMs / 3)");
            assertEquals(1, e.rl.inflight(Policy.concurrency("c", 5, 2)).renewMs());
            assertNotEquals(InFlight.newId(), InFlight.newId());
            assertThrows(IllegalArgumentException.class, () -> e.rl.inflight(c).hold("k", 0));
        }
    }
}
