//! The configuration: loading, load errors, matching (service/src/config.rs).

use ratelimit_core::catalogue::Kind;
use redis_ratelimit_service::config::*;
fn load(yaml: &str) -> Result<Config, ConfigError> {
    Config::load([("config.test", yaml)], false)
}

fn limit_of(c: &Config, domain: &str, e: &[(&str, &str)]) -> Option<(u32, Option<Unit>, String)> {
    c.get_limit(domain, e).map(|m| (m.limit.requests_per_unit, m.limit.unit, m.limit.full_key.clone()))
}

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: Hour
      requests_per_unit: 10
  - key: key3
    rate_limit:
      unit: day
      requests_per_unit: 0
"#;

#[test]
fn matches_exact_then_key_alone_and_only_at_the_last_entry() {
    let c = load(BASIC).unwrap();
    assert_eq!(
        limit_of(&c, "test-domain", &[("key2", "value2")]),
        Some((10, Some(Unit::Hour), "test-domain.key2_value2".into()))
    );
    assert_eq!(limit_of(&c, "test-domain", &[("key2", "other")]), Some((20, Some(Unit::Minute), "test-domain.key2".into())));
    assert_eq!(limit_of(&c, "test-domain", &[("key2", "")]), Some((20, Some(Unit::Minute), "test-domain.key2".into())));
    assert_eq!(
        limit_of(&c, "test-domain", &[("key1", "value1"), ("subkey1", "x")]),
        Some((5, Some(Unit::Second), "test-domain.key1_value1.subkey1".into()))
    );
    // the limit is on the second level: one entry does not reach it
    assert_eq!(limit_of(&c, "test-domain", &[("key1", "value1")]), None);
    // more entries than the config has levels: no limit
    assert_eq!(limit_of(&c, "test-domain", &[("key2", "value2"), ("extra", "x")]), None);
    assert_eq!(limit_of(&c, "test-domain", &[("key1", "other"), ("subkey1", "x")]), None);
    assert_eq!(limit_of(&c, "other-domain", &[("key2", "value2")]), None);
    assert_eq!(limit_of(&c, "test-domain", &[("key3", "x")]).unwrap().0, 0);
    assert!(c.has_domain("test-domain") && !c.has_domain("x"));
}

#[test]
fn wildcards_prefix_and_inner_stars_after_exact_values() {
    let c = load(
        r#"
domain: d
descriptors:
  - key: path
    value: /foo/bar
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: /foo/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /a*c*e
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: "*"
    rate_limit: {unit: minute, requests_per_unit: 4}
"#,
    )
    .unwrap();
    let rpu = |v: &str| c.get_limit("d", &[("path", v)]).map(|m| m.limit.requests_per_unit);
    assert_eq!(rpu("/foo/bar"), Some(1));
    assert_eq!(rpu("/foo/baz"), Some(2));
    assert_eq!(rpu("/foo/"), Some(2));
    assert_eq!(rpu("/abcde"), Some(3));
    assert_eq!(rpu("/ace"), Some(3));
    assert_eq!(rpu("/aXcYe"), Some(3));
    assert_eq!(rpu("/ae"), Some(4)); // too short for /a*c*e
    assert_eq!(rpu("/zzz"), Some(4));
    assert_eq!(rpu(""), Some(4));
    // without share_threshold the counter is per value
    assert!(c.get_limit("d", &[("path", "/foo/x")]).unwrap().share.is_empty());
}

