package io.redisratelimit;

import java.util.function.BooleanSupplier;

/** Poll, don't sleep: wait until a condition holds (at most seconds), else fail naming it. */
final class Poll {
    private Poll() {
    }

    static void until(double seconds, String what, BooleanSupplier cond) {
        long deadline = System.nanoTime() + (long) (seconds * 1e9);
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() - deadline > 0) {
                throw new AssertionError("timed out after " + seconds + " s waiting for " + what);
            }
            try {
                Thread.sleep(2);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new AssertionError(e);
            }
        }
    }

    static long ms(long t0) {
        return (System.nanoTime() - t0) / 1_000_000L;
    }
}
