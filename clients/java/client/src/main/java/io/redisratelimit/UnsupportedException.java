package io.redisratelimit;

/** The backend lacks what this call needs (RL.MULTI, RL.FIXEDWINDOW, the module itself). */
public class UnsupportedException extends RateLimitException {
    private static final long serialVersionUID = 1L;

    public UnsupportedException(String message) {
        super(message);
    }
}
