//! Proto3 JSON for POST /json (service/src/json.rs).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use redis_ratelimit_service::json::*;
use serde_json::json;
#[test]
fn reads_both_field_spellings_and_refuses_unknown_fields() {
    let r = parse_request(
        br#"{"domain":"d","hits_addend":3,"descriptors":[{"entries":[{"key":"a","value":"b"},{"key":"c"}],
                 "limit":{"requests_per_unit":5,"unit":"MINUTE"},"hitsAddend":"0"}]}"#,
    )
    .unwrap();
    assert_eq!(r.domain, "d");
    assert_eq!(r.hits_addend, 3);
    let d = &r.descriptors[0];
    assert_eq!((d.entries[1].key.as_str(), d.entries[1].value.as_str()), ("c", ""));
    assert_eq!(d.limit, Some(RateLimitOverride { requests_per_unit: 5, unit: 2 }));
    assert_eq!(d.hits_addend, Some(UInt64Value { value: 0 }));
    for bad in [
        &br#"{"domain":"d","bogus":1}"#[..],
        br#"{"domain":1}"#,
        br#"{"domain":"d","hitsAddend":-1}"#,
        br#"{"domain":"d","hitsAddend":4294967296}"#,
        br#"{"domain":"d","descriptors":[{"entries":[{"key":"a","x":1}]}]}"#,
        br#"{"domain":"d","descriptors":[{"limit":{"unit":"fortnight"}}]}"#,
        br#"{"domain":"d","hitsAddend":1,"hits_addend":1}"#,
        b"not json",
    ] {
        assert!(parse_request(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn writes_protojson() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{DescriptorStatus, RateLimit};
    use envoy_types::pb::google::protobuf::Duration;
    let r = RateLimitResponse {
        overall_code: 2,
        statuses: vec![
            DescriptorStatus {
                code: 2,
                current_limit: Some(RateLimit { name: "n".into(), requests_per_unit: 3, unit: 1 }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration { seconds: 1, nanos: 0 }),
                quota: None,
            },
            DescriptorStatus { code: 1, ..DescriptorStatus::default() },
        ],
        ..RateLimitResponse::default()
    };
    assert_eq!(
        render_response(&r),
        json!({"overallCode":"OVER_LIMIT","statuses":[
                {"code":"OVER_LIMIT","currentLimit":{"name":"n","requestsPerUnit":3,"unit":"SECOND"},"durationUntilReset":"1s"},
                {"code":"OK"}]})
    );
}
