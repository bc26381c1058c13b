package io.redisratelimit.spring;

import java.math.BigDecimal;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.MeterRegistry;
import org.springframework.cloud.gateway.event.FilterArgsEvent;
import org.springframework.cloud.gateway.filter.ratelimit.AbstractRateLimiter;
import org.springframework.cloud.gateway.support.ConfigurationService;
import reactor.core.publisher.Mono;

/**
 * A drop-in for Spring Cloud Gateway's RedisRateLimiter: the same route
 * arguments ({@code redis-rate-limiter.replenishRate}, {@code .burstCapacity},
 * {@code .requestedTokens}), the same response headers, the same KeyResolver
 * and empty-key handling (those belong to the RequestRateLimiter filter),
 * but one RL.TOKENBUCKET call with exact integer tokens instead of a Lua
 * script over float tokens kept in strings. Spring's headers are kept, and a
 * denial also carries Retry-After.
 */
public class RlRateLimiter extends AbstractRateLimiter<RlRateLimiter.Config> {

    public static final String CONFIGURATION_PROPERTY_NAME = "redis-rate-limiter";
    public static final String REMAINING_HEADER = "X-RateLimit-Remaining";
    public static final String REPLENISH_RATE_HEADER = "X-RateLimit-Replenish-Rate";
    public static final String BURST_CAPACITY_HEADER = "X-RateLimit-Burst-Capacity";
    public static final String REQUESTED_TOKENS_HEADER = "X-RateLimit-Requested-Tokens";

    /** The route arguments, as Spring's Config names them; doubles are accepted and mapped exactly. */
    public static class Config {
        private double replenishRate;
        private double burstCapacity = 1;
        private double requestedTokens = 1;
        public double getReplenishRate() { return replenishRate; }
        public Config setReplenishRate(double v) { replenishRate = v; return this; }
        public double getBurstCapacity() { return burstCapacity; }
        public Config setBurstCapacity(double v) { burstCapacity = v; return this; }
        public double getRequestedTokens() { return requestedTokens; }
        public Config setRequestedTokens(double v) { requestedTokens = v; return this; }
    }

    private final RlCommands redis;
    private final Duration timeout;
    private final boolean includeHeaders;
    private final Counter failures;
    private final Map<String, BucketMapping> mapped = new ConcurrentHashMap<>();
    private final String keyBefore;
    private final String keyBetween;
    private final String keyAfter;

    public RlRateLimiter(RlCommands redis, ConfigurationService configurationService, Duration timeout,
                         boolean includeHeaders, MeterRegistry registry) {
        this(redis, configurationService, timeout, includeHeaders, registry, DEFAULT_KEY_PATTERN);
    }

    /** Spring's prefix, but per id and route: Spring's keys are per id only (one hot slot per id). */
    public static final String DEFAULT_KEY_PATTERN = "request_rate_limiter.{$id}.$route";

    /** keyPattern: $id then $route, e.g. rl:{$id}:$route, the Python and Node gateways' keys. */
    public RlRateLimiter(RlCommands redis, ConfigurationService configurationService, Duration timeout,
                         boolean includeHeaders, MeterRegistry registry, String keyPattern) {
        super(Config.class, CONFIGURATION_PROPERTY_NAME, configurationService);
        int id = keyPattern.indexOf("$id");
        int route = keyPattern.indexOf("$route");
        if (id < 0 || route < id) {
            throw new IllegalArgumentException("ratelimit.rate-limiter.key-pattern = " + keyPattern
                + ": names $id, then $route");
        }
        this.keyBefore = keyPattern.substring(0, id);
        this.keyBetween = keyPattern.substring(id + 3, route);
        this.keyAfter = keyPattern.substring(route + 6);
        this.redis = redis;
        this.timeout = timeout;
        this.includeHeaders = includeHeaders;
        this.failures = Counter.builder("rate_limit.redis.failures").tag("limiter", "rl-rate-limiter")
            .register(registry);
    }

    /** Binds the route's arguments (as Spring's does), then maps them, refusing what has no exact form. */
    @Override
    public void onApplicationEvent(FilterArgsEvent event) {
        super.onApplicationEvent(event);
        Config c = getConfig().get(event.getRouteId());
        if (c != null) {
            mapped.put(event.getRouteId(), map("route " + event.getRouteId(), c));
        }
    }

    static BucketMapping map(String where, Config c) {
        return BucketMapping.of(where, c.getReplenishRate(), c.getBurstCapacity(), c.getRequestedTokens());
    }

    /** The mapping in force for a route (for tests and diagnostics). */
    public BucketMapping mapping(String routeId) {
        return mapped.get(routeId);
    }

    @Override
    public Mono<Response> isAllowed(String routeId, String id) {
        Config c = getConfig().get(routeId);
        if (c == null) {
            throw new IllegalArgumentException("No Configuration found for route " + routeId);
        }
        BucketMapping m = mapped.computeIfAbsent(routeId, r -> map("route " + r, c));
        if (m.blocksAll) {
            return Mono.just(new Response(false, headers(c, 0, -1)));
        }
        String key = keyBefore + id + keyBetween + routeId + keyAfter;
        return redis.tokenBucket(key, m.capacity, m.rate, m.periodMs, m.cost, timeout)
            .map(r -> new Response(r[0] != 0, headers(c, r[2], r[0] != 0 ? -1 : r[3])))
            .onErrorResume(e -> {
                // As Spring's: a Redis failure lets the request through, remaining -1.
                failures.increment();
                return Mono.just(new Response(true, headers(c, -1, -1)));
            });
    }

    private Map<String, String> headers(Config c, long remaining, long retryAfterMs) {
        Map<String, String> h = new LinkedHashMap<>();
        if (includeHeaders) {
            h.put(REMAINING_HEADER, Long.toString(remaining));
            h.put(REPLENISH_RATE_HEADER, plain(c.getReplenishRate()));
            h.put(BURST_CAPACITY_HEADER, plain(c.getBurstCapacity()));
            h.put(REQUESTED_TOKENS_HEADER, plain(c.getRequestedTokens()));
            if (retryAfterMs >= 0) {
                h.put("Retry-After", Long.toString(Math.max(1, (retryAfterMs + 999) / 1000)));
            }
        }
        return h;
    }

    /** 10 for 10.0 (as Spring's int properties print), 0.5 for 0.5. */
    static String plain(double v) {
        return BigDecimal.valueOf(v).stripTrailingZeros().toPlainString();
    }
}
