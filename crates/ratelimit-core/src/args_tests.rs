//! Tests of the argument parsers (args.rs): numbers, options, the single
//! commands' calls and RL.MULTI's (the generic parser and the fast path's).

use super::*;
use crate::multi::Params;

fn p(args: &[&str], pos: &[Arg]) -> Result<Call, ArgError> {
    parse(args.iter().map(|s| s.as_bytes()), pos)
}

#[test]
fn numbers() {
    assert_eq!(parse_num(b"1", 1), Some(1));
    assert_eq!(parse_num(b"0", 1), None);
    assert_eq!(parse_num(b"0", 0), Some(0));
    assert_eq!(parse_num(b"9007199254740991", 1), Some(MAX_ARG));
    assert_eq!(parse_num(b"9007199254740992", 1), None);
    assert_eq!(parse_num(b"99999999999999999999", 1), None);
    for bad in ["", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "abc", "١"] {
        assert_eq!(parse_num(bad.as_bytes(), 0), None, "{bad}");
    }
    assert_eq!(parse_num(b"0000000000000001", 1), Some(1));
}

/// The plain digit loop `parse_num` was: the eight-at-once path must
/// agree with it on every input.
fn plain_num(s: &[u8], min: u64) -> Option<u64> {
    if s.is_empty() || s.len() > 16 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v = s.iter().fold(0u64, |v, &b| v * 10 + u64::from(b - b'0'));
    (min..=MAX_ARG).contains(&v).then_some(v)
}

#[test]
fn eight_digits_at_once_agrees_with_the_digit_loop() {
    let bases: [&[u8]; 20] = [
        b"7",
        b"42",
        b"360",
        b"123456",
        b"9876543",
        b"123456789",
        b"90071992547",
        b"1234567890123",
        b"12345678901234",
        b"12345678",
        b"9007199254740991",
        b"9007199254740992",
        b"1000000000",
        b"0000000000000000",
        b"99999999",
        b"3600000",
        b"9999",
        b"12345",
        b"123456789012",
        b"900719925474099",
    ];
    for base in bases {
        assert_eq!(parse_num(base, 0), plain_num(base, 0));
        for i in 0..base.len() {
            for b in 0..=255u8 {
                let mut w = base.to_vec();
                w[i] = b;
                assert_eq!(parse_num(&w, 1), plain_num(&w, 1), "{w:?}");
            }
        }
    }
    // Every length, and a pseudo-random sweep of digit strings.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..200_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 18) as usize;
        let w: Vec<u8> = (0..len).map(|i| b'0' + ((x >> (i * 3)) % 10) as u8).collect();
        assert_eq!(parse_num(&w, 1), plain_num(&w, 1), "{w:?}");
    }
}

