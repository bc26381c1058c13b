package io.redisratelimit.spring;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.output.ArrayOutput;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import reactor.core.publisher.Mono;
import reactor.core.scheduler.Schedulers;

/**
 * One native call per decision: RL.TOKENBUCKET or RL.SLIDINGLOG over one
 * Lettuce connection. The reply is the module's five integers
 * (allowed, limit, remaining, retry_after_ms, reset_after_ms). Each call is
 * bounded by its own timeout on a timer of its own, whatever Lettuce does
 * with the command (queued while disconnected, stuck on a stopped server).
 */
public final class RlCommands implements AutoCloseable {

    enum Rl implements ProtocolKeyword {
        TOKENBUCKET, SLIDINGLOG;
        private final byte[] bytes = ("RL." + name()).getBytes(StandardCharsets.US_ASCII);
        @Override public byte[] getBytes() { return bytes; }
        @Override public String toString() { return "RL." + name(); }
    }

    private final RedisClient client;
    private final RedisURI uri;
    private volatile StatefulRedisConnection<String, String> connection;
    private final java.util.concurrent.atomic.AtomicBoolean connecting = new java.util.concurrent.atomic.AtomicBoolean();

    /**
     * Connects now if it can; a server down at startup does not stop the
     * application: calls fail (and are decided without Redis) until a
     * connection, retried in the background on each call, is up. While
     * disconnected Lettuce rejects commands rather than queueing them.
     */
    public RlCommands(String uri) {
        this.uri = RedisURI.create(uri);
        this.client = RedisClient.create();
        this.client.setOptions(ClientOptions.builder()
            .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
            .autoReconnect(true)
            .build());
        try {
            this.connection = client.connect(StringCodec.UTF8, this.uri);
        } catch (RuntimeException e) {
            connectInBackground();
        }
    }

    private void connectInBackground() {
        if (connection != null || !connecting.compareAndSet(false, true)) {
            return;
        }
        client.connectAsync(StringCodec.UTF8, uri).whenComplete((c, e) -> {
            if (c != null) {
                connection = c;
            }
            connecting.set(false);
        });
    }

    /** RL.TOKENBUCKET key capacity rate period_ms COST cost. */
    public Mono<long[]> tokenBucket(String key, long capacity, long rate, long periodMs, long cost,
                                    Duration timeout) {
        return call(Rl.TOKENBUCKET, key, timeout, capacity, rate, periodMs, cost);
    }

    /** RL.SLIDINGLOG key limit window_ms COST cost. */
    public Mono<long[]> slidingLog(String key, long limit, long windowMs, long cost, Duration timeout) {
        return call(Rl.SLIDINGLOG, key, timeout, limit, windowMs, 0, cost);
    }

    private Mono<long[]> call(Rl cmd, String key, Duration timeout, long a, long b, long c, long cost) {
        CommandArgs<String, String> args = new CommandArgs<>(StringCodec.UTF8).addKey(key).add(a).add(b);
        if (cmd == Rl.TOKENBUCKET) {
            args.add(c);
        }
        args.add("COST").add(cost);
        return Mono.defer(() -> {
                StatefulRedisConnection<String, String> conn = connection;
                if (conn == null) {
                    connectInBackground();
                    return Mono.error(new IllegalStateException("not connected to " + uri));
                }
                return Mono.fromCompletionStage(conn.async().dispatch(cmd, new ArrayOutput<>(StringCodec.UTF8), args));
            })
            .timeout(timeout, Schedulers.parallel())
            .map(RlCommands::toLongs);
    }

    private static long[] toLongs(List<Object> reply) {
        if (reply == null || reply.size() != 5) {
            throw new IllegalStateException("unexpected reply " + reply);
        }
        long[] out = new long[5];
        for (int i = 0; i < 5; i++) {
            out[i] = (Long) reply.get(i);
        }
        return out;
    }

    @Override
    public void close() {
        StatefulRedisConnection<String, String> c = connection;
        if (c != null) {
            c.close();
        }
        client.shutdown(Duration.ZERO, Duration.ofSeconds(2));
    }
}
