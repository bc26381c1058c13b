package io.redisratelimit;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.regex.Pattern;

/** One limit: its algorithm, parameters and name (clients/DESIGN.md, "Policies"). */
public final class Policy implements Rule {
    /** Numbers are integers 1 .. 2^53 - 1, as in every client. */
    public static final long MAX = (1L << 53) - 1;
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9._-]{1,64}");

    /** A single policy's algorithm; its module command is "RL." + kind in capitals. */
    public enum Kind {
        TOKENBUCKET, SLIDINGLOG, SLIDINGCOUNTER, FIXEDWINDOW,
        /** An in-flight limit (RL.CONCURRENCY): not a rate, used only by {@link RateLimit#inflight}. */
        CONCURRENCY;

        /** The Lua twin's name (tokenbucket.lua ...). */
        public String script() {
            return name().toLowerCase();
        }
    }

    private final Kind kind;
    private final String name;
    private final long limit;
    private final long windowMs;
    private final long[] params;
    private final long rate;
    private final long periodMs;
    private final long weight;
    private final boolean fromFirst;

    private Policy(Kind kind, String name, long limit, long[] params, long windowMs, long rate,
                   long periodMs, long weight, boolean fromFirst) {
        this.kind = kind;
        this.name = name;
        this.limit = limit;
        this.params = params;
        this.windowMs = windowMs;
        this.rate = rate;
        this.periodMs = periodMs;
        this.weight = check("weight", weight);
        this.fromFirst = fromFirst;
    }

    static long check(String what, long v) {
        if (v < 1 || v > MAX) {
            throw new IllegalArgumentException(what + " must be an integer from 1 to 2^53-1, not " + v);
        }
        return v;
    }

    static String checkName(String v) {
        if (v == null || !NAME.matcher(v).matches()) {
            throw new IllegalArgumentException("policy name '" + v + "': 1-64 of A-Z a-z 0-9 . _ -");
        }
        return v;
    }

    /** At most {@code capacity} tokens; {@code rate} come back every {@code periodMs}. */
    public static Policy tokenBucket(String name, long capacity, long rate, long periodMs) {
        checkName(name);
        check("capacity", capacity);
        check("rate", rate);
        check("periodMs", periodMs);
        // an empty bucket fills in this time: ceil(capacity * periodMs / rate), without overflow
        long window = java.math.BigInteger.valueOf(capacity).multiply(java.math.BigInteger.valueOf(periodMs))
                .add(java.math.BigInteger.valueOf(rate - 1)).divide(java.math.BigInteger.valueOf(rate))
                .min(java.math.BigInteger.valueOf(Long.MAX_VALUE)).longValue();
        return new Policy(Kind.TOKENBUCKET, name, capacity, new long[] {capacity, rate, periodMs}, window,
                rate, periodMs, 1, false);
    }

    /** Exact: at most {@code limit} units in any {@code windowMs}. */
    public static Policy slidingLog(String name, long limit, long windowMs) {
        return windowed(Kind.SLIDINGLOG, name, limit, windowMs, false);
    }

    /** Approximate sliding window (two fixed windows, weighted). */
    public static Policy slidingCounter(String name, long limit, long windowMs) {
        return windowed(Kind.SLIDINGCOUNTER, name, limit, windowMs, false);
    }

    /** At most {@code limit} units per window on the epoch's multiples of {@code windowMs}. */
    public static Policy fixedWindow(String name, long limit, long windowMs) {
        return windowed(Kind.FIXEDWINDOW, name, limit, windowMs, false);
    }

    /** A fixed window; {@code fromFirst}: each window starts at its first grant (FROMFIRST). */
    public static Policy fixedWindow(String name, long limit, long windowMs, boolean fromFirst) {
        return windowed(Kind.FIXEDWINDOW, name, limit, windowMs, fromFirst);
    }

    /**
     * At most {@code limit} units in flight at once, each hold a lease of {@code leaseMs} on the server's
     * clock (RL.CONCURRENCY). Not a rate: use it with {@link RateLimit#inflight}; limiter(), leased() and
     * allOf refuse it (IllegalArgumentException). Its windowMs (headers' {@code w}) is leaseMs.
     */
    public static Policy concurrency(String name, long limit, long leaseMs) {
        checkName(name);
        check("limit", limit);
        check("leaseMs", leaseMs);
        return new Policy(Kind.CONCURRENCY, name, limit, new long[] {limit, leaseMs}, leaseMs, limit, leaseMs, 1,
                false);
    }

    /** A concurrency policy given where a rate is expected: IllegalArgumentException naming it. */
    static void notARate(Rule rule, String what) {
        for (Policy p : rule.parts()) {
            if (p.kind == Kind.CONCURRENCY) {
                throw new IllegalArgumentException(what + " takes rates; concurrency '" + p.name
                        + "' is an in-flight limit: use RateLimit.inflight()");
            }
        }
    }

    private static Policy windowed(Kind kind, String name, long limit, long windowMs, boolean fromFirst) {
        checkName(name);
        check("limit", limit);
        check("windowMs", windowMs);
        return new Policy(kind, name, limit, new long[] {limit, windowMs}, windowMs, limit, windowMs, 1,
                fromFirst);
    }

    /** All the policies must grant, or none takes anything (RL.MULTI); named by the parts joined by ".". */
    public static AllOf allOf(Policy... policies) {
        return allOf(null, policies);
    }

    /** {@link #allOf(Policy...)} with its own name (null: the default). */
    public static AllOf allOf(String name, Policy... policies) {
        if (policies.length < 1 || policies.length > 16) {
            throw new IllegalArgumentException("allOf takes 1 to 16 policies");
        }
        List<String> names = new ArrayList<>();
        for (Policy p : policies) {
            notARate(p, "allOf");
            names.add(p.name);
        }
        if (new HashSet<>(names).size() != names.size()) {
            throw new IllegalArgumentException("allOf: policy names must be distinct, got " + names);
        }
        if (name == null) {
            name = String.join(".", names);
            if (name.length() > 64) {
                throw new IllegalArgumentException("allOf: the default name '" + name
                        + "' is longer than 64 characters; give allOf a name");
            }
        }
        return new AllOf(List.of(policies), checkName(name));
    }

    /** The same policy counting WEIGHT w units per unit of cost in allOf. */
    public Policy weighted(long w) {
        return new Policy(kind, name, limit, params, windowMs, rate, periodMs, w, fromFirst);
    }

    public Kind kind() {
        return kind;
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public long limit() {
        return limit;
    }

    @Override
    public long windowMs() {
        return windowMs;
    }

    @Override
    public List<Policy> parts() {
        return List.of(this);
    }

    @Override
    public boolean fixed() {
        return kind == Kind.FIXEDWINDOW;
    }

    public long weight() {
        return weight;
    }

    public boolean fromFirst() {
        return fromFirst;
    }

    /** Units regained per {@link #periodMs()} (what panic buckets refill at). */
    public long rate() {
        return rate;
    }

    public long periodMs() {
        return periodMs;
    }

    /** The module command: RL.TOKENBUCKET ... */
    public String command() {
        return "RL." + kind.name();
    }

    /** The arguments after the key of its own command (and Lua twin). */
    List<String> args() {
        List<String> a = new ArrayList<>();
        for (long p : params) {
            a.add(Long.toString(p));
        }
        if (fromFirst) {
            a.add("FROMFIRST");
        }
        return a;
    }

    /** Its part of RL.MULTI: KIND params [WEIGHT w] [FROMFIRST]. */
    List<String> multiSpec() {
        List<String> a = new ArrayList<>();
        a.add(kind.name());
        for (long p : params) {
            a.add(Long.toString(p));
        }
        if (weight != 1) {
            a.add("WEIGHT");
            a.add(Long.toString(weight));
        }
        if (fromFirst) {
            a.add("FROMFIRST");
        }
        return a;
    }

    @Override
    public String toString() {
        return "<" + kind.script() + " '" + name + "' " + Arrays.toString(params) + ">";
    }
}