/// Random RL.MULTI calls (the arguments after the command name) of the
/// common shape, perturbed: a wrong numkeys, a repeated key, another or an
/// unknown algorithm, a bad number, a WEIGHT or an option after a limit, a
/// missing or an extra last word. A fixed xorshift sequence: the same calls
/// on every run.
struct RandomCalls {
    x: u64,
    kinds: [&'static [u8]; 4],
}

impl RandomCalls {
    const NUMS: [&'static [u8]; 5] = [b"1", b"1000", b"9007199254740991", b"0", b"x"];
    const EXTRA: [&'static [u8]; 4] = [b"WEIGHT", b"2", b"COST", b"DRYRUN"];
    const NUMKEYS: [&'static [u8]; 5] = [b"1", b"2", b"3", b"4", b"0"];
    const KEYS: [&'static [u8]; 4] = [b"a", b"b", b"c", b"d"];

    /// `kinds[0]` must be TOKENBUCKET (three numbers), the others take two.
    fn new(seed: u64, kinds: [&'static [u8]; 4]) -> Self {
        RandomCalls { x: seed, kinds }
    }

    fn next(&mut self, m: u64) -> u64 {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.x % m
    }

    /// A call of 1..=`max_n` limits (`max_n` at most 4); one key in
    /// `repeat_one_in` is another of the first `max_n`; the limits' kinds
    /// are mostly of the first `common_kinds`.
    fn next_call(&mut self, max_n: u64, repeat_one_in: u64, common_kinds: u64) -> Vec<&'static [u8]> {
        let n = 1 + self.next(max_n) as usize;
        let numkeys = if self.next(8) == 0 { self.next(5) as usize } else { n - 1 };
        let mut args = vec![Self::NUMKEYS[numkeys]];
        for i in 0..n {
            let k = if self.next(repeat_one_in) == 0 { self.next(max_n) as usize } else { i };
            args.push(Self::KEYS[k]);
        }
        for _ in 0..n {
            let k = if self.next(10) == 0 { self.next(4) } else { self.next(common_kinds) } as usize;
            args.push(self.kinds[k]);
            for _ in 0..(if k == 0 { 3 } else { 2 }) {
                let v = if self.next(10) == 0 { self.next(5) } else { self.next(3) } as usize;
                args.push(Self::NUMS[v]);
            }
            if self.next(10) == 0 {
                args.push(Self::EXTRA[self.next(4) as usize]);
            }
        }
        match self.next(10) {
            0 => {
                args.pop();
            }
            1 => args.push(Self::EXTRA[self.next(4) as usize]),
            _ => {}
        }
        args
    }
}

/// The one parser sized for the module's common calls (`N` = 2, 4) and
/// checked as the module checks it answers what `parse_multi` does, and
/// `plain` (the module's fast path) marks exactly the calls of word-state
/// limits without WEIGHT or option.
#[test]
fn sized_parse_agrees_with_parse_multi() {
    let mut calls = RandomCalls::new(0x9E37_79B9_7F4A_7C15, [b"TOKENBUCKET", b"slidingcounter", b"SlidingLog", b"x"]);
    let mut plain = 0;
    for i in 0..300_000 {
        // Up to two or four limits, a key repeated one time in six or
        // eight, mostly the word kinds (the first two).
        let args = if i % 2 == 0 { calls.next_call(4, 6, 2) } else { calls.next_call(2, 8, 3) };
        let full = parse_multi(&args);
        let sized = |r: Result<MultiCall<4>, ArgError>| {
            r.and_then(|c| c.check(&args[1..=c.n], |a| a).map(|()| c))
                .map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund, c.plain))
        };
        let want = full.as_ref().map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund, c.plain));
        // The module's room for the call's argument count (commands/multi.rs):
        // a call of n limits has at least 1 + 4n arguments.
        let room = args.len().saturating_sub(1) / 4;
        if room <= 4 {
            let got = sized(parse_multi_n::<&[u8], 4>(&args, |a| a));
            assert_eq!(got, want.clone().map_err(|e| *e), "{args:?}");
        }
        if room <= 2 {
            let two = parse_multi_n::<&[u8], 2>(&args, |a| a)
                .and_then(|c| c.check(&args[1..=c.n], |a| a).map(|()| c))
                .map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund, c.plain));
            assert_eq!(two, want.clone().map_err(|e| *e), "{args:?}");
        }
        if let Ok(c) = full {
            let words = c.limits[..c.n].iter().all(|l| l.kind() != Kind::SlidingLog);
            let opts = !args.iter().any(|w| w.eq_ignore_ascii_case(b"WEIGHT") || is_option(w));
            assert_eq!(c.plain, words && opts, "{args:?}");
            plain += usize::from(c.plain);
        }
    }
    assert!(plain > 20_000, "only {plain} plain calls");
}

