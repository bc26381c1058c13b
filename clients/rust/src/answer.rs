//! What a limiter answers, without I/O: a reply read into a [`Decision`]
//! (the module's reply format is `ratelimit_core::reply`'s; the Lua twins
//! answer the same), and the panic limits' decision while Redis is
//! unavailable.

use std::sync::Arc;

use ratelimit_core::reply::{self, Reply};
use redis::Value;

use crate::breaker::PanicBuckets;
use crate::decision::{Decision, Part, Source};
use crate::error::{Error, Result};
use crate::policy::Rule;
use crate::request::Call;

/// A redis-rs reply value as `ratelimit_core::reply` reads it.
#[derive(Clone, Copy)]
struct V<'a>(&'a Value);

impl<'a> Reply for V<'a> {
    fn int(self) -> Option<i64> {
        match self.0 {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    fn array_len(self) -> Option<usize> {
        match self.0 {
            Value::Array(a) => Some(a.len()),
            _ => None,
        }
    }
    fn get(self, i: usize) -> Option<V<'a>> {
        match self.0 {
            Value::Array(a) => a.get(i).map(V),
            _ => None,
        }
    }
}

fn bad(v: &Value) -> impl Fn(reply::BadReply) -> Error + '_ {
    move |_| Error::Protocol(format!("{v:?}"))
}

/// A single command's five integers for a call of `cost` (a refund or a
/// lease: `partial`, `granted` = the units given back or leased).
pub(crate) fn single(v: &Value, cost: u64, partial: bool) -> Result<ratelimit_core::Decision> {
    reply::single(V(v), cost, partial).map_err(bad(v))
}

/// The reply of `rule`'s call of `cost` as a [`Decision`] from `source`.
pub(crate) fn decode(rule: &Arc<Rule>, v: &Value, cost: u64, partial: bool, source: Source) -> Result<Decision> {
    let (whole, binding, parts) = match &**rule {
        Rule::Single(p) => (single(v, cost, partial)?, p.name(), Vec::new()),
        Rule::AllOf(all) => {
            let m = reply::multi(V(v), all.parts().len(), cost, partial).map_err(bad(v))?;
            let parts = m.parts.iter().zip(all.parts()).map(|(d, p)| Part::of(p.name(), d)).collect();
            (m.whole, all.parts()[m.binding].name(), parts)
        }
    };
    Ok(Decision::of(rule, whole, whole.granted == cost, binding, source, parts))
}

/// A decision from the panic limits (all parts, all or nothing unless
/// `partial`) for the call's own keys, one per part.
pub(crate) fn panic<K: AsRef<str>>(rule: &Arc<Rule>, panics: &PanicBuckets, keys: &[K], call: Call, now: f64) -> Decision {
    let pp = rule.parts();
    let weights: Vec<u64> = match &**rule {
        Rule::Single(_) => vec![1],
        Rule::AllOf(_) => pp.iter().map(|p| p.weight()).collect(),
    };
    let res = panics.decide(keys, call.cost, &weights, call.partial, call.dry_run, now);
    let g = res[0].took / weights[0].max(1);
    let allowed = g == call.cost;
    let b = if let Rule::Single(_) = &**rule {
        0
    } else if allowed {
        (0..res.len()).min_by_key(|&i| (res[i].remaining / weights[i].max(1), i)).unwrap_or(0)
    } else {
        (0..res.len()).max_by_key(|&i| (res[i].retry_ms < 0, res[i].retry_ms, std::cmp::Reverse(i))).unwrap_or(0)
    };
    let retry = if allowed {
        0
    } else if res.iter().any(|r| r.retry_ms < 0) {
        -1
    } else {
        res.iter().map(|r| r.retry_ms).max().unwrap_or(1).max(1)
    };
    let figures = |r: &crate::breaker::PanicPart, granted, retry_after_ms| ratelimit_core::Decision {
        granted,
        limit: r.cap,
        remaining: r.remaining,
        retry_after_ms,
        reset_after_ms: r.reset_ms,
    };
    let parts = match &**rule {
        Rule::Single(_) => Vec::new(),
        Rule::AllOf(_) => res.iter().zip(pp).map(|(r, p)| Part::of(p.name(), &figures(r, r.took, r.retry_ms))).collect(),
    };
    Decision::of(rule, figures(&res[b], g, retry), allowed, pp[b].name(), Source::Panic, parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{all_of, sliding_log, token_bucket};

    fn ints(xs: &[i64]) -> Value {
        Value::Array(xs.iter().map(|&x| Value::Int(x)).collect())
    }

    #[test]
    fn replies_read_as_decisions_named_by_the_rule() {
        let api = token_bucket("api", 10, 1, 1000).unwrap();
        let day = sliding_log("day", 5, 86_400_000).unwrap().weighted(2).unwrap();
        let single = Arc::new(Rule::from(api.clone()));
        let d = decode(&single, &ints(&[1, 10, 7, 0, 300]), 3, false, Source::Module).unwrap();
        assert!(d.allowed && d.granted == 3 && d.policy == "api" && d.binding == "api" && d.parts.is_empty());
        let denied = decode(&single, &ints(&[0, 10, 0, 250, 900]), 3, false, Source::Lua).unwrap();
        assert!(!denied.allowed && denied.granted == 0 && denied.retry_after_ms == 250 && denied.source == Source::Lua);
        assert!(matches!(decode(&single, &ints(&[1, 10, 7, 0]), 1, false, Source::Module), Err(Error::Protocol(_))));

        let both = Arc::new(Rule::from(all_of(vec![api, day], None).unwrap()));
        let mut v = [0, 5, 1, 400, 900, 1].iter().map(|&x| Value::Int(x)).collect::<Vec<_>>();
        v.push(Value::Array(vec![ints(&[0, 10, 9, 0, 100]), ints(&[0, 5, 1, 400, 900])]));
        let d = decode(&both, &Value::Array(v), 1, false, Source::Module).unwrap();
        assert!(!d.allowed && d.policy == "api.day" && d.binding == "day" && d.limit == 5);
        assert_eq!(d.parts.iter().map(|p| (p.policy.as_str(), p.remaining)).collect::<Vec<_>>(), [("api", 9), ("day", 1)]);
        assert!(decode(&both, &ints(&[1, 10, 7, 0, 300]), 1, false, Source::Module).is_err(), "a single reply");
    }
}
