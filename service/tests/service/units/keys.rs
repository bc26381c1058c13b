//! The counters' keys (service/src/service.rs, `cache_key`).

use redis_ratelimit_client::key_slot;
use redis_ratelimit_service::config::Unit;
use redis_ratelimit_service::service::{cache_key, cache_key_tagged, ms_until_window_end, seconds_until_reset};

#[test]
fn keys_have_no_hash_tag_but_the_configured_one() {
    let k = cache_key("rl_", "edge", &[("user", "u1"), ("path", "/a")], &[], Unit::Minute);
    assert_eq!(k, "rl_edge_user_u1_path_/a_60");
    // share_threshold: the pattern replaces the value
    let s = cache_key("", "edge", &[("user", "u1"), ("path", "/a")], &[None, Some("/*".into())], Unit::Hour);
    assert_eq!(s, "edge_user_u1_path_/*_3600");
    // braces and % cannot open a tag or collide with an escape: the key is hashed whole
    let e = cache_key("", "d{x}", &[("k{", "v}%7B")], &[], Unit::Second);
    assert_eq!(e, "d%7Bx%7D_k%7B_v%7D%257B_1");
    assert_eq!(key_slot(&e), key_slot(e.as_bytes()));
    // hash_tag_key: the first entry of that key is the tag, escaped inside
    let t = |entries: &[(&str, &str)]| cache_key_tagged("", "d{x}", entries, &[], Some("user"), "60");
    assert_eq!(t(&[("user", "a{b")]), "d%7Bx%7D_{user_a%7Bb}_60");
    assert_eq!(t(&[("path", "/p"), ("user", "a"), ("user", "b")]), "d%7Bx%7D_path_/p_{user_a}_user_b_60");
    assert_eq!(key_slot(t(&[("path", "/p"), ("user", "a")])), key_slot("{user_a}"));
    assert_eq!(key_slot(t(&[("user", "a")])), key_slot(t(&[("user", "a"), ("path", "/q")])));
    // no entry of that key: hashed whole
    assert_eq!(t(&[("path", "/p")]), "d%7Bx%7D_path_/p_60");
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
    // the default keeps envoyproxy/ratelimit's layout, the unit's seconds for the window start
    assert_eq!(keys[0], cache_key("", "d", &[("k", "v")], &[], Unit::Second));
    assert_eq!(keys[0], "d_k_v_1");
    assert_eq!(keys[5], "d_k_v_1_tb");
    assert_eq!(keys[14], "d_k_v_1500ms_sl");
    assert_eq!(keys[19], "d_k_v_1500ms_sc");
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "two limits share a key");
    // the tags differ, and none ends in a digit or `ms` as the fixed window's keys do
    let tags: Vec<&str> = [Algorithm(Kind::TokenBucket), Algorithm(Kind::SlidingLog), Algorithm(Kind::SlidingCounter)]
        .map(|a| a.key_tag())
        .to_vec();
    assert!(tags.iter().all(|t| !t.is_empty() && !t.ends_with("ms") && !t.ends_with(|c: char| c.is_ascii_digit())));
}