/// `parse_exact` (the module's path for a call of numbers only) answers
/// what `parse` does, the argument an error names included, for every
/// mix of good and bad numbers; other lengths go to `parse` itself.
#[test]
fn parse_exact_agrees_with_parse() {
    let words: [&[u8]; 9] = [b"1", b"0", b"1000000000", b"9007199254740991", b"9007199254740992", b"x", b"", b"COST", b"07"];
    for pos in [TOKENBUCKET_ARGS, WINDOW_ARGS] {
        for n in 0..=4usize {
            let combos = words.len().pow(n as u32);
            for mut c in 0..combos {
                let args: Vec<&[u8]> = (0..n)
                    .map(|_| {
                        let w = words[c % words.len()];
                        c /= words.len();
                        w
                    })
                    .collect();
                assert_eq!(parse_exact(&args, pos), parse(args.iter().copied(), pos), "{args:?}");
            }
        }
    }
}

#[test]
fn options_any_order_case_insensitive() {
    let c = p(&["10", "1", "1000", "dryrun", "Cost", "5", "PARTIAL"], TOKENBUCKET_ARGS).unwrap();
    assert_eq!(c, Call { nums: [10, 1, 1000], cost: 5, partial: true, dryrun: true, refund: 0, force: false });
    let c = p(&["10", "1000"], WINDOW_ARGS).unwrap();
    assert_eq!(c, Call { nums: [10, 1000, 0], cost: 1, partial: false, dryrun: false, refund: 0, force: false });
}

#[test]
fn errors() {
    assert_eq!(p(&["10", "1"], TOKENBUCKET_ARGS), Err(ArgError::Arity));
    assert_eq!(p(&[], WINDOW_ARGS), Err(ArgError::Arity));
    assert_eq!(p(&["0", "1", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::Capacity)));
    assert_eq!(p(&["1", "x", "1"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::Rate)));
    assert_eq!(p(&["1", "1", "-5"], TOKENBUCKET_ARGS), Err(ArgError::Number(Arg::PeriodMs)));
    assert_eq!(p(&["1", "1", "COST"], WINDOW_ARGS), Err(ArgError::Syntax));
    assert_eq!(p(&["1", "1", "COST", "1", "COST", "2"], WINDOW_ARGS), Err(ArgError::Syntax));
    assert_eq!(p(&["1", "1", "PARTIAL", "partial"], WINDOW_ARGS), Err(ArgError::Syntax));
    assert_eq!(p(&["1", "1", "DRYRUN", "DRYRUN"], WINDOW_ARGS), Err(ArgError::Syntax));
    assert_eq!(p(&["1", "1", "FOO"], WINDOW_ARGS), Err(ArgError::Syntax));
    assert_eq!(p(&["1", "1", "COST", "9007199254740992"], WINDOW_ARGS), Err(ArgError::Number(Arg::Cost)));
    assert_eq!(p(&["1", "1", "COST", "0"], WINDOW_ARGS).map(|c| c.cost), Ok(0));
}

#[test]
fn refund_excludes_the_other_options() {
    assert_eq!(p(&["1", "1", "refund", "3"], WINDOW_ARGS).map(|c| (c.refund, c.cost)), Ok((3, 1)));
    for bad in [
        &["REFUND", "1", "COST", "1"][..],
        &["COST", "1", "REFUND", "1"],
        &["PARTIAL", "REFUND", "1"],
        &["REFUND", "1", "DRYRUN"],
        &["REFUND", "1", "REFUND", "1"],
        &["REFUND"],
    ] {
        let args: Vec<&str> = ["1", "1"].iter().chain(bad).copied().collect();
        assert_eq!(p(&args, WINDOW_ARGS), Err(ArgError::Syntax), "{bad:?}");
    }
    assert_eq!(p(&["1", "1", "REFUND", "0"], WINDOW_ARGS), Err(ArgError::Number(Arg::Refund)));
    assert_eq!(p(&["1", "1", "REFUND", "9007199254740992"], WINDOW_ARGS), Err(ArgError::Number(Arg::Refund)));
}

fn fw(args: &[&str]) -> Result<Call, ArgError> {
    parse_fixedwindow(args.iter().map(|s| s.as_bytes()))
}

