//! CL.THROTTLE's core: hand-computed cases (the first two seen from
//! redis-cell 0.5 itself), then random call sequences against the
//! reference model (`reference::gcra`), with the key's millisecond expiry.

use super::*;
use crate::reference::gcra::{throttle, Store, ZeroRate};
use proptest::prelude::*;

const S: u64 = 1_000_000_000;
const NOW: u64 = 1_796_212_800_123_456_000;

/// The glue's part: a key holds a state until its expiry millisecond
/// passes; an allowed call stores and expires it.
#[derive(Default)]
struct Key {
    v: Option<(State, u64)>,
}

impl Key {
    fn call(&mut self, b: i64, c: i64, p: i64, q: i64, now: u64) -> Result<[i64; 5], ParamError> {
        let params = Params::new(b, c, p, q)?;
        let now_ms = now / 1_000_000;
        if matches!(self.v, Some((_, exp)) if now_ms > exp) {
            self.v = None;
        }
        let o = step(self.v.map(|v| v.0), &params, now).expect("in range");
        if let Some(s) = o.write {
            self.v = Some((s, now_ms + o.ttl_ms));
        }
        Ok(reply(&o))
    }
}

#[test]
fn the_first_calls_answer_like_redis_cell() {
    let mut k = Key::default();
    // Seen from redis-cell 0.5 on Valkey 9.1 at this instant.
    assert_eq!(k.call(2, 1, 10, 1, NOW), Ok([0, 3, 2, -1, 10]));
    assert_eq!(k.call(2, 1, 10, 1, NOW), Ok([0, 3, 1, -1, 20]));
    assert_eq!(k.v.unwrap().0.tat_ns, NOW + 20 * S);
    assert_eq!(k.call(2, 1, 10, 1, NOW), Ok([0, 3, 0, -1, 30]));
    // Full: the next unit frees 10 s after the first.
    assert_eq!(k.call(2, 1, 10, 1, NOW), Ok([1, 3, 0, 10, 30]));
    // 2.5 s later: 7.5 s to wait, answered as 8 (a whole ms beyond 7 s).
    assert_eq!(k.call(2, 1, 10, 1, NOW + 5 * S / 2), Ok([1, 3, 0, 8, 28]));
    // A quantity above the limit never passes: retry −1.
    assert_eq!(k.call(2, 1, 10, 4, NOW + 5 * S / 2), Ok([1, 3, 0, -1, 28]));
}

#[test]
fn seconds_round_like_redis_cell() {
    assert_eq!(cell_seconds(-NS_PER_S), -1);
    assert_eq!(cell_seconds(0), 0);
    assert_eq!(cell_seconds(999_999), 0); // under a millisecond: not rounded up
    assert_eq!(cell_seconds(1_000_000), 1);
    assert_eq!(cell_seconds(2 * NS_PER_S), 2);
    assert_eq!(cell_seconds(2 * NS_PER_S + 999_999), 2);
    assert_eq!(cell_seconds(-500_000_000), 0);
    // f64 rounds s + 0.999999999 up to s + 1 once s is large: then + 1 again.
    let big = 9_000_000_000 * NS_PER_S + 999_999_999;
    assert_eq!(cell_seconds(big), 9_000_000_002);
    // Past i64 ns (the out-of-line path), and at its edges.
    let past = i128::from(u64::MAX) + 999_999;
    assert_eq!(cell_seconds(past), (past / NS_PER_S) as i64 + (if past % NS_PER_S >= 1_000_000 { 1 } else { 0 }));
    assert_eq!(cell_seconds(i128::from(i64::MAX)), cell_seconds_wide(i128::from(i64::MAX)));
    assert_eq!(cell_seconds(i128::from(i64::MIN)), cell_seconds_wide(i128::from(i64::MIN)));
}

#[test]
fn refused_numbers() {
    assert_eq!(Params::new(1, 0, 10, 1), Err(ParamError::ZeroRate));
    assert_eq!(Params::new(-5, 1, 0, 1), Err(ParamError::ZeroRate));
    assert_eq!(Params::new(1, 3_000_000_000, 1, 1), Err(ParamError::ZeroRate)); // 0.33 ns
    assert_eq!(Params::new(-1, 1, 10, 1), Err(ParamError::Negative));
    assert_eq!(Params::new(1, -1, 10, 1), Err(ParamError::Negative));
    assert_eq!(Params::new(1, 1, 10, -1), Err(ParamError::Negative));
    assert_eq!(Params::new(i64::MAX, 1, 10, 1), Err(ParamError::TooLarge));
    assert_eq!(Params::new(1, 1, i64::MAX, 1), Err(ParamError::TooLarge));
    assert_eq!(Params::new(1, 1, 10, i64::MAX / 10), Err(ParamError::TooLarge));
    assert!(Params::new(0, 1, 1, 0).is_ok());
}

