package io.redisratelimit;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HashMap;
import java.util.Map;

/** The Lua twins shipped in the jar (io/redisratelimit/lua/, copied from lua/ at build time) and their SHA1s. */
final class Scripts {
    static final String[] NAMES = {"tokenbucket", "slidinglog", "slidingcounter", "fixedwindow", "multi", "concurrency"};
    static final Scripts INSTANCE = new Scripts();

    final Map<String, String> text = new HashMap<>();
    final Map<String, String> sha = new HashMap<>();

    private Scripts() {
        for (String n : NAMES) {
            try (InputStream in = Scripts.class.getResourceAsStream("lua/" + n + ".lua")) {
                if (in == null) {
                    continue;
                }
                String t = new String(in.readAllBytes(), StandardCharsets.UTF_8);
                text.put(n, t);
                sha.put(n, sha1(t));
            } catch (IOException e) {
                throw new IllegalStateException("cannot read the Lua twin " + n + ".lua from the jar", e);
            }
        }
    }

    static String sha1(String t) {
        try {
            byte[] d = MessageDigest.getInstance("SHA-1").digest(t.getBytes(StandardCharsets.UTF_8));
            StringBuilder b = new StringBuilder();
            for (byte x : d) {
                b.append(String.format("%02x", x));
            }
            return b.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }
}
