//! Quota mode (`quota_mode` on a descriptor, `QUOTA_MODE` for all) and
//! `RESPONSE_DYNAMIC_METADATA` (issue 44, item 4), as envoyproxy/ratelimit's
//! `src/service/ratelimit.go` answers them: a quota descriptor over its
//! limit answers `OVER_LIMIT` in its status, and denies the request only
//! when every quota descriptor of it is over (docs/envoy.md, "Quota mode");
//! the dynamic metadata holds the request (domain, descriptors, hits) and
//! the `metadata` of the limits that passed, merged. Against a real server;
//! every limit is per hour (`in_one_window`).

use envoy_types::pb::google::protobuf::{value::Kind, Struct};
use serde_json::{json, Value};

use crate::support::*;

const QUOTA: &str = r#"
domain: quota
descriptors:
  - key: q1
    quota_mode: true
    metadata: {team: {q1: true}, tier: gold}
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: q2
    quota_mode: true
    metadata: {team: {q2: true}, tier: silver}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: qs
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: a
    metadata: {plain: 1, list: [x, 2.5, null]}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    quota_mode: true
    metadata: {free: yes}
    rate_limit: {unlimited: true}
"#;

fn ds(keys: &[(&str, &str)]) -> Vec<RateLimitDescriptor> {
    keys.iter().map(|kv| desc(&[*kv])).collect()
}

fn codes(r: &RateLimitResponse) -> (i32, Vec<(i32, u32)>) {
    (r.overall_code, r.statuses.iter().map(rem).collect())
}

/// The count of an hour's fixed window key (0: absent): what a check
/// (`COST 0`) against a large limit says is used; without the module, the
/// twin's `count` field (lua/src/parts/fixedwindow.lua keeps a hash).
fn count(e: &Env, key: &str) -> u64 {
    const BIG: u64 = 1 << 40;
    if common::without_module() {
        let n: Option<u64> = redis::cmd("HGET").arg(key).arg("count").query(&mut e.redis()).unwrap();
        return n.unwrap_or(0);
    }
    let reply: Vec<i64> =
        redis::cmd("RL.FIXEDWINDOW").arg(key).arg(BIG).arg(HOUR_MS).arg("COST").arg(0).query(&mut e.redis()).unwrap();
    BIG - reply[2] as u64
}

/// A limit's statistics: (total, over, near, within).
fn stats(e: &Env, key: &str) -> (u64, u64, u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut out = (0, 0, 0, 0);
    e.svc.service.metrics().with_key(key, |k| {
        out = (
            k.total_hits.load(Relaxed),
            k.over_limit.load(Relaxed),
            k.near_limit.load(Relaxed),
            k.within_limit.load(Relaxed),
        )
    });
    out
}

