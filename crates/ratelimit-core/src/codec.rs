//! The effect payload carried by `RL.STATE key payload` — the one command the
//! module replicates and writes to the AOF. Pure, so it is fuzzed directly.
//!
//! ```text
//! byte 0      kind: 1 token bucket state, 2 sliding log state,
//!             3 sliding counter state, 4 sliding log grant (a delta),
//!             5 sliding log refund (a delta), 6 fixed window state,
//!             7 CL.THROTTLE's GCRA state, 8 concurrency state,
//!             9 concurrency lease change (a delta)
//! bytes 1..9  absolute expiry, Unix ms, little endian; 0 = no expiry
//!             (AOF rewrite: Redis appends its own PEXPIREAT)
//! bytes 9..   the body: the type's own versioned encoding (the same bytes
//!             RDB stores), or for kind 4 a grant to apply to the log
//! ```
//!
//! Token buckets, sliding counters and fixed windows replicate their whole
//! state (a few words). A sliding log replicates the grant it just made — `(now_us,
//! window_ms, units)` — which the replica applies with the same pure
//! function the master used, so a log of a thousand entries does not ship
//! 8 KB per request. A refund on a sliding log replicates the same three
//! numbers under kind 5, applied with `slidinglog::refund`. A concurrency
//! key replicates the one lease its call changed (kind 9, a
//! `concurrency::Change`: instant, hash, units, expiry), applied with
//! `concurrency::State::apply`; kind 8, its whole state, is for the AOF
//! rewrite. (A refund or release that leaves a limiter fresh deletes the
//! key and replicates `DEL`.)

use crate::{
    concurrency as cc, fixedwindow as fw, gcra, slidingcounter as sc, slidinglog as sl, tokenbucket as tb, DecodeError,
    Reader, MAX_ARG,
};

pub const KIND_TOKENBUCKET: u8 = 1;
pub const KIND_SLIDINGLOG: u8 = 2;
pub const KIND_SLIDINGCOUNTER: u8 = 3;
pub const KIND_LOG_GRANT: u8 = 4;
pub const KIND_LOG_REFUND: u8 = 5;
pub const KIND_FIXEDWINDOW: u8 = 6;
pub const KIND_GCRA: u8 = 7;
pub const KIND_CONCURRENCY: u8 = 8;
pub const KIND_LEASE: u8 = 9;

pub const HEADER_LEN: usize = 9;
const GRANT_VERSION: u8 = 1;
const GRANT_BODY_LEN: usize = 1 + 3 * 8;
const LEASE_VERSION: u8 = 1;
const LEASE_BODY_LEN: usize = 1 + 4 * 8;

/// A decoded effect.
#[derive(Debug, PartialEq, Eq)]
pub enum Effect {
    TokenBucket(tb::State),
    SlidingLog(sl::State),
    SlidingCounter(sc::State),
    LogGrant(LogGrant),
    /// A refund made on a sliding log (the same three numbers).
    LogRefund(LogGrant),
    FixedWindow(fw::State),
    /// CL.THROTTLE's state (it replaces a redis-cell string too).
    Gcra(gcra::State),
    /// A concurrency key's whole state.
    Concurrency(cc::State),
    /// One lease changed on a concurrency key.
    Lease(cc::Change),
}

/// A grant made on a sliding log: what the replica applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogGrant {
    pub now_us: u64,
    pub window_ms: u64,
    pub units: u64,
}

// `Small::new` would silently cut a body longer than its buffer holds.
const _: () = assert!(
    HEADER_LEN + tb::State::ENCODED_LEN <= 64
        && HEADER_LEN + sc::State::ENCODED_LEN <= 64
        && HEADER_LEN + GRANT_BODY_LEN <= 64
        && HEADER_LEN + fw::State::ENCODED_LEN <= 64
        && HEADER_LEN + gcra::State::ENCODED_LEN <= 64
        && HEADER_LEN + LEASE_BODY_LEN <= 64
);

/// A small payload built on the stack (hot path: no heap allocation).
pub struct Small {
    buf: [u8; 64],
    len: usize,
}

impl Small {
    fn new(kind: u8, abs_expire_ms: u64, body: &[u8]) -> Small {
        let mut buf = [0u8; 64];
        buf[..HEADER_LEN].copy_from_slice(&header(kind, abs_expire_ms));
        let len = (HEADER_LEN + body.len()).min(buf.len());
        if let Some(dst) = buf.get_mut(HEADER_LEN..len) {
            dst.copy_from_slice(body.get(..len - HEADER_LEN).unwrap_or_default());
        }
        Small { buf, len }
    }
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}

