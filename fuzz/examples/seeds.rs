//! Writes the committed seed corpus: `cargo run --example seeds -- <dir>`
//! creates `<dir>/<target>/seed-*` with valid encodings of every format and
//! typical argument lists, so the short runs start from deep inputs.
use std::fs;
use std::path::Path;

use redis_ratelimit_fuzz::core::concurrency as cc;
use redis_ratelimit_fuzz::core::MAX_ARG;
use redis_ratelimit_fuzz::*;

fn args_input(now: u64, now2: u64, mode: u8, state: &[u8], args: &[&str]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&now.to_le_bytes());
    v.extend_from_slice(&now2.to_le_bytes());
    v.push(mode);
    v.extend_from_slice(&(state.len() as u16).to_le_bytes());
    v.extend_from_slice(state);
    v.extend_from_slice(args.join("\0").as_bytes());
    v
}

fn put(dir: &Path, target: &str, name: &str, bytes: &[u8]) {
    let d = dir.join(target);
    fs::create_dir_all(&d).unwrap();
    fs::write(d.join(format!("seed-{name}")), bytes).unwrap();
}

fn logs() -> Vec<(&'static str, sl::State)> {
    let t0 = 1_700_000_000_000_000u64;
    let mut out = Vec::new();
    let mut s = sl::State::default();
    for i in 0..20 {
        sl::grant(&mut s, 60_000, 1 + i % 3, t0 + i * 1000);
    }
    out.push(("log-narrow", s));
    let mut s = sl::State::default();
    sl::grant(&mut s, MAX_ARG, 5, t0);
    sl::grant(&mut s, MAX_ARG, 1 << 40, t0 + (1 << 40));
    out.push(("log-wide", s));
    let mut s = sl::State::default();
    sl::grant(&mut s, MAX_ARG, MAX_ARG - 1, t0);
    sl::grant(&mut s, MAX_ARG, 1, t0 + (1 << 62));
    out.push(("log-widest", s));
    let mut s = sl::State::default();
    sl::grant(&mut s, 1000, 3, t0);
    out.push(("log-one", s));
    out.push(("log-empty", sl::State::default()));
    out
}

