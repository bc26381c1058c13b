//! The plan of one request, pure: a `RateLimitRequest` and the
//! configuration give what to ask Redis: each descriptor's match (or its
//! request-given override), the limits another `replaces`, and the parts to
//! decide: their keys, numbers and hits, the same counter twice merged into
//! one part, the counted parts (hits > 0) apart from the check-only ones
//! (`hits_addend` 0). No I/O and no clock: [`Plan::new`] is tested without
//! Redis (the tests at the end of this file).
//!
//! envoyproxy/ratelimit's `src/service/ratelimit.go` and
//! `src/limiter/cache_key.go` read for behaviour.

use std::ops::Range;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use redis_ratelimit_client::MAX;

use crate::config::{Algorithm, Config, Domain, Matched, RateLimit, Unit};
use crate::error::ServiceError;
use ratelimit_core::catalogue::Kind;

/// The most descriptors with a counted limit one request may have: the
/// parts of one `RL.MULTI`.
pub const MAX_LIMITED_DESCRIPTORS: usize = 16;

/// The numbers of one part: what the backend's call for it is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The limit's algorithm.
    pub algorithm: Algorithm,
    /// `requests_per_unit`.
    pub limit: u64,
    /// The window in ms.
    pub window_ms: u64,
    /// The token bucket's capacity.
    pub burst: u64,
    /// The hits it adds per call (1 for a check-only part).
    pub weight: u64,
    /// RL.MULTI's per-limit `CHECK` and `SHADOW` ([`ratelimit_core::multi::CHECK`],
    /// [`ratelimit_core::multi::SHADOW`]): set by [`crate::service::run`]
    /// before the call, from the part's list and its shadow mode.
    pub flags: u8,
}

impl std::hash::Hash for Shape {
    /// One write of all its numbers: the backend looks a request's call up
    /// by its parts' shapes (a write per field cost ~1k instructions at 4 parts).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut b = [0u8; 33];
        b[0] = self.algorithm.0 as u8 | self.flags << 4;
        for (i, n) in [self.limit, self.window_ms, self.burst, self.weight].into_iter().enumerate() {
            b[1 + 8 * i..9 + 8 * i].copy_from_slice(&n.to_le_bytes());
        }
        state.write(&b);
    }
}

/// What one part says once decided: over the limit, units left, and
/// (from the module's reply) ms until the part's units fit (−1: never) and
/// until the state is fresh again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartState {
    /// Over the limit.
    pub over: bool,
    /// Units left.
    pub remaining: u64,
    /// ms until its units fit (0: they did; −1: never).
    pub retry_ms: i64,
    /// ms until the state is fresh again.
    pub reset_ms: u64,
    /// Redis (the module or its twin) said it: not the panic limits, not
    /// the local over-limit cache.
    pub redis: bool,
}

/// One part of a call: its key (a range of [`Plan::keys`]), its numbers
/// and, once the backend decided it, what it says.
#[derive(Debug, Clone)]
pub struct Part {
    /// Its key in [`Plan::keys`].
    pub key: Range<usize>,
    /// Its numbers.
    pub shape: Shape,
    /// What it says (the backend writes it).
    pub state: PartState,
    /// Counted parts: whether its units were taken (its remaining is after them).
    pub taken: bool,
    /// Every descriptor counted on it has a `shadow_mode` limit.
    pub shadow: bool,
}

