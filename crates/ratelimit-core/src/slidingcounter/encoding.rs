//! The sliding counter's state encoding and compact form.
//!
//! Encoding: version 1, 25 bytes.
//!
//! | offset | size | field                                        |
//! |--------|------|----------------------------------------------|
//! | 0      | 1    | encoding version = 1                         |
//! | 1      | 8    | `start_us`, u64 little-endian                |
//! | 9      | 8    | `cur`, u64 little-endian                     |
//! | 17     | 8    | `prev`, u64 little-endian                    |
//!
//! `decode` accepts exactly what a grant or a refund can store: `cur ≤
//! MAX_ARG` and `prev ≤ MAX_ARG`, not both 0 (the fresh state is never
//! stored; `cur = 0` with `prev > 0` is what a refund of the current
//! window's units leaves), and `start_us` a whole number of milliseconds
//! (it is a multiple of `W = window_ms·1000`). Anything else, a short or long input,
//! or an unknown version is refused without panicking.

use super::State;
use crate::{low_bits, split, DecodeError, Reader, MAX_ARG, PACK_EPOCH_US};

/// First byte of the binary encoding.
pub const ENCODING_VERSION: u8 = 1;

/// Compact in-memory form (`State::pack`), one 128-bit word, low bits first:
/// the window start in ms since `PACK_EPOCH_US` (42 bits: until 2159),
/// `cur` and `prev` (43 bits each: up to ~8.8 × 10^12 units per window).
const PACK_START_BITS: u32 = 42;
const PACK_COUNT_BITS: u32 = 43;

impl State {
    /// Size of the binary encoding: version byte + three u64.
    pub const ENCODED_LEN: usize = 1 + 8 + 8 + 8;

