package io.redisratelimit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Policies, keys, headers and the 429 body without a server (clients/DESIGN.md's examples). */
class UnitTest {
    @Test
    void keysAndSlots() {
        assertEquals("rl:{tenant42}:user7", Keys.make("tenant42", "user7"));
        assertEquals(12182, Keys.slot("foo")); // Redis's CLUSTER KEYSLOT foo
        assertEquals(Keys.slot("user1000"), Keys.slot("{user1000}.following"));
        assertThrows(IllegalArgumentException.class, () -> Keys.make("a{b"));
        AllOf a = Policy.allOf(Policy.tokenBucket("x", 1, 1, 1), Policy.slidingLog("y", 1, 1));
        assertEquals(List.of("rl:{t}:x", "rl:{t}:y"), a.keys("rl:{t}"));
        assertThrows(CrossSlotException.class, () -> a.keys(List.of("a", "b")));
    }

    @Test
    void policiesValidateLikeEveryClient() {
        assertEquals(60_000, Policy.tokenBucket("api", 100, 100, 60_000).windowMs());
        assertEquals(3, Policy.tokenBucket("api", 5, 2, 1).windowMs()); // ceil(5 * 1 / 2)
        assertThrows(IllegalArgumentException.class, () -> Policy.slidingLog("bad name", 1, 1));
        assertThrows(IllegalArgumentException.class, () -> Policy.slidingLog("a", 0, 1));
        assertThrows(IllegalArgumentException.class, () -> Policy.slidingLog("a", 1L << 53, 1));
        assertEquals("a.b", Policy.allOf(Policy.slidingLog("a", 1, 1), Policy.slidingLog("b", 1, 1)).name());
        assertThrows(IllegalArgumentException.class, () -> Policy.allOf(Policy.slidingLog("a", 1, 1), Policy.slidingLog("a", 2, 1)));
        assertEquals(List.of("RL.FIXEDWINDOW", "k", "4", "3600000", "FROMFIRST"),
                RateLimit.callFor(Policy.fixedWindow("f", 4, 3_600_000, true), List.of("k"), List.of()).module());
    }

    @Test
    void headersOfTheDesignsExample() {
        Policy api = Policy.tokenBucket("api", 100, 100, 60_000);
        Decision d = Decision.on(api, Source.MODULE, true, 1, 100, 99, 0, 600);
        assertEquals(Map.of("RateLimit-Policy", "\"api\";q=100;w=60", "RateLimit", "\"api\";r=99;t=1",
                "X-RateLimit-Limit", "100", "X-RateLimit-Remaining", "99", "X-RateLimit-Reset", "1"), Headers.of(d));
        assertEquals(List.of("RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining",
                "X-RateLimit-Reset"), List.copyOf(Headers.of(d).keySet()));
        Decision no = Decision.on(api, Source.MODULE, false, 0, 100, 0, 2001, 2001);
        assertEquals("3", Headers.of(no).get("Retry-After"));
        assertEquals("Rate limit \"api\" exceeded; retry in 3 s.", Headers.problem(no, null).get("detail"));
        Decision never = Decision.on(api, Source.MODULE, false, 0, 100, 0, -1, 0);
        assertTrue(!Headers.of(never).containsKey("Retry-After"));
        assertEquals("Request costs more than the \"api\" limit allows.", Headers.problem(never, "/p").get("detail"));
    }
}
