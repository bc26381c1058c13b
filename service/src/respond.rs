//! The answer to one request, pure but for the statistics it counts and
//! the clock of a fixed window's end: a decided [`Plan`] (each part's
//! state) gives each descriptor's status, the overall code, the
//! `RateLimit-*` headers and the per-key statistics, as
//! envoyproxy/ratelimit answers and counts them
//! (`src/limiter/base_limiter.go` read for behaviour; docs/envoy.md).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{self, Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, Struct};

use crate::config::{Algorithm, RateLimit, Unit};
use crate::metrics::{count_hits, Counted, Metrics};
use crate::plan::{Descriptor, PartState, Plan};
use crate::settings::Settings;
use ratelimit_core::catalogue::Kind;

/// Seconds until the current window of `unit` ends, as envoyproxy/ratelimit
/// computes it (`CalculateReset`): `divider − now mod divider`, 1…divider.
pub fn seconds_until_reset(unit: Unit) -> u64 {
    ms_until_window_end(unit.seconds() * 1000).div_ceil(1000)
}

/// Milliseconds until the current epoch-aligned window of `window_ms`
/// ends: `window_ms − now_ms mod window_ms`, 1…window_ms. Rounded up to
/// seconds it is [`seconds_until_reset`] for a unit's window.
pub fn ms_until_window_end(window_ms: u64) -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let w = window_ms.max(1);
    w - now % w
}

/// The response to a decided plan; its statistics counted in `metrics`.
pub fn respond(plan: &Plan, settings: &Settings, metrics: &Metrics) -> RateLimitResponse {
    let mut statuses = Vec::with_capacity(plan.descriptors.len());
    let mut over_any = false;
    let mut header_from: Option<(u64, u32, u64)> = None; // (remaining, limit, reset seconds)
    let mut min_remaining = u64::from(u32::MAX);
    // quota mode: the quota descriptors, and those of them over the limit
    let (mut quotas, mut quotas_over) = (0usize, 0usize);
    for desc in &plan.descriptors {
        let quota = desc.quota(settings.quota_mode);
        quotas += usize::from(quota);
        let (true, Some(m)) = (desc.limited(), &desc.matched) else {
            statuses.push(DescriptorStatus {
                code: Code::Ok as i32,
                limit_remaining: if desc.matched.as_ref().is_some_and(|m| m.limit.unlimited) { u32::MAX } else { 0 },
                ..DescriptorStatus::default()
            });
            continue;
        };
        let limit = &*m.limit;
        let state = plan.part_of(desc).map(|p| &p.state);
        if desc.debit {
            // a usage report: taken whatever was left; OK (nothing is denied
            // after the fact), with what is left after it
            count(plan, desc, limit, false, settings, metrics);
            let reset_s = reset_seconds(limit, desc.window_ms, state);
            statuses.push(status(Code::Ok, limit, desc.unit, state.map_or(0, |p| p.remaining), reset_s));
            continue;
        }
        if desc.negative {
            // a refund: OK, what is left after it, counted in no statistic
            let reset_s = reset_seconds(limit, desc.window_ms, state);
            statuses.push(status(Code::Ok, limit, desc.unit, state.map_or(0, |p| p.remaining), reset_s));
            continue;
        }
        let over = state.map_or(desc.hits > 0, |p| p.over);
        count(plan, desc, limit, over, settings, metrics);
        let code = if over && !limit.shadow_mode { Code::OverLimit } else { Code::Ok };
        let remaining = if over { 0 } else { state.map_or(0, |p| p.remaining) };
        let reset_s = reset_seconds(limit, desc.window_ms, state);
        let st = status(code, limit, desc.unit, remaining, reset_s);
        // the headers: the descriptor with the fewest left, or the last over the limit
        if u64::from(st.limit_remaining) < min_remaining {
            min_remaining = u64::from(st.limit_remaining);
            header_from = Some((min_remaining, limit.requests_per_unit, reset_s));
        }
        if code == Code::OverLimit && quota {
            quotas_over += 1;
        } else if code == Code::OverLimit {
            over_any = true;
            min_remaining = 0;
            header_from = Some((0, limit.requests_per_unit, reset_s));
        }
        statuses.push(st);
    }
    // over: a descriptor that is not a quota one, or all the quota ones
    let over_any = over_any || (quotas > 0 && quotas == quotas_over);
    let overall = if over_any && !settings.shadow_mode { Code::OverLimit } else { Code::Ok };
    if over_any && settings.shadow_mode {
        metrics.global_shadow_mode.fetch_add(1, Relaxed);
    }
    let response_headers_to_add = match header_from {
        Some((rem, lim, reset_s)) if settings.headers_enabled => vec![
            header(&settings.header_limit, lim.to_string()),
            header(&settings.header_remaining, rem.to_string()),
            header(&settings.header_reset, reset_s.to_string()),
        ],
        _ => Vec::new(),
    };
    RateLimitResponse { overall_code: overall as i32, statuses, response_headers_to_add, ..RateLimitResponse::default() }
}

