package io.redisratelimit;

/** The keys of an allOf call cannot share a cluster slot (raised before any call, on every deployment). */
public class CrossSlotException extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    public CrossSlotException(String message) {
        super(message);
    }
}