impl AsRef<[u8]> for Small {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

pub fn tokenbucket(state: &tb::State, abs_expire_ms: u64) -> Small {
    Small::new(KIND_TOKENBUCKET, abs_expire_ms, &state.encode())
}

pub fn slidingcounter(state: &sc::State, abs_expire_ms: u64) -> Small {
    Small::new(KIND_SLIDINGCOUNTER, abs_expire_ms, &state.encode())
}

pub fn fixedwindow(state: &fw::State, abs_expire_ms: u64) -> Small {
    Small::new(KIND_FIXEDWINDOW, abs_expire_ms, &state.encode())
}

pub fn gcra(state: &gcra::State, abs_expire_ms: u64) -> Small {
    Small::new(KIND_GCRA, abs_expire_ms, &state.encode())
}

pub fn log_grant(g: &LogGrant, abs_expire_ms: u64) -> Small {
    log_delta(KIND_LOG_GRANT, g, abs_expire_ms)
}

pub fn log_refund(g: &LogGrant, abs_expire_ms: u64) -> Small {
    log_delta(KIND_LOG_REFUND, g, abs_expire_ms)
}

fn log_delta(kind: u8, g: &LogGrant, abs_expire_ms: u64) -> Small {
    let mut body = [0u8; GRANT_BODY_LEN];
    body[0] = GRANT_VERSION;
    body[1..9].copy_from_slice(&g.now_us.to_le_bytes());
    body[9..17].copy_from_slice(&g.window_ms.to_le_bytes());
    body[17..25].copy_from_slice(&g.units.to_le_bytes());
    Small::new(kind, abs_expire_ms, &body)
}

/// The lease a concurrency call changed (kind 9): 42 bytes.
pub fn lease(c: &cc::Change, abs_expire_ms: u64) -> Small {
    let mut body = [0u8; LEASE_BODY_LEN];
    body[0] = LEASE_VERSION;
    for (dst, w) in body[1..].chunks_exact_mut(8).zip([c.now_us, c.hash, c.units, c.expiry_us]) {
        dst.copy_from_slice(&w.to_le_bytes());
    }
    Small::new(KIND_LEASE, abs_expire_ms, &body)
}

/// A whole concurrency state with its expiry (kind 8).
pub fn concurrency(state: &cc::State, abs_expire_ms: u64) -> Vec<u8> {
    full_state(KIND_CONCURRENCY, abs_expire_ms, state.encoded_len(), |out| state.encode(out))
}

/// The header every payload starts with: kind, then the absolute expiry.
fn header(kind: u8, abs_expire_ms: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = kind;
    h[1..].copy_from_slice(&abs_expire_ms.to_le_bytes());
    h
}

/// A whole state of any size in a heap buffer (the AOF rewrite, with
/// `abs_expire_ms` 0: Redis appends the key's PEXPIREAT itself). Not on the
/// request path.
pub fn full_state(kind: u8, abs_expire_ms: u64, body_len_hint: usize, encode_body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + body_len_hint);
    out.extend_from_slice(&header(kind, abs_expire_ms));
    encode_body(&mut out);
    out
}

/// A whole sliding log with its expiry.
pub fn slidinglog(state: &sl::State, abs_expire_ms: u64) -> Vec<u8> {
    full_state(KIND_SLIDINGLOG, abs_expire_ms, 16 + state.heap_bytes(), |out| state.encode(out))
}

