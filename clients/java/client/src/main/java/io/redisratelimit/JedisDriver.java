package io.redisratelimit;

import java.lang.reflect.Field;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import redis.clients.jedis.Response;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * Jedis 5 to 8 (UnifiedJedis: JedisPooled in 5, RedisClient in 7 and 8). Its calls block: they run on
 * the library's threads, bounded by its timer (see EXEC), and a client whose own settings let a call
 * outlast timeoutMs is refused, naming each setting (as the Python client refuses a redis-py client it
 * cannot bound): such a call would hold one of those threads that long.
 */
final class JedisDriver implements Driver {
    private final UnifiedJedis jedis;

    private JedisDriver(UnifiedJedis jedis) {
        this.jedis = jedis;
    }

    static JedisDriver of(UnifiedJedis jedis, long timeoutMs) {
        List<String> why = unbounded(jedis, timeoutMs);
        if (!why.isEmpty()) {
            throw new IllegalArgumentException("RateLimit.jedis refuses this client: " + String.join("; ", why));
        }
        return new JedisDriver(jedis);
    }

    private static Object field(Object o, String name) throws ReflectiveOperationException {
        for (Class<?> c = o.getClass(); c != null; c = c.getSuperclass()) {
            try {
                Field f = c.getDeclaredField(name);
                f.setAccessible(true);
                return f.get(o);
            } catch (NoSuchFieldException e) {
                // the superclass
            }
        }
        throw new NoSuchFieldException(name);
    }

    /** Every reason one call on this client could wait longer than timeoutMs, each naming its setting. */
    static List<String> unbounded(UnifiedJedis jedis, long timeoutMs) {
        List<String> why = new ArrayList<>();
        try {
            Object executor = field(jedis, "executor");
            if (executor.getClass().getSimpleName().startsWith("Retryable")) {
                why.add("it retries a failed call (maxAttempts / maxTotalRetriesDuration: "
                        + executor.getClass().getSimpleName() + "), so one decision could take several "
                        + "timeouts: use a client without retries (JedisPooled / RedisClient)");
            }
            Object provider = field(jedis, "provider");
            Object pool = provider.getClass().getMethod("getPool").invoke(provider);
            boolean blocks = (Boolean) pool.getClass().getMethod("getBlockWhenExhausted").invoke(pool);
            long maxWait = ((java.time.Duration) pool.getClass().getMethod("getMaxWaitDuration").invoke(pool))
                    .toMillis();
            if (blocks && (maxWait < 0 || maxWait > timeoutMs)) {
                why.add("its pool waits " + (maxWait < 0 ? "without end" : maxWait + " ms")
                        + " for a free connection (GenericObjectPoolConfig maxWait / blockWhenExhausted): set "
                        + "poolConfig.setMaxWait(Duration.ofMillis(" + timeoutMs + ")) or setBlockWhenExhausted(false)");
            }
            Object factory = field(pool, "factory");
            Object config = field(factory, "clientConfig");
            int so = (Integer) config.getClass().getMethod("getSocketTimeoutMillis").invoke(config);
            int connect = (Integer) config.getClass().getMethod("getConnectionTimeoutMillis").invoke(config);
            if (so <= 0 || so > timeoutMs) {
                why.add("its socketTimeoutMillis (" + (so <= 0 ? "none" : so + " ms; Jedis defaults it to 2000")
                        + ") is not at most timeoutMs (" + timeoutMs + " ms): "
                        + "DefaultJedisClientConfig.builder().socketTimeoutMillis(" + timeoutMs + ")");
            }
            if (connect <= 0 || connect > timeoutMs) {
                why.add("its connectionTimeoutMillis (" + (connect <= 0 ? "none" : connect + " ms")
                        + ") is longer than timeoutMs (" + timeoutMs + " ms), so a call that reconnects could "
                        + "wait that long: DefaultJedisClientConfig.builder().connectionTimeoutMillis("
                        + timeoutMs + ")");
            }
        } catch (ReflectiveOperationException | ClassCastException e) {
            why.add("its settings cannot be read (" + e + "): the library can bound only a pooled "
                    + "client (JedisPooled, RedisClient) with a DefaultJedisClientConfig");
        }
        return why;
    }

    /** Any command name (RL.* included). */
    private record Cmd(String name, byte[] raw) implements ProtocolCommand {
        Cmd(String name) {
            this(name, name.getBytes(StandardCharsets.US_ASCII));
        }

        @Override
        public byte[] getRaw() {
            return raw;
        }
    }

    private static Object decode(Object o) {
        if (o instanceof byte[] b) {
            return new String(b, StandardCharsets.UTF_8);
        }
        if (o instanceof List<?> l) {
            List<Object> out = new ArrayList<>(l.size());
            for (Object x : l) {
                out.add(decode(x));
            }
            return out;
        }
        return o;
    }

    private static Throwable convert(RuntimeException e) {
        if (e instanceof JedisDataException) {
            return new ReplyError(e.getMessage(), e);
        }
        return e;
    }

    /**
     * Jedis's calls run here, not on the caller's thread, and the library's timer bounds each: a call can
     * outlast its socket timeout inside Jedis (commons-pool2 2.13 replaces a broken connection on the
     * failing call's thread, a handshake that waits another socket timeout: 62 ms for a 30 ms timeout on a
     * SIGSTOPped server). At most 64 calls wait at once; past that a call fails at once (an outage).
     */
    static final ThreadPoolExecutor EXEC = new ThreadPoolExecutor(0, 64, 30, TimeUnit.SECONDS,
            new SynchronousQueue<>(), r -> {
                Thread t = new Thread(r, "redis-ratelimit-jedis");
                t.setDaemon(true);
                return t;
            });

    private static <T> CompletableFuture<T> run(Supplier<T> call) {
        CompletableFuture<T> out = new CompletableFuture<>();
        try {
            EXEC.execute(() -> {
                try {
                    out.complete(call.get());
                } catch (RuntimeException e) {
                    out.completeExceptionally(convert(e));
                }
            });
        } catch (RejectedExecutionException e) {
            out.completeExceptionally(e);
        }
        return out;
    }

    @Override
    public CompletableFuture<Object> send(List<String> args) {
        String[] rest = args.subList(1, args.size()).toArray(new String[0]);
        Cmd cmd = new Cmd(args.get(0));
        return run(() -> decode(jedis.sendCommand(cmd, rest)));
    }

    @Override
    public CompletableFuture<Object[]> sendWithWait(List<String> args, long replicas, long ms) {
        return run(() -> {
            try (var p = jedis.pipelined()) {
                Response<Object> call = p.sendCommand(new Cmd(args.get(0)), args.subList(1, args.size())
                        .toArray(new String[0]));
                Response<Object> wait = p.sendCommand(new Cmd("WAIT"), Long.toString(replicas), Long.toString(ms));
                p.sync();
                return new Object[] {value(call), value(wait)};
            }
        });
    }

    private static Object value(Response<Object> r) {
        try {
            return decode(r.get());
        } catch (JedisDataException e) {
            return new ReplyError(e.getMessage(), e);
        }
    }

    @Override
    public boolean blocking() {
        return false;
    }

}
