package io.redisratelimit;

import java.lang.ref.WeakReference;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;

/**
 * An in-flight limit (RL.CONCURRENCY, twin concurrency.lua; clients/DESIGN.md, "In-flight limits: the
 * guard"): {@code try (Hold h = inflight.hold(key, cost)) { if (!h.allowed()) ...; work }}. A hold
 * ACQUIREs under an id of its own, is renewed every renewMs on the library's shared timer while held, and
 * RELEASEs on close, whatever way the block is left. While the breaker is open, or when the ACQUIRE
 * finds Redis unavailable, the hold is decided by a local in-flight limit (per key, this process).
 */
public final class InFlight {
    /** {@code InFlight.options().renewMs(1000).panic(Panic.instances(4))}. */
    public static final class Options {
        long renewMs = -1;
        Panic panic;

        /** RENEW every this many ms while held (default max(1, leaseMs / 3)); 1 .. leaseMs - 1. */
        public Options renewMs(long ms) {
            if (ms < 1) {
                throw new IllegalArgumentException("renewMs must be an integer from 1 to leaseMs - 1, not " + ms);
            }
            renewMs = ms;
            return this;
        }

        /** The local in-flight limit under the breaker: its capacity per key (windowMs is not used). */
        public Options panic(Panic p) {
            panic = p;
            return this;
        }
    }

    public static Options options() {
        return new Options();
    }

    static final int NEW = 0;
    static final int HELD = 1;
    static final int DONE = 2;

    private static final SecureRandom RANDOM = new SecureRandom();
    private static final char[] HEX = "0123456789abcdef".toCharArray();

    final RateLimit rl;
    private final Policy policy;
    private final long leaseMs;
    private final long renewMs;
    private final long localCap;
    private final Map<String, Long> local = new HashMap<>();
    /**
     * ACQUIREs sent and not answered (a timeout: a stalled server may still apply them when it wakes): id
     * -> key and until when (System.nanoTime) their lease could hold. A RELEASE of each is sent at the
     * renewMs ticks once the breaker has closed again, until answered or the lease has lapsed, so what the
     * server took is freed then rather than at the end of the lease. Guarded by itself.
     */
    private final Map<String, Late> late = new HashMap<>();
    private boolean lateTicking;

    private record Late(String key, long until) {}

    InFlight(RateLimit rl, Policy policy, Options o) {
        if (policy == null || policy.kind() != Policy.Kind.CONCURRENCY) {
            throw new IllegalArgumentException("inflight() takes a concurrency policy "
                    + "(Policy.concurrency(name, limit, leaseMs)), not " + policy);
        }
        Options opts = o != null ? o : new Options();
        long lease = policy.windowMs();
        long renew = opts.renewMs < 0 ? Math.max(1, lease / 3) : opts.renewMs;
        if (renew >= Math.max(2, lease)) {
            throw new IllegalArgumentException("renewMs must be an integer from 1 to leaseMs - 1 (" + (lease - 1)
                    + "), not " + renew);
        }
        this.rl = rl;
        this.policy = policy;
        this.leaseMs = lease;
        this.renewMs = renew;
        this.localCap = (opts.panic != null ? opts.panic : Panic.instances(1)).capacity(policy);
    }

    public Policy policy() {
        return policy;
    }

    public long renewMs() {
        return renewMs;
    }

    /** The local in-flight limit per key while the breaker is open. */
    public long localCap() {
        return localCap;
    }

    /** 32 lowercase hex digits of 128 random bits. */
    static String newId() {
        byte[] b = new byte[16];
        RANDOM.nextBytes(b);
        char[] c = new char[32];
        for (int i = 0; i < 16; i++) {
            c[2 * i] = HEX[(b[i] >> 4) & 0xf];
            c[2 * i + 1] = HEX[b[i] & 0xf];
        }
        return new String(c);
    }

