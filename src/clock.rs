//! The server's own wall clock, read by the module (never a client's time).

use crate::ffi::opt;

/// Microseconds since the Unix epoch, once per command.
///
/// Where the server exports `RedisModule_CachedMicroseconds` (Redis 7.2+,
/// Valkey) this is the time the server sampled when the command started
/// (`server.ustime`, set on entering the outermost execution unit): every
/// RL call inside one MULTI/EXEC or one script sees the same time, the one
/// from which the server takes the time its own expiry uses there
/// (`cmd_time_snapshot`), and no clock is read. (While a script runs past
/// `busy-reply-threshold` the server serves other events and refreshes the
/// cached time; later calls of that script then see the newer time.)
///
/// Elsewhere (Redis 7.0) `CLOCK_REALTIME`, the clock behind the server's
/// `ustime()`, read on each call.
#[inline]
pub fn now_us() -> u64 {
    match opt!(RedisModule_CachedMicroseconds) {
        // SAFETY: the server's clock read takes no argument.
        Some(cached) => u64::try_from(unsafe { cached() }).unwrap_or(0),
        None => realtime_us(),
    }
}

/// `CLOCK_REALTIME` in µs. A clock before 1970 reads as 0.
#[inline]
fn realtime_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    if rc != 0 || ts.tv_sec < 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000).saturating_add((ts.tv_nsec as u64) / 1000)
}
