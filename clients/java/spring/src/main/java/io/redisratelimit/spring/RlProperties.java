package io.redisratelimit.spring;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.springframework.boot.context.properties.ConfigurationProperties;

/** The starter's properties, under {@code ratelimit.} (docs/java.md lists them). */
@ConfigurationProperties("ratelimit")
public class RlProperties {
    /** The Redis or Valkey server with the module. */
    private String redisUri = "redis://127.0.0.1:6379";
    /** Every Redis call's bound: past it the decision is taken without Redis. */
    private Duration timeout = Duration.ofMillis(50);
    private RateLimiter rateLimiter = new RateLimiter();
    private Filter filter = new Filter();
    private Rules rules = new Rules();
    private Breaker breaker = new Breaker();

    public String getRedisUri() { return redisUri; }
    public void setRedisUri(String v) { redisUri = v; }
    public Duration getTimeout() { return timeout; }
    public void setTimeout(Duration v) { timeout = v; }
    public RateLimiter getRateLimiter() { return rateLimiter; }
    public Filter getFilter() { return filter; }
    public Rules getRules() { return rules; }
    public Breaker getBreaker() { return breaker; }

    /**
     * The client library's circuit breaker, one per call timeout (clients/DESIGN.md,
     * "Circuit breaker"): open after {@code failures} consecutive failures, or when the
     * p95 of the last {@code latencyWindow} calls stays above {@code latencyBudget} for
     * {@code latencyPeriod}; open, every decision is the on-failure one, for {@code open}.
     * The defaults are the library's.
     */
    public static class Breaker {
        private int failures = 5;
        private Duration latencyBudget = Duration.ofMillis(50);
        private Duration latencyPeriod = Duration.ofMillis(1000);
        private int latencyWindow = 64;
        private Duration open = Duration.ofMillis(1000);
        public int getFailures() { return failures; }
        public void setFailures(int v) { failures = v; }
        public Duration getLatencyBudget() { return latencyBudget; }
        public void setLatencyBudget(Duration v) { latencyBudget = v; }
        public Duration getLatencyPeriod() { return latencyPeriod; }
        public void setLatencyPeriod(Duration v) { latencyPeriod = v; }
        public int getLatencyWindow() { return latencyWindow; }
        public void setLatencyWindow(int v) { latencyWindow = v; }
        public Duration getOpen() { return open; }
        public void setOpen(Duration v) { open = v; }

        /** A new breaker with these settings (each RateLimit owns one). */
        public io.redisratelimit.Breaker newBreaker() {
            return new io.redisratelimit.Breaker(failures, latencyBudget.toMillis(), latencyPeriod.toMillis(),
                latencyWindow, open.toMillis());
        }
    }

    /** The RedisRateLimiter replacement. */
    public static class RateLimiter {
        private boolean enabled = true;
        private boolean includeHeaders = true;
        private String keyPattern = RlRateLimiter.DEFAULT_KEY_PATTERN;
        public String getKeyPattern() { return keyPattern; }
        public void setKeyPattern(String v) { keyPattern = v; }
        public boolean isEnabled() { return enabled; }
        public void setEnabled(boolean v) { enabled = v; }
        public boolean isIncludeHeaders() { return includeHeaders; }
        public void setIncludeHeaders(boolean v) { includeHeaders = v; }
    }

    public enum OnFailure { OPEN, PANIC }

    /** The GlobalFilter. */
    public static class Filter {
        private boolean enabled = false;
        /** Routes the filter limits; empty: every route. */
        private List<String> routeIds = new ArrayList<>();
        private OnFailure onFailure = OnFailure.OPEN;
        /** PANIC: each instance grants limit / panicDivisor (at least 1) per window locally. */
        private long panicDivisor = 20;
        /** Tenants from X-Api-Key as key:sha256(key)[:32], the Python and Node gateways' ids. */
        private boolean hashApiKey = false;
        public boolean isHashApiKey() { return hashApiKey; }
        public void setHashApiKey(boolean v) { hashApiKey = v; }
        private Rule defaultRule = new Rule();
        private Map<String, Rule> routes = new HashMap<>();
        public boolean isEnabled() { return enabled; }
        public void setEnabled(boolean v) { enabled = v; }
        public List<String> getRouteIds() { return routeIds; }
        public void setRouteIds(List<String> v) { routeIds = v; }
        public OnFailure getOnFailure() { return onFailure; }
        public void setOnFailure(OnFailure v) { onFailure = v; }
        public long getPanicDivisor() { return panicDivisor; }
        public void setPanicDivisor(long v) { panicDivisor = v; }
        public Rule getDefaultRule() { return defaultRule; }
        public void setDefaultRule(Rule v) { defaultRule = v; }
        public Map<String, Rule> getRoutes() { return routes; }
        public void setRoutes(Map<String, Rule> v) { routes = v; }
    }

    /** Rules per tenant and route from PostgreSQL. */
    public static class Rules {
        private String jdbcUrl;
        private String username;
        private String password;
        private String table = "ratelimit_rules";
        private Duration refreshInterval = Duration.ofSeconds(10);
        public String getJdbcUrl() { return jdbcUrl; }
        public void setJdbcUrl(String v) { jdbcUrl = v; }
        public String getUsername() { return username; }
        public void setUsername(String v) { username = v; }
        public String getPassword() { return password; }
        public void setPassword(String v) { password = v; }
        public String getTable() { return table; }
        public void setTable(String v) { table = v; }
        public Duration getRefreshInterval() { return refreshInterval; }
        public void setRefreshInterval(Duration v) { refreshInterval = v; }
    }
}
