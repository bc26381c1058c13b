//! The pure core of redis-ratelimit: the three rate-limit algorithms
//! ([`tokenbucket`], [`slidinglog`], [`slidingcounter`]) with their states
//! and versioned binary encodings, the argument model ([`args`]) and the
//! RL.STATE effect payload ([`codec`]). Nothing in this crate knows about
//! Redis, and all of it is safe Rust (forbidden otherwise): every function
//! takes explicit times, so it is unit-, property- and fuzz-tested (`fuzz/`)
//! with a fake clock, with no server, clang or bindgen. The module crate (the repository root) is the
//! glue that reads keys, calls [`tokenbucket::step`] & co., stores, expires,
//! replicates and replies.
//!
//! Conventions shared by the three algorithms:
//! - Times are microseconds since the Unix epoch (`u64`). Durations given by
//!   the user are milliseconds and are converted with `ms_to_us`.
//! - Every argument the user can give is in `1..=MAX_ARG` (COST: `0..=MAX_ARG`),
//!   so `ms * 1000` always fits in a `u64` and products of two arguments fit
//!   in a `u128`.
//! - If the clock steps backwards (`now` earlier than a time stored in the
//!   state), the algorithms use the stored time: elapsed time counts as zero.
//! - `decide` never mutates: a denied, COST 0 or DRYRUN call leaves the
//!   stored state byte-for-byte unchanged.

#![forbid(unsafe_code)]

pub mod args;
pub mod catalogue;
pub mod codec;
pub mod concurrency;
pub mod fixedwindow;
pub mod gcra;
pub mod multi;
#[cfg(any(test, feature = "reference"))]
pub mod reference;
pub mod reply;
pub mod slidingcounter;
pub mod slidinglog;
pub mod tokenbucket;

/// Start of the time range covered by the compact in-memory forms
/// (`State::pack`): 2020-01-01T00:00:00Z in µs since the Unix epoch. A state
/// whose times fall outside the range is simply kept in its wide form.
pub const PACK_EPOCH_US: u64 = 1_577_836_800_000_000;

/// Largest value accepted for any numeric argument: 2^53 − 1, exact in every
/// client language's numbers.
pub const MAX_ARG: u64 = (1u64 << 53) - 1;

/// What a call answers. It maps 1:1 onto the five-integer reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Units granted by this call, `0..=cost`. Without PARTIAL it is either 0
    /// or `cost`.
    pub granted: u64,
    /// `capacity` or `limit`, as given.
    pub limit: u64,
    /// Whole units still available right after this call.
    pub remaining: u64,
    /// 0 when the call was fully granted; otherwise milliseconds (rounded up)
    /// until the same call would be fully granted; −1 when it never can be
    /// (cost > limit).
    pub retry_after_ms: i64,
    /// Milliseconds (rounded up) until the limiter is back to its fresh state,
    /// measured after this call's grant; 0 when it already is fresh.
    pub reset_after_ms: u64,
}

impl Decision {
    /// The first reply field: with PARTIAL the units granted, otherwise 1 when
    /// the call was fully granted and 0 when it was not.
    #[inline]
    pub fn allowed(&self, cost: u64, partial: bool) -> u64 {
        if partial {
            self.granted
        } else {
            u64::from(self.granted == cost)
        }
    }
}

/// Units a single call takes when `available` can be taken now: all `cost`
/// when they fit, else with PARTIAL what is there, else none. Every
/// algorithm's single command decides with it (RL.MULTI decides its common
/// grant in [`multi::requests`], then each limit answers for it through the
/// same per-algorithm functions).
#[inline]
pub fn grant_size(available: u64, cost: u64, partial: bool) -> u64 {
    if cost <= available {
        cost
    } else if partial {
        available
    } else {
        0
    }
}

/// Milliseconds to microseconds. Saturates instead of overflowing; for every
/// accepted argument (≤ MAX_ARG) the result is exact.
#[inline]
pub const fn ms_to_us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

/// `(n / d, n % d)`; `(u128::MAX, 0)` for `d == 0` instead of panicking.
/// When both fit in 64 bits (every figure of a call with everyday
/// arguments) this is one 64-bit divide giving both, instead of two calls
/// of the 128-bit division routine.
#[inline(always)]
pub const fn div_rem_u128(n: u128, d: u128) -> (u128, u128) {
    if d == 0 {
        return (u128::MAX, 0);
    }
    if (n | d) >> 64 == 0 {
        // Both below 2^64: the casts are exact.
        let (n, d) = (n as u64, d as u64);
        return ((n / d) as u128, (n % d) as u128);
    }
    (n / d, n % d)
}

/// ⌈n / d⌉ for `d > 0`; returns `u128::MAX` for `d == 0` instead of panicking.
#[inline]
pub const fn div_ceil_u128(n: u128, d: u128) -> u128 {
    if d == 0 {
        return u128::MAX;
    }
    let (q, r) = div_rem_u128(n, d);
    // r > 0 means q < n / 1 ≤ u128::MAX: q + 1 cannot overflow.
    if r == 0 {
        q
    } else {
        q + 1
    }
}

/// Microseconds to whole milliseconds, rounded up, as the `u64` the reply
/// carries (saturating).
#[inline]
pub fn us_to_ms_ceil(us: u128) -> u64 {
    let ms = div_ceil_u128(us, 1000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A 128-bit word as two `u64`, low word first.
pub fn split(x: u128) -> [u64; 2] {
    [low_bits(x, 64), low_bits(x >> 64, 64)]
}

/// The low `bits` (≤ 64) bits of `x`.
pub fn low_bits(x: u128, bits: u32) -> u64 {
    let mask = if bits >= 64 { u128::from(u64::MAX) } else { (1u128 << bits) - 1 };
    u64::try_from(x & mask).unwrap_or(u64::MAX)
}

/// Clamp to `i64` (saturating; never panics): the signed wait of a
/// [`Decision`], and the integers a caller puts in its reply.
#[inline]
pub fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A reason a binary state payload was refused. Decoders never panic: any
/// byte string either decodes into a state that satisfies every invariant
/// or yields one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the encoding needs.
    Truncated,
    /// Bytes left over after a complete encoding.
    TrailingBytes,
    /// An encoding version this build does not know.
    UnknownVersion,
    /// A field violates an invariant of the state.
    Invalid(&'static str),
}

/// A tiny cursor over a byte slice for the decoders: every read is
/// bounds-checked and returns `Truncated` instead of panicking.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let (&b, rest) = self.buf.split_first().ok_or(DecodeError::Truncated)?;
        self.buf = rest;
        Ok(b)
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let bytes = self.take(4)?;
        let mut a = [0u8; 4];
        a.copy_from_slice(bytes);
        Ok(u32::from_le_bytes(a))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let bytes = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(bytes);
        Ok(u64::from_le_bytes(a))
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }
    /// Succeeds only when every byte was consumed.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes)
        }
    }
}
