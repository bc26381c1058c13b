//! The counters' keys (service/src/service.rs, `cache_key`).

use redis_ratelimit_client::key_slot;
use redis_ratelimit_service::config::Unit;
use redis_ratelimit_service::service::{cache_key, seconds_until_reset};

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
}
