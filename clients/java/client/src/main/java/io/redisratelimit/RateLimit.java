package io.redisratelimit;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * One per Redis connection (clients/DESIGN.md, "The client object"): chooses the backend once (the module,
 * else the Lua twins), owns the breaker and the counters, and makes limiters.
 *
 * <p>Every call is bounded: on Lettuce by the library's own timer ({@code timeoutMs}; a call that
 * times out is cancelled, so Lettuce never sends it later), on Jedis by the client's socket timeout
 * (a client that could wait longer is refused at construction, naming the setting).
 */
public final class RateLimit {
    /** The backend a client chose. */
    public enum Backend {
        MODULE, LUA;

        @Override
        public String toString() {
            return name().toLowerCase();
        }
    }

    /** Construction settings: {@code RateLimit.options().timeoutMs(5).backend("auto")}. */
    public static final class Options {
        long timeoutMs = 5;
        String backend = "auto";
        Breaker breaker;
        long strictReplicas;
        long strictWaitMs = -1;

        /** Every call's bound, in ms (default 5). Jedis: its client's socket timeout must not be longer. */
        public Options timeoutMs(long ms) {
            if (ms < 1) {
                throw new IllegalArgumentException("timeoutMs must be >= 1, not " + ms);
            }
            this.timeoutMs = ms;
            return this;
        }

        /** "auto" (default), "module" or "lua". */
        public Options backend(String b) {
            if (!b.equals("auto") && !b.equals("module") && !b.equals("lua")) {
                throw new IllegalArgumentException("backend must be \"auto\", \"module\" or \"lua\", not \"" + b + "\"");
            }
            this.backend = b;
            return this;
        }

        public Options breaker(Breaker b) {
            this.breaker = b;
            return this;
        }

        /**
         * Strict mode: every grant is followed on the same connection by {@code WAIT replicas waitMs} and
         * counts only when that many replicas acknowledged it (else a failure: the panic limits decide).
         * {@code waitMs} &lt; 0: 80% of timeoutMs, rounded down.
         */
        public Options strict(long replicas, long waitMs) {
            if (replicas < 1) {
                throw new IllegalArgumentException("strict replicas must be an integer >= 1");
            }
            this.strictReplicas = replicas;
            this.strictWaitMs = waitMs;
            return this;
        }

        public Options strict() {
            return strict(1, -1);
        }
    }

    public static Options options() {
        return new Options();
    }

    static final ScheduledThreadPoolExecutor TIMER = new ScheduledThreadPoolExecutor(1, r -> {
        Thread t = new Thread(r, "redis-ratelimit-timer");
        t.setDaemon(true);
        return t;
    });

    static {
        TIMER.setRemoveOnCancelPolicy(true);
    }

    private static final String[] FAILURE_PREFIXES = {"BUSY", "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN",
        "NOREPLICAS", "READONLY", "MISCONF"};
    private static final List<String> DETECT = List.of("COMMAND", "INFO", "RL.TOKENBUCKET", "RL.MULTI",
            "RL.FIXEDWINDOW");

    final Driver driver;
    final long timeoutMs;
    final Breaker breaker;
    final Metrics metrics = new Metrics();
    private final Backend forced;
    private volatile Backend backend;
    private volatile boolean hasMulti;
    private volatile boolean hasFixedWindow;
    private CompletableFuture<Backend> detecting;
    private final long waitReplicas;
    private final long waitMs;
    private final Scripts scripts = Scripts.INSTANCE;

    RateLimit(Driver driver, Options o) {
        this.driver = driver;
        this.timeoutMs = o.timeoutMs;
        this.breaker = o.breaker != null ? o.breaker : new Breaker();
        this.breaker.metrics = metrics;
        this.forced = o.backend.equals("auto") ? null : Backend.valueOf(o.backend.toUpperCase());
        if (o.strictReplicas > 0) {
            long ms = o.strictWaitMs < 0 ? (long) Math.floor(o.timeoutMs * 0.8) : o.strictWaitMs;
            if (ms < 1 || ms >= o.timeoutMs) {
                throw new IllegalArgumentException("strict mode's WAIT timeout (" + ms + " ms: strict(replicas, "
                        + "waitMs)) must be at least 1 ms and shorter than the call's timeout (" + o.timeoutMs
                        + " ms: timeoutMs), so that the decision stays bounded");
            }
            waitReplicas = o.strictReplicas;
            waitMs = ms;
        } else {
            waitReplicas = 0;
            waitMs = 0;
        }
    }

