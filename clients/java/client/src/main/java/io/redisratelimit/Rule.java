package io.redisratelimit;

import java.util.List;

/** What a limiter enforces: one {@link Policy}, or {@link AllOf} several (RL.MULTI). */
public sealed interface Rule permits Policy, AllOf {
    /** 1-64 of A-Z a-z 0-9 . _ - (it goes into header fields and keys). */
    String name();

    /** The capacity or limit (for all_of: the smallest part's). */
    long limit();

    /** The window headers report (token bucket: the time an empty bucket takes to fill). */
    long windowMs();

    /** The single policies: itself, or all_of's parts in order. */
    List<Policy> parts();

    /** A part is a fixed window (the backend must have RL.FIXEDWINDOW). */
    boolean fixed();
}
