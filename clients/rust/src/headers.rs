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

/// The problem type of a 429 (RFC 9457, IANA's HTTP problem types).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// Its title.
pub const QUOTA_TITLE: &str = "Request cannot be satisfied as assigned quota has been exceeded";

/// The body of a 429 for a denied decision (serve it as
/// `application/problem+json`): the same members as the other libraries'
/// `problem(decision, instance)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// "Rate limit "api" exceeded; retry in 3 s." (or the cost-above-limit text).
    pub detail: String,
    /// The single policy's name, or for `all_of` every part that could not
    /// take its units (part `retry_after_ms != 0`), else the binding one.
    pub violated_policies: Vec<String>,
    /// The request's path, when given.
    pub instance: Option<String>,
}

/// The 429 body of a decision; `instance`: the request path, if wanted.
pub fn problem(d: &Decision, instance: Option<&str>) -> Problem {
    let violated_policies = if d.parts.is_empty() {
        vec![d.policy.clone()]
    } else {
        let v: Vec<String> = d.parts.iter().filter(|p| p.retry_after_ms != 0).map(|p| p.policy.clone()).collect();
        // no part short of units (an allowed decision, which gets no 429):
        // the binding one, as Python names it
        if v.is_empty() {
            vec![d.binding.clone()]
        } else {
            v
        }
    };
    let detail = if d.retry_after_ms < 0 {
        format!("Request costs more than the \"{}\" limit allows.", d.binding)
    } else {
        let s = (d.retry_after_ms as u64).div_ceil(1000).max(1);
        format!("Rate limit \"{}\" exceeded; retry in {s} s.", d.binding)
    };
    Problem { detail, violated_policies, instance: instance.map(str::to_owned) }
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

impl Problem {
    /// The body as JSON, members in the other libraries' order: `type`,
    /// `title`, `status`, `detail`, `violated-policies`, `instance` (only
    /// when given).
    pub fn to_json(&self) -> String {
        let mut o = String::from("{\"type\": ");
        json_str(&mut o, QUOTA_EXCEEDED);
        o.push_str(", \"title\": ");
        json_str(&mut o, QUOTA_TITLE);
        o.push_str(", \"status\": 429, \"detail\": ");
        json_str(&mut o, &self.detail);
        o.push_str(", \"violated-policies\": [");
        for (i, p) in self.violated_policies.iter().enumerate() {
            if i > 0 {
                o.push_str(", ");
            }
            json_str(&mut o, p);
        }
        o.push(']');
        if let Some(i) = &self.instance {
            o.push_str(", \"instance\": ");
            json_str(&mut o, i);
        }
        o.push('}');
        o
    }
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
    fn problem_bodies() {
        let p = problem(&single(false, 0, 2001, 0), Some("/a\"b\\c\n"));
        assert_eq!(p.detail, "Rate limit \"api\" exceeded; retry in 3 s.");
        assert_eq!(
            p.to_json(),
            format!(
                "{{\"type\": \"{QUOTA_EXCEEDED}\", \"title\": \"{QUOTA_TITLE}\", \"status\": 429, \
                 \"detail\": \"Rate limit \\\"api\\\" exceeded; retry in 3 s.\", \"violated-policies\": [\"api\"], \
                 \"instance\": \"/a\\\"b\\\\c\\u000a\"}}"
            )
        );
        let p = problem(&single(false, 0, -1, 0), None);
        assert_eq!(p.detail, "Request costs more than the \"api\" limit allows.");
        assert!(!p.to_json().contains("instance"));
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
