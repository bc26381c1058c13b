//! The sliding log's canonical binary encoding.
//!
//! Used by RDB, DUMP, AOF rewrite, DEBUG DIGEST and RL.STATE.
//!
//! Canonical: a function of the logical log only (not of the in-memory
//! format or capacity), so master and replica digest equally.
//!
//! ```text
//! u8      version = 1
//! u64 LE  n = number of entries; n = 0 ends the encoding (empty log)
//! u64 LE  time of the oldest entry (µs)
//! u8      words ∈ {1, 2, 4}: entry width in 32-bit words
//! u8      cbits: count bits (words = 4 ⇒ 64)
//! n × (4 × words) bytes: entries, value = delta << cbits | (count − 1),
//!         little endian; the first entry's delta is 0, every other ≥ 1
//! ```
//!
//! `words`/`cbits` must be the canonical format: the smallest `words` whose
//! `32 × words` bits hold the widest delta plus the widest `count − 1`, and
//! `cbits` = the bits of the widest `count − 1` (64 when `words = 4`).
//! The decoder checks all of it, the time and unit sums for overflow, and
//! that the byte count is exactly `n × 4 × words` before it allocates.

use super::packed::{bit_len, pack, unpack, State};
use crate::{DecodeError, Reader};

/// First byte of the binary encoding.
pub const ENCODING_VERSION: u8 = 1;

/// The canonical (encoding) format for the widest delta `d` and count `c`
/// bits: all spare bits go to the delta field.
pub(super) fn canonical_format(d: u32, c: u32) -> (u8, u8) {
    let need = d + c;
    if need <= 32 {
        (1, c as u8)
    } else if need <= 64 {
        (2, c as u8)
    } else {
        (4, 64)
    }
}

