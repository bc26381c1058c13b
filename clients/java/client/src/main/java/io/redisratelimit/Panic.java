package io.redisratelimit;

/**
 * Local limits used while Redis is unreachable: per key, a local token bucket of {@code limit} units
 * refilled over {@code windowMs}; by default the policy's limit divided by {@code instances}, over the
 * policy's window.
 */
public final class Panic {
    private final Integer instances;
    private final Long fixed;
    private final Long windowMs;

    private Panic(Integer instances, Long fixed, Long windowMs) {
        this.instances = instances;
        this.fixed = fixed;
        this.windowMs = windowMs;
    }

    /** Panic limit = the policy's limit / instances (at least 1), over its window. */
    public static Panic instances(int instances) {
        if (instances < 1) {
            throw new IllegalArgumentException("instances must be an integer >= 1");
        }
        return new Panic(instances, null, null);
    }

    /** A fixed per-key ceiling of {@code limit} per {@code windowMs}. */
    public static Panic fixed(long limit, long windowMs) {
        if (limit < 1 || windowMs < 1) {
            throw new IllegalArgumentException("limit and windowMs must be integers >= 1");
        }
        return new Panic(null, limit, windowMs);
    }

    long capacity(Policy p) {
        return fixed != null ? fixed : Math.max(1, p.limit() / instances);
    }

    long window(Policy p) {
        return windowMs != null ? windowMs : p.windowMs();
    }
}
