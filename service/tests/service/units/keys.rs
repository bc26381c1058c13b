//! The counters' keys (service/src/service.rs, `cache_key`).

use redis_ratelimit_client::key_slot;
use redis_ratelimit_service::config::Unit;
use redis_ratelimit_service::service::{cache_key, ms_until_window_end, seconds_until_reset};

#[test]
fn keys_have_the_domain_as_their_only_hash_tag() {
    let k = cache_key("rl_", "edge", &[("user", "u1"), ("path", "/a")], &[], Unit::Minute);
    assert_eq!(k, "rl_{edge}_user_u1_path_/a_60");
    // share_threshold: the pattern replaces the value
    let s = cache_key("", "edge", &[("user", "u1"), ("path", "/a")], &[None, Some("/*".into())], Unit::Hour);
    assert_eq!(s, "{edge}_user_u1_path_/*_3600");
    // braces and % cannot open another tag or collide with an escape
    let e = cache_key("", "d{x}", &[("k{", "v}%7B")], &[], Unit::Second);
    assert_eq!(e, "{d%7Bx%7D}_k%7B_v%7D%257B_1");
    let keys = [
        cache_key("", "d{x}", &[("a", "}")], &[], Unit::Second),
        cache_key("", "d{x}", &[("b", "{{")], &[], Unit::Day),
        cache_key("", "d{x}", &[("c", "")], &[], Unit::Year),
    ];
    assert!(keys.iter().all(|k| key_slot(k) == key_slot(&e)), "{keys:?}");
}

#[test]
fn the_reset_is_within_the_unit() {
    for u in [Unit::Second, Unit::Minute, Unit::Hour, Unit::Day, Unit::Week, Unit::Month, Unit::Year] {
        let r = seconds_until_reset(u);
        assert!((1..=u.seconds()).contains(&r), "{u:?}: {r}");
    }
    // a window in ms (window_ms): its end within the window
    for w in [1, 400, 1500, 86_400_000, (1 << 53) - 1] {
        let r = ms_until_window_end(w);
        assert!((1..=w).contains(&r), "{w}: {r}");
    }
}

#[test]
fn every_algorithm_and_window_has_its_own_key() {
    use ratelimit_core::catalogue::Kind;
    use redis_ratelimit_service::config::{Algorithm, Config};
    use redis_ratelimit_service::service::cache_key_with;
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    let mut n = 0;
    for a in ["fixed_window", "token_bucket", "sliding_log", "sliding_counter"] {
        for w in ["unit: second", "unit: minute", "window_ms: 1000", "window_ms: 60000", "window_ms: 1500"] {
            yaml.push_str(&format!("  - key: k{n}\n    rate_limit: {{algorithm: {a}, {w}, requests_per_unit: 3}}\n"));
            n += 1;
        }
    }
    let c = Config::load([("f", yaml.as_str())], false).unwrap();
    let mut keys: Vec<String> = (0..n)
        .map(|i| {
            let l = c.get_limit("d", &[(&format!("k{i}"), "")]).unwrap().limit;
            // every limit on the same descriptor: only the suffix tells them apart
            cache_key_with("", "d", &[("k", "v")], &[], &l.key_suffix())
        })
        .collect();
    // the default keeps envoyproxy/ratelimit's layout (and this service's earlier keys)
    assert_eq!(keys[0], cache_key("", "d", &[("k", "v")], &[], Unit::Second));
    assert_eq!(keys[0], "{d}_k_v_1");
    assert_eq!(keys[5], "{d}_k_v_1_tb");
    assert_eq!(keys[14], "{d}_k_v_1500ms_sl");
    assert_eq!(keys[19], "{d}_k_v_1500ms_sc");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "two limits share a key");
    // the tags differ, and none ends in a digit or `ms` as the fixed window's keys do
    let tags: Vec<&str> = [Algorithm(Kind::TokenBucket), Algorithm(Kind::SlidingLog), Algorithm(Kind::SlidingCounter)]
        .map(|a| a.key_tag())
        .to_vec();
    assert!(tags.iter().all(|t| !t.is_empty() && !t.ends_with("ms") && !t.ends_with(|c: char| c.is_ascii_digit())));
}
