package io.redisratelimit;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;

/**
 * Two-tier limiter (clients/DESIGN.md, "Two-tier leased limiter"): decisions from a local reservoir per
 * key, leased in batches ({@code COST batch PARTIAL}) from the shared policy, so all instances together
 * never exceed it. Refills run in the background (single flight per key); idle and evicted keys give their
 * tokens back (REFUND). One background thread per leased limiter.
 */
public final class LeasedLimiter implements AutoCloseable {
    /** {@code RateLimit.lease().batch(50).lowWater(0.2).maxKeys(10000).idleMs(5000).recheckMs(250)}. */
    public static final class Options {
        long batch = 50;
        double lowWater = 0.2;
        int maxKeys = 10_000;
        long idleMs = 5_000;
        long recheckMs = 250;
        Panic panic;

        public Options batch(long b) {
            if (b < 1) {
                throw new IllegalArgumentException("batch must be an integer >= 1");
            }
            batch = b;
            return this;
        }

        public Options lowWater(double w) {
            if (!(w >= 0 && w < 1)) {
                throw new IllegalArgumentException("lowWater must be in [0, 1)");
            }
            lowWater = w;
            return this;
        }

        public Options maxKeys(int n) {
            if (n < 1) {
                throw new IllegalArgumentException("maxKeys must be an integer >= 1");
            }
            maxKeys = n;
            return this;
        }

        public Options idleMs(long ms) {
            idleMs = ms;
            return this;
        }

        public Options recheckMs(long ms) {
            recheckMs = ms;
            return this;
        }

        public Options panic(Panic p) {
            panic = p;
            return this;
        }
    }

    private static final class Entry {
        long tokens;
        long used;
        boolean inflight;
        long nextTry;
        long remaining;
        long retry;
        long reset;
        long at;
        long limit;
        boolean failed;
        CompletableFuture<Void> event;

        Entry(long now) {
            used = now;
            at = now;
        }
    }

    private final RateLimit rl;
    private final Policy policy;
    private final long batch;
    private final double low;
    private final int maxKeys;
    private final long idleNs;
    private final long recheckNs;
    private final PanicBuckets panic;
    private final LinkedHashMap<String, Entry> entries = new LinkedHashMap<>(16, 0.75f, true);
    private final ScheduledExecutorService worker;
    private volatile boolean closed;

    LeasedLimiter(RateLimit rl, Policy policy, Options o) {
        if (policy == null) {
            throw new IllegalArgumentException("leased() takes a single policy (allOf is not leased)");
        }
        Policy.notARate(policy, "leased()");
        this.rl = rl;
        this.policy = policy;
        this.batch = Math.min(o.batch, policy.limit());
        this.low = o.lowWater * batch;
        this.maxKeys = o.maxKeys;
        this.idleNs = o.idleMs * 1_000_000L;
        this.recheckNs = o.recheckMs * 1_000_000L;
        this.panic = new PanicBuckets(o.panic != null ? o.panic : Panic.instances(1), policy);
        ScheduledThreadPoolExecutor w = new ScheduledThreadPoolExecutor(1, r -> {
            Thread t = new Thread(r, "rl-leases-" + policy.name());
            t.setDaemon(true);
            return t;
        });
        w.setRemoveOnCancelPolicy(true);
        this.worker = w;
        long tick = Math.max(10, Math.min(o.idleMs / 4, 1000));
        worker.scheduleWithFixedDelay(this::sweep, tick, tick, TimeUnit.MILLISECONDS);
    }

    public Policy policy() {
        return policy;
    }

    /** Blocking: a local decision, or at most the timeout. */
    public Decision limit(String key) {
        return Limiter.join(limitAsync(key, 1));
    }

    public Decision limit(String key, long cost) {
        return Limiter.join(limitAsync(key, cost));
    }

    public CompletableFuture<Decision> limitAsync(String key) {
        return limitAsync(key, 1);
    }

    public CompletableFuture<Decision> limitAsync(String key, long cost) {
        Limiter.checkCost(cost, 0);
        long now = System.nanoTime();
        Decision d = take(key, cost, now);
        return d != null ? CompletableFuture.completedFuture(d) : slow(key, cost, now);
    }

    /** A request granted locally was not served: its units go back into the key's reservoir (no I/O). */
    public Decision refund(String key, long n) {
        Limiter.checkCost(n, 1);
        Entry e;
        long left;
        synchronized (this) {
            e = entries.get(key);
            if (e != null) {
                e.tokens += n;
            }
            left = e != null ? e.tokens : 0;
        }
        return Decision.on(policy, Source.LOCAL, true, e != null ? n : 0, policy.limit(), left, 0, 0);
    }

    /** Units leased to this instance and not yet used (all keys). */
    public synchronized long stranded() {
        long s = 0;
        for (Entry e : entries.values()) {
            s += e.tokens;
        }
        return s;
    }

    // ---- the local tier (callers hold the lock) ----

