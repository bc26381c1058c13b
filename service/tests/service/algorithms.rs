//! The extension keys: token bucket, sliding log and counter, mixed
//! algorithms in one atomic request, a window in milliseconds.

use crate::support::*;

/// The extension keys (issue 32 point 3; service/README.md "Extension keys").
const EXT_CONFIG: &str = r#"
domain: ext
descriptors:
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 2, burst: 4}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 3}
  - key: ctr
    rate_limit: {algorithm: sliding_counter, unit: hour, requests_per_unit: 3}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: fast
    rate_limit: {window_ms: 400, requests_per_unit: 2}
"#;

/// A key's type, as the module's type name. Without the module
/// (`RL_MODULE=none`) the Lua twins write a sorted set (sliding log) or a
/// hash whose fields say which twin wrote it (docs/lua.md): read as the
/// module type of that algorithm.
fn type_of(r: &mut redis::Connection, key: &str) -> String {
    let t = redis::cmd("TYPE").arg(key).query::<String>(r).unwrap();
    if !common::without_module() {
        return t;
    }
    let fields: Vec<String> = if t == "hash" { redis::cmd("HKEYS").arg(key).query(r).unwrap() } else { Vec::new() };
    let has = |f: &str| fields.iter().any(|x| x == f);
    match t.as_str() {
        "zset" => "rl-slilog".into(),
        "hash" if has("tokens") && has("ts") => "rl-tokbkt".into(),
        "hash" if has("cur") && has("win") => "rl-slicnt".into(),
        "hash" if has("start") && has("count") => "rl-fixwin".into(),
        _ => t,
    }
}