/// One descriptor of a request: what it matched and, for a limit to
/// decide, how.
#[derive(Debug)]
pub struct Descriptor {
    /// The match, if any (kept when unlimited or replaced: its `replaces`
    /// still count).
    pub matched: Option<Matched>,
    /// Its limit is one another matched limit `replaces`: as no match.
    pub replaced: bool,
    /// The unit answered in `current_limit` (the proto's value; 0: none
    /// describes the window, [`RateLimit::reported_unit`]).
    pub unit: i32,
    /// The window in ms.
    pub window_ms: u64,
    /// The hits it adds: 0 for a check-only descriptor (`hits_addend` 0, sent with `COST 0`).
    pub hits: u64,
    /// Its part among the counted ones, the checked ones when its hits
    /// are 0, or the refunded ones when it is negative ([`Plan::list_of`]);
    /// `None`: no part (not limited). A
    /// `requests_per_unit: 0` limit is a part too, of limit 0, decided
    /// in the same call as the others (a limit that never fits).
    pub part: Option<usize>,
    /// The stats key of a `detailed_metric` limit (`domain.key_value…` of
    /// the request's values) or of a `value_to_metric` match, else `None`
    /// (the limit's own `full_key`).
    pub detailed_key: Option<String>,
    /// `is_negative_hits`: its hits are given back (`REFUND`, never below
    /// zero), before the request's other parts are decided; always `OK`.
    pub negative: bool,
    /// A usage report (its own `hits_addend` above 0, in a domain of
    /// `USAGE_REPORT_DOMAINS`): a debit, taken even past the limit, never
    /// denying; always `OK`.
    pub debit: bool,
}

impl Descriptor {
    /// A limit to decide: matched, neither `unlimited` nor replaced (else
    /// `OK`, remaining `u32::MAX` when unlimited, 0 otherwise).
    pub fn limited(&self) -> bool {
        !self.replaced && self.matched.as_ref().is_some_and(|m| !m.limit.unlimited)
    }

    /// A quota descriptor (`quota_mode`, or every descriptor but an
    /// `unlimited` one with `QUOTA_MODE`: `global`), as envoyproxy/ratelimit
    /// counts them (docs/envoy.md, "Quota mode").
    pub fn quota(&self, global: bool) -> bool {
        if self.negative || self.debit {
            return false; // a refund or a report is never over
        }
        match self.limit() {
            Some(l) if l.unlimited => false,
            _ => global || (self.limited() && self.limit().is_some_and(|l| l.quota_mode)),
        }
    }

    /// A quota descriptor that may be over its limit: limited, not in shadow mode.
    fn quota_may_fail(&self, global: bool) -> bool {
        self.quota(global) && self.limited() && self.limit().is_some_and(|l| !l.shadow_mode)
    }

    /// The matched limit, if any.
    fn limit(&self) -> Option<&Arc<RateLimit>> {
        self.matched.as_ref().map(|m| &m.limit)
    }
}

/// What to ask of the backend for one request.
#[derive(Debug)]
pub struct Plan {
    /// Every part's key, one after another (a range of it per part).
    pub keys: String,
    /// One per request descriptor, in order.
    pub descriptors: Vec<Descriptor>,
    /// The counted parts (hits > 0): one call with cost 1.
    pub counted: Vec<Part>,
    /// The check-only parts (hits 0): one call with cost 0.
    pub checked: Vec<Part>,
    /// The parts of `is_negative_hits` descriptors: their weights given
    /// back (`REFUND`), before the others are decided.
    pub refunded: Vec<Part>,
    /// The parts of usage reports: taken with `FORCE` (debits), after the
    /// refunds, before the others are decided.
    pub debited: Vec<Part>,
}

impl Plan {
    /// The plan of `req` under `cfg`, its keys prefixed with `prefix`
    /// (`CACHE_KEY_PREFIX`); `Invalid` for what the service refuses.
    pub fn new(req: &RateLimitRequest, cfg: &Config, prefix: &str) -> Result<Plan, ServiceError> {
        Plan::with_reports(req, cfg, prefix, false)
    }

