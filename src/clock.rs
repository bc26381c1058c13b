//! The server's own wall clock, read by the module (never a client's time).

/// Microseconds since the Unix epoch from `CLOCK_REALTIME` — the clock
/// behind Redis's own `mstime()`/`ustime()`. A clock before 1970 reads as 0.
#[inline]
pub fn now_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    if rc != 0 || ts.tv_sec < 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000).saturating_add((ts.tv_nsec as u64) / 1000)
}