/// Strict decoder for a payload: returns the effect and its absolute expiry
/// (0 = none). Never panics; anything it accepts satisfies the invariants
/// of the state type.
pub fn decode(bytes: &[u8]) -> Result<(Effect, u64), DecodeError> {
    let mut r = Reader::new(bytes);
    let kind = r.u8()?;
    let abs = r.u64()?;
    let body = r.take(r.remaining())?;
    let effect = match kind {
        KIND_TOKENBUCKET => Effect::TokenBucket(tb::State::decode(body)?),
        KIND_SLIDINGLOG => Effect::SlidingLog(sl::State::decode(body)?),
        KIND_SLIDINGCOUNTER => Effect::SlidingCounter(sc::State::decode(body)?),
        KIND_FIXEDWINDOW => Effect::FixedWindow(fw::State::decode(body)?),
        KIND_GCRA => Effect::Gcra(gcra::State::decode(body)?),
        KIND_CONCURRENCY => Effect::Concurrency(cc::State::decode(body)?),
        KIND_LEASE => {
            let mut b = Reader::new(body);
            if b.u8()? != LEASE_VERSION {
                return Err(DecodeError::UnknownVersion);
            }
            let c = cc::Change { now_us: b.u64()?, hash: b.u64()?, units: b.u64()?, expiry_us: b.u64()? };
            b.finish()?;
            if c.units > MAX_ARG {
                return Err(DecodeError::Invalid("units"));
            }
            Effect::Lease(c)
        }
        KIND_LOG_GRANT | KIND_LOG_REFUND => {
            let mut b = Reader::new(body);
            if b.u8()? != GRANT_VERSION {
                return Err(DecodeError::UnknownVersion);
            }
            let g = LogGrant { now_us: b.u64()?, window_ms: b.u64()?, units: b.u64()? };
            b.finish()?;
            if g.window_ms == 0 || g.window_ms > MAX_ARG {
                return Err(DecodeError::Invalid("window_ms"));
            }
            if g.units == 0 || g.units > MAX_ARG {
                return Err(DecodeError::Invalid("units"));
            }
            if kind == KIND_LOG_GRANT {
                Effect::LogGrant(g)
            } else {
                Effect::LogRefund(g)
            }
        }
        _ => return Err(DecodeError::Invalid("kind")),
    };
    Ok((effect, abs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let s = tb::State { tokens: 1, frac: 2, den: 3000, last_us: 4 };
        assert_eq!(decode(tokenbucket(&s, 99).as_bytes()), Ok((Effect::TokenBucket(s), 99)));
        let g = LogGrant { now_us: 5, window_ms: 6, units: 7 };
        assert_eq!(decode(log_grant(&g, 0).as_bytes()), Ok((Effect::LogGrant(g), 0)));
        assert_eq!(decode(log_refund(&g, 5).as_bytes()), Ok((Effect::LogRefund(g), 5)));
        assert!(decode(log_refund(&LogGrant { units: 0, ..g }, 0).as_bytes()).is_err());
        let bad = LogGrant { units: 0, ..g };
        assert!(decode(log_grant(&bad, 0).as_bytes()).is_err());
        let bad = LogGrant { window_ms: MAX_ARG + 1, ..g };
        assert!(decode(log_grant(&bad, 0).as_bytes()).is_err());
        assert!(decode(&[9, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert_eq!(decode(&[1, 0]), Err(DecodeError::Truncated));
        let f = fw::State { start_ms: 1_700_000_000_123, count: 3 };
        let b = fixedwindow(&f, 1_700_000_001_123);
        assert_eq!(b.as_bytes().len(), HEADER_LEN + 17);
        assert_eq!(b.as_bytes()[0], 6);
        assert_eq!(decode(b.as_bytes()), Ok((Effect::FixedWindow(f), 1_700_000_001_123)));
        assert!(decode(&b.as_bytes()[..b.as_bytes().len() - 1]).is_err());
        assert!(decode(fixedwindow(&fw::State { count: 0, ..f }, 0).as_bytes()).is_err());
        let g = gcra::State { tat_ns: 1_796_212_800_123_456_789 };
        assert_eq!(decode(gcra(&g, 42).as_bytes()), Ok((Effect::Gcra(g), 42)));
        let c = cc::Change { now_us: 1, hash: 2, units: 3, expiry_us: 4 };
        let b = lease(&c, 7);
        assert_eq!(b.as_bytes().len(), 42);
        assert_eq!(decode(b.as_bytes()), Ok((Effect::Lease(c), 7)));
        assert!(decode(&b.as_bytes()[..41]).is_err());
        assert!(decode(lease(&cc::Change { units: MAX_ARG + 1, ..c }, 7).as_bytes()).is_err());
        assert_eq!(
            decode(lease(&cc::Change { units: 0, ..c }, 7).as_bytes()),
            Ok((Effect::Lease(cc::Change { units: 0, ..c }), 7))
        );
        let mut s = cc::State::default();
        s.apply(&c).unwrap();
        assert_eq!(decode(&concurrency(&s, 9)), Ok((Effect::Concurrency(s), 9)));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode(&bytes);
        }
    }
}
