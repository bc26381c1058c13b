package io.redisratelimit;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;

/**
 * limit() / refund() on one rule, one shared call each (or the panic limits while the breaker is open).
 * The async methods never complete exceptionally for an outage: a Redis that is down or slow gives a
 * decision from the panic limits within the timeout.
 */
public final class Limiter {
    private final RateLimit rl;
    private final Rule rule;
    private final PanicBuckets panic;

    Limiter(RateLimit rl, Rule rule, Panic panic) {
        if (rule == null) {
            throw new IllegalArgumentException("rule must come from Policy.tokenBucket, slidingLog, "
                    + "slidingCounter, fixedWindow or allOf");
        }
        Policy.notARate(rule, "limiter()");
        this.rl = rl;
        this.rule = rule;
        this.panic = new PanicBuckets(panic != null ? panic : Panic.instances(1), rule);
    }

    public Rule rule() {
        return rule;
    }

    static void checkCost(long cost, long lo) {
        if (cost < lo || cost > Policy.MAX) {
            throw new IllegalArgumentException("cost must be an integer from " + lo + " to 2^53-1, not " + cost);
        }
    }

    static List<String> options(long cost, boolean partial, boolean dryRun) {
        List<String> o = new ArrayList<>(4);
        if (cost != 1) {
            o.add("COST");
            o.add(Long.toString(cost));
        }
        if (partial) {
            o.add("PARTIAL");
        }
        if (dryRun) {
            o.add("DRYRUN");
        }
        return o;
    }

    private List<String> keysFor(String key) {
        return rule instanceof AllOf a ? a.keys(key) : List.of(key);
    }

    /** One decision for {@code cost} units of {@code key} (allOf: the keys {@code key:<part name>}). */
    public CompletableFuture<Decision> limitAsync(String key, long cost, boolean partial, boolean dryRun) {
        checkCost(cost, 0);
        return decide(keysFor(key), cost, partial, dryRun);
    }

    /** allOf with one key per part (all in one cluster slot, else CrossSlotException). */
    public CompletableFuture<Decision> limitAsync(List<String> keys, long cost, boolean partial, boolean dryRun) {
        checkCost(cost, 0);
        if (!(rule instanceof AllOf a)) {
            throw new IllegalArgumentException("a list of keys is for allOf; " + rule.name() + " takes one key");
        }
        return decide(a.keys(keys), cost, partial, dryRun);
    }

    public CompletableFuture<Decision> limitAsync(String key, long cost) {
        return limitAsync(key, cost, false, false);
    }

    public CompletableFuture<Decision> limitAsync(String key) {
        return limitAsync(key, 1, false, false);
    }

    /** Blocking: at most the timeout (plus scheduling). */
    public Decision limit(String key) {
        return join(limitAsync(key, 1, false, false));
    }

    public Decision limit(String key, long cost) {
        return join(limitAsync(key, cost, false, false));
    }

    public Decision limit(String key, long cost, boolean partial, boolean dryRun) {
        return join(limitAsync(key, cost, partial, dryRun));
    }

    /**
     * Give {@code n} units back (the request was not served after all): a Decision whose granted is the
     * units given back (0 when Redis is unavailable: then nothing was given back).
     */
    public CompletableFuture<Decision> refundAsync(String key, long n) {
        checkCost(n, 1);
        List<String> keys = keysFor(key);
        int allow = rl.breaker.allow(System.nanoTime());
        if (allow == Breaker.NO) {
            return CompletableFuture.completedFuture(panicRefund(keys));
        }
        RateLimit.Call c = RateLimit.callFor(rule, keys, List.of("REFUND", Long.toString(n)));
        return rl.call(c, allow == Breaker.PROBE, rule, false).thenApply(reply -> {
            if (reply == null) {
                return panicRefund(keys);
            }
            rl.metrics.refunds.increment();
            Decision d = RateLimit.toDecision(reply, rule, n, false, rl.source(), true);
            rl.metrics.refundTokens.add(d.granted());
            return d;
        });
    }

    public Decision refund(String key, long n) {
        return join(refundAsync(key, n));
    }

    /**
     * Reserve-then-settle (clients/DESIGN.md, "Reservations"): {@code limit(key, estimate)}, all or
     * nothing, as a handle whose {@link Reservation#settle(long)} sends the REFUND or the debit once.
     */
    public CompletableFuture<Reservation> reserveAsync(String key, long estimate) {
        checkCost(estimate, 1);
        return limitAsync(key, estimate, false, false).thenApply(d -> new Reservation(this, key, estimate, d));
    }

    /** {@link #reserveAsync}, blocking (at most the timeout). */
    public Reservation reserve(String key, long estimate) {
        return join(reserveAsync(key, estimate));
    }

    /**
     * A debit: {@code COST n FORCE}, taken even past the limit. Redis unavailable: a Decision with granted
     * 0 from the panic limits' view (nothing was debited).
     */
    CompletableFuture<Decision> debitAsync(String key, long n) {
        checkCost(n, 1);
        List<String> keys = keysFor(key);
        int allow = rl.breaker.allow(System.nanoTime());
        if (allow == Breaker.NO) {
            return CompletableFuture.completedFuture(panicDebit(keys, n));
        }
        RateLimit.Call c = RateLimit.callFor(rule, keys, List.of("COST", Long.toString(n), "FORCE"));
        return rl.call(c, allow == Breaker.PROBE, rule, true).thenApply(reply -> reply == null
                ? panicDebit(keys, n) : RateLimit.toDecision(reply, rule, n, false, rl.source(), false));
    }

    private Decision panicDebit(List<String> keys, long n) {
        return RateLimit.panicDecision(panic, rule, keys, n, false, true).unsent();
    }

    private Decision panicRefund(List<String> keys) {
        return RateLimit.panicDecision(panic, rule, keys, 0, false, true).withGranted(0);
    }

    private CompletableFuture<Decision> decide(List<String> keys, long cost, boolean partial, boolean dryRun) {
        int allow = rl.breaker.allow(System.nanoTime());
        if (allow == Breaker.NO) {
            return CompletableFuture.completedFuture(
                    rl.count(RateLimit.panicDecision(panic, rule, keys, cost, partial, dryRun)));
        }
        RateLimit.Call c = RateLimit.callFor(rule, keys, options(cost, partial, dryRun));
        return rl.call(c, allow == Breaker.PROBE, rule, !dryRun).thenApply(reply -> rl.count(reply != null
                ? RateLimit.toDecision(reply, rule, cost, partial, rl.source(), false)
                : RateLimit.panicDecision(panic, rule, keys, cost, partial, dryRun)));
    }

    static <T> T join(CompletableFuture<T> f) {
        try {
            return f.join();
        } catch (CompletionException e) {
            Throwable c = RateLimit.unwrap(e);
            if (c instanceof RuntimeException r) {
                throw r;
            }
            throw e;
        }
    }
}
