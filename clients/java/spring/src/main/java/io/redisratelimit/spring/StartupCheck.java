package io.redisratelimit.spring;

import java.util.List;
import java.util.Map;

import org.springframework.boot.context.properties.bind.Bindable;
import org.springframework.boot.context.properties.bind.Binder;
import org.springframework.cloud.gateway.filter.FilterDefinition;
import org.springframework.cloud.gateway.route.RouteDefinition;
import org.springframework.core.env.Environment;

/**
 * Reads the routes from the configuration (both generations' prefixes) and
 * maps every RequestRateLimiter's redis-rate-limiter.* arguments that this
 * limiter serves, so that a value with no exact integer form stops the
 * application at startup with the property's name, rather than at the first
 * request.
 */
final class StartupCheck {
    private static final List<String> PREFIXES =
        List.of("spring.cloud.gateway.server.webflux.routes", "spring.cloud.gateway.routes");

    private StartupCheck() {}

    static void check(Environment env) {
        Binder binder = Binder.get(env);
        for (String prefix : PREFIXES) {
            List<RouteDefinition> routes = binder.bind(prefix, Bindable.listOf(RouteDefinition.class))
                .orElse(List.of());
            for (RouteDefinition route : routes) {
                for (FilterDefinition f : route.getFilters()) {
                    if ("RequestRateLimiter".equals(f.getName())) {
                        check(route.getId(), f.getArgs());
                    }
                }
            }
        }
    }

    static void check(String routeId, Map<String, String> args) {
        String limiter = args.getOrDefault("rate-limiter", args.get("rateLimiter"));
        if (limiter != null && !limiter.contains("rlRateLimiter")) {
            return; // another limiter bean serves this route
        }
        RlRateLimiter.Config c = new RlRateLimiter.Config();
        for (Map.Entry<String, String> e : args.entrySet()) {
            String k = e.getKey();
            if (!k.startsWith(RlRateLimiter.CONFIGURATION_PROPERTY_NAME + ".") || e.getValue().startsWith("#{")) {
                continue;
            }
            String name = k.substring(RlRateLimiter.CONFIGURATION_PROPERTY_NAME.length() + 1)
                .replace("-", "").toLowerCase();
            double v;
            try {
                v = Double.parseDouble(e.getValue().trim());
            } catch (NumberFormatException nfe) {
                throw new IllegalArgumentException(k + " = " + e.getValue() + " (route " + routeId + ") is not a number");
            }
            switch (name) {
                case "replenishrate" -> c.setReplenishRate(v);
                case "burstcapacity" -> c.setBurstCapacity(v);
                case "requestedtokens" -> c.setRequestedTokens(v);
                default -> { }
            }
        }
        RlRateLimiter.map("route " + routeId, c);
    }
}
