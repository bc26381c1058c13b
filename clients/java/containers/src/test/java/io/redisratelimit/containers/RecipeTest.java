package io.redisratelimit.containers;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.redisratelimit.Decision;
import io.redisratelimit.Headers;
import io.redisratelimit.Keys;
import io.redisratelimit.Limiter;
import io.redisratelimit.Policy;
import io.redisratelimit.RateLimit;
import io.redisratelimit.Source;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;
import org.testcontainers.containers.GenericContainer;
import org.testcontainers.containers.wait.strategy.Wait;
import org.testcontainers.utility.DockerImageName;

/**
 * The README's container recipe in Java: each server image started by Testcontainers, a Lettuce
 * connection, a token bucket per request with its headers; the Redis image started without the module
 * (its command line replaced) decides through the Lua twins. The calls of container/node's gateway test.
 */
class RecipeTest {
    static String version() throws Exception {
        String cargo = Files.readString(Path.of("../../../Cargo.toml"));
        Matcher m = Pattern.compile("\\[workspace\\.package\\][^\\[]*?\\nversion = \"([^\"]+)\"").matcher(cargo);
        assertTrue(m.find(), "Cargo.toml's version");
        return m.group(1);
    }

    @ParameterizedTest(name = "{0}")
    @CsvSource({"redis,redis,module", "valkey,valkey,module", "redis-without-module,redis,lua"})
    void tokenBucketWithHeaders(String name, String flavour, String source) throws Exception {
        DockerImageName image = DockerImageName.parse("localhost/redis-ratelimit:" + version() + "-" + flavour);
        try (GenericContainer<?> server = new GenericContainer<>(image).withExposedPorts(6379)
                .waitingFor(Wait.forLogMessage(".*Ready to accept connections.*", 1))) {
            if (source.equals("lua")) {
                server.withCommand("redis-server", "--protected-mode", "no");
            }
            server.start();
            RedisClient client = RedisClient.create("redis://" + server.getHost() + ":" + server.getMappedPort(6379));
            try (StatefulRedisConnection<String, String> conn = client.connect()) {
                RateLimit rl = RateLimit.lettuce(conn, RateLimit.options().timeoutMs(1000));
                Limiter api = rl.limiter(Policy.tokenBucket("api", 5, 5, 60_000));
                String key = Keys.make("alice", "api");
                List<Decision> ds = new ArrayList<>();
                for (int i = 0; i < 6; i++) {
                    ds.add(api.limit(key));
                }
                assertEquals(List.of(true, true, true, true, true, false), ds.stream().map(Decision::allowed).toList());
                assertEquals(Source.valueOf(source.toUpperCase()), ds.get(0).source(), ds.get(0).toString());
                Map<String, String> h = Headers.of(ds.get(0));
                assertEquals("\"api\";q=5;w=60", h.get("RateLimit-Policy"));
                assertEquals(List.of("5", "4"), List.of(h.get("X-RateLimit-Limit"), h.get("X-RateLimit-Remaining")));
                Decision denied = ds.get(5);
                assertTrue(denied.retryAfterMs() > 0 && denied.retryAfterMs() <= 12_000, denied.toString());
                assertEquals(String.valueOf((denied.retryAfterMs() + 999) / 1000), Headers.of(denied).get("Retry-After"));
                // the request was not served after all: REFUND gives its unit back
                assertEquals(1, api.refund(key, 1).granted());
                assertTrue(api.limit(key).allowed());
                assertTrue(!api.limit(key).allowed());
            } finally {
                client.shutdown();
            }
        }
    }
}