    private Decision local(Entry e, long cost, long now) {
        e.tokens -= cost;
        rl.metrics.decisionsLocal.increment();
        long reset = e.reset - (now - e.at) / 1_000_000L;
        return Decision.on(policy, Source.LOCAL, true, cost, policy.limit(), e.tokens + e.remaining, 0,
                Math.max(0, reset));
    }

    private Decision localDenial(Entry e, long now) {
        rl.metrics.decisionsLocal.increment();
        rl.metrics.denied.increment();
        long el = (now - e.at) / 1_000_000L;
        long retry = e.retry < 0 ? e.retry : Math.max(1, e.retry - el);
        return Decision.on(policy, Source.LOCAL, false, 0, policy.limit(), e.tokens + e.remaining, retry,
                Math.max(0, e.reset - el));
    }

    private Decision panicDecision(String key, long cost) {
        return rl.count(RateLimit.panicDecision(panic, policy, List.of(key), cost, false, false));
    }

    private Decision leasedDecision(Entry e, long cost) {
        Source source = rl.source();
        if (e.tokens >= cost) {
            e.tokens -= cost;
            return rl.count(Decision.on(policy, source, true, cost, e.limit, e.tokens + e.remaining, 0, e.reset));
        }
        return rl.count(Decision.on(policy, source, false, 0, e.limit, e.tokens + e.remaining,
                e.retry != 0 ? e.retry : 1, e.reset));
    }

    private Entry newEntry(String key, long now, List<Map.Entry<String, Long>> evicted) {
        Entry e = new Entry(now);
        entries.put(key, e);
        Iterator<Map.Entry<String, Entry>> it = entries.entrySet().iterator();
        while (entries.size() > maxKeys && it.hasNext()) {
            Map.Entry<String, Entry> old = it.next();
            it.remove();
            Entry o = old.getValue();
            if (o.tokens > 0 && !o.inflight) {
                evicted.add(Map.entry(old.getKey(), o.tokens));
                o.tokens = 0;
            }
        }
        return e;
    }

    private Decision take(String key, long cost, long now) {
        Entry e;
        Decision d;
        synchronized (this) {
            e = entries.get(key);
            if (e == null) {
                return null;
            }
            e.used = now;
            if (e.tokens < cost) {
                return null;
            }
            d = local(e, cost, now);
            if (e.tokens >= low || e.inflight || now - e.nextTry < 0 || rl.breaker.state() != Breaker.State.CLOSED) {
                return d;
            }
            e.inflight = true;
            e.event = new CompletableFuture<>();
        }
        later(() -> refill(key, e, batch, Breaker.YES));
        return d;
    }

    private CompletableFuture<Decision> slow(String key, long cost, long now) {
        List<Map.Entry<String, Long>> evicted = new ArrayList<>();
        Decision d = null;
        CompletableFuture<Void> wait = null;
        int allow = Breaker.NO;
        Entry e;
        synchronized (this) {
            e = entries.get(key);
            if (e == null) {
                e = newEntry(key, now, evicted);
            } else if (e.tokens >= cost) { // a refill landed meanwhile
                return CompletableFuture.completedFuture(local(e, cost, now));
            }
            if (e.inflight) {
                if (rl.breaker.state() == Breaker.State.CLOSED) {
                    wait = e.event;
                }
            } else {
                allow = rl.breaker.allow(now);
                if (allow == Breaker.YES && now - e.nextTry < 0) {
                    d = localDenial(e, now);
                } else if (allow != Breaker.NO) {
                    e.inflight = true;
                    e.event = new CompletableFuture<>();
                }
            }
        }
        for (Map.Entry<String, Long> x : evicted) {
            later(() -> giveBack(x.getKey(), x.getValue()));
        }
        final Entry fe = e;
        if (allow == Breaker.PROBE) {
            // the worker sends the probe (a lease for this key); no caller waits for it
            long n = Math.max(batch, cost - e.tokens);
            later(() -> refill(key, fe, n, Breaker.PROBE));
            return CompletableFuture.completedFuture(panicDecision(key, cost));
        }
        if (d != null) {
            return CompletableFuture.completedFuture(d);
        }
        if (wait == null && allow == Breaker.NO) {
            return CompletableFuture.completedFuture(panicDecision(key, cost));
        }
        if (wait != null) {
            rl.metrics.leaseWaits.increment();
            return wait.thenApply(v -> true).completeOnTimeout(false, rl.timeoutMs, TimeUnit.MILLISECONDS)
                    .thenApply(landed -> {
                        Decision r;
                        synchronized (this) {
                            r = afterWait(fe, cost, landed, System.nanoTime());
                        }
                        return r != null ? r : panicDecision(key, cost);
                    });
        }
        long n = Math.max(batch, cost - e.tokens);
        return lease(key, e, n, false, now).thenApply(reply -> {
            if (reply == null) {
                return panicDecision(key, cost);
            }
            synchronized (this) {
                return leasedDecision(fe, cost);
            }
        });
    }

    private Decision afterWait(Entry e, long cost, boolean landed, long now) {
        if (e.tokens >= cost) {
            return local(e, cost, now);
        }
        if (!landed || e.failed || e.limit == 0) {
            return null;
        }
        return localDenial(e, now);
    }