    /** Acquire one unit on {@code key}: blocking, at most the timeout. */
    public Hold hold(String key) {
        return hold(key, 1);
    }

    /** Acquire {@code cost} units on {@code key}: blocking, at most the timeout. Close it (try-with-resources). */
    public Hold hold(String key, long cost) {
        return Limiter.join(holdAsync(key, cost));
    }

    /**
     * The hold once its ACQUIRE is decided (by the server, or by the local limit when Redis is unavailable:
     * never completed exceptionally for an outage). Close it, or {@link Hold#releaseAsync()}.
     */
    public CompletableFuture<Hold> holdAsync(String key, long cost) {
        if (key == null) {
            throw new IllegalArgumentException("key must be a string, not null");
        }
        Limiter.checkCost(cost, 1);
        Hold h = new Hold(this, key, cost, newId());
        int allow = rl.breaker.allow(System.nanoTime());
        if (allow == Breaker.NO) {
            acquired(h, null);
            return CompletableFuture.completedFuture(h);
        }
        return rl.call(call(key, "ACQUIRE", h.id(), cost), allow == Breaker.PROBE, null, true).thenApply(reply -> {
            if (reply == null) {
                unanswered(h);
            }
            acquired(h, reply);
            return h;
        });
    }

    /** ACQUIREs sent but not answered whose RELEASE is still to be sent. */
    public int lateReleases() {
        synchronized (late) {
            return late.size();
        }
    }

    private void unanswered(Hold h) {
        synchronized (late) {
            late.put(h.id(), new Late(h.key(), System.nanoTime() + leaseMs * 1_000_000L));
            if (!lateTicking) {
                lateTicking = scheduleLate();
            }
        }
    }

    private boolean scheduleLate() {
        try {
            RateLimit.TIMER.schedule(this::lateTick, renewMs, TimeUnit.MILLISECONDS);
            return true;
        } catch (RejectedExecutionException e) {
            return false; // the JVM is shutting down: the leases lapse
        }
    }

    /** One tick: forget the lapsed, send the others' RELEASE while the breaker is closed. */
    private void lateTick() {
        List<Map.Entry<String, Late>> due = new ArrayList<>();
        synchronized (late) {
            long now = System.nanoTime();
            late.values().removeIf(l -> now - l.until() >= 0);
            if (late.isEmpty()) {
                lateTicking = false;
                return;
            }
            if (rl.breaker.state() == Breaker.State.CLOSED) {
                due.addAll(Map.copyOf(late).entrySet());
            }
            lateTicking = scheduleLate();
        }
        for (Map.Entry<String, Late> d : due) {
            String id = d.getKey();
            rl.call(call(d.getValue().key(), "RELEASE", id, 1), false, null, false).whenComplete((r, e) -> {
                if (e == null && r != null) {
                    synchronized (late) {
                        late.remove(id);
                    }
                }
            });
        }
    }

    /** Units held on {@code key} by the local in-flight limit (breaker open). */
    public long heldLocally(String key) {
        synchronized (local) {
            return local.getOrDefault(key, 0L);
        }
    }

    private RateLimit.Call call(String key, String action, String id, long cost) {
        List<String> argv = new ArrayList<>(6);
        argv.add(Long.toString(policy.limit()));
        argv.add(Long.toString(leaseMs));
        argv.add(action);
        argv.add(id);
        if (cost != 1) {
            argv.add("COST");
            argv.add(Long.toString(cost));
        }
        List<String> mod = new ArrayList<>(argv.size() + 2);
        mod.add("RL.CONCURRENCY");
        mod.add(key);
        mod.addAll(argv);
        return new RateLimit.Call(mod, new RateLimit.LuaCall("concurrency", List.of(key), argv));
    }

    private static List<?> reply5(Object reply) {
        if (!(reply instanceof List<?> r) || r.size() != 5) {
            throw new RateLimitException("unexpected RL.CONCURRENCY reply: " + reply);
        }
        return r;
    }