    /// Version byte, then `start_us`, `cur`, `prev` as little-endian u64.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        // Fixed offsets into a fixed-size array: the bounds are checked at
        // compile time, and this runs on every grant (the effect payload).
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = ENCODING_VERSION;
        out[1..9].copy_from_slice(&self.start_us.to_le_bytes());
        out[9..17].copy_from_slice(&self.cur.to_le_bytes());
        out[17..25].copy_from_slice(&self.prev.to_le_bytes());
        out
    }

    /// Strict inverse of `encode`: refuses short or long input, unknown
    /// versions and any state a grant cannot produce. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let start_us = r.u64()?;
        let cur = r.u64()?;
        let prev = r.u64()?;
        r.finish()?;
        if cur == 0 && prev == 0 {
            return Err(DecodeError::Invalid("sliding counter: both windows count 0 (a fresh state is never stored)"));
        }
        if cur > MAX_ARG {
            return Err(DecodeError::Invalid("sliding counter: cur exceeds 2^53-1"));
        }
        if prev > MAX_ARG {
            return Err(DecodeError::Invalid("sliding counter: prev exceeds 2^53-1"));
        }
        if start_us % 1000 != 0 {
            return Err(DecodeError::Invalid("sliding counter: window start is not a whole millisecond"));
        }
        Ok(State { start_us, cur, prev })
    }

    /// The state in two words, when it fits the compact form (see
    /// `PACK_START_BITS`); `unpack` gives back exactly this state. `None`
    /// for states outside it, which are then stored in full.
    pub fn pack(&self) -> Option<[u64; 2]> {
        if !self.start_us.is_multiple_of(1000) {
            return None;
        }
        let start = self.start_us.checked_sub(PACK_EPOCH_US)? / 1000;
        if start >> PACK_START_BITS != 0 || self.cur >> PACK_COUNT_BITS != 0 || self.prev >> PACK_COUNT_BITS != 0 {
            return None;
        }
        let x = u128::from(start)
            | (u128::from(self.cur) << PACK_START_BITS)
            | (u128::from(self.prev) << (PACK_START_BITS + PACK_COUNT_BITS));
        Some(split(x))
    }

    /// Inverse of `pack`. Total: any two words give some state (only words
    /// written by `pack` are ever passed).
    pub fn unpack(w: [u64; 2]) -> State {
        let x = u128::from(w[0]) | (u128::from(w[1]) << 64);
        State {
            start_us: low_bits(x, PACK_START_BITS) * 1000 + PACK_EPOCH_US,
            cur: low_bits(x >> PACK_START_BITS, PACK_COUNT_BITS),
            prev: low_bits(x >> (PACK_START_BITS + PACK_COUNT_BITS), PACK_COUNT_BITS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::Config as PropConfig;

    fn cfg(cases: u32) -> PropConfig {
        PropConfig { cases, failure_persistence: None, ..PropConfig::default() }
    }

    #[test]
    fn encoding_layout_and_round_trip() {
        let s = State { start_us: 0x0102_0304_0506_0708, cur: 5, prev: MAX_ARG };
        let b = s.encode();
        assert_eq!(b.len(), State::ENCODED_LEN);
        assert_eq!(State::ENCODED_LEN, 25);
        let mut want = vec![1u8];
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&MAX_ARG.to_le_bytes());
        assert_eq!(b.to_vec(), want);
        // start_us above is not whole ms: refused; a real one round-trips.
        assert!(matches!(State::decode(&b), Err(DecodeError::Invalid(_))));
        let s = State { start_us: 1_700_000_000_000_000, cur: 5, prev: MAX_ARG };
        assert_eq!(State::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn decode_refuses_what_no_grant_produces() {
        let ok = State { start_us: 7_000, cur: 1, prev: 0 };
        assert_eq!(State::decode(&ok.encode()), Ok(ok));
        assert_eq!(State::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&ok.encode()[..24]), Err(DecodeError::Truncated));
        let mut long = ok.encode().to_vec();
        long.push(0);
        assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
        let mut v2 = ok.encode();
        v2[0] = 2;
        assert_eq!(State::decode(&v2), Err(DecodeError::UnknownVersion));
        assert_eq!(State::decode(&[0]), Err(DecodeError::UnknownVersion));
        let invalid = |s: State| matches!(State::decode(&s.encode()), Err(DecodeError::Invalid(_)));
        assert!(invalid(State::default()));
        assert!(invalid(State { start_us: 7_000, cur: 0, prev: 0 }));
        // A refund can empty the current window and leave the previous one.
        assert!(!invalid(State { start_us: 7_000, cur: 0, prev: 4 }));
        assert!(invalid(State { start_us: 7_000, cur: MAX_ARG + 1, prev: 0 }));
        assert!(invalid(State { start_us: 7_000, cur: 1, prev: MAX_ARG + 1 }));
        assert!(invalid(State { start_us: 7_001, cur: 1, prev: 0 }));
        assert!(!invalid(State { start_us: 7_000, cur: MAX_ARG, prev: MAX_ARG }));
    }

    proptest! {
        #![proptest_config(cfg(5_000))]

        /// Whatever the compact form accepts, it gives back exactly; and any
        /// two words unpack without panicking.
        #[test]
        fn pack_round_trips_or_declines(
            start_ms in prop_oneof![any::<u64>(), 1_500_000_000_000u64..1_700_000_000_000, 0u64..10],
            sub_ms in prop_oneof![Just(0u64), 0u64..1000],
            cur in prop_oneof![any::<u64>(), 0u64..1_000_000, Just((1u64 << 43) - 1), Just(1u64 << 43)],
            prev in prop_oneof![any::<u64>(), 0u64..1_000_000, Just((1u64 << 43) - 1), Just(1u64 << 43)],
            words in any::<[u64; 2]>(),
        ) {
            let s = State { start_us: start_ms.saturating_mul(1000).saturating_add(sub_ms), cur, prev };
            if let Some(w) = s.pack() {
                prop_assert_eq!(State::unpack(w), s);
            } else {
                prop_assert!(s.start_us < PACK_EPOCH_US || sub_ms != 0 || !s.start_us.is_multiple_of(1000)
                    || (s.start_us - PACK_EPOCH_US) / 1000 >= 1 << 42 || cur >= 1 << 43 || prev >= 1 << 43);
            }
            let _ = State::unpack(words);
        }
    }

    #[test]
    fn pack_edges() {
        let s = State { start_us: PACK_EPOCH_US, cur: 1, prev: 0 };
        assert_eq!(s.pack().map(State::unpack), Some(s));
        assert_eq!(State { start_us: PACK_EPOCH_US - 1000, ..s }.pack(), None);
        assert_eq!(State { start_us: PACK_EPOCH_US + 1, ..s }.pack(), None);
        let last = PACK_EPOCH_US + ((1u64 << 42) - 1) * 1000;
        let big = State { start_us: last, cur: (1 << 43) - 1, prev: (1 << 43) - 1 };
        assert_eq!(big.pack().map(State::unpack), Some(big));
        assert_eq!(State { start_us: last + 1000, ..big }.pack(), None);
        assert_eq!(State { cur: 1 << 43, ..big }.pack(), None);
        assert_eq!(State { prev: 1 << 43, ..big }.pack(), None);
        assert_eq!(State { cur: MAX_ARG, prev: MAX_ARG, ..s }.pack(), None);
    }
}