fn main() {
    let dir = std::env::args().nth(1).expect("output directory");
    let dir = Path::new(&dir);
    let now = 1_700_000_000_123_456u64;

    let tbs = [
        ("tb-small", tb::State { tokens: 3, frac: 500_000, den: 1_000_000, last_us: now }),
        ("tb-max", tb::State { tokens: MAX_ARG - 1, frac: MAX_ARG * 1000 - 1, den: MAX_ARG * 1000, last_us: u64::MAX }),
        ("tb-zero", tb::State { tokens: 0, frac: 0, den: 1000, last_us: 0 }),
        // In debt (COST n FORCE): encoding version 2, whole tokens -2 and
        // the deepest, -(2^53 - 1).
        ("tb-debt", tb::State { tokens: (-2i64) as u64, frac: 250_000, den: 1_000_000, last_us: now }),
        ("tb-debt-max", tb::State { tokens: (-(MAX_ARG as i64)) as u64, frac: 0, den: 1000, last_us: now }),
    ];
    let scs = [
        ("sc-small", sc::State { start_us: now - now % 1_000_000, cur: 4, prev: 7 }),
        ("sc-max", sc::State { start_us: u64::MAX - u64::MAX % 1000, cur: MAX_ARG, prev: MAX_ARG }),
        ("sc-cur", sc::State { start_us: 0, cur: 1, prev: 0 }),
    ];
    for (name, s) in &tbs {
        put(dir, "decode_tokenbucket", name, &s.encode());
        put(dir, "decode_codec", name, codec::tokenbucket(s, now / 1000 + 5000).as_bytes());
        put(dir, "args_tokenbucket", name, &args_input(now, now + 250_000, 1, &s.encode(), &["10", "1", "1000"]));
    }
    for (name, s) in &scs {
        put(dir, "decode_slidingcounter", name, &s.encode());
        put(dir, "decode_codec", name, codec::slidingcounter(s, 0).as_bytes());
        put(
            dir,
            "args_slidingcounter",
            name,
            &args_input(now, now + 1_500_000, 1, &s.encode(), &["10", "1000", "COST", "3"]),
        );
    }
    let fws = [
        ("fw-small", fw::State { start_ms: now / 1000 - now / 1000 % 1000, count: 4 }),
        ("fw-first", fw::State { start_ms: now / 1000 - 17, count: 1 }),
        ("fw-max", fw::State { start_ms: u64::MAX, count: MAX_ARG }),
        ("fw-zero", fw::State { start_ms: 0, count: 1 }),
    ];
    for (name, s) in &fws {
        put(dir, "decode_fixedwindow", name, &s.encode());
        put(dir, "decode_codec", name, codec::fixedwindow(s, now / 1000 + 1000).as_bytes());
        for (i, a) in [
            &["10", "1000", "COST", "3"][..],
            &["10", "1000", "FROMFIRST", "PARTIAL", "COST", "9"],
            &["5", "1000", "REFUND", "2", "fromfirst"],
        ]
        .iter()
        .enumerate()
        {
            put(dir, "args_fixedwindow", &format!("{name}-{i}"), &args_input(now, now + 1_000_000, 1, &s.encode(), a));
        }
    }
    let ccs = {
        let lease = |now_us, hash, units, expiry_us| cc::Change { now_us, hash, units, expiry_us };
        let mut small = cc::State::default();
        for (i, h) in [3u64, 1, 2].into_iter().enumerate() {
            small.apply(&lease(now, h, 1 + i as u64, now + 1_000_000 * (1 + i as u64))).unwrap();
        }
        let mut max = cc::State::default();
        max.apply(&lease(u64::MAX - 2, 9, MAX_ARG - 1, u64::MAX)).unwrap();
        max.apply(&lease(u64::MAX - 2, 10, 1, u64::MAX)).unwrap();
        let mut one = cc::State::default();
        one.apply(&lease(0, 0, 1, 1)).unwrap();
        [("cc-small", small), ("cc-max", max), ("cc-one", one)]
    };
    for (name, s) in &ccs {
        let mut b = Vec::new();
        s.encode(&mut b);
        put(dir, "decode_concurrency", name, &b);
        put(dir, "decode_codec", name, &codec::concurrency(s, now / 1000 + 1000));
        let change = cc::Change { now_us: now, hash: 1, units: 2, expiry_us: now + 1_000_000 };
        put(dir, "decode_codec", &format!("{name}-lease"), codec::lease(&change, now / 1000 + 1000).as_bytes());
    }
    for (name, s) in logs() {
        let mut enc = Vec::new();
        s.encode(&mut enc);
        put(dir, "decode_slidinglog", name, &enc);
        put(dir, "decode_codec", name, &codec::slidinglog(&s, now / 1000));
        put(
            dir,
            "args_slidinglog",
            name,
            &args_input(now, now + 30_000_000, 1, &enc, &["10", "60000", "PARTIAL", "COST", "4"]),
        );
    }
    let g = codec::LogGrant { now_us: now, window_ms: 1000, units: 2 };
    put(dir, "decode_codec", "grant", codec::log_grant(&g, now / 1000 + 1000).as_bytes());

    // Argument lists: every option, in any order and case, and the bounds.
    let tb_args: &[&[&str]] = &[
        &["10", "1", "1000"],
        &["10", "1", "1000", "COST", "0"],
        &["10", "1", "1000", "dryrun", "Cost", "5", "partial"],
        &["9007199254740991", "9007199254740991", "9007199254740991", "COST", "9007199254740991", "PARTIAL"],
        &["1", "1", "3600000", "COST", "2"],
        &["10", "1"],
        &["0", "1", "1"],
        &["1", "1", "1", "COST"],
        &["1", "1", "1", "PARTIAL", "PARTIAL"],
        &["5", "1", "1000", "COST", "7", "FORCE"],
        &["5", "1", "1000", "force", "DRYRUN", "COST", "9007199254740991"],
        &["5", "1", "1000", "FORCE", "PARTIAL"],
    ];
    for (i, a) in tb_args.iter().enumerate() {
        put(dir, "args_tokenbucket", &format!("args{i}"), &args_input(now, now - 5_000_000, 0, &[], a));
    }
    let w_args: &[&[&str]] = &[
        &["10", "1000"],
        &["10", "1000", "COST", "0"],
        &["5", "60000", "PARTIAL", "COST", "9", "DRYRUN"],
        &["9007199254740991", "9007199254740991", "COST", "9007199254740991"],
        &["1", "1", "COST", "2"],
        &["10"],
        &["10", "0"],
        &["10", "1000", "cost", "9007199254740992"],
        &["10", "1000", "FOO"],
        &["5", "1000", "COST", "7", "FORCE"],
        &["5", "1000", "FORCE", "COST", "9007199254740991", "DRYRUN"],
        &["5", "1000", "FORCE", "REFUND", "2"],
    ];
    for (i, a) in w_args.iter().enumerate() {
        for t in ["args_slidinglog", "args_slidingcounter", "args_fixedwindow"] {
            put(dir, t, &format!("args{i}"), &args_input(now, now + 999_999, 2, &[7; 48], a));
        }
    }

    // REFUND on the single commands, and its exclusions.
    let refunds: &[&[&str]] =
        &[&["10", "1000", "REFUND", "3"], &["10", "1000", "refund", "1", "COST", "1"], &["10", "1000", "REFUND", "0"]];
    for (i, a) in refunds.iter().enumerate() {
        for t in ["args_slidinglog", "args_slidingcounter", "args_fixedwindow"] {
            put(dir, t, &format!("refund{i}"), &args_input(now, now + 999_999, 2, &[7; 48], a));
        }
        let mut tb: Vec<&str> = vec!["10", "1"];
        tb.extend_from_slice(a);
        put(dir, "args_tokenbucket", &format!("refund{i}"), &args_input(now, now, 2, &[7; 48], &tb));
    }
    let refund = codec::LogGrant { now_us: now, window_ms: 1000, units: 2 };
    put(dir, "decode_codec", "refund", codec::log_refund(&refund, now / 1000 + 1000).as_bytes());

    // RL.MULTI: every limit kind, WEIGHT, the options, and the errors.
    let multi_args: &[&[&str]] = &[
        &["2", "a", "b", "TOKENBUCKET", "10", "1", "1000", "SLIDINGLOG", "5", "60000", "WEIGHT", "2"],
        &[
            "3",
            "a",
            "b",
            "c",
            "tokenbucket",
            "10",
            "1",
            "1000",
            "slidinglog",
            "5",
            "1000",
            "slidingcounter",
            "7",
            "2000",
            "weight",
            "3",
            "COST",
            "2",
            "PARTIAL",
        ],
        &["2", "a", "b", "SLIDINGLOG", "5", "1000", "SLIDINGCOUNTER", "5", "1000", "REFUND", "2"],
        &["1", "a", "SLIDINGCOUNTER", "5", "1000", "DRYRUN", "COST", "9"],
        &["2", "a", "b", "FIXEDWINDOW", "5", "1000", "WEIGHT", "2", "FROMFIRST", "TOKENBUCKET", "5", "1", "1000"],
        &["1", "a", "FIXEDWINDOW", "5", "1000", "FROMFIRST", "FROMFIRST"],
        &["1", "a", "SLIDINGLOG", "5", "1000", "FROMFIRST"],
        &["2", "a", "a", "SLIDINGLOG", "5", "1000", "SLIDINGLOG", "5", "1000"],
        &["2", "a", "b", "SLIDINGLOG", "5", "1000"],
        &["1", "a", "SLIDINGLOG", "5", "1000", "WEIGHT", "9007199254740991", "COST", "2"],
        &["17", "a", "SLIDINGLOG", "5", "1000"],
        &["2", "a", "b", "CONCURRENCY", "10", "30000", "req-1", "TOKENBUCKET", "100", "100", "1000"],
        &["2", "a", "b", "TOKENBUCKET", "5", "1", "1000", "concurrency", "3", "1000", "COST", "WEIGHT", "2", "PARTIAL"],
        &["1", "a", "CONCURRENCY", "3", "100", "x", "REFUND", "1"],
        &["1", "a", "CONCURRENCY", "3", "100"],
        &[
            "3",
            "a",
            "b",
            "c",
            "TOKENBUCKET",
            "5",
            "1",
            "1000",
            "SLIDINGLOG",
            "5",
            "1000",
            "WEIGHT",
            "2",
            "FIXEDWINDOW",
            "5",
            "1000",
            "COST",
            "7",
            "FORCE",
        ],
        &["1", "a", "SLIDINGCOUNTER", "5", "1000", "FORCE", "DRYRUN"],
        &["1", "a", "CONCURRENCY", "5", "1000", "id", "FORCE"],
    ];
    for (i, a) in multi_args.iter().enumerate() {
        put(dir, "args_multi", &format!("args{i}"), &args_input(now, now, (i % 3) as u8, &[7; 96], a));
    }
}
