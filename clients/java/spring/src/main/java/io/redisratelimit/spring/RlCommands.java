package io.redisratelimit.spring;

import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.Supplier;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.redisratelimit.Breaker;
import io.redisratelimit.Decision;
import io.redisratelimit.Limiter;
import io.redisratelimit.Policy;
import io.redisratelimit.RateLimit;
import io.redisratelimit.Source;
import reactor.core.publisher.Mono;
import reactor.core.scheduler.Schedulers;

/**
 * One call per decision through the Java client library
 * (io.redisratelimit:redis-ratelimit-client, clients/java/client): a
 * token bucket or a sliding log over one Lettuce connection, as
 * RL.TOKENBUCKET / RL.SLIDINGLOG where the module is loaded and as their
 * Lua twins (EVALSHA) where it is not (managed Redis), told apart by the
 * library's detection. The answer is the module's five integers
 * (allowed, limit, remaining, retry_after_ms, reset_after_ms). A call the
 * library could not make (Redis slow, down, or its breaker open: a panic
 * decision) is an error here, so the starter's fail-open or panic limits
 * and its failure counter decide it, as they always have. Each call is
 * also bounded by its own timeout on a timer of its own.
 */
public final class RlCommands implements AutoCloseable {

    private final RedisClient client;
    private final RedisURI uri;
    private volatile StatefulRedisConnection<String, String> connection;
    private final java.util.concurrent.atomic.AtomicBoolean connecting = new java.util.concurrent.atomic.AtomicBoolean();
    /** The library on the current connection: one RateLimit per timeout, one Limiter per policy. */
    private volatile Library library;

    /** A breaker for each RateLimit (the library's defaults unless ratelimit.breaker.* says otherwise). */
    private final Supplier<Breaker> breakers;

    private record Library(StatefulRedisConnection<String, String> connection, Supplier<Breaker> breakers,
                           Map<Long, RateLimit> byTimeout, Map<String, Limiter> limiters) {
        Limiter limiter(long timeoutMs, String name, Policy policy) {
            return limiters.computeIfAbsent(timeoutMs + " " + name, k -> byTimeout.computeIfAbsent(timeoutMs,
                t -> RateLimit.lettuce(connection, RateLimit.options().timeoutMs(t).breaker(breakers.get())))
                .limiter(policy));
        }
    }

    /**
     * Connects now if it can; a server down at startup does not stop the
     * application: calls fail (and are decided without Redis) until a
     * connection, retried in the background on each call, is up. While
     * disconnected Lettuce rejects commands rather than queueing them.
     */
    public RlCommands(String uri) {
        this(uri, Breaker::new);
    }

    /** As above, each RateLimit with a breaker from {@code breakers} (ratelimit.breaker.*). */
    public RlCommands(String uri, Supplier<Breaker> breakers) {
        this.breakers = breakers;
        this.uri = RedisURI.create(uri);
        this.client = RedisClient.create();
        this.client.setOptions(ClientOptions.builder()
            .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
            .autoReconnect(true)
            .build());
        try {
            use(client.connect(StringCodec.UTF8, this.uri));
        } catch (RuntimeException e) {
            connectInBackground();
        }
    }

    private void connectInBackground() {
        if (connection != null || !connecting.compareAndSet(false, true)) {
            return;
        }
        client.connectAsync(StringCodec.UTF8, uri).whenComplete((c, e) -> {
            if (c != null) {
                use(c);
            }
            connecting.set(false);
        });
    }

    private void use(StatefulRedisConnection<String, String> c) {
        library = new Library(c, breakers, new ConcurrentHashMap<>(), new ConcurrentHashMap<>());
        connection = c;
    }

    /** RL.TOKENBUCKET key capacity rate period_ms COST cost (or its twin). */
    public Mono<long[]> tokenBucket(String key, long capacity, long rate, long periodMs, long cost,
                                    Duration timeout) {
        String name = "tb " + capacity + " " + rate + " " + periodMs;
        return call(key, cost, timeout, name, () -> Policy.tokenBucket("token-bucket", capacity, rate, periodMs));
    }

    /** RL.SLIDINGLOG key limit window_ms COST cost (or its twin). */
    public Mono<long[]> slidingLog(String key, long limit, long windowMs, long cost, Duration timeout) {
        String name = "sl " + limit + " " + windowMs;
        return call(key, cost, timeout, name, () -> Policy.slidingLog("sliding-log", limit, windowMs));
    }

    private Mono<long[]> call(String key, long cost, Duration timeout, String name,
                              java.util.function.Supplier<Policy> policy) {
        return Mono.defer(() -> {
                Library lib = library;
                if (lib == null) {
                    connectInBackground();
                    return Mono.error(new IllegalStateException("not connected to " + uri));
                }
                Limiter limiter = lib.limiter(Math.max(1, timeout.toMillis()), name, policy.get());
                return Mono.fromFuture(() -> limiter.limitAsync(key, cost));
            })
            .timeout(timeout, Schedulers.parallel())
            .map(RlCommands::toLongs);
    }

    private static long[] toLongs(Decision d) {
        if (d.source() == Source.PANIC) {
            throw new IllegalStateException("Redis did not decide (no answer within the timeout, or the breaker is open)");
        }
        return new long[] {d.allowed() ? 1 : 0, d.limit(), d.remaining(), d.retryAfterMs(), d.resetAfterMs()};
    }

    /** Which backend decides: MODULE or LUA (null before the first call). */
    public String backend() {
        Library lib = library;
        return lib == null ? null : lib.byTimeout().values().stream().map(r -> String.valueOf(r.backend()))
            .findFirst().orElse(null);
    }

    /**
     * The client library's counters and its breaker's state (RateLimit.metrics()),
     * one map per call timeout in milliseconds; empty before the first call.
     */
    public Map<Long, Map<String, Object>> libraryMetrics() {
        Library lib = library;
        Map<Long, Map<String, Object>> m = new java.util.TreeMap<>();
        if (lib != null) {
            lib.byTimeout().forEach((t, rl) -> m.put(t, rl.metrics()));
        }
        return m;
    }

    @Override
    public void close() {
        StatefulRedisConnection<String, String> c = connection;
        if (c != null) {
            c.close();
        }
        client.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    }
}
