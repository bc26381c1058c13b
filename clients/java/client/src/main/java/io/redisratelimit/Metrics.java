package io.redisratelimit;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

/** The counters RateLimit.metrics() reports (clients/DESIGN.md, "Metrics"; Node's camelCase names). */
final class Metrics {
    final LongAdder decisionsModule = new LongAdder();
    final LongAdder decisionsLua = new LongAdder();
    final LongAdder decisionsLocal = new LongAdder();
    final LongAdder decisionsPanic = new LongAdder();
    final LongAdder denied = new LongAdder();
    final LongAdder calls = new LongAdder();
    final LongAdder failures = new LongAdder();
    final LongAdder leases = new LongAdder();
    final LongAdder leaseTokens = new LongAdder();
    final LongAdder leaseWaits = new LongAdder();
    final LongAdder refunds = new LongAdder();
    final LongAdder refundTokens = new LongAdder();
    final LongAdder trips = new LongAdder();
    final LongAdder tripsFailures = new LongAdder();
    final LongAdder tripsLatency = new LongAdder();
    final LongAdder probesOk = new LongAdder();
    final LongAdder probesFailed = new LongAdder();
    final LongAdder unreplicated = new LongAdder();
    final LongAdder redetects = new LongAdder();

    Map<String, Long> snapshot() {
        Map<String, Long> m = new LinkedHashMap<>();
        m.put("decisionsModule", decisionsModule.sum());
        m.put("decisionsLua", decisionsLua.sum());
        m.put("decisionsLocal", decisionsLocal.sum());
        m.put("decisionsPanic", decisionsPanic.sum());
        m.put("denied", denied.sum());
        m.put("calls", calls.sum());
        m.put("failures", failures.sum());
        m.put("leases", leases.sum());
        m.put("leaseTokens", leaseTokens.sum());
        m.put("leaseWaits", leaseWaits.sum());
        m.put("refunds", refunds.sum());
        m.put("refundTokens", refundTokens.sum());
        m.put("trips", trips.sum());
        m.put("tripsFailures", tripsFailures.sum());
        m.put("tripsLatency", tripsLatency.sum());
        m.put("probesOk", probesOk.sum());
        m.put("probesFailed", probesFailed.sum());
        m.put("unreplicated", unreplicated.sum());
        m.put("redetects", redetects.sum());
        return m;
    }
}