/// RL.FIXEDWINDOW: the window commands' grammar and errors, plus
/// FROMFIRST (once, anywhere, any case, with a grant or a refund).
#[test]
fn fixedwindow_takes_fromfirst() {
    use crate::fixedwindow::FROMFIRST;
    let plain = Call { nums: [10, 1000, 0], cost: 1, partial: false, dryrun: false, refund: 0, force: false };
    assert_eq!(fw(&["10", "1000"]), Ok(plain));
    assert_eq!(fw(&["10", "1000", "FROMFIRST"]), Ok(Call { nums: [10, 1000, FROMFIRST], ..plain }));
    let c = fw(&["10", "1000", "fromFirst", "cost", "3", "DRYRUN", "partial"]).unwrap();
    assert_eq!(c, Call { nums: [10, 1000, FROMFIRST], cost: 3, partial: true, dryrun: true, refund: 0, force: false });
    let c = fw(&["10", "1000", "COST", "0", "FROMFIRST"]).unwrap();
    assert_eq!((c.cost, c.nums[2]), (0, FROMFIRST));
    assert_eq!(fw(&["10", "1000", "REFUND", "2", "FROMFIRST"]).map(|c| (c.refund, c.nums[2])), Ok((2, FROMFIRST)));
    assert_eq!(fw(&["10", "1000", "FROMFIRST", "REFUND", "2"]).map(|c| (c.refund, c.nums[2])), Ok((2, FROMFIRST)));
    for bad in [
        &["FROMFIRST", "FROMFIRST"][..],
        &["fromfirst", "FromFirst"],
        &["FROMFIRST", "REFUND", "1", "COST", "1"],
        &["REFUND", "1", "FROMFIRST", "DRYRUN"],
        &["PARTIAL", "FROMFIRST", "REFUND", "1"],
        &["FROMFIRST", "1"],
        &["FROM", "FIRST"],
        &["FROMFIRSTX"],
        &["COST"],
    ] {
        let args: Vec<&str> = ["1", "1"].iter().chain(bad).copied().collect();
        assert_eq!(fw(&args), Err(ArgError::Syntax), "{bad:?}");
    }
    assert_eq!(fw(&["10"]), Err(ArgError::Arity));
    assert_eq!(fw(&["FROMFIRST", "10"]), Err(ArgError::Number(Arg::Limit)));
    assert_eq!(fw(&["0", "10"]), Err(ArgError::Number(Arg::Limit)));
    assert_eq!(fw(&["1", "0", "FROMFIRST"]), Err(ArgError::Number(Arg::WindowMs)));
    assert_eq!(fw(&["1", "9007199254740992"]), Err(ArgError::Number(Arg::WindowMs)));
    assert_eq!(fw(&["1", "1", "COST", "9007199254740992"]), Err(ArgError::Number(Arg::Cost)));
    assert_eq!(fw(&["1", "1", "REFUND", "0"]), Err(ArgError::Number(Arg::Refund)));
    // The other commands do not take it.
    assert_eq!(p(&["1", "1", "FROMFIRST"], WINDOW_ARGS), Err(ArgError::Syntax));
    // Without FROMFIRST the fixed window's parse is the window commands'.
    for args in [&["5", "7", "COST", "2"][..], &["5", "7", "REFUND", "3"], &["5", "7", "x"], &["5"]] {
        assert_eq!(fw(args), p(args, WINDOW_ARGS), "{args:?}");
    }
}

fn m(args: &str) -> Result<MultiCall, ArgError> {
    let v: Vec<&[u8]> = args.split(' ').filter(|s| !s.is_empty()).map(str::as_bytes).collect();
    parse_multi(&v)
}

