//! A sliding log read back from its canonical encoding (the models and
//! the checks compare logical content, never the struct).

use crate::input::le_u64;
use crate::sl;

/// The sliding log's logical content, `(time µs, units)` oldest first, read
/// back from its canonical encoding (format in core/slidinglog.rs).
pub fn log_entries(enc: &[u8]) -> Vec<(u64, u64)> {
    assert!(enc.len() >= 9 && enc[0] == 1, "{enc:?}");
    let n = le_u64(&enc[1..9]) as usize;
    if n == 0 {
        assert_eq!(enc.len(), 9);
        return Vec::new();
    }
    let mut t = le_u64(&enc[9..17]);
    let words = usize::from(enc[17]);
    let cbits = u32::from(enc[18]);
    let body = &enc[19..];
    assert_eq!(body.len(), n * 4 * words);
    let mut out = Vec::with_capacity(n);
    for (i, chunk) in body.chunks(4 * words).enumerate() {
        let mut v = [0u8; 16];
        v[..chunk.len()].copy_from_slice(chunk);
        let v = u128::from_le_bytes(v);
        let mask = if cbits >= 128 { u128::MAX } else { (1u128 << cbits) - 1 };
        let delta = (v >> cbits) as u64;
        let count = (v & mask) as u64 + 1;
        if i > 0 {
            t += delta;
        }
        out.push((t, count));
    }
    out
}

/// A sliding log's canonical encoding (what RDB, DUMP and DEBUG DIGEST see).
pub fn sl_encode(s: &sl::State) -> Vec<u8> {
    let mut v = Vec::new();
    s.encode(&mut v);
    v
}
