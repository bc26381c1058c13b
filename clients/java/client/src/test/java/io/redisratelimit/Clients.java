package io.redisratelimit;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.resource.ClientResources;
import io.lettuce.core.resource.DefaultClientResources;
import java.time.Duration;
import java.util.function.Consumer;
import org.apache.commons.pool2.impl.GenericObjectPoolConfig;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.UnifiedJedis;

/** The drivers' clients as a user makes them (Lettuce 6/7, Jedis 5 JedisPooled or 7/8 RedisClient). */
final class Clients {
    static final ClientResources RESOURCES = DefaultClientResources.builder().ioThreadPoolSize(2)
            .computationThreadPoolSize(2).build();

    private Clients() {
    }

    /** A Lettuce client and connection; options tweaks the ClientOptions builder. */
    static final class Lettuce implements AutoCloseable {
        final RedisClient client;
        final StatefulRedisConnection<String, String> conn;

        Lettuce(TestServer s, Consumer<ClientOptions.Builder> options) {
            client = RedisClient.create(RESOURCES, RedisURI.create(s.url()));
            ClientOptions.Builder b = ClientOptions.builder();
            if (options != null) {
                options.accept(b);
            }
            client.setOptions(b.build());
            conn = client.connect();
        }

        @Override
        public void close() {
            conn.close();
            client.shutdown(Duration.ZERO, Duration.ofSeconds(2));
        }
    }

    static Lettuce lettuce(TestServer s) {
        return new Lettuce(s, null);
    }

    static JedisClientConfig jedisConfig(int socketMs, int connectMs) {
        return DefaultJedisClientConfig.builder().socketTimeoutMillis(socketMs).connectionTimeoutMillis(connectMs)
                .build();
    }

    static GenericObjectPoolConfig<Connection> pool(Duration maxWait) {
        GenericObjectPoolConfig<Connection> p = new GenericObjectPoolConfig<>();
        p.setMaxWait(maxWait);
        return p;
    }

    /** JedisPooled (Jedis 5) or RedisClient (Jedis 7, 8), found by reflection so one test source serves both. */
    static UnifiedJedis jedis(TestServer s, JedisClientConfig config, GenericObjectPoolConfig<Connection> pool) {
        HostAndPort hp = new HostAndPort("127.0.0.1", s.port);
        try {
            Class<?> pooled = Class.forName("redis.clients.jedis.JedisPooled");
            return (UnifiedJedis) pooled.getConstructor(GenericObjectPoolConfig.class, HostAndPort.class,
                    JedisClientConfig.class).newInstance(pool, hp, config);
        } catch (ClassNotFoundException e) {
            try {
                Class<?> rc = Class.forName("redis.clients.jedis.RedisClient");
                Object b = rc.getMethod("builder").invoke(null);
                Class<?> bc = b.getClass();
                b = bc.getMethod("hostAndPort", HostAndPort.class).invoke(b, hp);
                b = bc.getMethod("clientConfig", JedisClientConfig.class).invoke(b, config);
                b = bc.getMethod("poolConfig", GenericObjectPoolConfig.class).invoke(b, pool);
                return (UnifiedJedis) bc.getMethod("build").invoke(b);
            } catch (ReflectiveOperationException x) {
                throw new IllegalStateException(x);
            }
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
    }

    /** A Jedis client the library accepts: every call bounded by ms. */
    static UnifiedJedis boundedJedis(TestServer s, int ms) {
        return jedis(s, jedisConfig(ms, ms), pool(Duration.ofMillis(ms)));
    }
}
