//! The token bucket's state encoding and compact form.
//!
//! Encoding: version 1, 33 bytes: the version byte, then `tokens`, `frac`,
//! `den` and `last_us`, each a u64 little-endian. `decode` accepts exactly
//! what a call can store: `den` a whole number of milliseconds (in µs) up
//! to `MAX_ARG` ms, `frac < den`, `tokens < MAX_ARG` (a stored bucket is
//! never full). Anything else, a short or long input, or an unknown
//! version is refused without panicking.
//!
//! Version 2 is the same 33 bytes for a bucket in debt (`COST n FORCE`):
//! `tokens` read as an `i64` in `−MAX_ARG..=−1`. A bucket not in debt is
//! written as version 1, byte for byte as before, so its DUMP payloads,
//! digests and effects are unchanged and an older module loads it; an
//! older module refuses a version 2 payload rather than misread a debt.

use super::State;
use crate::{low_bits, split, DecodeError, Reader, MAX_ARG, PACK_EPOCH_US};

/// Encoding version written by `encode` (first byte) for a bucket not in
/// debt.
pub const ENCODING_VERSION: u8 = 1;
/// The version of a bucket in debt (negative whole tokens).
pub const ENCODING_VERSION_DEBT: u8 = 2;

/// Compact in-memory form (`State::pack`), one 128-bit word, low bits first:
/// `last_us − PACK_EPOCH_US` (51 bits: until 2091), `pb` = the bit length of
/// `period_ms` (6 bits), `period_ms` (`pb` bits), `frac` (as many bits as
/// `den` has), then `tokens` in the bits left (`61 − 2·pb` or so: about
/// 2·10^12 tokens for a per-second bucket, 4·10^8 per minute, 1.3·10^5 per
/// hour). Anything else stays in the wide form. No division either way.
const PACK_T_BITS: u32 = 51;
const PACK_PB_BITS: u32 = 6;
/// The fixed head: `t` and `pb`.
const PACK_HEAD_BITS: u32 = PACK_T_BITS + PACK_PB_BITS;

