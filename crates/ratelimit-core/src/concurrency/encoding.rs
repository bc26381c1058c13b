//! The concurrency state's encoding (RDB, DUMP, the whole-state effect).
//!
//! Version 1: `13 + 24 n` bytes.
//!
//! | offset | size | field                                          |
//! |--------|------|------------------------------------------------|
//! | 0      | 1    | encoding version = 1                           |
//! | 1      | 8    | `last_us`, the last write's instant, u64 LE    |
//! | 9      | 4    | `n`, the number of leases, u32 LE, ≥ 1         |
//! | 13     | 24 n | each lease: `expiry_us`, `units`, `hash` (u64 LE) |
//!
//! The leases in the state's order (strictly increasing `(expiry, hash)`).
//! `decode` accepts exactly the states a call can store
//! ([`State::from_leases`]): at least one lease, the order, each hash once,
//! every expiry after `last_us`, units in `1..=MAX_ARG` and their sum within MAX_ARG; a short or long
//! body, an unknown version or a count the bytes do not hold are refused
//! before anything is allocated for them. Never panics.

use super::{Lease, State};
use crate::{DecodeError, Reader};

/// First byte of the binary encoding.
pub const ENCODING_VERSION: u8 = 1;

/// Bytes per lease in the encoding (and in memory).
pub const LEASE_LEN: usize = 24;

/// Bytes before the leases: version, `last_us`, count.
pub const HEAD_LEN: usize = 13;

impl State {
    /// The encoding's length.
    pub fn encoded_len(&self) -> usize {
        HEAD_LEN + LEASE_LEN * self.leases.len()
    }

    /// Append the encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        out.push(ENCODING_VERSION);
        out.extend_from_slice(&self.last_us.to_le_bytes());
        let n = u32::try_from(self.leases.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&n.to_le_bytes());
        for l in self.leases.iter().take(n as usize) {
            out.extend_from_slice(&l.expiry_us.to_le_bytes());
            out.extend_from_slice(&l.units.to_le_bytes());
            out.extend_from_slice(&l.hash.to_le_bytes());
        }
    }

    /// Strict inverse of [`State::encode`].
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let last_us = r.u64()?;
        let n = usize::try_from(r.u32()?).map_err(|_| DecodeError::Invalid("concurrency: count"))?;
        let body = n.checked_mul(LEASE_LEN).ok_or(DecodeError::Invalid("concurrency: count"))?;
        match r.remaining().cmp(&body) {
            core::cmp::Ordering::Less => return Err(DecodeError::Truncated),
            core::cmp::Ordering::Greater => return Err(DecodeError::TrailingBytes),
            core::cmp::Ordering::Equal => {}
        }
        let mut leases = Vec::with_capacity(n);
        for _ in 0..n {
            let expiry_us = r.u64()?;
            let units = r.u64()?;
            let hash = r.u64()?;
            leases.push(Lease { expiry_us, hash, units });
        }
        r.finish()?;
        State::from_leases(last_us, leases).map_err(DecodeError::Invalid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_ARG;
    use proptest::prelude::*;

    fn enc(s: &State) -> Vec<u8> {
        let mut out = Vec::new();
        s.encode(&mut out);
        out
    }

    #[test]
    fn layout_and_round_trip() {
        let s = State::from_leases(
            4,
            vec![Lease { expiry_us: 5, hash: 9, units: 2 }, Lease { expiry_us: 5, hash: 10, units: MAX_ARG - 2 }],
        )
        .unwrap();
        let b = enc(&s);
        assert_eq!(b.len(), 13 + 48);
        assert_eq!(b[..13], [1, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(b[13..21], 5u64.to_le_bytes());
        assert_eq!(b[21..29], 2u64.to_le_bytes());
        assert_eq!(b[29..37], 9u64.to_le_bytes());
        assert_eq!(State::decode(&b), Ok(s));
    }

    #[test]
    fn refuses_what_no_call_stores() {
        let lease = |e, h, u| Lease { expiry_us: e, hash: h, units: u };
        let raw = |ls: &[Lease]| {
            let mut b = vec![1u8];
            b.extend_from_slice(&0u64.to_le_bytes());
            b.extend_from_slice(&(ls.len() as u32).to_le_bytes());
            for l in ls {
                for w in [l.expiry_us, l.units, l.hash] {
                    b.extend_from_slice(&w.to_le_bytes());
                }
            }
            b
        };
        let invalid = |ls: &[Lease]| matches!(State::decode(&raw(ls)), Err(DecodeError::Invalid(_)));
        assert!(invalid(&[]));
        assert!(invalid(&[lease(1, 1, 0)]));
        assert!(invalid(&[lease(1, 1, MAX_ARG + 1)]));
        assert!(invalid(&[lease(1, 1, MAX_ARG), lease(2, 2, 1)]));
        assert!(invalid(&[lease(2, 1, 1), lease(1, 2, 1)]));
        assert!(invalid(&[lease(1, 2, 1), lease(1, 1, 1)]));
        assert!(invalid(&[lease(1, 1, 1), lease(1, 1, 1)]));
        assert!(invalid(&[lease(1, 7, 1), lease(2, 7, 1)]));
        assert!(!invalid(&[lease(1, 7, 1), lease(2, 8, MAX_ARG - 1)]));
        assert!(invalid(&[lease(0, 7, 1)]), "lapsed before the last write");
        let ok = raw(&[lease(1, 7, 1)]);
        assert_eq!(State::decode(&ok[..ok.len() - 1]), Err(DecodeError::Truncated));
        let mut long = ok.clone();
        long.push(0);
        assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
        let mut v2 = ok.clone();
        v2[0] = 2;
        assert_eq!(State::decode(&v2), Err(DecodeError::UnknownVersion));
        // A count the bytes do not hold: refused before allocating for it.
        let mut huge = ok.clone();
        huge[9..13].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(State::decode(&huge), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&[1, 0, 0]), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&ok[..12]), Err(DecodeError::Truncated));
    }

    proptest! {
        /// Whatever it accepts re-encodes to the same bytes and satisfies
        /// the invariants; nothing panics.
        #[test]
        fn decode_is_strict(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(s) = State::decode(&bytes) {
                prop_assert_eq!(enc(&s), bytes);
                prop_assert!(State::from_leases(s.last_us(), s.leases().to_vec()).is_ok());
            }
        }

        /// Valid states with one field changed: accepted exactly when the
        /// change keeps every invariant.
        #[test]
        fn mutated_states(
            ls in proptest::collection::vec((1u64..6, 0u64..6, 1u64..4), 1..6),
            at in 0usize..200,
            v in prop_oneof![Just(0u64), Just(1), Just(3), Just(MAX_ARG), Just(u64::MAX)],
        ) {
            let mut leases: Vec<Lease> = ls.iter().map(|&(e, h, u)| Lease { expiry_us: e, hash: h, units: u }).collect();
            leases.sort();
            leases.dedup_by_key(|l| l.hash);
            let s = State::from_leases(0, leases.clone());
            prop_assume!(s.is_ok());
            let mut b = enc(&s.unwrap());
            let word = 13 + 8 * (at % (3 * leases.len()));
            b[word..word + 8].copy_from_slice(&v.to_le_bytes());
            let i = (word - 13) / 24;
            let mut m = leases.clone();
            match (word - 13) % 24 {
                0 => m[i].expiry_us = v,
                8 => m[i].units = v,
                _ => m[i].hash = v,
            }
            prop_assert_eq!(State::decode(&b).is_ok(), State::from_leases(0, m).is_ok());
        }
    }
}
