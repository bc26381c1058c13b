//! The id's hash: SipHash-1-3 with the all-zero key (docs/contract.md,
//! "RL.CONCURRENCY": two ids with the same hash are one holder).
//!
//! Written from the SipHash paper (Aumasson and Bernstein, 2012): four
//! 64-bit words initialised from the key, `C` rounds per 8-byte
//! little-endian block, the last block padded with the length's low byte
//! in its top byte, then `D` rounds after `v2 ^= 0xff`. The id's bytes are
//! hashed as they are (no length prefix). Used with `C = 1, D = 3`; the
//! tests check the same code with `C = 2, D = 4` against the paper's
//! vector and against std's SipHasher.

/// The hash of an id as RL.CONCURRENCY stores it.
#[inline]
pub fn id_hash(id: &[u8]) -> u64 {
    siphash::<1, 3>(0, 0, id)
}

#[inline(always)]
fn round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

#[inline(always)]
fn compress<const C: usize>(v: &mut [u64; 4], m: u64) {
    v[3] ^= m;
    for _ in 0..C {
        round(v);
    }
    v[0] ^= m;
}

/// SipHash-C-D of `msg` under the key `(k0, k1)`.
#[inline]
pub(crate) fn siphash<const C: usize, const D: usize>(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v =
        [k0 ^ 0x736f_6d65_7073_6575, k1 ^ 0x646f_7261_6e64_6f6d, k0 ^ 0x6c79_6765_6e65_7261, k1 ^ 0x7465_6462_7974_6573];
    let mut blocks = msg.chunks_exact(8);
    for b in blocks.by_ref() {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        compress::<C>(&mut v, u64::from_le_bytes(w));
    }
    let mut last = [0u8; 8];
    let tail = blocks.remainder();
    if let Some(dst) = last.get_mut(..tail.len()) {
        dst.copy_from_slice(tail);
    }
    // The length's low byte (the wrap is the algorithm's).
    last[7] = msg.len() as u8;
    compress::<C>(&mut v, u64::from_le_bytes(last));
    v[2] ^= 0xff;
    for _ in 0..D {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::Hasher;

    /// The paper's appendix: key 00 01 .. 0f, message 00 01 .. 0e.
    #[test]
    fn the_papers_vector() {
        let k0 = u64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]);
        let k1 = u64::from_le_bytes([8, 9, 10, 11, 12, 13, 14, 15]);
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash::<2, 4>(k0, k1, &msg), 0xa129_ca61_49be_45e5);
    }

    #[allow(deprecated)]
    fn std_24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
        let mut h = std::hash::SipHasher::new_with_keys(k0, k1);
        h.write(msg);
        h.finish()
    }

    /// std's `DefaultHasher::new()` is SipHash-1-3 with the zero key today
    /// (its algorithm is unspecified: if a toolchain changes it, this test
    /// says so, and the two other tests still pin ours).
    fn std_13_zero(msg: &[u8]) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write(msg);
        h.finish()
    }

    #[test]
    fn fixed_ids() {
        assert_eq!(id_hash(b""), std_13_zero(b""));
        assert_eq!(id_hash(b"req-7f3a"), std_13_zero(b"req-7f3a"));
        assert_ne!(id_hash(b"a"), id_hash(b"b"));
    }

    proptest! {
        #[test]
        fn agrees_with_std(k0 in any::<u64>(), k1 in any::<u64>(), msg in proptest::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(siphash::<2, 4>(k0, k1, &msg), std_24(k0, k1, &msg));
            prop_assert_eq!(id_hash(&msg), std_13_zero(&msg));
        }
    }
}