#[test]
fn multi_parses_limits_and_options() {
    let c = m("2 a b TOKENBUCKET 10 1 1000 slidinglog 5 60000 weight 3 cost 2 PARTIAL").unwrap();
    assert_eq!((c.n, c.cost, c.partial, c.dryrun, c.refund), (2, 2, true, false, 0));
    let tb = Params::TokenBucket(crate::tokenbucket::Params { capacity: 10, rate: 1, period_ms: 1000 });
    assert_eq!(c.limits[0], LimitSpec { params: tb, weight: 1 });
    let log = Params::SlidingLog(crate::slidinglog::Params { limit: 5, window_ms: 60000 });
    assert_eq!(c.limits[1], LimitSpec { params: log, weight: 3 });
    let c = m("1 k SLIDINGCOUNTER 5 1000 REFUND 4").unwrap();
    assert_eq!((c.n, c.refund, c.limits[0].kind()), (1, 4, Kind::SlidingCounter));
    let c = m("1 k fixedwindow 5 1000 WEIGHT 2 FROMFIRST").unwrap();
    let fw = Params::FixedWindow(crate::fixedwindow::Params { limit: 5, window_ms: 1000, from_first: true });
    assert_eq!((c.limits[0], c.plain), (LimitSpec { params: fw, weight: 2 }, false));
    // A key may be named like a keyword: keys are positional.
    assert_eq!(m("1 TOKENBUCKET TOKENBUCKET 1 1 1").map(|c| c.n), Ok(1));
    let sixteen: String = (0..16).map(|i| format!("k{i} ")).collect::<String>() + &"SLIDINGLOG 1 1 ".repeat(16);
    assert_eq!(m(&format!("16 {sixteen}")).map(|c| c.n), Ok(16));
}

/// The word compare is `eq_ignore_ascii_case` for every byte at every
/// position, and the sized parser answers what the full one does.
#[test]
fn fast_word_compare_and_sized_parse_agree_with_the_plain_ones() {
    for name in [&b"TOKENBUCKET"[..], b"SLIDINGLOG", b"SLIDINGCOUNTER", b"WEIGHT"] {
        for i in 0..name.len() {
            for b in 0..=255u8 {
                let mut w = name.to_vec();
                w[i] = b;
                assert_eq!(eq_upper_letters(&w, name), w.eq_ignore_ascii_case(name), "{w:?}");
            }
        }
        assert!(!eq_upper_letters(&name[1..], name));
    }
    for args in [
        "1 a tokenbucket 1 1 1",
        "2 a b TOKENBUCKET 10 1 1000 slidinglog 5 60000 weight 3 cost 2 PARTIAL",
        "2 a b SLIDINGCOUNTER 1 1 SLIDINGLOG 1 1 REFUND 2",
        "2 a a SLIDINGLOG 1 1 SLIDINGLOG 1 1",
        "2 a b SLIDINGLOG 1 1 SLIDINGLOG 1 0",
    ] {
        let v: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
        let full = parse_multi(&v);
        let two = parse_multi_n::<&[u8], 2>(&v, |a| a).and_then(|c| c.check(&v[1..=c.n], |a| a).map(|()| c));
        assert_eq!(
            full.map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund)),
            two.map(|c| (c.n, c.limits[..c.n].to_vec(), c.cost, c.partial, c.dryrun, c.refund)),
            "{args}"
        );
    }
    // A numkeys above the room is parsed through: a call of more limits
    // than the room has more arguments, and answers the same error.
    for args in ["3 a b c SLIDINGLOG 1 1 SLIDINGLOG 1 1", "3 a b c SLIDINGLOG 1 1 SLIDINGLOG 1 1 SLIDINGLOG 1"] {
        let v: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
        assert_eq!(parse_multi_n::<&[u8], 2>(&v, |a| a).map(|c| c.n), parse_multi(&v).map(|c| c.n), "{args}");
    }
    let v: Vec<&[u8]> = "3 a b c SLIDINGLOG 1 1 SLIDINGLOG 1 1 SLIDINGLOG 1 1".split(' ').map(str::as_bytes).collect();
    assert_eq!(parse_multi(&v).map(|c| c.n), Ok(3));
}