    /// [`Plan::new`]; with `reports`, a descriptor's own `hits_addend`
    /// above 0 is a usage report (a debit: [`Descriptor::debit`]).
    pub fn with_reports(req: &RateLimitRequest, cfg: &Config, prefix: &str, reports: bool) -> Result<Plan, ServiceError> {
        if req.domain.is_empty() {
            return Err(ServiceError::Invalid("rate limit domain must not be empty".into()));
        }
        if req.descriptors.is_empty() {
            return Err(ServiceError::Invalid("rate limit descriptor list must not be empty".into()));
        }
        let mut descriptors = Vec::with_capacity(req.descriptors.len());
        let domain = cfg.domain(&req.domain);
        for d in &req.descriptors {
            let matched = match_one(&req.domain, domain, d)?;
            descriptors.push(Descriptor {
                matched,
                replaced: false,
                unit: 0,
                window_ms: 0,
                hits: 0,
                part: None,
                detailed_key: None,
                negative: d.is_negative_hits,
                debit: reports && !d.is_negative_hits && d.hits_addend.as_ref().is_some_and(|h| h.value > 0),
            });
        }
        mark_replaced(&mut descriptors);
        let mut plan = Plan {
            keys: key_buffer(req, prefix),
            descriptors,
            counted: Vec::new(),
            checked: Vec::new(),
            refunded: Vec::new(),
            debited: Vec::new(),
        };
        plan.add_parts(req, prefix, domain.and_then(|d| d.hash_tag_key()))?;
        if plan.counted.len() + plan.checked.len() > MAX_LIMITED_DESCRIPTORS
            || plan.refunded.len() > MAX_LIMITED_DESCRIPTORS
            || plan.debited.len() > MAX_LIMITED_DESCRIPTORS
        {
            return Err(ServiceError::Invalid(format!(
                "at most {MAX_LIMITED_DESCRIPTORS} limited descriptors per request (one RL.MULTI)"
            )));
        }
        Ok(plan)
    }

    /// Quota mode (`global`: `QUOTA_MODE`): the quota descriptors' parts
    /// in the call. A request is denied by its quota descriptors only when
    /// all of them are over the limit. One quota descriptor that may be
    /// over is then an ordinary part (it denies the request, which takes
    /// nothing). Otherwise each quota part is a shadow part (it never
    /// denies; it takes its hits where they fit): exact when one quota
    /// descriptor never fails (`shadow_mode`; with `QUOTA_MODE`, one not
    /// limited) or when every part is a quota part (all over: none took);
    /// with two or more beside other limits, those others took their hits
    /// when the quota ones are all over (docs/envoy.md, "Quota mode").
    pub fn quota_parts(&mut self, global: bool) {
        let total = self.descriptors.iter().filter(|d| d.quota(global)).count();
        let may_fail = self.descriptors.iter().filter(|d| d.quota_may_fail(global)).count();
        if may_fail == 0 || (total == 1 && may_fail == 1) {
            return;
        }
        // a part is a shadow part when each descriptor on it is shadow or quota
        let mut shadow = [[true; MAX_LIMITED_DESCRIPTORS]; 2];
        for d in &self.descriptors {
            if let (Some(j), Some(l), false) = (d.part, d.limit(), d.negative || d.debit) {
                if let Some(s) = shadow[usize::from(d.hits == 0)].get_mut(j) {
                    *s &= l.shadow_mode || d.quota(global);
                }
            }
        }
        for (list, shadow) in [&mut self.counted, &mut self.checked].into_iter().zip(shadow) {
            for (p, s) in list.iter_mut().zip(shadow) {
                p.shadow = s;
            }
        }
    }

    /// The list a descriptor's part is in: the refunded parts for a
    /// negative one, the debited ones for a usage report, the checked ones
    /// for a check (`hits_addend` 0), else the counted ones.
    pub fn list_of(&self, d: &Descriptor) -> &[Part] {
        if d.negative {
            &self.refunded
        } else if d.debit {
            &self.debited
        } else if d.hits == 0 {
            &self.checked
        } else {
            &self.counted
        }
    }

    /// The part a descriptor was decided on, if any.
    pub fn part_of(&self, d: &Descriptor) -> Option<&Part> {
        d.part.and_then(|j| self.list_of(d).get(j))
    }

    /// The key of a part.
    pub fn key(&self, p: &Part) -> &str {
        self.keys.get(p.key.clone()).unwrap_or_default()
    }

