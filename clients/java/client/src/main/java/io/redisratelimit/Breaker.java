package io.redisratelimit;

import java.util.ArrayDeque;
import java.util.Arrays;

/**
 * The circuit breaker (clients/DESIGN.md, "Circuit breaker"): closed, then open after {@code failures}
 * consecutive failures or when the p95 of the last {@code latencyWindow} call latencies stays above
 * {@code latencyBudgetMs} for {@code latencyPeriodMs}. Open: no calls for {@code openMs}, then half-open:
 * one probe; its success closes the breaker, its failure opens it again. One per RateLimit.
 */
public final class Breaker {
    /** The breaker's state, as metrics() reports it: closed, open, half_open. */
    public enum State {
        CLOSED, OPEN, HALF_OPEN;

        @Override
        public String toString() {
            return name().toLowerCase();
        }
    }

    static final int NO = 0;
    static final int YES = 1;
    static final int PROBE = 2;

    private final int failures;
    private final long budgetNs;
    private final long periodNs;
    private final int window;
    private final long openNs;
    private volatile State state = State.CLOSED;
    private int consecutive;
    private final ArrayDeque<Long> lat = new ArrayDeque<>();
    private long overSince = -1;
    private long openUntil;
    private long probeAt;
    Metrics metrics;

    /** The defaults: failures 5, latency budget 50 ms over 1000 ms, window 64, open 1000 ms. */
    public Breaker() {
        this(5, 50, 1000, 64, 1000);
    }

    public Breaker(int failures, long latencyBudgetMs, long latencyPeriodMs, int latencyWindow, long openMs) {
        if (failures < 1 || latencyWindow < 1 || openMs < 0) {
            throw new IllegalArgumentException("failures and latencyWindow must be >= 1, openMs >= 0");
        }
        this.failures = failures;
        this.budgetNs = latencyBudgetMs * 1_000_000L;
        this.periodNs = latencyPeriodMs * 1_000_000L;
        this.window = latencyWindow;
        this.openNs = openMs * 1_000_000L;
    }

    public State state() {
        return state;
    }

    /** NO (panic limits), YES, or PROBE (this call is the half-open probe). */
    int allow(long now) {
        if (state == State.CLOSED) {
            return YES;
        }
        synchronized (this) {
            if (state == State.CLOSED) {
                return YES;
            }
            if (state == State.OPEN) {
                if (now - openUntil < 0) {
                    return NO;
                }
            } else if (now - probeAt < Math.max(openNs, 50_000_000L)) {
                return NO; // a probe is out; a lost one is replaced later
            }
            state = State.HALF_OPEN;
            probeAt = now;
            return PROBE;
        }
    }

    synchronized void success(long latencyNs, boolean probe) {
        consecutive = 0;
        if (probe || state != State.CLOSED) {
            if (state != State.CLOSED) {
                state = State.CLOSED;
                lat.clear();
                overSince = -1;
                if (metrics != null) {
                    metrics.probesOk.increment();
                }
            }
            return;
        }
        lat.addLast(latencyNs);
        if (lat.size() > window) {
            lat.removeFirst();
        }
        if (latencyNs <= budgetNs && overSince < 0) {
            return;
        }
        int n = lat.size();
        if (n < Math.min(5, window)) {
            return;
        }
        long[] sorted = lat.stream().mapToLong(Long::longValue).toArray();
        Arrays.sort(sorted);
        long p95 = sorted[(95 * n - 1) / 100];
        long now = System.nanoTime();
        if (p95 <= budgetNs) {
            overSince = -1;
        } else if (overSince < 0) {
            overSince = now;
        } else if (now - overSince >= periodNs) {
            trip(now, false);
        }
    }

    synchronized void failure(boolean probe) {
        long now = System.nanoTime();
        if (probe || state == State.HALF_OPEN) {
            state = State.OPEN;
            openUntil = now + openNs;
            if (metrics != null && probe) {
                metrics.probesFailed.increment();
            }
            return;
        }
        consecutive++;
        if (consecutive >= failures && state == State.CLOSED) {
            trip(now, true);
        }
    }

    private void trip(long now, boolean byFailures) {
        if (state != State.CLOSED) {
            return;
        }
        state = State.OPEN;
        openUntil = now + openNs;
        consecutive = 0;
        lat.clear();
        overSince = -1;
        if (metrics != null) {
            metrics.trips.increment();
            (byFailures ? metrics.tripsFailures : metrics.tripsLatency).increment();
        }
    }
}