    /**
     * A RateLimit on a Lettuce connection ({@code StatefulRedisConnection<String, String>}, Lettuce 6 or 7,
     * a standalone or Sentinel-managed primary). Refused (IllegalArgumentException naming the setting) when
     * its ClientOptions could break the promise of one call per decision, bounded: see LettuceDriver.
     */
    public static RateLimit lettuce(io.lettuce.core.api.StatefulRedisConnection<String, String> connection,
                                    Options options) {
        return new RateLimit(LettuceDriver.of(connection, options.timeoutMs), options);
    }

    /**
     * A RateLimit on a Jedis client (JedisPooled, Jedis 5 to 8): blocking calls, bounded by the client's own
     * socket timeout, which must be at most {@code timeoutMs}; a client that could wait longer (no socket
     * timeout, a longer connect timeout, a pool that waits for a connection without bound, retries) is
     * refused with an IllegalArgumentException naming the setting.
     */
    public static RateLimit jedis(redis.clients.jedis.UnifiedJedis client, Options options) {
        return new RateLimit(JedisDriver.of(client, options.timeoutMs), options);
    }

    /** The chosen backend (null before the first call or {@link #detect()}). */
    public Backend backend() {
        return backend;
    }

    /** Choose the backend now (blocking, at most the timeout); null when Redis did not answer. */
    public Backend detect() {
        try {
            return detectAsync().get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return null;
        } catch (ExecutionException e) {
            if (e.getCause() instanceof RateLimitException r) {
                throw r;
            }
            return null;
        }
    }

    /** One shared call per decision (or panic limits while Redis is away); panic: Panic.instances(1). */
    public Limiter limiter(Rule rule) {
        return new Limiter(this, rule, null);
    }

    public Limiter limiter(Rule rule, Panic panic) {
        return new Limiter(this, rule, panic);
    }

    /** Two-tier: decisions from local reservoirs leased in batches (clients/DESIGN.md, "Two-tier"). */
    public LeasedLimiter leased(Policy policy, LeasedLimiter.Options options) {
        return new LeasedLimiter(this, policy, options);
    }

    /**
     * An in-flight limit on a concurrency policy: {@code try (Hold h = inflight.hold(key, cost)) {...}}
     * (clients/DESIGN.md, "In-flight limits: the guard"). Options: renewMs, and the local limit's Panic.
     */
    public io.redisratelimit.InFlight inflight(Policy policy, io.redisratelimit.InFlight.Options options) {
        return new io.redisratelimit.InFlight(this, policy, options);
    }

    public io.redisratelimit.InFlight inflight(Policy policy) {
        return new io.redisratelimit.InFlight(this, policy, null);
    }

    public static LeasedLimiter.Options lease() {
        return new LeasedLimiter.Options();
    }

    /** The counters (Node's camelCase names) and "state": closed, open, half_open. */
    public Map<String, Object> metrics() {
        Map<String, Object> m = new LinkedHashMap<>(metrics.snapshot());
        m.put("state", breaker.state().toString());
        return m;
    }

    // ---- detection ----

    synchronized CompletableFuture<Backend> detectAsync() {
        if (backend != null) {
            return CompletableFuture.completedFuture(backend);
        }
        if (forced == Backend.LUA) {
            setBackend(null, null);
            return CompletableFuture.completedFuture(backend);
        }
        if (detecting != null && !detecting.isDone()) {
            return detecting;
        }
        CompletableFuture<Backend> d = bounded(driver.send(DETECT)).handle((reply, exc) -> {
            Throwable e = unwrap(exc);
            if (e == null) {
                setBackend(reply, null);
            } else if (e instanceof Driver.ReplyError r && !isOutage(r)) {
                setBackend(null, r); // COMMAND renamed or not permitted (managed services): Lua
            } else {
                throw new CompletionException(e);
            }
            return backend;
        });
        detecting = d;
        return d;
    }

    private void setBackend(Object reply, Driver.ReplyError refused) {
        boolean module = false;
        boolean multi = false;
        boolean fixed = false;
        if (refused != null) {
            if (forced == Backend.MODULE) {
                throw new UnsupportedException("backend \"module\" but COMMAND INFO failed: " + refused.getMessage());
            }
        } else if (reply != null) {
            if (!(reply instanceof List<?> l) || l.size() != 3) {
                throw new RateLimitException("unexpected COMMAND INFO reply: " + reply);
            }
            module = present(l.get(0));
            multi = present(l.get(1));
            fixed = present(l.get(2));
        }
        if (forced == Backend.MODULE && !module) {
            throw new UnsupportedException("backend \"module\" but the server has no RL.* commands");
        }
        Backend b = forced != null ? forced : (module ? Backend.MODULE : Backend.LUA);
        hasMulti = b == Backend.MODULE ? multi : scripts.sha.containsKey("multi");
        hasFixedWindow = b == Backend.MODULE ? fixed : scripts.sha.containsKey("fixedwindow");
        backend = b;
    }

