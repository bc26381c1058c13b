//! HTTP fields for a Decision: the IETF draft's `RateLimit-Policy` /
//! `RateLimit`, the legacy `X-RateLimit-*`, and `Retry-After`.

use crate::decision::Decision;

fn ceil_s(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The header fields of a decision, in a fixed order (the same fields and
/// values as the Python and Node libraries give for the same decision).
pub fn headers(d: &Decision) -> Vec<(&'static str, String)> {
    let rule_parts = d.rule.parts();
    let policy = if d.parts.is_empty() {
        format!("\"{}\";q={};w={}", d.rule.name(), d.limit, ceil_s(rule_parts[0].window_ms()))
    } else {
        let mut s = String::new();
        for (i, (p, rp)) in d.parts.iter().zip(rule_parts).enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!("\"{}\";q={};w={}", rp.name(), p.limit, ceil_s(rp.window_ms())));
        }
        s
    };
    let reset = ceil_s(d.reset_after_ms).to_string();
    let mut h = vec![
        ("RateLimit-Policy", policy),
        ("RateLimit", format!("\"{}\";r={};t={}", d.binding, d.remaining, reset)),
        ("X-RateLimit-Limit", d.limit.to_string()),
        ("X-RateLimit-Remaining", d.remaining.to_string()),
        ("X-RateLimit-Reset", reset),
    ];
    if !d.allowed && d.retry_after_ms >= 0 {
        let s = (d.retry_after_ms as u64).div_ceil(1000).max(1);
        h.push(("Retry-After", s.to_string()));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{Part, Source};
    use crate::policy::{all_of, sliding_log, token_bucket, Rule};
    use std::sync::Arc;

    fn single(allowed: bool, remaining: u64, retry: i64, reset: u64) -> Decision {
        let p = token_bucket("api", 100, 100, 60_000).unwrap();
        Decision {
            allowed,
            granted: allowed as u64,
            limit: 100,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            policy: "api".into(),
            binding: "api".into(),
            source: Source::Module,
            parts: vec![],
            rule: Arc::new(Rule::Single(p)),
        }
    }

    #[test]
    fn the_design_example() {
        let h = headers(&single(true, 99, 0, 600));
        let want = [
            ("RateLimit-Policy", "\"api\";q=100;w=60"),
            ("RateLimit", "\"api\";r=99;t=1"),
            ("X-RateLimit-Limit", "100"),
            ("X-RateLimit-Remaining", "99"),
            ("X-RateLimit-Reset", "1"),
        ];
        assert_eq!(h, want.map(|(k, v)| (k, v.to_string())).to_vec());
    }

    #[test]
    fn retry_after_only_on_a_denial_that_can_succeed() {
        let h = headers(&single(false, 0, 1, 1001));
        assert_eq!(h.last().unwrap(), &("Retry-After", "1".to_string()));
        assert_eq!(h[4].1, "2");
        let h = headers(&single(false, 0, 2001, 0));
        assert_eq!(h.last().unwrap(), &("Retry-After", "3".to_string()));
        assert_eq!(headers(&single(false, 0, -1, 0)).len(), 5);
        assert_eq!(headers(&single(false, 0, 0, 0)).last().unwrap().1, "1");
    }

    #[test]
    fn all_of_lists_every_part() {
        let a = token_bucket("api", 10, 1, 1000).unwrap();
        let b = sliding_log("day", 1000, 86_400_000).unwrap();
        let rule = all_of(vec![a, b], None).unwrap();
        let part = |n: &str, l, r| Part {
            policy: n.into(),
            granted: 1,
            limit: l,
            remaining: r,
            retry_after_ms: 0,
            reset_after_ms: 1000,
        };
        let d = Decision {
            allowed: true,
            granted: 1,
            limit: 10,
            remaining: 9,
            retry_after_ms: 0,
            reset_after_ms: 1000,
            policy: "api.day".into(),
            binding: "api".into(),
            source: Source::Lua,
            parts: vec![part("api", 10, 9), part("day", 1000, 999)],
            rule: Arc::new(Rule::AllOf(rule)),
        };
        let h = headers(&d);
        assert_eq!(h[0].1, "\"api\";q=10;w=10, \"day\";q=1000;w=86400");
        assert_eq!(h[1].1, "\"api\";r=9;t=1");
    }
}
