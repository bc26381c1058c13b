package io.redisratelimit;

/**
 * Redis refused a call for a reason that is not an outage (a key of another type, bad arguments): a bug to
 * fix, not a reason to panic. Outages never raise: they are failures the breaker counts.
 */
public class RateLimitException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RateLimitException(String message) {
        super(message);
    }

    public RateLimitException(String message, Throwable cause) {
        super(message, cause);
    }
}
