package io.redisratelimit;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;

/** Several policies on several keys, all or nothing (RL.MULTI). Made by {@link Policy#allOf}. */
public final class AllOf implements Rule {
    private final List<Policy> parts;
    private final String name;
    private final long limit;
    private final long windowMs;
    private final boolean fixed;

    AllOf(List<Policy> parts, String name) {
        this.parts = parts;
        this.name = name;
        this.limit = parts.stream().mapToLong(Policy::limit).min().orElseThrow();
        this.windowMs = parts.stream().mapToLong(Policy::windowMs).max().orElseThrow();
        this.fixed = parts.stream().anyMatch(Policy::fixed);
    }

    @Override
    public String name() {
        return name;
    }

    @Override
    public long limit() {
        return limit;
    }

    @Override
    public long windowMs() {
        return windowMs;
    }

    @Override
    public List<Policy> parts() {
        return parts;
    }

    @Override
    public boolean fixed() {
        return fixed;
    }

    /** The key of each part: {@code key:name} for one key. */
    public List<String> keys(String key) {
        List<String> keys = new ArrayList<>();
        for (Policy p : parts) {
            keys.add(key + ":" + p.name());
        }
        return checkSlots(keys);
    }

    /** One key per part, given; all must share a cluster slot. */
    public List<String> keys(List<String> given) {
        if (given.size() != parts.size()) {
            throw new IllegalArgumentException("allOf '" + name + "' has " + parts.size()
                    + " policies but " + given.size() + " keys were given");
        }
        if (new HashSet<>(given).size() != given.size()) {
            throw new IllegalArgumentException("the keys of an allOf call must be distinct");
        }
        return checkSlots(List.copyOf(given));
    }

    private List<String> checkSlots(List<String> keys) {
        int slot = Keys.slot(keys.get(0));
        for (String k : keys) {
            if (Keys.slot(k) != slot) {
                throw new CrossSlotException("allOf '" + name + "': keys " + keys
                        + " map to different cluster slots; put the shared part in a hash tag (Keys.make)");
            }
        }
        return keys;
    }

    @Override
    public String toString() {
        return "<allOf '" + name + "' " + parts + ">";
    }
}