    private static boolean present(Object entry) {
        return entry != null && !(entry instanceof List<?> l && l.isEmpty());
    }

    // ---- one call ----

    /** The Lua twin of a call: script name, keys, argv. */
    record LuaCall(String script, List<String> keys, List<String> argv) {
    }

    /** A call's module arguments and Lua twin. */
    record Call(List<String> module, LuaCall lua) {
    }

    static Call callFor(Rule rule, List<String> keys, List<String> opts) {
        if (rule instanceof Policy p) {
            List<String> args = p.args();
            args.addAll(opts);
            List<String> mod = new ArrayList<>(args.size() + 2);
            mod.add(p.command());
            mod.add(keys.get(0));
            mod.addAll(args);
            return new Call(mod, new LuaCall(p.kind().script(), List.of(keys.get(0)), args));
        }
        List<String> specs = new ArrayList<>();
        for (Policy p : rule.parts()) {
            specs.addAll(p.multiSpec());
        }
        specs.addAll(opts);
        List<String> mod = new ArrayList<>();
        mod.add("RL.MULTI");
        mod.add(Integer.toString(keys.size()));
        mod.addAll(keys);
        mod.addAll(specs);
        return new Call(mod, new LuaCall("multi", keys, specs));
    }

    void checkRule(Rule rule) {
        Backend b = backend;
        if (b == null) {
            return;
        }
        if (rule instanceof AllOf && !hasMulti) {
            throw new UnsupportedException("allOf needs RL.MULTI, which this " + b + " backend does not have");
        }
        if (rule.fixed() && !hasFixedWindow) {
            throw new UnsupportedException("fixedWindow needs RL.FIXEDWINDOW, which this " + b
                    + " backend does not have (upgrade the module, or backend \"lua\")");
        }
    }

    /** What the call in flight is (so the timer can cancel it). */
    private static final class InFlight {
        volatile CompletableFuture<?> current;

        <T> CompletableFuture<T> track(CompletableFuture<T> f) {
            current = f;
            return f;
        }

        void cancel() {
            CompletableFuture<?> c = current;
            if (c != null) {
                c.cancel(false);
            }
        }
    }

    /**
     * One Redis call (detecting the backend the first time): its reply, or null when Redis is unavailable
     * (the breaker has counted it). Other errors complete it with a RateLimitException. Never longer than
     * timeoutMs on a non-blocking driver.
     */
    CompletableFuture<Object> call(Call c, boolean probe, Rule rule, boolean grant) {
        long t0 = System.nanoTime();
        InFlight fl = new InFlight();
        CompletableFuture<Object> out = new CompletableFuture<>();
        try {
            CompletableFuture<Backend> det = backend != null ? CompletableFuture.completedFuture(backend)
                    : detectAsync();
            det.thenCompose(b -> {
                if (rule != null) {
                    checkRule(rule);
                }
                metrics.calls.increment();
                return send(c, grant, fl);
            }).whenComplete((v, e) -> {
                if (e == null) {
                    out.complete(v);
                } else {
                    out.completeExceptionally(unwrap(e));
                }
            });
        } catch (RuntimeException e) {
            out.completeExceptionally(e);
        }
        if (!out.isDone() && !driver.blocking()) {
            ScheduledFuture<?> t = TIMER.schedule(() -> {
                if (out.completeExceptionally(new TimeoutException("no reply within " + timeoutMs + " ms"))) {
                    fl.cancel();
                }
            }, timeoutMs * 1_000_000L, TimeUnit.NANOSECONDS);
            out.whenComplete((v, e) -> t.cancel(false));
        }
        return out.handle((reply, exc) -> exc == null ? answered(reply, probe, grant, t0) : failed(exc, probe));
    }

    private CompletableFuture<Object> send(Call c, boolean grant, InFlight fl) {
        if (grant && waitReplicas > 0) {
            return sendStrict(c, fl);
        }
        if (backend == Backend.MODULE) {
            return fl.track(driver.send(c.module()));
        }
        LuaCall l = c.lua();
        String sha = scripts.sha.get(l.script());
        if (sha == null) {
            throw new UnsupportedException("the jar ships no " + l.script() + ".lua");
        }
        return fl.track(driver.send(evalArgs("EVALSHA", sha, l))).handle((v, e) -> {
            Throwable x = unwrap(e);
            if (x == null) {
                return CompletableFuture.completedFuture(v);
            }
            if (isNoScript(x)) {
                // first use on this node (or after SCRIPT FLUSH / a restart): EVAL runs it and caches it
                return fl.track(driver.send(evalArgs("EVAL", scripts.text.get(l.script()), l)));
            }
            return CompletableFuture.<Object>failedFuture(x);
        }).thenCompose(f -> f);
    }