    /** Records the ACQUIRE's decision (reply null: Redis unavailable, the local limit decides). */
    private void acquired(Hold h, Object reply) {
        Decision d;
        if (reply == null) {
            d = localAcquire(h);
        } else {
            List<?> r = reply5(reply);
            boolean ok = RateLimit.num(r.get(0)) == 1;
            d = Decision.on(policy, rl.source(), ok, ok ? h.cost() : 0, RateLimit.num(r.get(1)),
                    RateLimit.num(r.get(2)), RateLimit.num(r.get(3)), RateLimit.num(r.get(4)));
        }
        h.decision = rl.count(d);
        synchronized (h) {
            if (!d.allowed()) {
                h.state = DONE;
                return;
            }
            h.state = HELD;
            if (!h.local) {
                schedule(new WeakReference<>(h), h);
            }
        }
    }

    private Decision localAcquire(Hold h) {
        long cost = h.cost();
        long held;
        boolean ok;
        synchronized (local) {
            held = local.getOrDefault(h.key(), 0L);
            ok = held + cost <= localCap;
            if (ok) {
                held += cost;
                local.put(h.key(), held);
                h.local = true;
            }
        }
        long retry = ok ? 0 : (cost > localCap ? -1 : 1);
        return Decision.on(policy, Source.PANIC, ok, ok ? cost : 0, localCap, Math.max(0, localCap - held), retry, 0);
    }

    /**
     * The next RENEW of a hold (the caller holds its lock). The timer's task holds it weakly: a hold
     * dropped without close() stops being renewed, and its lease lapses within leaseMs.
     */
    private void schedule(WeakReference<Hold> ref, Hold h) {
        try {
            h.timer = RateLimit.TIMER.schedule(() -> renew(ref), renewMs, TimeUnit.MILLISECONDS);
        } catch (RejectedExecutionException e) {
            h.timer = null; // the JVM is shutting down: the lease lapses
        }
    }

    private void renew(WeakReference<Hold> ref) {
        Hold h = ref.get();
        if (h == null) {
            return; // dropped without close(): its lease lapses
        }
        synchronized (h) {
            if (h.state != HELD) {
                return;
            }
        }
        rl.call(call(h.key(), "RENEW", h.id(), 1), false, null, false).whenComplete((reply, e) -> {
            Hold g = ref.get();
            if (g == null) {
                return;
            }
            synchronized (g) {
                if (g.state != HELD) {
                    return; // released meanwhile: a RENEW after the RELEASE holds nothing
                }
                long renewed = -1;
                if (e == null && reply instanceof List<?> r && r.size() == 5) {
                    renewed = RateLimit.num(r.get(0));
                }
                if (renewed == 1) {
                    g.renewals.incrementAndGet();
                } else if (renewed == 0) {
                    g.lost = true; // the lease lapsed, or the key is gone: no longer counted
                    return;
                }
                // answered 1, Redis unavailable (the breaker counted it), or an error: the next tick
                schedule(ref, g);
            }
        });
    }

    /** close(): stop the renewals, then RELEASE once (or give the local units back). */
    CompletableFuture<Void> release(Hold h) {
        synchronized (h) {
            if (h.state != HELD) {
                h.state = DONE;
                return CompletableFuture.completedFuture(null);
            }
            h.state = DONE;
            if (h.timer != null) {
                h.timer.cancel(false);
                h.timer = null;
            }
        }
        if (h.local) {
            synchronized (local) {
                long left = local.getOrDefault(h.key(), 0L) - h.cost();
                if (left > 0) {
                    local.put(h.key(), left);
                } else {
                    local.remove(h.key());
                }
            }
            return CompletableFuture.completedFuture(null);
        }
        // not retried when Redis is unavailable: the lease lapses within leaseMs of its last renewal
        return rl.call(call(h.key(), "RELEASE", h.id(), 1), false, null, false).thenApply(r -> null);
    }
}
