package io.redisratelimit;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** The local buckets of one limiter's panic limits (a bounded LRU). */
final class PanicBuckets {
    static final int MAX_KEYS = 100_000;

    private final double[] cap;
    private final double[] msPer;
    private final Map<String, double[]> buckets = new LinkedHashMap<>(16, 0.75f, true) {
        private static final long serialVersionUID = 1L;

        @Override
        protected boolean removeEldestEntry(Map.Entry<String, double[]> eldest) {
            return size() > MAX_KEYS;
        }
    };

    PanicBuckets(Panic panic, Rule rule) {
        List<Policy> parts = rule.parts();
        cap = new double[parts.size()];
        msPer = new double[parts.size()];
        for (int i = 0; i < parts.size(); i++) {
            long c = panic.capacity(parts.get(i));
            cap[i] = c;
            msPer[i] = (double) panic.window(parts.get(i)) / c;
        }
    }

    /** [units taken, cap, remaining, retry ms, reset ms] per part (all or nothing unless partial). */
    synchronized long[][] decide(List<String> keys, long cost, List<Policy> parts, boolean partial, boolean dryRun) {
        double now = System.nanoTime() / 1e6;
        int n = keys.size();
        double[][] bs = new double[n][];
        for (int i = 0; i < n; i++) {
            String k = i + "\u0000" + keys.get(i);
            double[] b = buckets.get(k);
            if (b == null) {
                b = new double[] {cap[i], now};
                buckets.put(k, b);
            } else {
                b[0] = Math.min(cap[i], b[0] + (now - b[1]) / msPer[i]);
                b[1] = now;
            }
            bs[i] = b;
        }
        long g = cost;
        for (int i = 0; i < n; i++) {
            g = Math.min(g, (long) Math.floor(bs[i][0] / parts.get(i).weight()));
        }
        if (g < cost && !partial) {
            g = 0;
        }
        long[][] out = new long[n][];
        for (int i = 0; i < n; i++) {
            long w = parts.get(i).weight();
            double u = (double) g * w;
            double c = (double) cost * w;
            boolean alone = bs[i][0] >= c;
            double tokens = bs[i][0] - u;
            if (!dryRun) {
                bs[i][0] = tokens;
            }
            long retry;
            if (g == cost || alone) {
                retry = 0;
            } else if (c > cap[i]) {
                retry = -1;
            } else {
                retry = Math.max(1, (long) Math.ceil((c - tokens) * msPer[i]));
            }
            long reset = Math.max(0, (long) Math.ceil((cap[i] - tokens) * msPer[i]));
            out[i] = new long[] {(long) u, (long) cap[i], (long) tokens, retry, reset};
        }
        return out;
    }
}