    /// Every limited descriptor's part: its key, its numbers, its hits;
    /// the same key twice (the key holds the algorithm and the window) is
    /// one part, its hits added up.
    /// `tag`: the domain's `hash_tag_key` (crate::spread).
    fn add_parts(&mut self, req: &RateLimitRequest, prefix: &str, tag: Option<&str>) -> Result<(), ServiceError> {
        let n = self.descriptors.len();
        for (desc, d) in self.descriptors.iter_mut().zip(&req.descriptors) {
            let Some(m) = desc.matched.as_ref().filter(|_| desc.limited()) else { continue };
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            if hits > MAX {
                return Err(ServiceError::Invalid(format!("hits_addend {hits} is above 2^53-1")));
            }
            let window_ms = m.limit.window().unwrap_or(1000);
            let start = self.keys.len();
            push_cache_key(&mut self.keys, prefix, &req.domain, entries(d), &m.share, tag);
            m.limit.push_key_suffix(&mut self.keys);
            let rpu = u64::from(m.limit.requests_per_unit);
            let shape = Shape {
                algorithm: m.limit.algorithm,
                limit: rpu,
                window_ms,
                burst: m.limit.burst.unwrap_or(rpu),
                // a check-only part (hits 0) is sent with weight 1 and CHECK
                weight: hits.max(1),
                flags: 0,
            };
            let list = if desc.negative {
                &mut self.refunded
            } else if desc.debit {
                &mut self.debited
            } else if hits == 0 {
                &mut self.checked
            } else {
                &mut self.counted
            };
            // `requests_per_unit: 0` too: a part of limit 0, in the same
            // call (a refund of nothing, or to a limit of 0, is no part)
            let part = if desc.negative && (hits == 0 || rpu == 0) {
                keys_truncate(&mut self.keys, start)
            } else {
                Some(add_part(&mut self.keys, list, start, shape, m.limit.shadow_mode, n))
            };
            desc.unit = m.limit.reported_unit().map(Unit::proto).unwrap_or(0);
            desc.detailed_key =
                m.limit.detailed_metric.then(|| detailed_key(&req.domain, d, &m.share)).or_else(|| m.metric_key.clone());
            (desc.window_ms, desc.hits, desc.part) = (window_ms, hits, part);
        }
        Ok(())
    }
}

/// Drops the key just written at `keys[start..]`: no part.
fn keys_truncate(keys: &mut String, start: usize) -> Option<usize> {
    keys.truncate(start);
    None
}

/// A request descriptor's entries as (key, value).
fn entries(d: &RateLimitDescriptor) -> impl ExactSizeIterator<Item = (&str, &str)> {
    d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))
}

/// The buffer of a request's keys, with room for all of them.
fn key_buffer(req: &RateLimitRequest, prefix: &str) -> String {
    String::with_capacity(
        req.descriptors
            .iter()
            .map(|d| {
                prefix.len()
                    + req.domain.len()
                    + 24
                    + d.entries.iter().map(|e| e.key.len() + e.value.len() + 2).sum::<usize>()
            })
            .sum(),
    )
}

/// The part of the key just written at `keys[start..]`: an existing one
/// with the same key (the same counter twice in one request: the hits
/// added up, the tighter numbers kept, in shadow mode only if both are),
/// else a new one. Its index.
fn add_part(keys: &mut String, list: &mut Vec<Part>, start: usize, shape: Shape, shadow: bool, n: usize) -> usize {
    if let Some(j) = list.iter().position(|p| keys.get(p.key.clone()) == keys.get(start..)) {
        keys.truncate(start);
        let p = &mut list[j];
        p.shape.limit = p.shape.limit.min(shape.limit);
        p.shape.burst = p.shape.burst.min(shape.burst);
        p.shape.weight = p.shape.weight.saturating_add(shape.weight).min(MAX);
        p.shadow &= shadow;
        return j;
    }
    if list.capacity() == 0 {
        list.reserve(n);
    }
    list.push(Part { key: start..keys.len(), shape, state: PartState::default(), taken: false, shadow });
    list.len() - 1
}

