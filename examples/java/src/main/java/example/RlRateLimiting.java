package example;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.ArrayOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import org.springframework.cloud.gateway.filter.ratelimit.AbstractRateLimiter;
import org.springframework.cloud.gateway.filter.ratelimit.KeyResolver;
import org.springframework.cloud.gateway.support.ConfigurationService;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import reactor.core.publisher.Mono;

@Configuration
class RlRateLimiting {

    /** The RequestRateLimiter's limiter: one RL.TOKENBUCKET call per request. */
    @Bean
    RlTokenBucketRateLimiter rlRateLimiter(ConfigurationService configurationService) {
        StatefulRedisConnection<String, String> redis =
            RedisClient.create("redis://127.0.0.1:6379").connect();
        return new RlTokenBucketRateLimiter(redis, configurationService);
    }

    /** Same caller ids as the Python and Node gateways, so all three share limits. */
    @Bean
    KeyResolver apiKeyResolver() {
        return exchange -> {
            String apiKey = exchange.getRequest().getHeaders().getFirst("X-Api-Key");
            if (apiKey != null && !apiKey.isEmpty()) {
                return Mono.just("key:" + sha256Hex(apiKey).substring(0, 32));
            }
            var addr = exchange.getRequest().getRemoteAddress();
            return Mono.just("ip:" + (addr == null ? "unknown" : addr.getAddress().getHostAddress()));
        };
    }

    static String sha256Hex(String s) {
        try {
            return HexFormat.of().formatHex(
                MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}

class RlTokenBucketRateLimiter extends AbstractRateLimiter<RlTokenBucketRateLimiter.Config> {

    /** Route args: rl-token-bucket.capacity, .rate, .period-ms */
    public static class Config {
        private long capacity = 20;
        private long rate = 10;
        private long periodMs = 1000;
        public long getCapacity() { return capacity; }
        public void setCapacity(long v) { capacity = v; }
        public long getRate() { return rate; }
        public void setRate(long v) { rate = v; }
        public long getPeriodMs() { return periodMs; }
        public void setPeriodMs(long v) { periodMs = v; }
    }

    enum Rl implements ProtocolKeyword {
        TOKENBUCKET;
        private final byte[] bytes = ("RL." + name()).getBytes(StandardCharsets.US_ASCII);
        @Override public byte[] getBytes() { return bytes; }
        @Override public String toString() { return "RL." + name(); }
    }

    private final StatefulRedisConnection<String, String> redis;
    private final Config defaults = new Config();

    RlTokenBucketRateLimiter(StatefulRedisConnection<String, String> redis, ConfigurationService cs) {
        super(Config.class, "rl-token-bucket", cs);
        this.redis = redis;
    }

    @Override
    public Mono<Response> isAllowed(String routeId, String id) {
        Config c = getConfig().getOrDefault(routeId, defaults);
        CommandArgs<String, String> args = new CommandArgs<>(StringCodec.UTF8)
            .addKey("rl:{" + id + "}:" + routeId)
            .add(c.getCapacity()).add(c.getRate()).add(c.getPeriodMs());
        return Mono.fromCompletionStage(
                redis.async().dispatch(Rl.TOKENBUCKET, new ArrayOutput<>(StringCodec.UTF8), args))
            .timeout(Duration.ofMillis(50))               // a strict timeout on the Redis call
            .map(reply -> toResponse(routeId, c, reply))
            .onErrorResume(e -> Mono.just(new Response(true, Map.of())));  // fail open
    }

    private static Response toResponse(String routeId, Config c, List<Object> reply) {
        long allowed = (Long) reply.get(0), limit = (Long) reply.get(1),
             remaining = (Long) reply.get(2), retryMs = (Long) reply.get(3),
             resetMs = (Long) reply.get(4);
        long window = ceilDiv(c.getCapacity() * c.getPeriodMs(), c.getRate()); // ms to refill
        Map<String, String> h = new LinkedHashMap<>();
        h.put("X-RateLimit-Limit", Long.toString(limit));
        h.put("X-RateLimit-Remaining", Long.toString(remaining));
        h.put("RateLimit", "\"" + routeId + "\";r=" + remaining + ";t=" + ceilDiv(resetMs, 1000));
        h.put("RateLimit-Policy", "\"" + routeId + "\";q=" + limit + ";w=" + ceilDiv(window, 1000));
        if (allowed == 0 && retryMs >= 0) {
            h.put("Retry-After", Long.toString(ceilDiv(retryMs, 1000)));
        }
        return new Response(allowed != 0, h);
    }

    private static long ceilDiv(long a, long b) {
        return Math.floorDiv(a + b - 1, b);
    }
}