fn header(r: &RateLimitResponse, name: &str) -> String {
    r.response_headers_to_add.iter().find(|h| h.key == name).map(|h| h.value.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_quota_descriptor_over_denies_and_takes_nothing() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("quota-one", QUOTA, &[]).await;
        let r = || req("quota", ds(&[("q1", "v"), ("a", "v")]));
        assert_eq!(codes(&e.ask(r()).await), (OK, vec![(OK, 1), (OK, 99)]));
        let first = e.ask(r()).await;
        assert_eq!(codes(&first), (OK, vec![(OK, 0), (OK, 98)]));
        assert_eq!(first.dynamic_metadata, None, "RESPONSE_DYNAMIC_METADATA is off by default");
        // the only quota descriptor is over: denied, as there, and nothing is taken
        assert_eq!(codes(&e.ask(r()).await), (OVER, vec![(OVER, 0), (OK, 98)]));
        assert_eq!((count(&e, "quota_q1_v_3600"), count(&e, "quota_a_v_3600")), (2, 2));
        // counted as any limit: 3 hits, the last over (the limit's near threshold is 1)
        assert_eq!(stats(&e, "quota.q1"), (3, 1, 1, 2));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_descriptors_deny_only_when_all_are_over() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("quota-all", QUOTA, &[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]).await;
        let r = || req("quota", ds(&[("q1", "v"), ("q2", "v")]));
        assert_eq!(codes(&e.ask(r()).await), (OK, vec![(OK, 1), (OK, 0)]));
        // q2 is over, q1 is not: allowed; q1 takes its hit, q2 nothing
        let a = e.ask(r()).await;
        assert_eq!(codes(&a), (OK, vec![(OK, 0), (OVER, 0)]));
        assert_eq!((count(&e, "quota_q1_v_3600"), count(&e, "quota_q2_v_3600")), (2, 1));
        // the headers: the fewest left, q1's; a quota descriptor over does not take them
        assert_eq!(header(&a, "RateLimit-Limit"), "2");
        // both over: denied
        assert_eq!(codes(&e.ask(r()).await), (OVER, vec![(OVER, 0), (OVER, 0)]));
        assert_eq!((count(&e, "quota_q1_v_3600"), count(&e, "quota_q2_v_3600")), (2, 1));
        assert_eq!(stats(&e, "quota.q2"), (3, 2, 1, 1));
        assert_eq!(stats(&e, "quota.q1").1, 1);
        // a quota descriptor in shadow mode never fails: q1 over alone does not deny
        let r = || req("quota", ds(&[("q1", "v"), ("qs", "v")]));
        assert_eq!(codes(&e.ask(r()).await), (OK, vec![(OVER, 0), (OK, 0)]));
        assert_eq!(codes(&e.ask(r()).await), (OK, vec![(OVER, 0), (OK, 0)]));
        // a descriptor that is not a quota one denies as ever: the quota ones take nothing
        let r = || req("quota", ds(&[("q1", "w"), ("q2", "w"), ("b", "w")]));
        assert_eq!(codes(&e.ask(r()).await), (OK, vec![(OK, 1), (OK, 0), (OK, 0)]));
        assert_eq!(codes(&e.ask(r()).await), (OVER, vec![(OK, 1), (OVER, 0), (OVER, 0)]));
        assert_eq!((count(&e, "quota_q1_w_3600"), count(&e, "quota_q2_w_3600")), (1, 1));
    })
    .await;
}

/// The one case one call cannot decide as envoyproxy/ratelimit answers it
/// without taking: two quota descriptors or more beside another limit,
/// all of them over. The answer is the same (`OVER_LIMIT`); the other
/// limit took the request's hit, as there (docs/envoy.md, "Quota mode").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_quota_descriptors_beside_a_limit_all_over_the_documented_exception() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("quota-mixed", QUOTA, &[]).await;
        let r = || req("quota", ds(&[("q1", "v"), ("q2", "v"), ("a", "v")]));
        for _ in 0..2 {
            e.ask(r()).await;
        }
        assert_eq!(codes(&e.ask(r()).await), (OVER, vec![(OVER, 0), (OVER, 0), (OK, 97)]));
        assert_eq!(count(&e, "quota_a_v_3600"), 3);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_mode_makes_every_descriptor_a_quota_one() {
    const PLAIN: &str = "
domain: g
descriptors:
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: c, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: free, rate_limit: {unlimited: true}}
";
    in_one_window(HOUR_MS, || async {
        let e = Env::start("quota-global", PLAIN, &[("QUOTA_MODE", "true")]).await;
        let r = |keys: &[(&str, &str)]| req("g", ds(keys));
        assert_eq!(codes(&e.ask(r(&[("b", "1")])).await), (OK, vec![(OK, 0)]));
        assert_eq!(codes(&e.ask(r(&[("b", "1")])).await), (OVER, vec![(OVER, 0)]));
        assert_eq!(codes(&e.ask(r(&[("b", "1"), ("c", "1")])).await), (OK, vec![(OVER, 0), (OK, 0)]));
        assert_eq!(count(&e, "g_c_1_3600"), 1);
        assert_eq!(codes(&e.ask(r(&[("b", "1"), ("c", "1")])).await), (OVER, vec![(OVER, 0), (OVER, 0)]));
        // a descriptor no limit matches is a quota descriptor that passes, as
        // there; an unlimited one is none
        assert_eq!(codes(&e.ask(r(&[("b", "1"), ("none", "x")])).await), (OK, vec![(OVER, 0), (OK, 0)]));
        assert_eq!(codes(&e.ask(r(&[("b", "1"), ("free", "x")])).await), (OVER, vec![(OVER, 0), (OK, u32::MAX)]));
    })
    .await;
}