/// What one request descriptor matches: its override (`limit`), else the
/// configuration's limit in the request's domain.
fn match_one(
    domain_name: &str,
    domain: Option<Domain<'_>>,
    d: &RateLimitDescriptor,
) -> Result<Option<Matched>, ServiceError> {
    let Some(domain) = domain else { return Ok(None) };
    let Some(o) = &d.limit else { return Ok(domain.get_limit_of(entries(d))) };
    let unit = Unit::from_proto(o.unit)
        .ok_or_else(|| ServiceError::Invalid(format!("limit override with an unknown unit {}", o.unit)))?;
    // `domain.key_value.key…` (an empty value: the key alone)
    let mut full_key = domain_name.to_owned();
    full_key.push('.');
    for (j, (k, v)) in entries(d).enumerate() {
        if j > 0 {
            full_key.push('.');
        }
        full_key.push_str(k);
        if !v.is_empty() {
            full_key.push('_');
            full_key.push_str(v);
        }
    }
    Ok(Some(Matched {
        limit: Arc::new(RateLimit {
            requests_per_unit: o.requests_per_unit,
            unit: Some(unit),
            unlimited: false,
            name: String::new(),
            replaces: Vec::new(),
            shadow_mode: false,
            quota_mode: false,
            metadata: None,
            detailed_metric: false,
            full_key,
            // an override has a unit and a number: envoyproxy/ratelimit's fixed window
            algorithm: Algorithm(Kind::FixedWindow),
            window_ms: None,
            burst: None,
        }),
        share: Vec::new(),
        metric_key: None,
    }))
}

/// A named limit that any matched limit (unlimited ones too) replaces is dropped.
fn mark_replaced(descs: &mut [Descriptor]) {
    for i in 0..descs.len() {
        let replaced = match descs[i].limit() {
            Some(l) if descs[i].limited() && !l.name.is_empty() => {
                descs.iter().filter_map(Descriptor::limit).any(|x| x.replaces.iter().any(|r| *r == l.name))
            }
            _ => false,
        };
        descs[i].replaced = replaced;
    }
}

/// envoyproxy/ratelimit's detailed key: domain, then key_value per entry
/// (the wildcard pattern for a share_threshold entry).
fn detailed_key(domain: &str, d: &RateLimitDescriptor, share: &[Option<String>]) -> String {
    let mut k = domain.to_owned();
    for (j, (key, value)) in entries(d).enumerate() {
        k.push('.');
        k.push_str(key);
        k.push('_');
        k.push_str(share.get(j).and_then(|s| s.as_deref()).unwrap_or(value));
    }
    k
}

/// The key of a limit's counter: envoyproxy/ratelimit's
/// `prefix + domain + "_" + (key + "_" + value + "_")*`, with the window
/// length in seconds in place of the window's start (`RL.FIXEDWINDOW`
/// keeps the window itself). `{`, `}` and `%` are %-escaped, so that the
/// key has no hash tag: Redis Cluster hashes it whole, as upstream's
/// (docs/envoy.md, "Key layout"; a domain's `hash_tag_key` adds one:
/// [`cache_key_tagged`]).
pub fn cache_key(prefix: &str, domain: &str, entries: &[(&str, &str)], share: &[Option<String>], unit: Unit) -> String {
    cache_key_with(prefix, domain, entries, share, &unit.seconds().to_string())
}

/// [`cache_key`] with the end given: a limit's [`RateLimit::key_suffix`]
/// (the window, then the algorithm's tag), so that no two algorithms or
/// windows share a key.
pub fn cache_key_with(
    prefix: &str,
    domain: &str,
    entries: &[(&str, &str)],
    share: &[Option<String>],
    suffix: &str,
) -> String {
    cache_key_tagged(prefix, domain, entries, share, None, suffix)
}