/// `RESPONSE_DYNAMIC_METADATA`: the response's dynamic metadata
/// ([`crate::dynamic_metadata`]), with the `metadata` of the limits of the
/// descriptors that passed (limited, not answered `OVER_LIMIT`).
pub fn dynamic_metadata(req: &RateLimitRequest, plan: &Plan, resp: &RateLimitResponse) -> Struct {
    let passed = plan.descriptors.iter().zip(&resp.statuses).filter_map(|(d, st)| {
        let m = d.matched.as_ref().filter(|_| d.limited() && st.code != Code::OverLimit as i32)?;
        m.limit.metadata.as_ref()
    });
    crate::dynamic_metadata::of_request(req, passed)
}

/// A limited descriptor's statistics, as envoyproxy/ratelimit counts them
/// ([`count_hits`]; `total_hits` was counted before Redis): the count
/// before and after the hits from the part's state, where they were taken
/// or, when the request took nothing, where they would have taken it.
fn count(plan: &Plan, desc: &Descriptor, limit: &RateLimit, over: bool, settings: &Settings, metrics: &Metrics) {
    let stats_key = desc.detailed_key.as_deref().unwrap_or(limit.full_key.as_str());
    let rpu = u64::from(limit.requests_per_unit);
    let (before, after) = match plan.part_of(desc) {
        Some(p) => {
            let now = rpu.saturating_sub(p.state.remaining);
            if p.taken {
                (now.saturating_sub(desc.hits), now)
            } else {
                (now, now.saturating_add(desc.hits))
            }
        }
        None => (0, desc.hits),
    };
    let c = Counted { limit: rpu, before, after, hits: desc.hits };
    metrics.with_key(stats_key, |k| count_hits(k, c, settings.near_limit_ratio, over, limit.shadow_mode));
}

/// `duration_until_reset` in seconds, rounded up (Envoy reads the seconds).
/// The fixed window (and `requests_per_unit: 0`): the window's end, as
/// envoyproxy/ratelimit answers. Token bucket and sliding windows, from the
/// module's reply: over the limit, the time until the descriptor's hits fit
/// again (when a client may retry); else the time until the state is full
/// again (the whole quota back, what `RateLimit-Reset` means); a check
/// (`hits_addend` 0) over the limit, and hits above the limit, the latter.
fn reset_seconds(limit: &RateLimit, window_ms: u64, state: Option<&PartState>) -> u64 {
    let ms = match state {
        Some(p) if limit.algorithm != Algorithm(Kind::FixedWindow) => {
            if p.over && p.retry_ms > 0 {
                p.retry_ms as u64
            } else {
                p.reset_ms
            }
        }
        _ => ms_until_window_end(window_ms),
    };
    ms.div_ceil(1000)
}

fn status(code: Code, limit: &RateLimit, unit: i32, remaining: u64, reset_s: u64) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(rate_limit_response::RateLimit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit,
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(PbDuration { seconds: i64::try_from(reset_s).unwrap_or(i64::MAX), nanos: 0 }),
        quota: None,
    }
}

fn header(k: &str, v: String) -> HeaderValue {
    HeaderValue { key: k.to_owned(), value: v, raw_value: Vec::new() }
}

#[cfg(test)]
mod tests {
    //! The answer to a plan whose parts' states are set here (no Redis).
    use std::collections::HashMap;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    use super::*;
    use crate::config::Config;

