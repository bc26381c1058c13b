//! The fixed window's state encoding and compact form.
//!
//! Encoding: version 1, 17 bytes.
//!
//! | offset | size | field                                        |
//! |--------|------|----------------------------------------------|
//! | 0      | 1    | encoding version = 1                         |
//! | 1      | 8    | `start_ms`, u64 little-endian                |
//! | 9      | 8    | `count`, u64 little-endian                   |
//!
//! `decode` accepts exactly what a grant or a refund can store: `count` in
//! `1..=MAX_ARG` (a grant never counts more than a limit, a fresh state is
//! never stored: a refund to 0 deletes the key). `start_ms` is any instant
//! (FROMFIRST starts a window at any millisecond). Anything else, a short or
//! long input, or an unknown version is refused without panicking.
//!
//! The compact in-memory form is the two words `[start_ms, count]`: 16
//! bytes, and every state fits it.

use super::State;
use crate::{DecodeError, Reader, MAX_ARG};

/// First byte of the binary encoding.
pub const ENCODING_VERSION: u8 = 1;

impl State {
    /// Size of the binary encoding: version byte + two u64.
    pub const ENCODED_LEN: usize = 1 + 8 + 8;

    /// Version byte, then `start_ms`, `count` as little-endian u64.
    pub fn encode(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0] = ENCODING_VERSION;
        out[1..9].copy_from_slice(&self.start_ms.to_le_bytes());
        out[9..17].copy_from_slice(&self.count.to_le_bytes());
        out
    }

    /// Strict inverse of `encode`: refuses short or long input, unknown
    /// versions and any state a grant cannot produce. Never panics.
    pub fn decode(bytes: &[u8]) -> Result<State, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.u8()? != ENCODING_VERSION {
            return Err(DecodeError::UnknownVersion);
        }
        let start_ms = r.u64()?;
        let count = r.u64()?;
        r.finish()?;
        if count == 0 {
            return Err(DecodeError::Invalid("fixed window: count 0 (a fresh state is never stored)"));
        }
        if count > MAX_ARG {
            return Err(DecodeError::Invalid("fixed window: count exceeds 2^53-1"));
        }
        Ok(State { start_ms, count })
    }

    /// The state in two words: always (the form is the state itself).
    pub fn pack(&self) -> Option<[u64; 2]> {
        Some([self.start_ms, self.count])
    }

    /// Inverse of `pack`. Total.
    pub fn unpack(w: [u64; 2]) -> State {
        State { start_ms: w[0], count: w[1] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encoding_layout_and_round_trip() {
        let s = State { start_ms: 0x0102_0304_0506_0708, count: MAX_ARG };
        let b = s.encode();
        assert_eq!(State::ENCODED_LEN, 17);
        let mut want = vec![1u8];
        want.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        want.extend_from_slice(&MAX_ARG.to_le_bytes());
        assert_eq!(b.to_vec(), want);
        assert_eq!(State::decode(&b), Ok(s));
        let odd = State { start_ms: 1_700_000_000_123, count: 1 };
        assert_eq!(State::decode(&odd.encode()), Ok(odd));
        assert_eq!(State::unpack(odd.pack().unwrap()), odd);
    }

    #[test]
    fn decode_refuses_what_no_grant_produces() {
        let ok = State { start_ms: 7, count: 1 };
        assert_eq!(State::decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&ok.encode()[..16]), Err(DecodeError::Truncated));
        assert_eq!(State::decode(&ok.encode()[..1]), Err(DecodeError::Truncated));
        let mut long = ok.encode().to_vec();
        long.push(0);
        assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
        let mut v2 = ok.encode();
        v2[0] = 2;
        assert_eq!(State::decode(&v2), Err(DecodeError::UnknownVersion));
        assert_eq!(State::decode(&[0]), Err(DecodeError::UnknownVersion));
        let invalid = |s: State| matches!(State::decode(&s.encode()), Err(DecodeError::Invalid(_)));
        assert!(invalid(State { start_ms: 7, count: 0 }));
        assert!(invalid(State { start_ms: 7, count: MAX_ARG + 1 }));
        assert!(invalid(State { start_ms: 0, count: u64::MAX }));
        assert!(!invalid(State { start_ms: u64::MAX, count: MAX_ARG }));
        assert!(!invalid(State { start_ms: 0, count: 1 }));
    }

    proptest! {
        #[test]
        fn decode_accepts_exactly_valid_bodies(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            match State::decode(&bytes) {
                Ok(s) => {
                    prop_assert_eq!(bytes.len(), 17);
                    prop_assert!(s.count >= 1 && s.count <= MAX_ARG);
                    prop_assert_eq!(s.encode().to_vec(), bytes);
                }
                Err(_) => {
                    let bad_count = bytes.len() == 17 && {
                        let c = u64::from_le_bytes(bytes[9..17].try_into().unwrap());
                        c == 0 || c > MAX_ARG
                    };
                    prop_assert!(bytes.len() != 17 || bytes[0] != 1 || bad_count);
                }
            }
        }

        #[test]
        fn pack_round_trips(start_ms in any::<u64>(), count in any::<u64>()) {
            let s = State { start_ms, count };
            prop_assert_eq!(s.pack().map(State::unpack), Some(s));
        }
    }
}
