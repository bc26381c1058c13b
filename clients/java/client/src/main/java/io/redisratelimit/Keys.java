package io.redisratelimit;

import java.nio.charset.StandardCharsets;

/** Keys: {@code rl:{tag}:part...}, and the cluster slot of a key. */
public final class Keys {
    private Keys() {
    }

    /** {@code rl:{tag}:part1:part2}: the tag is what must share a cluster slot. */
    public static String make(String tag, String... parts) {
        return makeWithPrefix("rl", tag, parts);
    }

    /** {@link #make} with another prefix ("" for none). */
    public static String makeWithPrefix(String prefix, String tag, String... parts) {
        if (tag == null || tag.isEmpty() || tag.contains("{") || tag.contains("}")) {
            throw new IllegalArgumentException("key tag '" + tag + "': a non-empty string without braces");
        }
        StringBuilder b = new StringBuilder();
        if (prefix == null || prefix.contains("{") || prefix.contains("}")) {
            throw new IllegalArgumentException("key part '" + prefix + "': a string without braces");
        }
        if (!prefix.isEmpty()) {
            b.append(prefix).append(':');
        }
        b.append('{').append(tag).append('}');
        for (String p : parts) {
            if (p == null || p.contains("{") || p.contains("}")) {
                throw new IllegalArgumentException("key part '" + p + "': a string without braces");
            }
            b.append(':').append(p);
        }
        return b.toString();
    }

    /** The cluster slot of {@code key}: CRC16 (XMODEM) of its hash tag, as Redis computes it. */
    public static int slot(String key) {
        byte[] k = key.getBytes(StandardCharsets.UTF_8);
        int from = 0;
        int to = k.length;
        int open = indexOf(k, (byte) '{', 0);
        if (open >= 0) {
            int close = indexOf(k, (byte) '}', open + 1);
            if (close > open + 1) {
                from = open + 1;
                to = close;
            }
        }
        return crc16(k, from, to) & 16383;
    }

    private static int indexOf(byte[] b, byte c, int from) {
        for (int i = from; i < b.length; i++) {
            if (b[i] == c) {
                return i;
            }
        }
        return -1;
    }

    static int crc16(byte[] b, int from, int to) {
        int crc = 0;
        for (int i = from; i < to; i++) {
            crc ^= (b[i] & 0xff) << 8;
            for (int j = 0; j < 8; j++) {
                crc = (crc & 0x8000) != 0 ? (crc << 1) ^ 0x1021 : crc << 1;
            }
        }
        return crc & 0xffff;
    }
}