/// [`cache_key_with`] in a domain whose `hash_tag_key` is `tag`: the first
/// entry of that key is written `{key_value}`, the key's hash tag.
pub fn cache_key_tagged(
    prefix: &str,
    domain: &str,
    entries: &[(&str, &str)],
    share: &[Option<String>],
    tag: Option<&str>,
    suffix: &str,
) -> String {
    let mut k = String::with_capacity(prefix.len() + domain.len() + 32);
    push_cache_key(&mut k, prefix, domain, entries.iter().copied(), share, tag);
    k.push_str(suffix);
    k
}

/// [`cache_key_with`] without its suffix, appended to `out`.
fn push_cache_key<'e>(
    out: &mut String,
    prefix: &str,
    domain: &str,
    entries: impl Iterator<Item = (&'e str, &'e str)>,
    share: &[Option<String>],
    tag: Option<&str>,
) {
    fn esc(out: &mut String, s: &str) {
        // ASCII bytes never occur inside a multi-byte character: a byte scan finds them
        if !s.bytes().any(|b| matches!(b, b'%' | b'{' | b'}')) {
            out.push_str(s);
            return;
        }
        for c in s.chars() {
            match c {
                '%' => out.push_str("%25"),
                '{' => out.push_str("%7B"),
                '}' => out.push_str("%7D"),
                c => out.push(c),
            }
        }
    }
    out.push_str(prefix);
    esc(out, domain);
    out.push('_');
    let mut tag = tag;
    for (i, (key, value)) in entries.enumerate() {
        let tagged = tag == Some(key);
        if tagged {
            out.push('{');
            tag = None; // the first such entry only: Redis reads the first `{…}`
        }
        esc(out, key);
        out.push('_');
        match share.get(i).and_then(|s| s.as_deref()) {
            Some(pattern) => esc(out, pattern),
            None => esc(out, value),
        }
        if tagged {
            out.push('}');
        }
        out.push('_');
    }
}