impl State {
    /// Versioned canonical binary encoding (see the module documentation).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
        if self.len == 0 {
            return;
        }
        out.extend_from_slice(&self.head_time.to_le_bytes());
        let (d, c) = self.widths();
        let (words, cbits) = canonical_format(d, c);
        out.push(words);
        out.push(cbits);
        let nbytes = 4 * usize::from(words);
        out.reserve(self.len.saturating_mul(nbytes));
        for idx in self.head..self.head + self.len {
            let (delta, count) = self.raw(idx);
            let delta = if idx == self.head { 0 } else { delta };
            let bytes = pack(cbits, delta, count).to_le_bytes();
            out.extend_from_slice(bytes.get(..nbytes).unwrap_or(&bytes));
        }
    }

    /// Strict decoder: accepts exactly the canonical encodings of valid
    /// states, never panics, allocates only what the input's length holds.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let n = r.u64()?;
        if n == 0 {
            r.finish()?;
            return Ok(State::default());
        }
        let head_time = r.u64()?;
        let words = r.u8()?;
        let cbits = r.u8()?;
        if !matches!(words, 1 | 2 | 4) {
            return Err(DecodeError::Invalid("entry width"));
        }
        if (words == 4 && cbits != 64) || (words < 4 && u32::from(cbits) > 32 * u32::from(words)) {
            return Err(DecodeError::Invalid("count bits"));
        }
        let wn = usize::from(words);
        let body = usize::try_from(n).ok().and_then(|n| n.checked_mul(4 * wn)).ok_or(DecodeError::Truncated)?;
        if r.remaining() < body {
            return Err(DecodeError::Truncated);
        }
        if r.remaining() > body {
            return Err(DecodeError::TrailingBytes);
        }
        let raw = r.take(body)?;
        r.finish()?;
        let len = body / (4 * wn);
        let mut buf = Vec::with_capacity(body / 4);
        for chunk in raw.chunks_exact(4) {
            let mut a = [0u8; 4];
            a.copy_from_slice(chunk);
            buf.push(u32::from_le_bytes(a));
        }
        let mut st = State { buf, head: 0, len, head_time, tail_time: head_time, total: 0, words, cbits };
        let (mut d, mut c) = (0u32, 0u32);
        let mut time = head_time;
        let mut total = 0u64;
        for idx in 0..len {
            let (delta, cm1) = unpack(cbits, st.load(idx));
            if idx == 0 {
                if delta != 0 {
                    return Err(DecodeError::Invalid("first entry delta"));
                }
            } else {
                if delta == 0 {
                    return Err(DecodeError::Invalid("entry times not increasing"));
                }
                time = time.checked_add(delta).ok_or(DecodeError::Invalid("entry time overflows"))?;
                d = d.max(bit_len(delta));
            }
            let count = cm1.checked_add(1).ok_or(DecodeError::Invalid("entry count overflows"))?;
            total = total.checked_add(count).ok_or(DecodeError::Invalid("total units overflow"))?;
            c = c.max(bit_len(cm1));
        }
        if canonical_format(d, c) != (words, cbits) {
            return Err(DecodeError::Invalid("entry format not canonical"));
        }
        st.tail_time = time;
        st.total = total;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;
    use crate::MAX_ARG;
    use proptest::prelude::*;
    use proptest::test_runner::Config as ProptestConfig;

    #[test]
    fn encoding_layout_exact_bytes() {
        // Entries (1000 µs, 1) and (1500 µs, 3): widest delta 500 (9 bits),
        // widest count−1 = 2 (2 bits) → canonical format words 1, cbits 2.
        let mut s = State::default();
        grant(&mut s, 1000, 1, 1000);
        grant(&mut s, 1000, 3, 1500);
        let mut expect = vec![1u8];
        expect.extend_from_slice(&2u64.to_le_bytes());
        expect.extend_from_slice(&1000u64.to_le_bytes());
        expect.extend_from_slice(&[1, 2]);
        expect.extend_from_slice(&0u32.to_le_bytes()); // delta 0, count 1
        expect.extend_from_slice(&((500u32 << 2) | 2).to_le_bytes()); // delta 500, count 3
        assert_eq!(enc(&s), expect);
        assert_eq!(State::decode(&expect), Ok(s.clone()));

        // Rejections.
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = expect.clone();
            f(&mut b);
            State::decode(&b)
        };
        assert_eq!(State::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(bad(&|b| b[0] = 2), Err(DecodeError::UnknownVersion));
        assert_eq!(bad(&|b| b.push(0)), Err(DecodeError::TrailingBytes));
        assert_eq!(
            bad(&|b| {
                b.pop();
            }),
            Err(DecodeError::Truncated)
        );
        assert_eq!(bad(&|b| b[17] = 3), Err(DecodeError::Invalid("entry width")));
        assert_eq!(bad(&|b| b[18] = 33), Err(DecodeError::Invalid("count bits")));
        assert_eq!(bad(&|b| b[18] = 3), Err(DecodeError::Invalid("entry format not canonical")));
        assert_eq!(bad(&|b| b[19] = 4), Err(DecodeError::Invalid("first entry delta")));
        assert_eq!(
            bad(&|b| b[23..27].copy_from_slice(&2u32.to_le_bytes())),
            Err(DecodeError::Invalid("entry times not increasing"))
        );
        // n huge: refused before any allocation.
        assert_eq!(bad(&|b| b[1..9].copy_from_slice(&u64::MAX.to_le_bytes())), Err(DecodeError::Truncated));
        assert_eq!(bad(&|b| b[1..9].copy_from_slice(&(1u64 << 40).to_le_bytes())), Err(DecodeError::Truncated));
        // Time overflow.
        assert_eq!(
            bad(&|b| b[9..17].copy_from_slice(&(u64::MAX - 100).to_le_bytes())),
            Err(DecodeError::Invalid("entry time overflows"))
        );
        // Empty with trailing bytes.
        assert_eq!(State::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(DecodeError::TrailingBytes));
        // 4-word entries: count field of u64::MAX (count 2^64) is refused;
        // two counts summing past u64::MAX too.
        let mut w4 = vec![1u8];
        w4.extend_from_slice(&1u64.to_le_bytes());
        w4.extend_from_slice(&0u64.to_le_bytes());
        w4.extend_from_slice(&[4, 64]);
        w4.extend_from_slice(&u128::from(u64::MAX).to_le_bytes());
        assert_eq!(State::decode(&w4), Err(DecodeError::Invalid("entry count overflows")));
        let mut w4 = vec![1u8];
        w4.extend_from_slice(&2u64.to_le_bytes());
        w4.extend_from_slice(&0u64.to_le_bytes());
        w4.extend_from_slice(&[4, 64]);
        w4.extend_from_slice(&u128::from(u64::MAX - 1).to_le_bytes());
        w4.extend_from_slice(&((u128::from(u64::MAX >> 1) << 64) | 5).to_le_bytes());
        assert_eq!(State::decode(&w4), Err(DecodeError::Invalid("total units overflow")));
    }

    #[test]
    fn wide_formats_round_trip() {
        // Window of ~285,000 years and counts near 2^53: 4-word entries.
        let p = Params { limit: MAX_ARG, window_ms: MAX_ARG };
        let mut s = State::default();
        let mut now = 5u64;
        let mut m = Log::default();
        for (i, cost) in [1u64, MAX_ARG / 4, 3, MAX_ARG / 8, MAX_ARG / 16].into_iter().enumerate() {
            let d = call(&mut s, p, cost, true, now);
            assert_eq!(d, m.decide(&p, cost, true, now));
            m.grant(p.window_ms, d.granted, now);
            now += 1u64 << (50 + i);
            s.check_invariants();
        }
        assert_eq!(s.words, 4);
        assert_eq!(s.entry_vec(), m.entries());
        let e = enc(&s);
        assert_eq!(e[17], 4);
        assert_eq!(State::decode(&e), Ok(s.clone()));
        // Later everything expires except the newest, and the format narrows.
        let d = call(&mut s, Params { limit: MAX_ARG, window_ms: 1 }, 1, false, u64::MAX);
        assert_eq!(d.granted, 1);
        assert_eq!(s.entry_vec(), vec![(u64::MAX, 1)]);
        assert_eq!(s.words, 1);
        // The smallest buffer: 4 entries of 4 bytes.
        assert!(s.heap_bytes() <= 16);
    }

    // ---------------------------------------------------------------
    // Decoder fuzzing.
    // ---------------------------------------------------------------

    fn accepted_is_canonical(bytes: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(s) = State::decode(bytes) {
            s.check_invariants();
            prop_assert_eq!(enc(&s), bytes.to_vec());
            prop_assert!(s.heap_bytes() <= bytes.len());
            // Usable afterwards.
            let mut s2 = s.clone();
            let p = Params { limit: MAX_ARG, window_ms: 1000 };
            let d = decide(&s2, &p, 1, false, 0);
            if d.granted > 0 {
                grant(&mut s2, p.window_ms, d.granted, 0);
                s2.check_invariants();
            }
        }
        Ok(())
    }

    fn valid_encoding() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec((0u64..=5000, prop_oneof![1u64..=3, 1u64..=MAX_ARG], 1u64..=MAX_ARG), 0..40).prop_map(|gs| {
            let mut s = State::default();
            let mut now = 0u64;
            for (dt, units, window_ms) in gs {
                now = now.wrapping_add(dt.wrapping_mul(dt).wrapping_mul(dt));
                grant(&mut s, window_ms, units, now);
            }
            enc(&s)
        })
    }

    #[derive(Clone, Debug)]
    enum Mutation {
        Set(usize, u8),
        Flip(usize, u8),
        Truncate(usize),
        Insert(usize, u8),
        Remove(usize),
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
            (any::<usize>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
            any::<usize>().prop_map(Mutation::Truncate),
            (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
            any::<usize>().prop_map(Mutation::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: scaled(20_000),
            failure_persistence: None,
            .. ProptestConfig::default()
        })]

        #[test]
        fn decode_random_bytes(mut bytes in prop::collection::vec(any::<u8>(), 0..80), v in 0u8..3) {
            // Bias towards a plausible header.
            if let Some(b) = bytes.first_mut() {
                if v > 0 { *b = 1; }
            }
            if v == 2 && bytes.len() >= 19 {
                let n = (bytes.len() as u64 - 19) / 4;
                bytes[1..9].copy_from_slice(&n.to_le_bytes());
                bytes[17] = 1;
                bytes[18] %= 33;
            }
            accepted_is_canonical(&bytes)?;
        }

        #[test]
        fn decode_mutated(bytes in valid_encoding(), muts in prop::collection::vec(mutation(), 0..4)) {
            // The unmutated encoding is accepted and canonical.
            prop_assert!(State::decode(&bytes).is_ok());
            accepted_is_canonical(&bytes)?;
            let mut b = bytes.clone();
            for m in muts {
                let n = b.len().max(1);
                match m {
                    Mutation::Set(i, x) => { if let Some(y) = b.get_mut(i % n) { *y = x; } }
                    Mutation::Flip(i, bit) => { if let Some(y) = b.get_mut(i % n) { *y ^= 1 << bit; } }
                    Mutation::Truncate(i) => b.truncate(i % n),
                    Mutation::Insert(i, x) => { let at = i % (b.len() + 1); b.insert(at, x); }
                    Mutation::Remove(i) => { if !b.is_empty() { let at = i % b.len(); b.remove(at); } }
                }
                accepted_is_canonical(&b)?;
            }
        }
    }
}
