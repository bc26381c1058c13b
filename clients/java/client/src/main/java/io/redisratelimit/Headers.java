package io.redisratelimit;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** What HTTP makes of a decision: the header fields and the 429 body (clients/DESIGN.md, "Headers"). */
public final class Headers {
    public static final String QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded";
    public static final String QUOTA_TITLE = "Request cannot be satisfied as assigned quota has been exceeded";

    private Headers() {
    }

    static long secs(long ms) {
        return ms > 0 ? (ms + 999) / 1000 : 0;
    }

    /**
     * RateLimit-Policy, RateLimit, X-RateLimit-Limit, -Remaining, -Reset and, on a denial that can be
     * retried, Retry-After (whole seconds rounded up, never 0), in the order they should be sent.
     */
    public static Map<String, String> of(Decision d) {
        StringBuilder pol = new StringBuilder();
        if (!d.parts().isEmpty()) {
            List<Policy> ps = d.rule().parts();
            for (int i = 0; i < d.parts().size(); i++) {
                Decision.Part part = d.parts().get(i);
                if (i > 0) {
                    pol.append(", ");
                }
                pol.append('"').append(part.policy()).append("\";q=").append(part.limit()).append(";w=")
                        .append(secs(ps.get(i).windowMs()));
            }
        } else {
            pol.append('"').append(d.policy()).append("\";q=").append(d.limit()).append(";w=")
                    .append(secs(d.rule().windowMs()));
        }
        long reset = secs(d.resetAfterMs());
        Map<String, String> h = new LinkedHashMap<>();
        h.put("RateLimit-Policy", pol.toString());
        h.put("RateLimit", "\"" + d.binding() + "\";r=" + d.remaining() + ";t=" + reset);
        h.put("X-RateLimit-Limit", Long.toString(d.limit()));
        h.put("X-RateLimit-Remaining", Long.toString(d.remaining()));
        h.put("X-RateLimit-Reset", Long.toString(reset));
        if (!d.allowed() && d.retryAfterMs() >= 0) {
            h.put("Retry-After", Long.toString(Math.max(1, secs(d.retryAfterMs()))));
        }
        return h;
    }

    /** Names of the policies that could not take their units. */
    public static List<String> violated(Decision d) {
        List<String> names = new ArrayList<>();
        if (d.parts().isEmpty()) {
            names.add(d.policy());
            return names;
        }
        for (Decision.Part p : d.parts()) {
            if (p.retryAfterMs() != 0) {
                names.add(p.policy());
            }
        }
        if (names.isEmpty()) {
            names.add(d.binding());
        }
        return names;
    }

    /** The body of a 429 (application/problem+json) for a denied decision; instance may be null. */
    public static Map<String, Object> problem(Decision d, String instance) {
        String detail = d.retryAfterMs() < 0
                ? "Request costs more than the \"" + d.binding() + "\" limit allows."
                : "Rate limit \"" + d.binding() + "\" exceeded; retry in " + Math.max(1, secs(d.retryAfterMs()))
                        + " s.";
        Map<String, Object> body = new LinkedHashMap<>();
        body.put("type", QUOTA_EXCEEDED);
        body.put("title", QUOTA_TITLE);
        body.put("status", 429);
        body.put("detail", detail);
        body.put("violated-policies", violated(d));
        if (instance != null) {
            body.put("instance", instance);
        }
        return body;
    }

    /** {@link #problem} as JSON text. */
    public static String problemJson(Decision d, String instance) {
        StringBuilder b = new StringBuilder("{");
        boolean first = true;
        for (Map.Entry<String, Object> e : problem(d, instance).entrySet()) {
            if (!first) {
                b.append(", ");
            }
            first = false;
            b.append(json(e.getKey())).append(": ");
            Object v = e.getValue();
            if (v instanceof Integer) {
                b.append(v);
            } else if (v instanceof List<?> l) {
                b.append('[');
                for (int i = 0; i < l.size(); i++) {
                    b.append(i > 0 ? ", " : "").append(json((String) l.get(i)));
                }
                b.append(']');
            } else {
                b.append(json((String) v));
            }
        }
        return b.append('}').toString();
    }

    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