impl State {
    pub const ENCODED_LEN: usize = 1 + 4 * 8;

    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        // 1, or 2 in debt (the sign bit of the tokens), without a branch.
        const _: () = assert!(ENCODING_VERSION_DEBT == ENCODING_VERSION + 1);
        out[0] = ENCODING_VERSION + (self.tokens >> 63) as u8;
        out[1..9].copy_from_slice(&self.tokens.to_le_bytes());
        out[9..17].copy_from_slice(&self.frac.to_le_bytes());
        out[17..25].copy_from_slice(&self.den.to_le_bytes());
        out[25..33].copy_from_slice(&self.last_us.to_le_bytes());
        out
    }

    /// The state in two words, when it fits the compact form (see
    /// `PACK_T_BITS`); `unpack` gives back exactly this state. `None` for
    /// states outside it, which are then stored in full.
    ///
    /// The fields above the 57-bit head (`period`, `frac`, `tokens`) are
    /// built as one number `y` (`x = head | y << 57`): in 64-bit
    /// arithmetic with one 128-bit shift when `period` and `frac` take at
    /// most 64 bits together (every period up to 37 hours), else by
    /// [`State::pack_wide`]; the same words either way (the property test
    /// `pack_paths_agree`).
    #[inline]
    pub fn pack(&self) -> Option<[u64; 2]> {
        let mut w = [0; 2];
        self.pack_to(&mut w).then_some(w)
    }

    /// [`State::pack`] into `out`: true when the state fits the compact
    /// form and `out` holds its words, false (`out` untouched) when it does
    /// not. The store of a compact value writes its words here, in place,
    /// without passing them through an `Option`.
    #[inline]
    pub fn pack_to(&self, out: &mut [u64; 2]) -> bool {
        let Some(t) = self.last_us.checked_sub(PACK_EPOCH_US) else { return false };
        // `den` a nonzero whole number of ms (one division: `period` is 0
        // for a `den` below 1000, and `period × 1000` is `den` only for a
        // multiple of 1000).
        let period = self.den / 1000;
        if t >> PACK_T_BITS != 0 || period == 0 || period * 1000 != self.den || self.frac >= self.den {
            return false;
        }
        let pb = bit_len(period); // 1..=54
        let low = pb + bit_len(self.den); // period and frac
        if low > 64 {
            return match self.pack_wide(t, period, pb) {
                Some(w) => {
                    *out = w;
                    true
                }
                None => false,
            };
        }
        // `tokens` fits in the bits above `57 + low`.
        if bit_len(self.tokens) + low > u128::BITS - PACK_HEAD_BITS {
            return false;
        }
        // frac < den < 2^(low − pb): `frac << pb | period` fits in 64 bits;
        // `tokens << low` in 71 (the check above).
        let y = u128::from(self.tokens) << low | u128::from(self.frac << pb | period);
        let head = t | u64::from(pb) << PACK_T_BITS;
        *out = [head | (y as u64) << PACK_HEAD_BITS, (y >> (64 - PACK_HEAD_BITS)) as u64];
        true
    }

    /// [`State::pack`] of a state whose `period` and `frac` take more than
    /// 64 bits (periods above 37 hours), in 128-bit arithmetic throughout;
    /// `t`, `period` and `pb` as `pack` computed them.
    #[inline(never)]
    fn pack_wide(&self, t: u64, period: u64, pb: u32) -> Option<[u64; 2]> {
        let tokens_at = PACK_HEAD_BITS + pb + bit_len(self.den);
        // `tokens` fits in the bits above `tokens_at` (no 128-bit shift).
        if bit_len(self.tokens) + tokens_at > u128::BITS {
            return None;
        }
        let x = u128::from(t)
            | (u128::from(pb) << PACK_T_BITS)
            | (u128::from(period) << PACK_HEAD_BITS)
            | (u128::from(self.frac) << (PACK_HEAD_BITS + pb))
            | u128::from(self.tokens).checked_shl(tokens_at).unwrap_or(0);
        Some(split(x))
    }

    /// Inverse of `pack`. Total: any two words give some state (only words
    /// written by `pack` are ever passed). In 64-bit arithmetic and one
    /// 128-bit shift when `period` and `frac` take at most 64 bits, else
    /// by [`State::unpack_wide`], which gives the same state for any words
    /// (the property test `unpack_paths_agree`).
    #[inline]
    pub fn unpack(w: [u64; 2]) -> State {
        let [w0, w1] = w;
        // pb < 64; y = x >> 57: 71 bits
        let pb = ((w0 >> PACK_T_BITS) & ((1 << PACK_PB_BITS) - 1)) as u32;
        let y = (u128::from(w1) << 64 | u128::from(w0)) >> PACK_HEAD_BITS;
        let period = y as u64 & ones(pb);
        let den = period.saturating_mul(1000);
        let low = pb + bit_len(den);
        if low > 64 {
            return State::unpack_wide(w);
        }
        State {
            // low ≤ 64 < 128: the shift is defined; its low 64 bits.
            tokens: (y >> low) as u64,
            // pb < 64
            frac: (y as u64 >> pb) & ones(bit_len(den)),
            den,
            last_us: (w0 & ones(PACK_T_BITS)) + PACK_EPOCH_US,
        }
    }

    /// [`State::unpack`] in 128-bit arithmetic throughout (any words).
    /// Inlined, though rarely run: out of line, its returned state made
    /// `unpack`'s merge with it go through memory.
    #[inline(always)]
    fn unpack_wide(w: [u64; 2]) -> State {
        let x = u128::from(w[0]) | (u128::from(w[1]) << 64);
        let t = low_bits(x, PACK_T_BITS);
        let pb = low_bits(x >> PACK_T_BITS, PACK_PB_BITS) as u32; // < 64
        let period = low_bits(x >> PACK_HEAD_BITS, pb);
        let den = period.saturating_mul(1000);
        let frac_at = PACK_HEAD_BITS + pb; // ≤ 120
        let tokens_at = frac_at + bit_len(den);
        State {
            tokens: x.checked_shr(tokens_at).map_or(0, |v| low_bits(v, 64)),
            frac: low_bits(x >> frac_at, bit_len(den)),
            den,
            last_us: t + PACK_EPOCH_US,
        }
    }

    /// Strict decoder: every invariant is checked, trailing bytes refused.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        let version = r.u8()?;
        if version != ENCODING_VERSION && version != ENCODING_VERSION_DEBT {
            return Err(DecodeError::UnknownVersion);
        }
        let s = State { tokens: r.u64()?, frac: r.u64()?, den: r.u64()?, last_us: r.u64()? };
        r.finish()?;
        if s.den == 0 || !s.den.is_multiple_of(1000) || s.den / 1000 > MAX_ARG {
            return Err(DecodeError::Invalid("period"));
        }
        if s.frac >= s.den {
            return Err(DecodeError::Invalid("fraction"));
        }
        if version == ENCODING_VERSION && s.tokens >= MAX_ARG {
            // A stored bucket is never full, so it holds fewer than
            // capacity ≤ MAX_ARG tokens.
            return Err(DecodeError::Invalid("tokens"));
        }
        if version == ENCODING_VERSION_DEBT && !(-(MAX_ARG as i64)..0).contains(&s.whole()) {
            // A debt: whole tokens from −MAX_ARG to −1 (`force` never
            // takes a bucket below −MAX_ARG).
            return Err(DecodeError::Invalid("debt"));
        }
        Ok(s)
    }
}

