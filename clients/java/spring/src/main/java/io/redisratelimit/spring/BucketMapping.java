package io.redisratelimit.spring;

import java.math.BigDecimal;
import java.math.BigInteger;

/**
 * Spring's RedisRateLimiter properties (replenishRate per second,
 * burstCapacity, requestedTokens, all doubles here) mapped exactly onto the
 * module's integers: capacity, rate tokens per period_ms, COST. A
 * replenishRate of 0.5 is 1 token per 2,000 ms; 0.1 is 1 per 10,000 ms.
 * What has no exact integer form is refused, naming the property.
 * A burstCapacity of 0 blocks everything (no Redis call).
 */
public final class BucketMapping {
    /** The module's largest integer argument (2^53 - 1). */
    static final long MAX = 9007199254740991L;

    public final long capacity;
    public final long rate;
    public final long periodMs;
    public final long cost;
    public final boolean blocksAll;

    private BucketMapping(long capacity, long rate, long periodMs, long cost, boolean blocksAll) {
        this.capacity = capacity;
        this.rate = rate;
        this.periodMs = periodMs;
        this.cost = cost;
        this.blocksAll = blocksAll;
    }

    public static BucketMapping of(String where, double replenishRate, double burstCapacity,
                                   double requestedTokens) {
        long burst = whole(where, "burstCapacity", burstCapacity, 0);
        long cost = whole(where, "requestedTokens", requestedTokens, 1);
        if (burst == 0) {
            return new BucketMapping(0, 0, 0, cost, true);
        }
        if (!(replenishRate > 0) || Double.isInfinite(replenishRate)) {
            throw refuse(where, "replenishRate", replenishRate, "must be a positive number");
        }
        // replenishRate tokens per second = rate tokens per period_ms, exactly:
        // the decimal value u / 10^s per 1000 ms = u per (1000 * 10^s) ms, reduced.
        BigDecimal r = BigDecimal.valueOf(replenishRate).stripTrailingZeros();
        BigInteger num;
        BigInteger den;
        if (r.scale() <= 0) {
            num = r.toBigIntegerExact();
            den = BigInteger.valueOf(1000);
        } else {
            num = r.unscaledValue();
            den = BigInteger.TEN.pow(r.scale()).multiply(BigInteger.valueOf(1000));
        }
        BigInteger g = num.gcd(den);
        num = num.divide(g);
        den = den.divide(g);
        BigInteger max = BigInteger.valueOf(MAX);
        if (num.compareTo(max) > 0 || den.compareTo(max) > 0) {
            throw refuse(where, "replenishRate", replenishRate,
                "has no exact form as integer tokens per integer milliseconds");
        }
        return new BucketMapping(burst, num.longValueExact(), den.longValueExact(), cost, false);
    }

    private static long whole(String where, String name, double v, long min) {
        if (Double.isNaN(v) || Double.isInfinite(v) || v != Math.rint(v) || v < min || v > MAX) {
            throw refuse(where, name, v, "must be a whole number between " + min + " and " + MAX
                + " (the module counts exact integer tokens)");
        }
        return (long) v;
    }

    private static IllegalArgumentException refuse(String where, String name, double v, String why) {
        return new IllegalArgumentException(
            "redis-rate-limiter." + name + " = " + v + " (" + where + ") " + why);
    }

    @Override
    public String toString() {
        return blocksAll ? "blocks all" : capacity + " tokens, " + rate + " per " + periodMs + " ms, cost " + cost;
    }
}