    /** Send e's lease of n units and fold its reply in; the reply or null (Redis unavailable). */
    private CompletableFuture<Object> lease(String key, Entry e, long n, boolean probe, long now) {
        RateLimit.Call c = RateLimit.callFor(policy, List.of(key), List.of("COST", Long.toString(n), "PARTIAL"));
        CompletableFuture<Object> f;
        try {
            f = rl.call(c, probe, policy, true);
        } catch (RuntimeException x) {
            f = CompletableFuture.failedFuture(x);
        }
        return f.handle((reply, exc) -> {
            Object r = exc == null ? reply : null;
            long back = landed(key, e, r, n, now);
            if (back > 0) {
                later(() -> giveBack(key, back));
            }
            if (exc != null) {
                throw new java.util.concurrent.CompletionException(RateLimit.unwrap(exc));
            }
            return r;
        });
    }

    private long landed(String key, Entry e, Object reply, long n, long now) {
        CompletableFuture<Void> ev;
        long back = 0;
        synchronized (this) {
            e.inflight = false;
            e.failed = reply == null;
            if (reply != null) {
                List<?> r = (List<?>) reply;
                long g = RateLimit.num(r.get(0));
                rl.metrics.leases.increment();
                rl.metrics.leaseTokens.add(g);
                e.tokens += g;
                e.limit = RateLimit.num(r.get(1));
                e.remaining = RateLimit.num(r.get(2));
                e.retry = RateLimit.num(r.get(3));
                e.reset = RateLimit.num(r.get(4));
                e.at = now;
                if (g < n) {
                    long wait = e.retry > 0 ? e.retry * 1_000_000L : recheckNs;
                    e.nextTry = now + Math.min(wait, recheckNs);
                } else {
                    e.nextTry = now;
                }
                if (entries.get(key) != e && e.tokens > 0) { // it left the table meanwhile
                    back = e.tokens;
                    e.tokens = 0;
                }
            }
            ev = e.event;
        }
        if (ev != null) {
            ev.complete(null);
        }
        return back;
    }

    /** The background lease take() started, or the half-open probe slow() handed over. */
    private void refill(String key, Entry e, long n, int allow) {
        if (allow == Breaker.YES) {
            allow = rl.breaker.allow(System.nanoTime());
        }
        if (allow == Breaker.NO) {
            landed(key, e, null, 0, System.nanoTime());
            return;
        }
        lease(key, e, n, allow == Breaker.PROBE, System.nanoTime());
    }

    private void giveBack(String key, long n) {
        if (rl.breaker.allow(System.nanoTime()) == Breaker.NO) {
            return;
        }
        RateLimit.Call c = RateLimit.callFor(policy, List.of(key), List.of("REFUND", Long.toString(n)));
        rl.call(c, false, policy, false).thenAccept(reply -> {
            if (reply != null) {
                rl.metrics.refunds.increment();
                rl.metrics.refundTokens.add(RateLimit.num(((List<?>) reply).get(0)));
            }
        }).join();
    }

    private void later(Runnable r) {
        if (closed) {
            return;
        }
        try {
            worker.execute(() -> {
                try {
                    r.run();
                } catch (RuntimeException x) {
                    // the worker must outlive a bad reply; the next call tries again
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException x) {
            // closed meanwhile
        }
    }

    private void sweep() {
        long cutoff = System.nanoTime() - idleNs;
        List<Map.Entry<String, Long>> out = new ArrayList<>();
        synchronized (this) {
            Iterator<Map.Entry<String, Entry>> it = entries.entrySet().iterator();
            while (it.hasNext()) {
                Map.Entry<String, Entry> x = it.next();
                Entry e = x.getValue();
                if (e.used - cutoff > 0) {
                    break;
                }
                it.remove();
                if (e.tokens > 0 && !e.inflight) {
                    out.add(Map.entry(x.getKey(), e.tokens));
                    e.tokens = 0;
                }
            }
        }
        for (Map.Entry<String, Long> x : out) {
            try {
                giveBack(x.getKey(), x.getValue());
            } catch (RuntimeException ignored) {
                // a failed refund only denies more
            }
        }
    }

    /** Stop the worker and give every reservoir back (REFUND). */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        closed = true;
        worker.shutdown();
        try {
            worker.awaitTermination(Math.max(1, rl.timeoutMs * 4), TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        List<Map.Entry<String, Long>> items = new ArrayList<>();
        synchronized (this) {
            for (Map.Entry<String, Entry> x : entries.entrySet()) {
                if (x.getValue().tokens > 0) {
                    items.add(Map.entry(x.getKey(), x.getValue().tokens));
                    x.getValue().tokens = 0;
                }
            }
            entries.clear();
        }
        for (Map.Entry<String, Long> x : items) {
            try {
                giveBack(x.getKey(), x.getValue());
            } catch (RuntimeException ignored) {
                // a failed refund only denies more
            }
        }
    }
}