/// Number of significant bits of `v` (0 for 0).
#[inline(always)]
fn bit_len(v: u64) -> u32 {
    u64::BITS - v.leading_zeros()
}

/// The low `bits` bits set (all 64 for `bits >= 64`).
#[inline(always)]
fn ones(bits: u32) -> u64 {
    u64::MAX.checked_shr(u64::BITS.saturating_sub(bits)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::{step, Params};
    use super::*;
    use proptest::prelude::*;

    fn tb(capacity: u64, rate: u64, period_ms: u64) -> Params {
        Params { capacity, rate, period_ms }
    }

    #[test]
    fn decode_rejects_bad_payloads() {
        let good = State { tokens: 3, frac: 5, den: 1000, last_us: 7 };
        let enc = good.encode();
        assert_eq!(State::decode(&enc), Ok(good));
        for n in 0..enc.len() {
            assert_eq!(State::decode(&enc[..n]), Err(DecodeError::Truncated));
        }
        let mut long = enc.to_vec();
        long.push(0);
        assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
        let mut v = enc;
        v[0] = 3;
        assert_eq!(State::decode(&v), Err(DecodeError::UnknownVersion));
        // Version 2, a debt: negative whole tokens down to −MAX_ARG.
        let debt = State { tokens: (-7i64) as u64, ..good };
        let enc2 = debt.encode();
        assert_eq!(enc2[0], 2);
        assert_eq!(State::decode(&enc2), Ok(debt));
        let deepest = State { tokens: (-(MAX_ARG as i64)) as u64, ..good };
        assert_eq!(State::decode(&deepest.encode()), Ok(deepest));
        for bad in [State { tokens: (-(MAX_ARG as i64) - 1) as u64, ..good }, State { tokens: u64::MAX / 2 + 1, ..good }] {
            assert_eq!(State::decode(&bad.encode()), Err(DecodeError::Invalid("debt")), "{bad:?}");
        }
        // A version 1 payload of a debt's bytes, or a version 2 payload of
        // a bucket not in debt, is refused.
        let mut v1 = enc2;
        v1[0] = 1;
        assert_eq!(State::decode(&v1), Err(DecodeError::Invalid("tokens")));
        let mut v2 = enc;
        v2[0] = 2;
        assert_eq!(State::decode(&v2), Err(DecodeError::Invalid("debt")));
        for bad in [
            State { den: 0, ..good },
            State { den: 1001, ..good },
            State { frac: 1000, ..good },
            State { tokens: MAX_ARG, ..good },
            State { den: (MAX_ARG + 1) * 1000, ..good },
        ] {
            assert!(matches!(State::decode(&bad.encode()), Err(DecodeError::Invalid(_))), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(s) = State::decode(&bytes) {
                prop_assert_eq!(&s.encode()[..], &bytes[..]);
            }
        }

        /// Whatever the compact form accepts, it gives back exactly; and any
        /// two words unpack without panicking.
        #[test]
        fn pack_round_trips_or_declines(
            tokens in prop_oneof![any::<u64>(), 0u64..1_000_000],
            frac in any::<u64>(),
            period in prop_oneof![any::<u64>(), 1u64..10_000_000],
            last_us in prop_oneof![any::<u64>(), PACK_EPOCH_US - 10..PACK_EPOCH_US + (1u64 << 52)],
            words in any::<[u64; 2]>(),
        ) {
            let den = period.saturating_mul(1000);
            let s = State { tokens, frac: frac % den.max(1), den, last_us };
            if let Some(w) = s.pack() {
                prop_assert_eq!(State::unpack(w), s);
                prop_assert!(last_us >= PACK_EPOCH_US);
            }
            let _ = State::unpack(words);
        }

        /// The 64-bit paths of `pack` and `unpack` write and read the same
        /// words as the 128-bit ones: `pack_wide` gives the same words for
        /// every state `pack` packs in 64 bits, and `unpack_wide` the same
        /// state for any two words.
        #[test]
        fn pack_paths_agree(
            tokens in prop_oneof![any::<u64>(), 0u64..1_000_000, Just(0u64)],
            frac in any::<u64>(),
            period in prop_oneof![any::<u64>(), 1u64..200_000_000, Just(1u64)],
            last_us in prop_oneof![any::<u64>(), PACK_EPOCH_US..PACK_EPOCH_US + (1u64 << 51)],
        ) {
            let den = period.saturating_mul(1000);
            let s = State { tokens, frac: frac % den.max(1), den, last_us };
            if let Some(w) = s.pack() {
                let t = last_us - PACK_EPOCH_US;
                prop_assert_eq!(s.pack_wide(t, period, bit_len(period)), Some(w));
                prop_assert_eq!(State::unpack_wide(w), s);
            } else if let (Some(t), true) = (last_us.checked_sub(PACK_EPOCH_US), den % 1000 == 0 && den > 0) {
                // Declined: the 128-bit path declines it too.
                if t >> PACK_T_BITS == 0 && s.frac < den {
                    prop_assert_eq!(s.pack_wide(t, period, bit_len(period)), None);
                }
            }
        }

        #[test]
        fn unpack_paths_agree(words in any::<[u64; 2]>(), period in prop_oneof![any::<u64>(), 1u64..200_000_000]) {
            prop_assert_eq!(State::unpack(words), State::unpack_wide(words));
            // Words whose head holds the length of the period above it
            // (as `pack` writes them), the rest random.
            let pb = bit_len(period);
            let x = u128::from(words[0]) | u128::from(words[1]) << 64;
            let x = x & !(((1u128 << (PACK_PB_BITS + pb)) - 1) << PACK_T_BITS)
                | u128::from(pb) << PACK_T_BITS
                | u128::from(period) << PACK_HEAD_BITS;
            let [w0, w1] = split(x);
            prop_assert_eq!(State::unpack([w0, w1]), State::unpack_wide([w0, w1]));
        }

        /// The states real buckets reach (per second up to per hour, up to
        /// 100,000 tokens, any time from 2020 to 2090) all fit the compact
        /// form, which is what keeps a bucket key at 16 bytes of state.
        #[test]
        fn typical_buckets_are_compact(
            capacity in 1u64..=100_000, rate in 1u64..=100_000, period in 1u64..=3_600_000,
            t in PACK_EPOCH_US..PACK_EPOCH_US + 70 * 365 * 86_400_000_000,
            steps in proptest::collection::vec((0u64..10_000_000, 0u64..1000, any::<bool>()), 1..50),
        ) {
            let p = tb(capacity, rate, period);
            let mut s = State::default();
            let mut now = t;
            for (dt, cost, partial) in steps {
                now += dt;
                let (d, n) = step(&s, &p, cost, partial, now);
                if d.granted > 0 {
                    let w = n.pack();
                    prop_assert!(w.is_some(), "{:?} did not pack", n);
                    prop_assert_eq!(w.map(State::unpack), Some(n));
                    s = n;
                }
            }
        }
    }

    #[test]
    fn pack_edges() {
        let s = State { tokens: 5, frac: 7, den: 1_000_000, last_us: PACK_EPOCH_US };
        assert_eq!(s.pack().map(State::unpack), Some(s));
        // Before the epoch, at the end of the 51-bit range, bad fractions
        // and periods that are not whole ms: wide form.
        assert_eq!(State { last_us: PACK_EPOCH_US - 1, ..s }.pack(), None);
        let last = PACK_EPOCH_US + (1u64 << 51) - 1;
        assert_eq!(State { last_us: last, ..s }.pack().map(State::unpack), Some(State { last_us: last, ..s }));
        assert_eq!(State { last_us: last + 1, ..s }.pack(), None);
        assert_eq!(State { frac: 1_000_000, ..s }.pack(), None);
        assert_eq!(State { den: 1_000_001, frac: 0, ..s }.pack(), None);
        assert_eq!(State { den: 0, frac: 0, ..s }.pack(), None);
        // Tokens fill exactly the bits left: 128 − 51 − 6 − 10 (period 1000)
        // − 20 (den 10^6) = 41.
        let top = State { tokens: (1 << 41) - 1, frac: 999_999, den: 1_000_000, last_us: last };
        assert_eq!(top.pack().map(State::unpack), Some(top));
        assert_eq!(State { tokens: 1 << 41, ..top }.pack(), None);
        // The largest period and capacity the arguments allow: wide.
        assert_eq!(State { tokens: MAX_ARG - 1, frac: 0, den: MAX_ARG * 1000, last_us: last }.pack(), None);
    }
}
