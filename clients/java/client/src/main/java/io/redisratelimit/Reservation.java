package io.redisratelimit;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * What {@link Limiter#reserve} returns: the decision on {@code limit(key, estimate)}, to settle once the
 * real cost is known (clients/DESIGN.md, "Reservations: reserve and settle"). {@code settle(actual)} sends
 * at most one call, exactly once: REFUND (estimate - actual), COST (actual - estimate) FORCE, or nothing.
 * Never settled (dropped, an exception): it stays charged at its estimate, and nothing is sent.
 */
public final class Reservation {
    private final Limiter limiter;
    private final String key;
    private final long estimate;
    private final Decision decision;
    private final AtomicBoolean settled = new AtomicBoolean();

    Reservation(Limiter limiter, String key, long estimate, Decision decision) {
        this.limiter = limiter;
        this.key = key;
        this.estimate = estimate;
        this.decision = decision;
    }

    /** The estimate was granted. */
    public boolean allowed() {
        return decision.allowed();
    }

    /** The decision on limit(key, estimate). */
    public Decision decision() {
        return decision;
    }

    public String key() {
        return key;
    }

    public long estimate() {
        return estimate;
    }

    /** settle() was called (whatever its call's outcome). */
    public boolean settled() {
        return settled.get();
    }

    /**
     * Settle with the real cost ({@code actual} 0 .. 2^53 - 1): the call's Decision, or null when nothing
     * was sent (actual = estimate; a denied reservation; one decided by the panic limits). A second settle
     * throws IllegalStateException and sends nothing. Never fails for an outage (the breaker counts it;
     * not retried).
     */
    public CompletableFuture<Decision> settleAsync(long actual) {
        Limiter.checkCost(actual, 0);
        if (settled.getAndSet(true)) {
            throw new IllegalStateException("this reservation is settled already (settle sends once)");
        }
        Source src = decision.source();
        if (!decision.allowed() || src == Source.PANIC || src == Source.LOCAL) {
            return CompletableFuture.completedFuture(null); // nothing was taken on Redis
        }
        long diff = actual - estimate;
        if (diff < 0) {
            return limiter.refundAsync(key, -diff);
        }
        if (diff > 0) {
            return limiter.debitAsync(key, diff);
        }
        return CompletableFuture.completedFuture(null);
    }

    /** {@link #settleAsync}, blocking (at most the timeout). */
    public Decision settle(long actual) {
        return Limiter.join(settleAsync(actual));
    }

    @Override
    public String toString() {
        return "<reservation " + estimate + " on '" + key + "': " + (allowed() ? "allowed" : "denied")
                + (settled() ? ", settled" : "") + ">";
    }
}