/// A TAT far ahead (only a hand-written string holds one) is denied and
/// never written: an allowed TAT is at most now + τ < 2^64 ns.
#[test]
fn a_far_tat_is_denied_not_overflowed() {
    let p = Params::new(5, 1, 1, 1).unwrap();
    let o = step(Some(State { tat_ns: u64::MAX }), &p, NOW).unwrap();
    assert!(o.limited && o.write.is_none());
    assert_eq!(reply(&o)[4], cell_seconds(i128::from(u64::MAX - NOW)));
}

#[test]
fn cell_strings_parse_like_rust_u64() {
    assert_eq!(parse_cell_string(b"123"), Some(123));
    assert_eq!(parse_cell_string(b"+0123"), Some(123));
    assert_eq!(parse_cell_string(b"18446744073709551615"), Some(u64::MAX));
    for bad in [&b""[..], b"+", b"-1", b" 1", b"1 ", b"18446744073709551616", b"1e3", b"++1"] {
        assert_eq!(parse_cell_string(bad), None, "{bad:?}");
    }
}

proptest! {
    /// The i64 path of a step answers what the i128 one does, wherever it
    /// answers (TATs and instants near and past i64's end included).
    #[test]
    fn step_paths_agree(
        (b, c, p) in params(),
        q in 0i64..40,
        now in prop_oneof![Just(NOW), any::<u64>(), (i64::MAX as u64 - 1_000_000_000)..=(i64::MAX as u64 + 1_000_000_000)],
        tat in proptest::option::of(prop_oneof![any::<u64>(), NOW - 5 * S..NOW + 400_000 * S]),
    ) {
        if let Ok(pp) = Params::new(b, c, p, q) {
            let cur = tat.map(|tat_ns| State { tat_ns });
            if let Some(fast) = step_i64(cur, &pp, now) {
                prop_assert_eq!(Ok(fast), step_wide(cur, &pp, now));
            }
        }
    }

    /// The i64 path of the seconds rounding answers what the i128 one does.
    #[test]
    fn seconds_paths_agree(ns in any::<i64>()) {
        prop_assert_eq!(cell_seconds(i128::from(ns)), cell_seconds_wide(i128::from(ns)));
    }

    /// The byte parser accepts exactly what Rust's `str::parse::<i64>`
    /// (redis-cell's) accepts, with the same value.
    #[test]
    fn integers_parse_like_rust(s in "[-+]?[0-9]{0,20}|[ -~]{0,6}", n in any::<i64>()) {
        prop_assert_eq!(parse_i64(s.as_bytes()), s.parse::<i64>().ok());
        let t = n.to_string();
        prop_assert_eq!(parse_i64(t.as_bytes()), Some(n));
    }
}

#[test]
fn integer_edges() {
    for s in [
        "",
        "+",
        "-",
        "-0",
        "+0",
        "007",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        " 1",
        "1 ",
        "1.0",
        "٣",
    ] {
        assert_eq!(parse_i64(s.as_bytes()), s.parse::<i64>().ok(), "{s:?}");
    }
    assert_eq!(parse_i64(b"\xff1"), None);
}

#[test]
fn encoding_round_trips_and_is_strict() {
    let s = State { tat_ns: NOW };
    assert_eq!(State::decode(&s.encode()), Ok(s));
    assert_eq!(State::unpack(s.pack().unwrap()), s);
    assert_eq!(State::decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0]), Err(DecodeError::UnknownVersion));
    assert_eq!(State::decode(&s.encode()[..8]), Err(DecodeError::Truncated));
    let mut long = s.encode().to_vec();
    long.push(0);
    assert_eq!(State::decode(&long), Err(DecodeError::TrailingBytes));
}

/// Parameters that mix sub-µs intervals (remaining's 0/0 in f64), bursts,
/// quantities above the limit, and multi-year tolerances.
fn params() -> impl Strategy<Value = (i64, i64, i64)> {
    prop_oneof![
        (0i64..20, 1i64..20, 1i64..120),
        (0i64..5, 1i64..5_000_000_000, 1i64..4),
        (0i64..1_000_000, 1i64..1_000, 1i64..1_000_000),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any sequence of calls on one key, time moving forward by ns to days
    /// (or standing), answers what the model answers and leaves the TAT it
    /// leaves.
    #[test]
    fn sequences_match_the_model(
        (b, c, p) in params(),
        steps in proptest::collection::vec((0i64..30, prop_oneof![Just(0u64), 0u64..2_000_000, 0u64..30 * S, 0u64..400_000 * S]), 1..60),
    ) {
        let mut k = Key::default();
        let mut m = Store::default();
        let mut now = NOW;
        for (q, dt) in steps {
            now += dt;
            let got = k.call(b, c, p, q, now);
            if got == Err(ParamError::TooLarge) {
                continue;
            }
            let want = throttle(&mut m, b, c, p, q, now);
            match got {
                Ok(got) => prop_assert_eq!(Ok(got), want),
                Err(e) => prop_assert_eq!(want, Err(ZeroRate), "{:?}", e),
            }
            prop_assert_eq!(k.v.map(|v| (v.0.tat_ns, i128::from(v.1))), m.key);
        }
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
        let _ = State::decode(&bytes);
    }
}