    private CompletableFuture<Object> sendStrict(Call c, InFlight fl) {
        List<List<String>> cmds = new ArrayList<>();
        if (backend == Backend.MODULE) {
            cmds.add(c.module());
        } else {
            LuaCall l = c.lua();
            cmds.add(evalArgs("EVALSHA", scripts.sha.get(l.script()), l));
            cmds.add(evalArgs("EVAL", scripts.text.get(l.script()), l));
        }
        return strictStep(cmds, 0, fl);
    }

    private CompletableFuture<Object> strictStep(List<List<String>> cmds, int i, InFlight fl) {
        return fl.track(driver.sendWithWait(cmds.get(i), waitReplicas, waitMs)).thenCompose(r -> {
            Object reply = r[0];
            Object acked = r[1];
            if (reply instanceof Throwable t && isNoScript(t) && i + 1 < cmds.size()) {
                return strictStep(cmds, i + 1, fl);
            }
            if (reply instanceof Throwable t) {
                return CompletableFuture.failedFuture(t);
            }
            if (acked instanceof Throwable t) {
                return CompletableFuture.failedFuture(t);
            }
            return CompletableFuture.completedFuture(new Object[] {reply, acked});
        });
    }

    private static List<String> evalArgs(String cmd, String script, LuaCall l) {
        List<String> a = new ArrayList<>(l.keys().size() + l.argv().size() + 3);
        a.add(cmd);
        a.add(script);
        a.add(Integer.toString(l.keys().size()));
        a.addAll(l.keys());
        a.addAll(l.argv());
        return a;
    }

    private Object answered(Object reply, boolean probe, boolean grant, long t0) {
        if (grant && waitReplicas > 0) {
            Object[] r = (Object[]) reply;
            reply = r[0];
            if (num(((List<?>) reply).get(0)) != 0 && num(r[1]) < waitReplicas) {
                metrics.unreplicated.increment();
                metrics.failures.increment();
                breaker.failure(probe);
                return null;
            }
        }
        breaker.success(System.nanoTime() - t0, probe);
        return reply;
    }

    private Object failed(Throwable exc, boolean probe) {
        Throwable e = unwrap(exc);
        boolean ours = e instanceof RateLimitException || e instanceof IllegalArgumentException;
        if (!ours && (isOutage(e) || (isUnknownCommand(e) && lostBackend()))) {
            metrics.failures.increment();
            breaker.failure(probe);
            return null;
        }
        if (probe) {
            breaker.success(0, true);
        }
        if (ours) {
            throw (RuntimeException) e;
        }
        throw new RateLimitException(e.getMessage(), e);
    }

    /**
     * An RL.* command is unknown where the module was found: the primary changed (a failover to a server
     * without the module). The call is a failure; the next one detects the backend again.
     */
    private synchronized boolean lostBackend() {
        if (forced != null) {
            return false;
        }
        if (backend == Backend.MODULE) {
            backend = null;
            metrics.redetects.increment();
        }
        return true;
    }

    static boolean isOutage(Throwable e) {
        if (e instanceof Driver.ReplyError) {
            String m = e.getMessage() == null ? "" : e.getMessage();
            for (String p : FAILURE_PREFIXES) {
                if (m.startsWith(p)) {
                    return true;
                }
            }
            return false;
        }
        return !(e instanceof RateLimitException || e instanceof IllegalArgumentException);
    }

    static boolean isUnknownCommand(Throwable e) {
        if (!(e instanceof Driver.ReplyError)) {
            return false;
        }
        String m = String.valueOf(e.getMessage()).toLowerCase();
        return m.startsWith("unknown command") || m.startsWith("err unknown command");
    }

    static boolean isNoScript(Throwable e) {
        return e instanceof Driver.ReplyError && String.valueOf(e.getMessage()).startsWith("NOSCRIPT");
    }

    static Throwable unwrap(Throwable e) {
        while ((e instanceof CompletionException || e instanceof ExecutionException) && e.getCause() != null) {
            e = e.getCause();
        }
        return e;
    }