/// Calls of `5n + 1` arguments that are not n plain token buckets: the
/// parser's branch for those reads the plain limits in front, then hands
/// the call on to the loop at the first limit that is not one (or answers a
/// bucket's number out of range itself), and the result is the loop's.
#[test]
fn plain_bucket_branch_hands_on_what_it_does_not_read() {
    use ArgError::*;
    let tb = |capacity, rate, period_ms| LimitSpec {
        params: Params::TokenBucket(crate::tokenbucket::Params { capacity, rate, period_ms }),
        weight: 1,
    };
    // A fixed window with FROMFIRST takes four words, as a bucket does.
    let c = m("2 a b TOKENBUCKET 10 1 1000 FIXEDWINDOW 5 1000 FROMFIRST").unwrap();
    let fw = Params::FixedWindow(crate::fixedwindow::Params { limit: 5, window_ms: 1000, from_first: true });
    assert_eq!((c.limits[0], c.limits[1], c.plain), (tb(10, 1, 1000), LimitSpec { params: fw, weight: 1 }, true));
    let c = m("2 a b FIXEDWINDOW 5 1000 FROMFIRST TOKENBUCKET 10 1 1000").unwrap();
    assert_eq!((c.limits[0].kind(), c.limits[1], c.plain), (Kind::FixedWindow, tb(10, 1, 1000), true));
    // The bucket in front keeps its WEIGHT when the next word is one.
    let c = m("2 a b TOKENBUCKET 10 1 1000 WEIGHT 2 SLIDINGLOG 5 1").unwrap();
    assert_eq!((c.limits[0].weight, c.limits[1].kind(), c.plain), (2, Kind::SlidingLog, false));
    let c = m("3 a b c TOKENBUCKET 1 1 1 TOKENBUCKET 2 2 2 SLIDINGCOUNTER 3 3 DRYRUN").unwrap();
    assert_eq!((c.limits[1], c.limits[2].kind(), c.dryrun, c.plain), (tb(2, 2, 2), Kind::SlidingCounter, true, false));
    let cases: &[(&str, ArgError)] = &[
        ("2 a b TOKENBUCKET 10 1 1000 WEIGHT 2 TOKENBUCKET 10 1", Syntax),
        ("2 a b TOKENBUCKET 10 x 1000 TOKENBUCKET 10 1 1000", Number(Arg::Rate)),
        ("2 a b TOKENBUCKET 10 1 1000 TOKENBUCKET 0 1 1000", Number(Arg::Capacity)),
        ("2 a b TOKENBUCKET 10 1 1000 TOKENBUCKET 1 1 0", Number(Arg::PeriodMs)),
        ("2 a b TOKENBUCKET 1 1 1 COST 1 TOKENBUCKET 1 1", LimitCount),
        ("2 a b TOKENBUCKET 1 1 1 LEAKY 1 1 1", Syntax),
        ("2 a b TOKENBUCKET 1 1 1 WEIGHT 0 SLIDINGLOG 1", Number(Arg::Weight)),
    ];
    for (args, want) in cases {
        assert_eq!(m(args), Err(*want), "{args}");
        let v: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
        assert_eq!(parse_multi_n::<&[u8], 2>(&v, |a| a).map(|c| c.n), Err(*want), "{args}");
    }
    // Each argument is read once, but the word where the branch hands the
    // call on (read again by the loop, to tell its kind): counted through
    // the parser's `bytes`, by position.
    for (args, handed_on) in [
        ("2 a b TOKENBUCKET 10 1 1000 FIXEDWINDOW 5 1000 FROMFIRST", Some(7)),
        ("2 a b TOKENBUCKET 10 1 1000 WEIGHT 2 TOKENBUCKET 10 1", Some(7)),
        ("2 a b TOKENBUCKET 10 1 1000 TOKENBUCKET 0 1 1000", None),
        ("2 a b TOKENBUCKET 10 1 1000 TOKENBUCKET 10 1 1000", None),
        ("3 a b c TOKENBUCKET 1 1 1 TOKENBUCKET 2 2 2 SLIDINGCOUNTER 3 3 DRYRUN", Some(12)),
    ] {
        let v: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
        let reads = std::cell::RefCell::new(vec![0u32; v.len()]);
        let idx: Vec<usize> = (0..v.len()).collect();
        let _ = parse_multi_n::<usize, 4>(&idx, |i| {
            reads.borrow_mut()[i] += 1;
            v[i]
        });
        for (i, &r) in reads.borrow().iter().enumerate() {
            let most = if Some(i) == handed_on { 2 } else { 1 };
            assert!(r <= most, "{args}: argument {i} ({:?}) read {r} times", std::str::from_utf8(v[i]));
        }
    }
}

