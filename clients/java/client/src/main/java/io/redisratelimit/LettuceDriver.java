package io.redisratelimit;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisFuture;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.api.async.RedisAsyncCommands;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.NestedMultiOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;

/**
 * Lettuce 6 and 7 (async API). The library bounds every call with its own timer, whatever the
 * connection's command timeout, and cancels a call that timed out: Lettuce then never writes it (a
 * command queued while disconnected, or one to replay after a reconnect, is skipped once done).
 */
final class LettuceDriver implements Driver {
    private final StatefulRedisConnection<String, String> conn;
    private final RedisAsyncCommands<String, String> async;

    private LettuceDriver(StatefulRedisConnection<String, String> conn) {
        this.conn = conn;
        this.async = conn.async();
    }

    static LettuceDriver of(StatefulRedisConnection<String, String> conn, long timeoutMs) {
        String why = unbounded(conn.getOptions());
        if (why != null) {
            throw new IllegalArgumentException("RateLimit.lettuce refuses this connection: " + why);
        }
        return new LettuceDriver(conn);
    }

    /** Why a connection with these options could break the promise, naming the setting; or null. */
    static String unbounded(ClientOptions o) {
        if (!o.isAutoReconnect()) {
            return "its ClientOptions.autoReconnect is false: after a restart or a failover the connection "
                    + "would never come back, and every decision would come from the panic limits for good "
                    + "(keep Lettuce's default, ClientOptions.builder().autoReconnect(true))";
        }
        return null;
    }

    /** A command keyword for any command name (RL.* included). */
    private static final class Keyword implements ProtocolKeyword {
        private final String name;
        private final byte[] bytes;

        Keyword(String name) {
            this.name = name;
            this.bytes = name.getBytes(StandardCharsets.US_ASCII);
        }

        @Override
        public byte[] getBytes() {
            return bytes;
        }

        @Override
        public String name() {
            return name;
        }

        @Override
        public String toString() {
            return name;
        }
    }

    /** The future the core sees: cancelling it cancels the Lettuce commands. */
    private static final class Sent<T> extends CompletableFuture<T> {
        private final RedisFuture<?>[] commands;

        Sent(RedisFuture<?>... commands) {
            this.commands = commands;
        }

        @Override
        public boolean cancel(boolean interrupt) {
            for (RedisFuture<?> c : commands) {
                c.cancel(false);
            }
            return super.cancel(interrupt);
        }
    }

    private RedisFuture<List<Object>> dispatch(List<String> args) {
        CommandArgs<String, String> ca = new CommandArgs<>(StringCodec.UTF8);
        for (int i = 1; i < args.size(); i++) {
            ca.add(args.get(i));
        }
        return async.dispatch(new Keyword(args.get(0)), new NestedMultiOutput<>(StringCodec.UTF8), ca);
    }

    private static Throwable convert(Throwable e) {
        e = RateLimit.unwrap(e);
        if (e instanceof RedisCommandExecutionException) {
            return new ReplyError(e.getMessage(), e);
        }
        return e;
    }

    @Override
    public CompletableFuture<Object> send(List<String> args) {
        RedisFuture<List<Object>> f;
        try {
            f = dispatch(args);
        } catch (RuntimeException e) { // e.g. the request queue is full
            return CompletableFuture.failedFuture(e);
        }
        Sent<Object> out = new Sent<>(f);
        f.whenComplete((v, e) -> {
            if (e == null) {
                out.complete(v);
            } else {
                out.completeExceptionally(convert(e));
            }
        });
        return out;
    }

    @Override
    public CompletableFuture<Object[]> sendWithWait(List<String> args, long replicas, long ms) {
        // two commands written back to back on the one connection: WAIT follows the call there
        RedisFuture<List<Object>> call;
        RedisFuture<List<Object>> wait;
        try {
            call = dispatch(args);
            wait = dispatch(List.of("WAIT", Long.toString(replicas), Long.toString(ms)));
        } catch (RuntimeException e) {
            return CompletableFuture.failedFuture(e);
        }
        Sent<Object[]> out = new Sent<>(call, wait);
        Object[] r = new Object[2];
        call.whenComplete((v, e) -> {
            r[0] = e == null ? v : convert(e);
            wait.whenComplete((w, e2) -> {
                r[1] = e2 == null ? (w.size() == 1 ? w.get(0) : w) : convert(e2);
                Throwable lost = r[0] instanceof Throwable t && !(t instanceof ReplyError) ? t
                        : r[1] instanceof Throwable t2 && !(t2 instanceof ReplyError) ? t2 : null;
                if (lost != null) {
                    out.completeExceptionally(lost); // the connection, not the server, failed
                } else {
                    out.complete(r);
                }
            });
        });
        return out;
    }

    @Override
    public boolean blocking() {
        return false;
    }
}
