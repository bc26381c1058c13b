package io.redisratelimit.spring;

import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.HexFormat;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import io.micrometer.core.instrument.Counter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Timer;
import org.springframework.cloud.gateway.filter.GatewayFilterChain;
import org.springframework.cloud.gateway.filter.GlobalFilter;
import org.springframework.cloud.gateway.route.Route;
import org.springframework.cloud.gateway.support.ServerWebExchangeUtils;
import org.springframework.core.Ordered;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpStatus;
import org.springframework.web.server.ServerWebExchange;
import reactor.core.publisher.Mono;

/**
 * The seeds' gateway filter: the tenant from X-Api-Key (else the client
 * address), a sliding log or a token bucket per tenant and route in
 * {@code rl:{tenant}:route}, 429 with Retry-After, the X-RateLimit-* and IETF
 * RateLimit headers on every response. A Redis call past its timeout, or
 * failing, counts in {@code rate_limit.redis.failures} and is decided
 * without Redis: let through (OPEN) or by a local bucket of limit /
 * panic-divisor (PANIC). Every decision counts in {@code rate_limit.decisions}
 * (tag outcome) and {@code rate_limit.decision} (a timer, tag route).
 */
public class RlGlobalFilter implements GlobalFilter, Ordered {

    private final RlCommands redis;
    private final RuleStore rules;
    private final RlProperties props;
    private final MeterRegistry registry;
    private final Counter failures;
    /** rate_limit.decision per route: one route's latency is not hidden by another's. */
    private final Map<String, Timer> decisionTime = new ConcurrentHashMap<>();
    private final Map<String, LocalBucket> panic = new ConcurrentHashMap<>();

    public RlGlobalFilter(RlCommands redis, RuleStore rules, RlProperties props, MeterRegistry registry) {
        this.redis = redis;
        this.rules = rules;
        this.props = props;
        this.registry = registry;
        this.failures = Counter.builder("rate_limit.redis.failures").tag("limiter", "global-filter")
            .register(registry);
    }

    @Override
    public int getOrder() {
        return Ordered.HIGHEST_PRECEDENCE + 1000;
    }

    @Override
    public Mono<Void> filter(ServerWebExchange exchange, GatewayFilterChain chain) {
        Route route = exchange.getAttribute(ServerWebExchangeUtils.GATEWAY_ROUTE_ATTR);
        String routeId = route == null ? "" : route.getId();
        if (route == null || (!props.getFilter().getRouteIds().isEmpty()
                              && !props.getFilter().getRouteIds().contains(routeId))) {
            return chain.filter(exchange);
        }
        String tenant = tenant(exchange, props.getFilter().isHashApiKey());
        Rule rule = rules.rule(tenant, routeId);
        String key = "rl:{" + tenant + "}:" + routeId;
        Duration timeout = RuleStore.orDefault(rule.getTimeout(), props.getTimeout());
        long start = System.nanoTime();
        Mono<long[]> call = rule.getAlgorithm() == Rule.Algorithm.TOKEN_BUCKET
            ? redis.tokenBucket(key, rule.getLimit(), rule.effectiveRate(), rule.getWindowMs(), 1, timeout)
            : redis.slidingLog(key, rule.getLimit(), rule.getWindowMs(), 1, timeout);
        return call
            .map(r -> new Decision(r[0] != 0, r[1], r[2], r[3], r[4], r[0] != 0 ? "allowed" : "denied"))
            .onErrorResume(e -> Mono.just(withoutRedis(key, rule)))
            .flatMap(d -> {
                decisionTime.computeIfAbsent(routeId, r -> Timer.builder("rate_limit.decision").tag("route", r)
                    .register(registry)).record(System.nanoTime() - start, java.util.concurrent.TimeUnit.NANOSECONDS);
                registry.counter("rate_limit.decisions", "outcome", d.outcome).increment();
                HttpHeaders h = exchange.getResponse().getHeaders();
                h.set("X-RateLimit-Limit", Long.toString(d.limit));
                h.set("X-RateLimit-Remaining", Long.toString(d.remaining));
                if (d.remaining >= 0) {
                    h.set("RateLimit", "\"" + routeId + "\";r=" + d.remaining + ";t="
                        + Rule.ceilDiv(d.resetMs, 1000));
                }
                h.set("RateLimit-Policy", "\"" + routeId + "\";q=" + rule.getLimit() + ";w=" + rule.windowSeconds());
                if (d.allowed) {
                    return chain.filter(exchange);
                }
                if (d.retryMs >= 0) {
                    h.set("Retry-After", Long.toString(Math.max(1, Rule.ceilDiv(d.retryMs, 1000))));
                }
                exchange.getResponse().setStatusCode(HttpStatus.TOO_MANY_REQUESTS);
                return exchange.getResponse().setComplete();
            });
    }

    private Decision withoutRedis(String key, Rule rule) {
        failures.increment();
        if (props.getFilter().getOnFailure() == RlProperties.OnFailure.OPEN) {
            return new Decision(true, rule.getLimit(), -1, 0, 0, "fail_open");
        }
        long share = Math.max(1, rule.getLimit() / Math.max(1, props.getFilter().getPanicDivisor()));
        LocalBucket b = panic.computeIfAbsent(key, k -> new LocalBucket(share, rule.getWindowMs()));
        long retry = b.take();
        return retry == 0
            ? new Decision(true, share, -1, 0, 0, "panic_allowed")
            : new Decision(false, share, -1, retry, retry, "panic_denied");
    }

    static String tenant(ServerWebExchange exchange, boolean hash) {
        String apiKey = exchange.getRequest().getHeaders().getFirst("X-Api-Key");
        if (apiKey != null && !apiKey.isEmpty()) {
            if (hash) {
                return "key:" + sha256Hex(apiKey).substring(0, 32);
            }
            if (apiKey.length() <= 64 && apiKey.chars().allMatch(RlGlobalFilter::plainChar)) {
                return apiKey;
            }
            return "sha256:" + sha256Hex(apiKey).substring(0, 32);
        }
        InetSocketAddress addr = exchange.getRequest().getRemoteAddress();
        return "ip:" + (addr == null || addr.getAddress() == null ? "unknown" : addr.getAddress().getHostAddress());
    }

    private static boolean plainChar(int c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
            || c == '-' || c == '_' || c == '.' || c == ':';
    }

    static String sha256Hex(String s) {
        try {
            return HexFormat.of().formatHex(
                MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private record Decision(boolean allowed, long limit, long remaining, long retryMs, long resetMs,
                            String outcome) {}

    /** The panic limit: a local token bucket of {@code capacity} refilled over {@code periodMs}. */
    static final class LocalBucket {
        private final long capacity;
        private final long periodMs;
        private double tokens;
        private long last = System.nanoTime();

        LocalBucket(long capacity, long periodMs) {
            this.capacity = capacity;
            this.periodMs = periodMs;
            this.tokens = capacity;
        }

        /** 0 when a token was taken, else the ms until one is there. */
        synchronized long take() {
            long now = System.nanoTime();
            double perMs = (double) capacity / periodMs;
            tokens = Math.min(capacity, tokens + (now - last) / 1e6 * perMs);
            last = now;
            if (tokens >= 1) {
                tokens -= 1;
                return 0;
            }
            return (long) Math.ceil((1 - tokens) / perMs);
        }
    }
}