#[test]
fn multi_errors() {
    use ArgError::*;
    let cases: &[(&str, ArgError)] = &[
        ("1 k TOKENBUCKET 1", Arity),
        ("0 k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
        ("17 k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
        ("x k TOKENBUCKET 1 1 1", Number(Arg::NumKeys)),
        ("2 a b TOKENBUCKET 1 1 1", LimitCount),
        ("2 a b TOKENBUCKET 1 1 1 COST 1", LimitCount),
        ("1 a TOKENBUCKET 1 1 1 SLIDINGLOG 1 1", LimitCount),
        ("3 a b c TOKENBUCKET", Syntax),
        ("4 a b c TOKENBUCKET", LimitCount),
        ("1 a LEAKY 1 1 1", Syntax),
        ("1 a TOKENBUCKET 1 1", Syntax),
        ("1 a TOKENBUCKET 1 1 1 WEIGHT", Syntax),
        ("1 a TOKENBUCKET 1 1 1 WEIGHT 2 WEIGHT 2", Syntax),
        ("1 a TOKENBUCKET 1 1 1 COST 1 WEIGHT 2", Syntax),
        ("1 a TOKENBUCKET 1 1 1 REFUND 1 COST 1", Syntax),
        ("1 a TOKENBUCKET 1 1 1 DRYRUN REFUND 1", Syntax),
        ("1 a TOKENBUCKET 0 1 1", Number(Arg::Capacity)),
        ("1 a SLIDINGLOG 1 0", Number(Arg::WindowMs)),
        ("1 a SLIDINGCOUNTER x 1", Number(Arg::Limit)),
        ("1 a SLIDINGLOG 1 1 WEIGHT 0", Number(Arg::Weight)),
        ("1 a SLIDINGLOG 1 1 COST -1", Number(Arg::Cost)),
        ("1 a SLIDINGLOG 1 1 REFUND 0", Number(Arg::Refund)),
        ("2 a a SLIDINGLOG 1 1 SLIDINGLOG 1 1", DuplicateKey),
        ("1 a SLIDINGLOG 1 1 WEIGHT 134217728 COST 67108864", Product(Arg::Cost)),
        ("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 REFUND 2", Product(Arg::Refund)),
    ];
    for (args, want) in cases {
        assert_eq!(m(args), Err(*want), "{args}");
    }
    // The product at the edge is accepted.
    assert!(m("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 COST 1").is_ok());
    assert!(m("1 a SLIDINGLOG 1 1 WEIGHT 9007199254740991 COST 0").is_ok());
}

#[test]
fn check_and_shadow_follow_a_limit_in_that_order_never_with_refund() {
    use crate::multi::{CHECK, SHADOW};
    fn w(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }
    let c = parse_multi(&w(
        "3 a b c FIXEDWINDOW 5 1000 WEIGHT 2 FROMFIRST CHECK SHADOW TOKENBUCKET 3 1 10 check SLIDINGLOG 4 100 SHADOW COST 2",
    ))
    .unwrap();
    assert_eq!(&c.flags[..3], &[CHECK | SHADOW, CHECK, SHADOW]);
    assert!(c.flagged && !c.plain && c.cost == 2);
    let c = parse_multi(&w("2 a b TOKENBUCKET 3 1 10 TOKENBUCKET 3 1 10")).unwrap();
    assert!(!c.flagged && c.plain && c.flags.iter().all(|&f| f == 0));
    // SHADOW before CHECK, twice, or with REFUND: a syntax error
    assert_eq!(parse_multi(&w("1 a TOKENBUCKET 3 1 10 SHADOW CHECK")), Err(ArgError::Syntax));
    assert_eq!(parse_multi(&w("1 a TOKENBUCKET 3 1 10 CHECK CHECK")), Err(ArgError::Syntax));
    assert_eq!(parse_multi(&w("1 a TOKENBUCKET 3 1 10 CHECK REFUND 1")), Err(ArgError::Syntax));
    // before WEIGHT: WEIGHT is then an unknown option
    assert_eq!(parse_multi(&w("1 a TOKENBUCKET 3 1 10 CHECK WEIGHT 2")), Err(ArgError::Syntax));
}

/// FORCE: once, with COST and DRYRUN in any order, never with PARTIAL or
/// REFUND; in RL.MULTI never with CHECK, SHADOW or a CONCURRENCY limit.
#[test]
fn force_is_a_debit_option() {
    let c = p(&["5", "1000", "COST", "7", "force"], WINDOW_ARGS).unwrap();
    assert_eq!(c, Call { nums: [5, 1000, 0], cost: 7, partial: false, dryrun: false, refund: 0, force: true });
    let c = p(&["5", "1", "1000", "FORCE", "DRYRUN"], TOKENBUCKET_ARGS).unwrap();
    assert!(c.force && c.dryrun && c.cost == 1);
    assert_eq!(
        fw(&["5", "1000", "FORCE", "FROMFIRST"]).map(|c| (c.force, c.nums[2])),
        Ok((true, crate::fixedwindow::FROMFIRST))
    );
    for bad in [
        &["5", "1000", "FORCE", "FORCE"][..],
        &["5", "1000", "FORCE", "PARTIAL"],
        &["5", "1000", "PARTIAL", "FORCE"],
        &["5", "1000", "FORCE", "REFUND", "2"],
        &["5", "1000", "REFUND", "2", "FORCE"],
    ] {
        assert_eq!(p(bad, WINDOW_ARGS), Err(ArgError::Syntax), "{bad:?}");
    }
    let c = m("2 a b TOKENBUCKET 5 1 1000 SLIDINGLOG 5 1000 WEIGHT 3 COST 7 FORCE").unwrap();
    assert!(c.force && !c.plain && c.cost == 7);
    assert_eq!(m("1 a FIXEDWINDOW 5 1000 FORCE DRYRUN").map(|c| (c.force, c.dryrun)), Ok((true, true)));
    for bad in [
        "1 a TOKENBUCKET 5 1 1000 CHECK FORCE",
        "2 a b TOKENBUCKET 5 1 1000 SHADOW SLIDINGLOG 5 1000 FORCE",
        "2 a b TOKENBUCKET 5 1 1000 CONCURRENCY 5 1000 id-1 FORCE",
        "1 a TOKENBUCKET 5 1 1000 FORCE PARTIAL",
        "1 a TOKENBUCKET 5 1 1000 REFUND 1 FORCE",
    ] {
        assert_eq!(m(bad).map(|c| c.force), Err(ArgError::Syntax), "{bad}");
    }
    // RL.CONCURRENCY takes no FORCE.
    let cc = |s: &str| crate::concurrency::parse(&s.split(' ').map(str::as_bytes).collect::<Vec<_>>());
    assert_eq!(cc("5 1000 ACQUIRE id COST 7 FORCE"), Err(ArgError::Syntax));
}
