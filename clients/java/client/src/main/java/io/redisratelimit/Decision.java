package io.redisratelimit;

import java.util.List;

/**
 * The answer to one limit() or refund() call (clients/DESIGN.md, "Decision").
 *
 * @param allowed      all {@code cost} units were granted
 * @param granted      units granted (with partial: 0..cost); for refund: units given back
 * @param limit        limit of the binding policy (panic decisions: the panic limit)
 * @param remaining    whole units left in the binding policy right after the call
 * @param retryAfterMs 0 when granted; else ms until the same call could be granted (at least 1); -1: never
 * @param resetAfterMs ms until the binding policy is fresh again
 * @param policy       the rule's name
 * @param binding      the binding policy's name (= policy for a single policy)
 * @param source       module, lua, local or panic
 * @param parts        allOf only: one Part per policy, in order; empty for a single policy
 * @param rule         the rule the decision was made for (used by headers)
 */
public record Decision(boolean allowed, long granted, long limit, long remaining, long retryAfterMs,
                       long resetAfterMs, String policy, String binding, Source source, List<Part> parts,
                       Rule rule) {

    /** One policy's answer inside an allOf decision. */
    public record Part(String policy, long granted, long limit, long remaining, long retryAfterMs,
                       long resetAfterMs) {
    }

    static Decision on(Policy p, Source source, boolean allowed, long granted, long limit, long remaining,
                       long retryAfterMs, long resetAfterMs) {
        return new Decision(allowed, granted, limit, remaining, retryAfterMs, resetAfterMs, p.name(), p.name(),
                source, List.of(), p);
    }

    Decision unsent() {
        return new Decision(false, 0, limit, remaining, retryAfterMs, resetAfterMs, policy, binding, source, parts,
                rule);
    }

    Decision withGranted(long g) {
        return new Decision(allowed, g, limit, remaining, retryAfterMs, resetAfterMs, policy, binding, source,
                parts, rule);
    }
}
