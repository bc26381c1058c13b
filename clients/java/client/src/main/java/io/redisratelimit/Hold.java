package io.redisratelimit;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One hold of an {@link InFlight} limit, acquired by {@code inflight.hold(key, cost)}: close it
 * (try-with-resources), which stops its renewals and sends RELEASE once, on every exit path. A denied
 * hold holds nothing and its close sends nothing.
 */
public final class Hold implements AutoCloseable {
    private final InFlight inflight;
    private final String key;
    private final long cost;
    private final String id;
    volatile Decision decision;
    volatile boolean lost;
    final AtomicLong renewals = new AtomicLong();
    // guarded by this
    int state = InFlight.NEW;
    volatile boolean local;
    ScheduledFuture<?> timer;

    Hold(InFlight inflight, String key, long cost, String id) {
        this.inflight = inflight;
        this.key = key;
        this.cost = cost;
        this.id = id;
    }

    /** The units are held (false after a denial). */
    public boolean allowed() {
        Decision d = decision;
        return d != null && d.allowed();
    }

    /** The ACQUIRE's decision: remaining = free units; source module, lua or panic (the local limit). */
    public Decision decision() {
        return decision;
    }

    /** The id the lease is held under: 32 lowercase hex digits (128 random bits). */
    public String id() {
        return id;
    }

    public String key() {
        return key;
    }

    public long cost() {
        return cost;
    }

    /** A RENEW found the lease lapsed (Redis away longer than the lease, the key deleted): no longer counted. */
    public boolean lost() {
        return lost;
    }

    /** RENEWs the server answered 1. */
    public long renewals() {
        return renewals.get();
    }

    /** Held now: granted and not yet closed. */
    public synchronized boolean held() {
        return state == InFlight.HELD;
    }

    /** Stop renewing, then RELEASE (once; later calls do nothing). Never fails for an outage. */
    public CompletableFuture<Void> releaseAsync() {
        return inflight.release(this);
    }

    /** {@link #releaseAsync()}, blocking (at most the timeout). */
    @Override
    public void close() {
        Limiter.join(releaseAsync());
    }

    @Override
    public String toString() {
        return "<hold " + id + " of " + cost + " on '" + key + "': " + (allowed() ? "allowed" : "denied")
                + (lost ? ", lost" : "") + ">";
    }
}