    const YAML: &str = "
domain: d
descriptors:
  - {key: a, rate_limit: {unit: hour, requests_per_unit: 10, name: a}}
  - {key: b, rate_limit: {unit: hour, requests_per_unit: 4}}
  - {key: s, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: tb, rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket}}
  - {key: free, rate_limit: {unlimited: true}}
";

    /// The plan of `keys`, each part's state (over, remaining) as given, all taken.
    fn decided(keys: &[&str], states: &[(bool, u64)]) -> Plan {
        let descriptors = keys
            .iter()
            .map(|k| RateLimitDescriptor {
                entries: vec![Entry { key: (*k).into(), value: "v".into() }],
                ..RateLimitDescriptor::default()
            })
            .collect();
        let req = RateLimitRequest { domain: "d".into(), descriptors, hits_addend: 0 };
        let mut plan = Plan::new(&req, &Config::load([("f", YAML)], false).unwrap(), "").unwrap();
        for (p, &(over, remaining)) in plan.counted.iter_mut().zip(states) {
            p.state = PartState { over, remaining, retry_ms: if over { 2500 } else { 0 }, reset_ms: 7000, redis: true };
            p.taken = true;
        }
        plan
    }

    fn settings(vars: &[(&str, &str)]) -> Settings {
        Settings::from_map(&vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<HashMap<_, _>>()).unwrap()
    }

    fn codes(r: &RateLimitResponse) -> Vec<(i32, u32)> {
        r.statuses.iter().map(|s| (s.code, s.limit_remaining)).collect()
    }

    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;

    #[test]
    fn statuses_and_the_headers_of_the_fewest_left() {
        let s = settings(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "true")]);
        let r = respond(&decided(&["a", "b", "free", "none"], &[(false, 7), (false, 3)]), &s, &Metrics::new());
        assert_eq!(r.overall_code, OK);
        assert_eq!(codes(&r), [(OK, 7), (OK, 3), (OK, u32::MAX), (OK, 0)]);
        let h: Vec<(&str, &str)> = r.response_headers_to_add.iter().map(|h| (h.key.as_str(), h.value.as_str())).collect();
        assert_eq!(h[..2], [("RateLimit-Limit", "4"), ("RateLimit-Remaining", "3")]);
        assert_eq!(r.statuses[0].current_limit.as_ref().map(|l| (l.name.as_str(), l.unit)), Some(("a", 3)));
        // over: OVER_LIMIT, remaining 0, the headers from it
        let r = respond(&decided(&["b", "a"], &[(false, 1), (true, 0)]), &s, &Metrics::new());
        assert_eq!((r.overall_code, codes(&r)), (OVER, vec![(OK, 1), (OVER, 0)]));
        assert_eq!(r.response_headers_to_add[0].value, "10");
        // the headers are off by default
        assert!(respond(&decided(&["a"], &[(false, 7)]), &settings(&[]), &Metrics::new())
            .response_headers_to_add
            .is_empty());
    }

    #[test]
    fn shadow_mode_answers_ok_and_counts_it() {
        let m = Metrics::new();
        let r = respond(&decided(&["s", "a"], &[(true, 0), (false, 9)]), &settings(&[]), &m);
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OK, 0), (OK, 9)]));
        m.with_key("d.s", |k| assert_eq!((k.over_limit.load(Relaxed), k.shadow_mode.load(Relaxed)), (1, 1)));
        // SHADOW_MODE: the descriptor says OVER_LIMIT, the request OK
        let m = Metrics::new();
        let r = respond(&decided(&["a"], &[(true, 0)]), &settings(&[("SHADOW_MODE", "true")]), &m);
        assert_eq!((r.overall_code, codes(&r)), (OK, vec![(OVER, 0)]));
        assert_eq!(m.global_shadow_mode.load(Relaxed), 1);
    }

    #[test]
    fn reset_of_a_token_bucket_from_its_state() {
        let s = settings(&[]);
        let reset = |over| respond(&decided(&["tb"], &[(over, 0)]), &s, &Metrics::new()).statuses[0].duration_until_reset;
        // over: until the hits fit (2.5 s → 3); else until it is full (7 s)
        assert_eq!((reset(true).unwrap().seconds, reset(false).unwrap().seconds), (3, 7));
    }
}