/// A Struct as JSON (numbers as floats, as the Struct holds them).
fn to_json(s: &Struct) -> Value {
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::BoolValue(b)) => json!(b),
            Some(Kind::NumberValue(n)) => json!(n),
            Some(Kind::StringValue(s)) => json!(s),
            Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
            Some(Kind::StructValue(s)) => to_json(s),
        }
    }
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_holds_the_request_and_the_passed_limits_metadata() {
    in_one_window(HOUR_MS, || async {
        let e = Env::start("quota-metadata", QUOTA, &[("RESPONSE_DYNAMIC_METADATA", "true")]).await;
        let mut d = ds(&[("q1", "m"), ("a", "m"), ("free", "m"), ("o", "x")]);
        d[3].limit = Some(RateLimitOverride { requests_per_unit: 10, unit: 2 });
        d[3].hits_addend = Some(UInt64Value { value: 3 });
        let r = e.ask(req("quota", d)).await;
        assert_eq!(r.overall_code, OK);
        let want = json!({
            "domain": "quota",
            "descriptors": [
                {"entries": ["q1=m"]},
                {"entries": ["a=m"]},
                {"entries": ["free=m"]},
                {"entries": ["o=x"], "limit": "requests_per_unit:10 unit:MINUTE", "hitsAddend": 3.0},
            ],
            // the unlimited descriptor's metadata is not given
            "metadata": {"team": {"q1": true}, "tier": "gold", "plain": 1.0, "list": ["x", 2.5, null]},
        });
        assert_eq!(to_json(r.dynamic_metadata.as_ref().unwrap()), want);
        // q2 over (2 hits of 1): its metadata is not given; the request's hits are
        let mut two = req("quota", ds(&[("q1", "n"), ("q2", "n")]));
        two.hits_addend = 2;
        let r = e.ask(two).await;
        assert_eq!(codes(&r), (OK, vec![(OK, 0), (OVER, 0)]));
        let want = json!({
            "domain": "quota",
            "descriptors": [{"entries": ["q1=n"]}, {"entries": ["q2=n"]}],
            "hitsAddend": 2.0,
            "metadata": {"team": {"q1": true}, "tier": "gold"},
        });
        assert_eq!(to_json(r.dynamic_metadata.as_ref().unwrap()), want);
        // both passed: maps merged, the first descriptor's value kept on a clash
        let r = e.ask(req("quota", ds(&[("q1", "p"), ("q2", "p")]))).await;
        let md = to_json(r.dynamic_metadata.as_ref().unwrap());
        assert_eq!(md["metadata"], json!({"team": {"q1": true, "q2": true}, "tier": "gold"}));
        // POST /json: the same, as proto3 JSON
        let body = json!({"domain": "quota", "descriptors": [{"entries": [{"key": "a", "value": "j"}]}]});
        let (status, got) = e.json(body).await;
        assert_eq!(status, 200);
        let want = json!({
            "domain": "quota",
            "descriptors": [{"entries": ["a=j"]}],
            "metadata": {"plain": 1, "list": ["x", 2.5, null]},
        });
        assert_eq!(got["dynamicMetadata"], want, "{got}");
    })
    .await;
}