#[cfg(test)]
mod tests {
    //! The plan without Redis: what parts a request gives, and what it refuses.
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{Entry, RateLimitOverride};
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    const YAML: &str = "
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5, name: user}
  - key: user2
    rate_limit: {unit: minute, requests_per_unit: 3, name: user2, replaces: [{name: user}]}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket, burst: 9}
  - key: free
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 7}
";

    fn cfg() -> Config {
        Config::load([("f", YAML)], false).unwrap()
    }

    fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries.iter().map(|(k, v)| Entry { key: (*k).into(), value: (*v).into() }).collect(),
            ..RateLimitDescriptor::default()
        }
    }

    fn hits(entries: &[(&str, &str)], n: u64) -> RateLimitDescriptor {
        RateLimitDescriptor { hits_addend: Some(UInt64Value { value: n }), ..desc(entries) }
    }

    fn req(ds: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest { domain: "d".into(), descriptors: ds, hits_addend: 0 }
    }

    fn plan(ds: Vec<RateLimitDescriptor>) -> Result<Plan, ServiceError> {
        Plan::new(&req(ds), &cfg(), "p_")
    }

    fn keys(p: &Plan, parts: &[Part]) -> Vec<String> {
        parts.iter().map(|x| p.key(x).to_owned()).collect()
    }

    #[test]
    fn each_limited_descriptor_is_a_part_with_its_key_and_numbers() {
        let p = plan(vec![desc(&[("user", "a")]), desc(&[("tb", "x")]), desc(&[("nothing", "y")])]).unwrap();
        assert_eq!(keys(&p, &p.counted), ["p_d_user_a_60", "p_d_tb_x_1_tb"]);
        let shapes: Vec<Shape> = p.counted.iter().map(|x| x.shape).collect();
        let fw = |limit, window_ms| Shape {
            algorithm: Algorithm(Kind::FixedWindow),
            limit,
            window_ms,
            burst: limit,
            weight: 1,
            flags: 0,
        };
        let tb = Shape { algorithm: Algorithm(Kind::TokenBucket), limit: 4, window_ms: 1000, burst: 9, weight: 1, flags: 0 };
        assert_eq!(shapes, [fw(5, 60_000), tb]);
        assert!(p.checked.is_empty());
        let parts: Vec<Option<usize>> = p.descriptors.iter().map(|d| d.part).collect();
        assert_eq!(parts, [Some(0), Some(1), None]);
        assert!(!p.descriptors[2].limited());
    }

    #[test]
    fn the_same_counter_twice_is_one_part_its_hits_added_up() {
        let p = plan(vec![hits(&[("user", "a")], 2), desc(&[("tb", "x")]), hits(&[("user", "a")], 3)]).unwrap();
        assert_eq!(keys(&p, &p.counted), ["p_d_user_a_60", "p_d_tb_x_1_tb"]);
        assert_eq!(p.counted[0].shape.weight, 5);
        assert_eq!(p.keys.len(), p.counted[1].key.end, "the merged key is not written twice");
        let parts: Vec<Option<usize>> = p.descriptors.iter().map(|d| d.part).collect();
        assert_eq!(parts, [Some(0), Some(1), Some(0)]);
        // another value: another counter
        let p = plan(vec![desc(&[("user", "a")]), desc(&[("user", "b")])]).unwrap();
        assert_eq!(p.counted.len(), 2);
    }

    #[test]
    fn a_check_only_descriptor_is_a_part_of_its_own_call() {
        let p = plan(vec![hits(&[("user", "a")], 0), desc(&[("tb", "x")])]).unwrap();
        assert_eq!(keys(&p, &p.checked), ["p_d_user_a_60"]);
        assert_eq!(keys(&p, &p.counted), ["p_d_tb_x_1_tb"]);
        assert_eq!(p.checked[0].shape.weight, 1, "sent with weight 1 and cost 0");
        assert_eq!((p.descriptors[0].hits, p.descriptors[0].part, p.descriptors[1].hits), (0, Some(0), 1));
        // the request's hits_addend applies where a descriptor has none
        let r = RateLimitRequest { hits_addend: 4, ..req(vec![desc(&[("user", "a")])]) };
        assert_eq!(Plan::new(&r, &cfg(), "").unwrap().counted[0].shape.weight, 4);
    }

    #[test]
    fn replaced_and_unlimited_ask_redis_nothing_a_zero_limit_is_a_part() {
        let p = plan(vec![desc(&[("user", "a")]), desc(&[("user2", "a")]), desc(&[("free", "")]), desc(&[("zero", "")])])
            .unwrap();
        assert_eq!(keys(&p, &p.counted), ["p_d_user2_a_60", "p_d_zero__1"]);
        let d = &p.descriptors;
        assert!(d[0].replaced && !d[0].limited(), "user2 replaces user");
        assert!(d[1].limited() && !d[2].limited(), "unlimited");
        assert!(d[3].limited() && d[3].part == Some(1) && d[3].hits == 1, "requests_per_unit 0: in the same call");
        assert_eq!(p.counted[1].shape.limit, 0);
    }

    #[test]
    fn shadow_flags_and_detailed_keys() {
        let p = plan(vec![desc(&[("shadow", "s")]), desc(&[("user", "a")]), desc(&[("tenant", "t1")])]).unwrap();
        assert_eq!(p.counted.iter().map(|x| x.shadow).collect::<Vec<_>>(), [true, false, false]);
        assert_eq!(p.descriptors.iter().map(|d| d.unit).collect::<Vec<_>>(), [3, 2, 3], "HOUR, MINUTE, HOUR");
        assert_eq!(p.descriptors[2].detailed_key.as_deref(), Some("d.tenant_t1"));
        assert_eq!(p.descriptors[1].detailed_key, None);
        // one counter, shadow on one of its limits only: not a shadow part
        let yaml =
            "domain: d\ndescriptors:\n  - {key: a, shadow_mode: true, rate_limit: {unit: hour, requests_per_unit: 2}}\n";
        let cfg = Config::load([("f", yaml)], false).unwrap();
        let r = req(vec![desc(&[("a", "")]), desc(&[("a", "")])]);
        assert!(Plan::new(&r, &cfg, "").unwrap().counted[0].shadow);
        let mut not_shadow = desc(&[("a", "")]);
        not_shadow.limit = Some(RateLimitOverride { requests_per_unit: 2, unit: 3 }); // the same key, no shadow_mode
        let p = Plan::new(&req(vec![desc(&[("a", "")]), not_shadow]), &cfg, "").unwrap();
        assert_eq!((p.counted.len(), p.counted[0].shadow), (1, false));
    }

    #[test]
    fn an_override_is_a_fixed_window_of_its_unit() {
        let mut d = desc(&[("anything", "v"), ("k", "")]);
        d.limit = Some(RateLimitOverride { requests_per_unit: 2, unit: 3 });
        let p = plan(vec![d.clone()]).unwrap();
        assert_eq!(keys(&p, &p.counted), ["p_d_anything_v_k__3600"]);
        let l = &p.descriptors[0].matched.as_ref().unwrap().limit;
        assert_eq!((l.requests_per_unit, l.unit, l.full_key.as_str()), (2, Some(Unit::Hour), "d.anything_v.k"));
        // in a domain that is not configured: no match
        let r = RateLimitRequest { domain: "other".into(), ..req(vec![d.clone()]) };
        assert!(Plan::new(&r, &cfg(), "").unwrap().counted.is_empty());
        d.limit = Some(RateLimitOverride { requests_per_unit: 2, unit: 0 });
        assert_eq!(plan(vec![d]).unwrap_err(), ServiceError::Invalid("limit override with an unknown unit 0".into()));
    }

    #[test]
    fn negative_hits_are_refunded_parts() {
        let neg = |e: &[(&str, &str)], n: u64| RateLimitDescriptor { is_negative_hits: true, ..hits(e, n) };
        // a refund of 3 beside a take of 1 on the same key: two lists, one part each
        let p = plan(vec![neg(&[("user", "a")], 3), desc(&[("user", "a")]), neg(&[("user", "a")], 2)]).unwrap();
        assert_eq!((p.counted.len(), p.checked.len(), p.refunded.len()), (1, 0, 1));
        assert_eq!(p.refunded[0].shape.weight, 5, "the same key twice: the refunds added up");
        assert_eq!(p.key(&p.refunded[0]), p.key(&p.counted[0]));
        assert!(p.descriptors[0].negative && !p.descriptors[1].negative);
        assert_eq!(p.part_of(&p.descriptors[2]).map(|x| x.shape.weight), Some(5));
        assert!(!p.descriptors[0].quota(true), "a refund is never a quota descriptor");
        // a refund of nothing is no part
        let p = plan(vec![neg(&[("user", "a")], 0)]).unwrap();
        assert!(p.refunded.is_empty() && p.descriptors[0].part.is_none());
    }

    #[test]
    fn what_it_refuses() {
        let inv = |m: &str| Err(ServiceError::Invalid(m.into()));
        let err = |r: &RateLimitRequest| Plan::new(r, &cfg(), "").map(|_| ());
        let no_domain = RateLimitRequest { domain: String::new(), ..req(vec![desc(&[("user", "a")])]) };
        assert_eq!(err(&no_domain), inv("rate limit domain must not be empty"));
        assert_eq!(err(&req(vec![])), inv("rate limit descriptor list must not be empty"));
        assert_eq!(err(&req(vec![hits(&[("user", "a")], MAX + 1)])), inv("hits_addend 9007199254740992 is above 2^53-1"));
        assert!(err(&req(vec![hits(&[("user", "a")], MAX)])).is_ok());
        let many = |n: usize| req((0..n).map(|i| desc(&[("user", &i.to_string())])).collect());
        assert!(err(&many(MAX_LIMITED_DESCRIPTORS)).is_ok());
        assert_eq!(
            err(&many(MAX_LIMITED_DESCRIPTORS + 1)),
            inv("at most 16 limited descriptors per request (one RL.MULTI)")
        );
    }
}
