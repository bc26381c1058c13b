//! The input layout of the `args_*` targets (see lib.rs) and the
//! little-endian words the state synthesizers read.

/// The parts of an `args_*` input.
pub struct Input<'a> {
    pub now: u64,
    pub now2: u64,
    pub mode: u8,
    pub state: &'a [u8],
    pub args: Vec<&'a [u8]>,
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    for (d, s) in a.iter_mut().zip(b) {
        *d = *s;
    }
    u64::from_le_bytes(a)
}

impl<'a> Input<'a> {
    pub fn parse(data: &'a [u8]) -> Input<'a> {
        let get = |from: usize, to: usize| data.get(from.min(data.len())..to.min(data.len())).unwrap_or(&[]);
        let now = le_u64(get(0, 8));
        let now2 = le_u64(get(8, 16));
        let mode = get(16, 17).first().copied().unwrap_or(0) & 3;
        let sl = get(17, 19);
        let state_len = usize::from(sl.first().copied().unwrap_or(0)) | usize::from(sl.get(1).copied().unwrap_or(0)) << 8;
        let state = get(19, 19 + state_len);
        let rest = get(19 + state_len, data.len());
        let args = if rest.is_empty() { Vec::new() } else { rest.split(|&b| b == 0).collect() };
        Input { now, now2, mode, state, args }
    }
}

/// Little-endian u64 words of `b` (the last one zero-padded).
pub fn words(b: &[u8]) -> impl Iterator<Item = u64> + '_ {
    b.chunks(8).map(le_u64)
}
