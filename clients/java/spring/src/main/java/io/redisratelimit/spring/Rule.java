package io.redisratelimit.spring;

import java.time.Duration;

/**
 * One tenant-and-route rule of the GlobalFilter: a sliding log of
 * {@code limit} per {@code windowMs}, or a token bucket of {@code limit}
 * regaining {@code rate} per {@code windowMs}.
 */
public class Rule {
    public enum Algorithm { SLIDING_LOG, TOKEN_BUCKET }

    private Algorithm algorithm = Algorithm.SLIDING_LOG;
    private long limit = 100;
    private long windowMs = 60_000;
    private long rate = 0;
    private Duration timeout;

    public Rule() {}

    public Rule(Algorithm algorithm, long limit, long windowMs, long rate, Duration timeout) {
        this.algorithm = algorithm;
        this.limit = limit;
        this.windowMs = windowMs;
        this.rate = rate;
        this.timeout = timeout;
    }

    public Algorithm getAlgorithm() { return algorithm; }
    public void setAlgorithm(Algorithm v) { algorithm = v; }
    public long getLimit() { return limit; }
    public void setLimit(long v) { limit = v; }
    public long getWindowMs() { return windowMs; }
    public void setWindowMs(long v) { windowMs = v; }
    /** Token bucket only: tokens regained per windowMs (0: limit per windowMs). */
    public long getRate() { return rate; }
    public void setRate(long v) { rate = v; }
    /** The Redis call's timeout for this rule; null for ratelimit.timeout. */
    public Duration getTimeout() { return timeout; }
    public void setTimeout(Duration v) { timeout = v; }

    long effectiveRate() {
        return rate > 0 ? rate : limit;
    }

    /** ⌈time to a fresh state / 1000⌉: the window, or the bucket's refill from empty. */
    long windowSeconds() {
        long ms = algorithm == Algorithm.TOKEN_BUCKET
            ? ceilDiv(saturatingMul(limit, windowMs), effectiveRate())
            : windowMs;
        return ceilDiv(ms, 1000);
    }

    static long saturatingMul(long a, long b) {
        try {
            return Math.multiplyExact(a, b);
        } catch (ArithmeticException e) {
            return Long.MAX_VALUE;
        }
    }

    static long ceilDiv(long a, long b) {
        return a / b + ((a % b == 0) ? 0 : 1);
    }

    void check(String where) {
        if (limit < 1 || windowMs < 1 || rate < 0) {
            throw new IllegalArgumentException(where + ": limit and window-ms must be at least 1, rate at least 0");
        }
    }
}
