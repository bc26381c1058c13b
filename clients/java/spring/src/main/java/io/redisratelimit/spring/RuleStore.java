package io.redisratelimit.spring;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The rules in force: per tenant and route from PostgreSQL (when
 * ratelimit.rules.jdbc-url is set), else per route from the properties,
 * else the default rule. The table is read whole every refresh interval on a
 * thread of its own; the request path only reads an immutable map, so a slow
 * or unreachable database never delays a decision (the last rules read stay
 * in force).
 */
public class RuleStore implements AutoCloseable {
    private static final Logger log = LoggerFactory.getLogger(RuleStore.class);

    private final RlProperties props;
    private volatile Map<String, Rule> fromDb = Map.of();
    private final AtomicLong loads = new AtomicLong();
    private ScheduledExecutorService timer;

    public RuleStore(RlProperties props) {
        this.props = props;
        RlProperties.Rules r = props.getRules();
        if (r.getJdbcUrl() != null && !r.getJdbcUrl().isEmpty()) {
            refresh();
            timer = Executors.newSingleThreadScheduledExecutor(t -> {
                Thread th = new Thread(t, "ratelimit-rules");
                th.setDaemon(true);
                return th;
            });
            long ms = r.getRefreshInterval().toMillis();
            timer.scheduleWithFixedDelay(this::refresh, ms, ms, TimeUnit.MILLISECONDS);
        }
    }

    public Rule rule(String tenant, String routeId) {
        Rule r = fromDb.get(tenant + "\n" + routeId);
        if (r == null) {
            r = fromDb.get("*\n" + routeId);
        }
        if (r == null) {
            r = props.getFilter().getRoutes().get(routeId);
        }
        return r != null ? r : props.getFilter().getDefaultRule();
    }

    /** How many times the table was read (for tests and diagnostics). */
    public long loads() {
        return loads.get();
    }

    void refresh() {
        RlProperties.Rules cfg = props.getRules();
        String sql = "SELECT tenant, route, algorithm, lim, window_ms, rate FROM " + cfg.getTable();
        try (Connection c = DriverManager.getConnection(cfg.getJdbcUrl(), cfg.getUsername(), cfg.getPassword());
             Statement st = c.createStatement()) {
            st.setQueryTimeout(5);
            Map<String, Rule> next = new HashMap<>();
            try (ResultSet rs = st.executeQuery(sql)) {
                while (rs.next()) {
                    String where = "rule " + rs.getString(1) + "/" + rs.getString(2);
                    Rule rule = new Rule(Rule.Algorithm.valueOf(rs.getString(3).trim().toUpperCase().replace('-', '_')),
                        rs.getLong(4), rs.getLong(5), rs.getLong(6), null);
                    try {
                        rule.check(where);
                        next.put(rs.getString(1) + "\n" + rs.getString(2), rule);
                    } catch (IllegalArgumentException e) {
                        log.warn("ratelimit: skipping {}", e.getMessage());
                    }
                }
            }
            fromDb = Map.copyOf(next);
            loads.incrementAndGet();
        } catch (Exception e) {
            log.warn("ratelimit: rules not refreshed, the last ones stay in force: {}", e.toString());
        }
    }

    @Override
    public void close() {
        if (timer != null) {
            timer.shutdownNow();
        }
    }

    static Duration orDefault(Duration d, Duration def) {
        return d != null ? d : def;
    }
}
