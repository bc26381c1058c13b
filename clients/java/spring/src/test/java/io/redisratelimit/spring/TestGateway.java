package io.redisratelimit.spring;

import java.util.LinkedHashMap;
import java.util.Map;

import org.springframework.boot.SpringBootConfiguration;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.cloud.gateway.filter.ratelimit.KeyResolver;
import org.springframework.context.annotation.Bean;
import reactor.core.publisher.Mono;

/** The gateway application of the tests: auto-configuration only, plus one KeyResolver. */
@SpringBootConfiguration
@EnableAutoConfiguration
public class TestGateway {

    /**
     * Loops of this context's own: the tests start a few contexts in one JVM,
     * and closing one must not dispose the global loops the others serve on.
     */
    @Bean
    org.springframework.http.client.ReactorResourceFactory reactorResourceFactory() {
        var f = new org.springframework.http.client.ReactorResourceFactory();
        f.setUseGlobalResources(false);
        return f;
    }

    /** The caller from X-Key; none: an empty key (the RequestRateLimiter's deny-empty-key applies). */
    @Bean
    KeyResolver hdrKey() {
        return exchange -> {
            String k = exchange.getRequest().getHeaders().getFirst("X-Key");
            return k == null ? Mono.empty() : Mono.just(k);
        };
    }

    /** The route table: Spring's RedisRateLimiter and the replacement on the same arguments. */
    static Map<String, Object> routes(String upstream, String prefix) {
        Map<String, Object> p = new LinkedHashMap<>();
        int[] i = {0};
        java.util.function.BiConsumer<String, Map<String, String>> route = (id, args) -> {
            String r = prefix + "[" + i[0]++ + "]";
            p.put(r + ".id", id);
            p.put(r + ".uri", upstream);
            p.put(r + ".predicates[0]", "Path=/" + id + "/**");
            if (args != null) {
                p.put(r + ".filters[0].name", "RequestRateLimiter");
                args.forEach((k, v) -> p.put(r + ".filters[0].args[" + k + "]", v));
            }
        };
        for (String impl : new String[] {"spring", "rl"}) {
            String suffix = impl.equals("spring") ? "-spring" : "";
            Map<String, String> common = new LinkedHashMap<>();
            common.put("key-resolver", "#{@hdrKey}");
            common.put("deny-empty-key", "true");
            common.put("empty-key-status", "403");
            if (impl.equals("spring")) {
                common.put("rate-limiter", "#{@redisRateLimiter}");
            }
            // 3 requests of 1,000 tokens from 3,000; 1 token/s back: the 4th waits 1,000 s.
            Map<String, String> a = new LinkedHashMap<>(common);
            a.put("redis-rate-limiter.replenishRate", "1");
            a.put("redis-rate-limiter.burstCapacity", "3000");
            a.put("redis-rate-limiter.requestedTokens", "1000");
            route.accept("burst" + suffix, a);
            Map<String, String> z = new LinkedHashMap<>(common);
            z.put("redis-rate-limiter.replenishRate", "1");
            z.put("redis-rate-limiter.burstCapacity", "0");
            route.accept("zero" + suffix, z);
        }
        for (String id : new String[] {"tenant", "bucket", "pg", "stop", "open"}) {
            route.accept(id, null);
        }
        return p;
    }
}
