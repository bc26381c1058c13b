package io.redisratelimit;

import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * One Redis client (Lettuce or Jedis) as the library uses it. Replies are Long, String, null or List of
 * them; a server's error reply completes the future with {@link ReplyError}; anything else it completes
 * with is an outage (connection lost, timed out, rejected while disconnected).
 */
interface Driver {
    /** One command. A non-blocking driver returns at once; a blocking one is bounded by its own timeout. */
    CompletableFuture<Object> send(List<String> args);

    /** Strict mode: {@code args} then {@code WAIT replicas ms} on one connection; both replies (errors as values). */
    CompletableFuture<Object[]> sendWithWait(List<String> args, long replicas, long ms);

    /** True when send() blocks the caller (Jedis): then its own socket timeout bounds every call. */
    boolean blocking();

    /** A server error reply (its text as the server sent it). */
    final class ReplyError extends RuntimeException {
        private static final long serialVersionUID = 1L;

        ReplyError(String message, Throwable cause) {
            super(message, cause, false, false);
        }
    }
}
