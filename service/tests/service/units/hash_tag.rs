//! `hash_tag_key` (a file's top-level extension key): read into the
//! domain, refused clearly when it cannot work.

use redis_ratelimit_service::config::Config;

const BODY: &str = "descriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: path\n    descriptors:\n      - key: user_id\n        rate_limit: {unit: second, requests_per_unit: 3}\n";

fn load(files: &[&str], merge: bool) -> Result<Config, String> {
    let named: Vec<(String, String)> = files.iter().enumerate().map(|(i, f)| (format!("f{i}"), (*f).to_owned())).collect();
    Config::load(named.iter().map(|(n, t)| (n.as_str(), t.as_str())), merge).map_err(|e| e.0)
}

#[test]
fn the_key_is_read_into_its_domain() {
    let c = load(&[&format!("domain: d\nhash_tag_key: user\n{BODY}")], false).unwrap();
    assert_eq!(c.domain("d").unwrap().hash_tag_key(), Some("user"));
    // a key below the top level of the tree counts as used
    let c = load(&[&format!("domain: d\nhash_tag_key: user_id\n{BODY}")], false).unwrap();
    assert_eq!(c.domain("d").unwrap().hash_tag_key(), Some("user_id"));
    // absent: none
    assert_eq!(load(&[&format!("domain: d\n{BODY}")], false).unwrap().domain("d").unwrap().hash_tag_key(), None);
    // merged files: said once is enough, the same twice is fine
    let a = format!("domain: d\nhash_tag_key: user\n{BODY}");
    let b = "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
    assert_eq!(load(&[&a, b], true).unwrap().domain("d").unwrap().hash_tag_key(), Some("user"));
}

#[test]
fn what_it_refuses() {
    let refused = |head: &str| load(&[&format!("domain: d\n{head}{BODY}")], false).unwrap_err();
    assert_eq!(refused("hash_tag_key: ''\n"), "f0: hash_tag_key must not be empty (leave it out: every key its own slot)");
    assert_eq!(refused("hash_tag_key: usr\n"), "f0: hash_tag_key 'usr' is the key of no descriptor of domain 'd'");
    // `use` is a prefix of `user`, not a key
    assert_eq!(refused("hash_tag_key: use\n"), "f0: hash_tag_key 'use' is the key of no descriptor of domain 'd'");
    let nested = "domain: d\ndescriptors:\n  - key: user\n    hash_tag_key: user\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
    assert_eq!(
        load(&[nested], false).unwrap_err(),
        "f0: config error, key 'hash_tag_key' is only valid at the top of a file, beside domain"
    );
    let a = format!("domain: d\nhash_tag_key: user\n{BODY}");
    let b = "domain: d\nhash_tag_key: p2\ndescriptors:\n  - key: p2\n    rate_limit: {unit: second, requests_per_unit: 3}\n";
    assert_eq!(load(&[&a, b], true).unwrap_err(), "f1: domain 'd' has two hash_tag_key: 'user' and 'p2'");
}