    /** A future completed within timeoutMs (else with a TimeoutException, the future cancelled). */
    <T> CompletableFuture<T> bounded(CompletableFuture<T> f) {
        if (f.isDone() || driver.blocking()) {
            return f;
        }
        CompletableFuture<T> out = new CompletableFuture<>();
        ScheduledFuture<?> t = TIMER.schedule(() -> {
            if (out.completeExceptionally(new TimeoutException("no reply within " + timeoutMs + " ms"))) {
                f.cancel(false);
            }
        }, timeoutMs * 1_000_000L, TimeUnit.NANOSECONDS);
        f.whenComplete((v, e) -> {
            t.cancel(false);
            if (e == null) {
                out.complete(v);
            } else {
                out.completeExceptionally(unwrap(e));
            }
        });
        return out;
    }

    static long num(Object o) {
        if (o instanceof Long l) {
            return l;
        }
        if (o instanceof Number n) {
            return n.longValue();
        }
        if (o instanceof byte[] b) {
            return Long.parseLong(new String(b, java.nio.charset.StandardCharsets.UTF_8));
        }
        return Long.parseLong(String.valueOf(o));
    }

    // ---- decisions ----

    Source source() {
        return backend == Backend.LUA ? Source.LUA : Source.MODULE;
    }

    static Decision toDecision(Object reply, Rule rule, long cost, boolean partial, Source source, boolean refund) {
        List<?> r = (List<?>) reply;
        long a = num(r.get(0));
        long granted = (partial || refund) ? a : (a == 1 ? cost : 0);
        boolean allowed = refund || granted == cost;
        if (rule instanceof Policy p) {
            return Decision.on(p, source, allowed, granted, num(r.get(1)), num(r.get(2)), num(r.get(3)),
                    num(r.get(4)));
        }
        int b = (int) num(r.get(5));
        List<?> per = (List<?>) r.get(6);
        List<Decision.Part> parts = new ArrayList<>(per.size());
        List<Policy> ps = rule.parts();
        for (int i = 0; i < per.size(); i++) {
            List<?> x = (List<?>) per.get(i);
            parts.add(new Decision.Part(ps.get(i).name(), num(x.get(0)), num(x.get(1)), num(x.get(2)),
                    num(x.get(3)), num(x.get(4))));
        }
        return new Decision(allowed, granted, num(r.get(1)), num(r.get(2)), num(r.get(3)), num(r.get(4)),
                rule.name(), ps.get(b).name(), source, List.copyOf(parts), rule);
    }

    static Decision panicDecision(PanicBuckets buckets, Rule rule, List<String> keys, long cost, boolean partial,
                                  boolean dryRun) {
        List<Policy> ps = rule.parts();
        long[][] res = buckets.decide(keys, cost, ps, partial, dryRun);
        if (rule instanceof Policy p) {
            long[] x = res[0];
            return Decision.on(p, Source.PANIC, x[0] == cost, x[0], x[1], x[2], x[3], x[4]);
        }
        long g = res[0][0] / ps.get(0).weight();
        List<Decision.Part> parts = new ArrayList<>();
        for (int i = 0; i < res.length; i++) {
            parts.add(new Decision.Part(ps.get(i).name(), res[i][0], res[i][1], res[i][2], res[i][3], res[i][4]));
        }
        int b = 0;
        if (g == cost) { // granted: the part with the fewest whole requests left
            for (int i = 1; i < res.length; i++) {
                if (res[i][2] / ps.get(i).weight() < res[b][2] / ps.get(b).weight()) {
                    b = i;
                }
            }
        } else { // denied: the longest wait, -1 counting as longest
            for (int i = 1; i < res.length; i++) {
                boolean ni = res[i][3] < 0;
                boolean nb = res[b][3] < 0;
                if ((ni && !nb) || (ni == nb && res[i][3] > res[b][3])) {
                    b = i;
                }
            }
        }
        long retry = 0;
        if (g != cost) {
            boolean never = false;
            long max = 0;
            for (long[] x : res) {
                never |= x[3] < 0;
                max = Math.max(max, x[3]);
            }
            retry = never ? -1 : Math.max(1, max);
        }
        return new Decision(g == cost, g, res[b][1], res[b][2], retry, res[b][4], rule.name(), ps.get(b).name(),
                Source.PANIC, List.copyOf(parts), rule);
    }

    Decision count(Decision d) {
        switch (d.source()) {
            case MODULE -> metrics.decisionsModule.increment();
            case LUA -> metrics.decisionsLua.increment();
            case LOCAL -> metrics.decisionsLocal.increment();
            default -> metrics.decisionsPanic.increment();
        }
        if (!d.allowed()) {
            metrics.denied.increment();
        }
        return d;
    }
}