fn reset_s(a: &RateLimitResponse, i: usize) -> i64 {
    a.statuses[i].duration_until_reset.unwrap().seconds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_bucket_burst_and_its_reset() {
    let e = Env::start("tb", EXT_CONFIG, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
    let ask = || e.ask(req("ext", vec![desc(&[("tb", "u1")])]));
    // 2 an hour with a burst of 4: 4 pass at once (a fixed window of 2
    // would pass 2), then OVER_LIMIT
    let mut got = Vec::new();
    let t0 = Instant::now();
    for _ in 0..5 {
        let a = ask().await;
        let l = a.statuses[0].current_limit.clone().unwrap();
        assert_eq!((l.requests_per_unit, l.unit), (2, 3));
        got.push((a.overall_code, rem(&a.statuses[0]), reset_s(&a, 0)));
    }
    // the bucket refills while the calls run: the resets below are less by
    // at most the run's time (10 s allowed however fast it ran)
    let slack = 10.max(t0.elapsed().as_secs() as i64 + 1);
    // one token short: full again in 30 min
    assert_eq!(got[0], (OK, (OK, 3), 1800), "{got:?}");
    assert_eq!((got[1].1, got[2].1), ((OK, 2), (OK, 1)), "{got:?}");
    // empty: full again in 2 h; over the limit: one more token in 30 min
    assert!(got[3].1 == (OK, 0) && (7200 - slack..=7200).contains(&got[3].2), "{got:?}");
    assert!(got[4].0 == OVER && got[4].1 == (OVER, 0) && (1800 - slack..=1800).contains(&got[4].2), "{got:?}");
    // the headers follow the descriptor's numbers
    let a = ask().await;
    let h: Vec<(String, String)> = a.response_headers_to_add.iter().map(|h| (h.key.clone(), h.value.clone())).collect();
    assert_eq!(h[..2], [("RateLimit-Limit".into(), "2".into()), ("RateLimit-Remaining".into(), "0".into())]);
    assert_eq!(h[2], ("RateLimit-Reset".into(), reset_s(&a, 0).to_string()));
    assert_eq!(type_of(&mut e.redis(), "ext_tb_u1_3600_tb"), "rl-tokbkt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_windows_count_down() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("sliding", EXT_CONFIG, &[]).await;
        // 3 an hour: 2, 1, 0 left, then OVER_LIMIT
        for (k, t) in [("log", "rl-slilog"), ("ctr", "rl-slicnt")] {
            let mut got = Vec::new();
            let t0 = Instant::now();
            for _ in 0..4 {
                let a = e.ask(req("ext", vec![desc(&[(k, "u1")])])).await;
                got.push((rem(&a.statuses[0]), reset_s(&a, 0)));
            }
            let codes: Vec<_> = got.iter().map(|g| g.0).collect();
            assert_eq!(codes, [(OK, 2), (OK, 1), (OK, 0), (OVER, 0)], "{k}");
            if k == "log" {
                // over the limit: one more fits when the oldest grant leaves the
                // hour (less the run's time since it; 10 s allowed however fast)
                let slack = 10.max(t0.elapsed().as_secs() as i64 + 1);
                assert!((3600 - slack..=3600).contains(&got[3].1), "{got:?}");
            }
            let key = format!("ext_{k}_u1_3600_{}", if k == "log" { "sl" } else { "sc" });
            assert_eq!(type_of(&mut e.redis(), &key), t);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_algorithms_are_atomic() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("mixed", EXT_CONFIG, &[]).await;
        // four algorithms in one request, one RL.MULTI: all or nothing
        let mixed = |with_log: bool| {
            let mut ds = vec![desc(&[("tb", "m")]), desc(&[("ctr", "m")]), desc(&[("site", "")])];
            if with_log {
                ds.push(desc(&[("log", "m")]));
            }
            req("ext", ds)
        };
        let st = |a: &RateLimitResponse| a.statuses.iter().map(rem).collect::<Vec<_>>();
        let a = e.ask(mixed(true)).await;
        assert_eq!((a.overall_code, st(&a)), (OK, vec![(OK, 3), (OK, 2), (OK, 99), (OK, 2)]));
        e.ask(req("ext", vec![desc(&[("log", "m")])])).await;
        e.ask(req("ext", vec![desc(&[("log", "m")])])).await;
        // the sliding log is spent: denied, and nothing taken from the other three
        for _ in 0..2 {
            let a = e.ask(mixed(true)).await;
            assert_eq!((a.overall_code, st(&a)), (OVER, vec![(OK, 3), (OK, 2), (OK, 99), (OVER, 0)]));
        }
        let a = e.ask(mixed(false)).await;
        assert_eq!((a.overall_code, st(&a)), (OK, vec![(OK, 2), (OK, 1), (OK, 98)]));
        // a limit override on the sliding counter's descriptor is a fixed window
        // of its unit: another key (a shared one would answer WRONGTYPE)
        let mut d = desc(&[("ctr", "m")]);
        d.limit = Some(RateLimitOverride { requests_per_unit: 5, unit: 3 });
        let a = e.ask(req("ext", vec![d])).await;
        assert_eq!((a.overall_code, rem(&a.statuses[0])), (OK, (OK, 4)));
        let mut r = e.redis();
        for (k, t) in [
            ("ext_tb_m_3600_tb", "rl-tokbkt"),
            ("ext_ctr_m_3600_sc", "rl-slicnt"),
            ("ext_site__3600", "rl-fixwin"),
            ("ext_log_m_3600_sl", "rl-slilog"),
            ("ext_ctr_m_3600", "rl-fixwin"),
        ] {
            assert_eq!(type_of(&mut r, k), t, "{k}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_in_ms_resets() {
    let e = Env::start("ms", EXT_CONFIG, &[]).await;
    let ask = |v: &str| e.ask(req("ext", vec![desc(&[("fast", v)])]));
    // 2 per 400 ms, epoch-aligned: 1, 0 left, then OVER_LIMIT in the same
    // window (made again on another key if a window began during the calls)
    let (v, got, pttl) = burst_in_one_window(400, 300, |attempt| {
        let e = &e;
        async move {
            let v = format!("x{attempt}");
            let mut got = Vec::new();
            for _ in 0..3 {
                let a = ask(&v).await;
                let s = &a.statuses[0];
                let l = s.current_limit.clone().unwrap();
                // no unit is 400 ms: UNKNOWN (0); the reset rounds up to 1 s
                assert_eq!((l.requests_per_unit, l.unit, s.duration_until_reset.unwrap().seconds), (2, 0, 1));
                got.push(rem(s));
            }
            let pttl: i64 = redis::cmd("PTTL").arg(format!("ext_fast_{v}_400ms")).query(&mut e.redis()).unwrap();
            (v, got, pttl)
        }
    })
    .await;
    assert_eq!(got, [(OK, 1), (OK, 0), (OVER, 0)]);
    // the module keeps the window: the key expires at its end, within 400 ms
    assert!((1..=400).contains(&pttl), "{pttl}");
    // and the next window starts afresh (polled)
    let t0 = Instant::now();
    loop {
        let a = ask(&v).await;
        if a.overall_code == OK {
            assert_eq!(rem(&a.statuses[0]), (OK, 1));
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the 400 ms window did not reset");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