#[test]
fn share_threshold_gives_the_pattern_and_needs_a_wildcard() {
    let c = load(
        r#"
domain: d
descriptors:
  - key: user
    value: "*"
    descriptors:
      - key: path
        value: /files/*
        share_threshold: true
        rate_limit: {unit: second, requests_per_unit: 7}
"#,
    )
    .unwrap();
    let m = c.get_limit("d", &[("user", "u1"), ("path", "/files/a")]).unwrap();
    assert_eq!(m.share, vec![None, Some("/files/*".to_owned())]);
    let e = load("domain: d\ndescriptors:\n  - key: path\n    value: /x\n    share_threshold: true\n").unwrap_err();
    assert!(e.0.contains("share_threshold can only be used with wildcard values"), "{e}");
}

#[test]
fn the_load_errors_of_envoyproxy_ratelimit() {
    let cases: &[(&str, &str)] = &[
            ("domain: d\nfoo: 1\n", "config error, unknown key 'foo'"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      bogus: 2\n", "unknown key 'bogus'"),
            ("domain: d\ndomain: e\n", "error loading config file"),
            ("domain: d\ndescriptors:\n  - key: a\n    key: b\n", "error loading config file"),
            ("descriptors: []\n", "config file cannot have empty domain"),
            ("domain: d\ndescriptors:\n  - value: a\n", "descriptor has empty key"),
            ("domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", "duplicate descriptor composite key 'd.a_b'"),
            ("domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n", "duplicate descriptor composite key 'd.a.b'"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "invalid rate limit unit 'fortnight'"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 1}\n", "invalid rate limit unit 'unknown'"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}\n", "replaces should not contain name of same descriptor"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "should not have an empty replaces entry"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "requests_per_unit"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", "requests_per_unit"),
            ("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n", "error checking config"),
            ("domain: d\ndescriptors: [1]\n", "list of type other than map"),
            ("domain: d\ndescriptors:\n  - key: a\n    metadata: 5\n", "error parsing metadata"),
            ("domain: [d\n", "error loading config file"),
        ];
    for (yaml, want) in cases {
        let e = load(yaml).expect_err(yaml);
        assert!(e.0.starts_with("config.test: ") && e.0.contains(want), "{yaml:?}: got {e}, want {want}");
    }
}

#[test]
fn duplicate_domains_unless_merged_and_the_accepted_extras() {
    let a = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n";
    let e = Config::load([("config.a", a), ("config.b", b)], false).unwrap_err();
    assert_eq!(e.0, "config.b: duplicate domain 'd' in config file");
    let c = Config::load([("config.a", a), ("config.b", b)], true).unwrap();
    assert_eq!(c.get_limit("d", &[("b", "x")]).unwrap().limit.requests_per_unit, 2);
    assert!(Config::load([("config.a", a), ("config.a2", a)], true).is_err()); // same descriptor twice
    let c = load(
            "domain: d\ndescriptors:\n  - key: a\n    detailed_metric: true\n    value_to_metric: true\n    shadow_mode: true\n    metadata: {any: [1, 2.5, {x: y}]}\n    rate_limit: {unlimited: true, name: free}\n",
        )
        .unwrap();
    let l = c.get_limit("d", &[("a", "1")]).unwrap().limit;
    assert!(l.unlimited && l.shadow_mode && l.detailed_metric && l.unit.is_none() && l.name == "free");
}

#[test]
fn units_and_their_windows() {
    for (n, s, p) in [
        ("second", 1, 1),
        ("MINUTE", 60, 2),
        ("hour", 3600, 3),
        ("day", 86400, 4),
        ("month", 2_592_000, 5),
        ("year", 31_536_000, 6),
        ("week", 604_800, 7),
    ] {
        let u = Unit::parse(n).unwrap();
        assert_eq!((u.seconds(), u.proto(), Unit::from_proto(p)), (s, p, Some(u)));
    }
    assert_eq!(Unit::parse("unknown"), None);
    assert_eq!(Unit::from_proto(0), None);
}

const EXT: &str = r#"
domain: ext
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 10, burst: 50}
  - key: tb_default
    rate_limit: {algorithm: Token_Bucket, window_ms: 1500, requests_per_unit: 3}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 7}
  - key: ctr
    rate_limit: {algorithm: sliding_counter, window_ms: 60000, requests_per_unit: 9}
  - key: fw_ms
    rate_limit: {algorithm: fixed_window, window_ms: 9007199254740991, requests_per_unit: 1}
"#;

#[test]
fn the_extension_keys_algorithm_burst_and_window_ms() {
    let c = load(EXT).unwrap();
    let l = |k: &str| c.get_limit("ext", &[(k, "x")]).unwrap().limit;
    // without the extension: envoyproxy/ratelimit's fixed window, its unit, its key
    let p = l("plain");
    assert_eq!((p.algorithm, p.window_ms, p.burst, p.window()), (Algorithm(Kind::FixedWindow), None, None, Some(60_000)));
    assert_eq!((p.reported_unit(), p.key_suffix().as_str()), (Some(Unit::Minute), "60"));
    let t = l("tb");
    assert_eq!(
        (t.algorithm, t.unit, t.burst, t.window()),
        (Algorithm(Kind::TokenBucket), Some(Unit::Second), Some(50), Some(1000))
    );
    assert_eq!(t.key_suffix(), "1_tb");
    let t = l("tb_default");
    assert_eq!((t.algorithm, t.unit, t.window_ms, t.burst), (Algorithm(Kind::TokenBucket), None, Some(1500), None));
    // no unit is 1.5 s: current_limit answers UNKNOWN
    assert_eq!((t.reported_unit(), t.key_suffix().as_str()), (None, "1500ms_tb"));
    let s = l("log");
    assert_eq!((s.algorithm, s.key_suffix().as_str()), (Algorithm(Kind::SlidingLog), "3600_sl"));
    let s = l("ctr");
    // 60000 ms is a minute: current_limit says MINUTE (the key keeps the ms)
    assert_eq!(
        (s.algorithm, s.reported_unit(), s.key_suffix().as_str()),
        (Algorithm(Kind::SlidingCounter), Some(Unit::Minute), "60000ms_sc")
    );
    let f = l("fw_ms");
    assert_eq!(
        (f.algorithm, f.window(), f.key_suffix().as_str()),
        (Algorithm(Kind::FixedWindow), Some(MAX_NUMBER), "9007199254740991ms")
    );
}

#[test]
fn a_key_suffix_writes_the_window_as_format_does() {
    let c = load(EXT).unwrap();
    let base = (*c.get_limit("ext", &[("log", "x")]).unwrap().limit).clone();
    for ms in [1, 9, 10, 99, 100, 1000, 1001, 86_400_000, 1 << 40, MAX_NUMBER - 1, MAX_NUMBER] {
        let l = RateLimit { window_ms: Some(ms), unit: None, ..base.clone() };
        assert_eq!(l.key_suffix(), format!("{ms}ms_sl"));
    }
    for u in [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year] {
        let l = RateLimit { window_ms: None, unit: Some(u), algorithm: Algorithm(Kind::FixedWindow), ..base.clone() };
        assert_eq!(l.key_suffix(), u.seconds().to_string());
    }
}

#[test]
fn the_extension_keys_errors() {
    let rl = |body: &str| format!("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {{{body}}}\n");
    let cases: Vec<(String, &str)> = vec![
        // misspelled or misplaced: refused by name
        (rl("unit: second, requests_per_unit: 1, algoritm: token_bucket"), "config error, unknown key 'algoritm'"),
        (rl("unit: second, requests_per_unit: 1, algorithm: token_bucket, burts: 2"), "config error, unknown key 'burts'"),
        (rl("window_msec: 100, requests_per_unit: 1"), "config error, unknown key 'window_msec'"),
        (
            "domain: d\ndescriptors:\n  - key: a\n    burst: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
                .into(),
            "config error, key 'burst' is only valid in a rate_limit",
        ),
        ("domain: d\nalgorithm: token_bucket\n".into(), "config error, key 'algorithm' is only valid in a rate_limit"),
        // the algorithm
        (rl("unit: second, requests_per_unit: 1, algorithm: leaky_bucket"), "invalid rate limit algorithm 'leaky_bucket'"),
        (rl("unit: second, requests_per_unit: 1, algorithm: ''"), "invalid rate limit algorithm ''"),
        // window_ms: exactly one of unit and window_ms, 1 to 2^53 - 1
        (rl("unit: second, window_ms: 1000, requests_per_unit: 1"), "should not specify both rate limit unit and window_ms"),
        (
            rl("window_ms: 0, requests_per_unit: 1"),
            "invalid rate limit window_ms '0': an integer from 1 to 9007199254740991",
        ),
        (rl("window_ms: 9007199254740992, requests_per_unit: 1"), "invalid rate limit window_ms '9007199254740992'"),
        (rl("window_ms: -5, requests_per_unit: 1"), "invalid rate limit window_ms '-5'"),
        (rl("window_ms: '100', requests_per_unit: 1"), "invalid rate limit window_ms '100'"),
        (rl("window_ms: 1.5, requests_per_unit: 1"), "error checking config"),
        (rl("requests_per_unit: 1, algorithm: sliding_log"), "invalid rate limit unit ''"),
        // burst: a token bucket's, 1 to 2^53 - 1, with requests_per_unit above 0
        (
            rl("unit: second, requests_per_unit: 1, burst: 5"),
            "rate limit burst only applies to algorithm token_bucket, not 'fixed_window'",
        ),
        (
            rl("unit: second, requests_per_unit: 1, burst: 5, algorithm: sliding_log"),
            "rate limit burst only applies to algorithm token_bucket, not 'sliding_log'",
        ),
        (rl("unit: second, requests_per_unit: 1, burst: 5, algorithm: sliding_counter"), "not 'sliding_counter'"),
        (rl("unit: second, requests_per_unit: 1, burst: 0, algorithm: token_bucket"), "invalid rate limit burst '0'"),
        (
            rl("unit: second, requests_per_unit: 1, burst: 9007199254740992, algorithm: token_bucket"),
            "invalid rate limit burst '9007199254740992'",
        ),
        (
            rl("unit: second, requests_per_unit: 0, burst: 3, algorithm: token_bucket"),
            "rate limit burst needs requests_per_unit above 0",
        ),
        // unlimited takes none of them
        (rl("unlimited: true, algorithm: token_bucket"), "should not specify rate limit algorithm when unlimited"),
        (rl("unlimited: true, window_ms: 10"), "should not specify rate limit window_ms when unlimited"),
        (rl("unlimited: true, burst: 10"), "should not specify rate limit burst when unlimited"),
    ];
    for (yaml, want) in &cases {
        let e = load(yaml).expect_err(yaml);
        assert!(e.0.starts_with("config.test: ") && e.0.contains(want), "{yaml:?}: got {e}, want {want}");
    }
    // rpu 0 stays envoyproxy/ratelimit's "refuse every request", with any algorithm
    assert!(load(&rl("window_ms: 10, requests_per_unit: 0, algorithm: sliding_log")).is_ok());
}
