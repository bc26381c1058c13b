package example;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;

import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cloud.gateway.filter.ratelimit.KeyResolver;
import org.springframework.context.annotation.Bean;
import reactor.core.publisher.Mono;

/**
 * A gateway whose limits are the starter's (redis-ratelimit-spring-gateway5):
 * its RateLimiter replaces Spring's RedisRateLimiter under the route's
 * unchanged redis-rate-limiter.* arguments, and its GlobalFilter limits every
 * tenant per route (application.yml). The only code here is the caller id.
 */
@SpringBootApplication
public class RlRateLimiting {

    public static void main(String[] args) {
        SpringApplication.run(RlRateLimiting.class, args);
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
