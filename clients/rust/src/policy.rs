//! Policies: what a limit is (algorithm, numbers, name). Immutable; each
//! holds the arguments it sends, prepared once.

use crate::error::{Error, Result};

/// The largest number a policy takes: 2^53 − 1, the module's
/// [`ratelimit_core::MAX_ARG`] (a JavaScript safe integer, a Lua double's
/// exact range), as in the other libraries.
pub const MAX: u64 = ratelimit_core::MAX_ARG;

/// The algorithm of a single policy: the catalogue's kind
/// (`ratelimit_core::catalogue`), with its command ([`Kind::command`]),
/// its RL.MULTI word ([`Kind::word`]), its Lua twin's name ([`Kind::name`])
/// and its positional arguments ([`Kind::args`]).
pub use ratelimit_core::catalogue::Kind;

/// One limit: an algorithm with its numbers and a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    kind: Kind,
    name: String,
    limit: u64,
    window_ms: u64,
    params: Vec<u64>,
    weight: u64,
    from_first: bool,
    /// RL.MULTI's CHECK: take nothing, deny when its units do not fit.
    check: bool,
    /// RL.MULTI's SHADOW: never deny; on a grant take its units if they fit.
    shadow: bool,
}

impl Policy {
    /// The algorithm.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The name (1–64 of `A-Z a-z 0-9 . _ -`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Capacity (token bucket) or limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The window for headers: for a token bucket the time an empty bucket
    /// takes to fill, `ceil(capacity × period_ms / rate)`; else `window_ms`.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
    /// The numbers sent after the key, as given.
    pub fn params(&self) -> &[u64] {
        &self.params
    }
    /// `RL.MULTI`'s `WEIGHT` (default 1; only matters inside `all_of`).
    pub fn weight(&self) -> u64 {
        self.weight
    }
    /// A fixed window started at a key's first grant (`FROMFIRST`), not
    /// aligned to the epoch.
    pub fn from_first(&self) -> bool {
        self.from_first
    }
    /// The same policy with `RL.MULTI`'s `WEIGHT w`.
    pub fn weighted(&self, w: u64) -> Result<Policy> {
        check_int("weight", w, 1)?;
        Ok(Policy { weight: w, ..self.clone() })
    }
    /// `RL.MULTI`'s `CHECK` (inside `all_of` only): the limit takes
    /// nothing, and the call is denied when its units do not fit.
    pub fn checked(&self) -> Policy {
        Policy { check: true, ..self.clone() }
    }
    /// `RL.MULTI`'s `SHADOW` (inside `all_of` only): the limit never
    /// denies the call; on a grant it takes its units only if they fit.
    pub fn shadowed(&self) -> Policy {
        Policy { shadow: true, ..self.clone() }
    }
    /// Whether it is [`Policy::checked`].
    pub fn check(&self) -> bool {
        self.check
    }
    /// Whether it is [`Policy::shadowed`].
    pub fn shadow(&self) -> bool {
        self.shadow
    }
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("policy name {name:?}: 1-64 of A-Z a-z 0-9 . _ -")))
    }
}

pub(crate) fn check_int(what: &str, v: u64, lo: u64) -> Result<u64> {
    if v < lo || v > MAX {
        return Err(Error::Invalid(format!("{what} must be an integer from {lo} to 2^53-1, not {v}")));
    }
    Ok(v)
}

/// A policy of `kind` named `name`: its positional arguments `params`
/// checked against the catalogue's spec of them (names and lower bounds,
/// in order, each at most [`MAX`]); `window_ms` is the last of them.
fn single(kind: Kind, name: &str, params: &[u64]) -> Result<Policy> {
    check_name(name)?;
    let spec = kind.args();
    if params.len() != spec.len() {
        return Err(Error::Invalid(format!("{} takes {} numbers, not {}", kind.name(), spec.len(), params.len())));
    }
    for (a, &v) in spec.iter().zip(params) {
        check_int(a.name(), v, a.min())?;
    }
    let (limit, window_ms) = (params[0], params[params.len() - 1]);
    Ok(Policy {
        kind,
        name: name.to_owned(),
        limit,
        window_ms,
        params: params.to_vec(),
        weight: 1,
        from_first: false,
        check: false,
        shadow: false,
    })
}

/// A token bucket: at most `capacity` tokens, regains `rate` tokens every
/// `period_ms`.
pub fn token_bucket(name: &str, capacity: u64, rate: u64, period_ms: u64) -> Result<Policy> {
    let mut p = single(Kind::TokenBucket, name, &[capacity, rate, period_ms])?;
    // ⌈capacity·period/rate⌉ exactly (u128: no overflow)
    let w = (capacity as u128 * period_ms as u128).div_ceil(rate as u128);
    p.window_ms = u64::try_from(w).unwrap_or(u64::MAX);
    Ok(p)
}

/// Exact: at most `limit` units in any `window_ms`.
pub fn sliding_log(name: &str, limit: u64, window_ms: u64) -> Result<Policy> {
    single(Kind::SlidingLog, name, &[limit, window_ms])
}

/// Cloudflare's approximation of a sliding window: two counters.
pub fn sliding_counter(name: &str, limit: u64, window_ms: u64) -> Result<Policy> {
    single(Kind::SlidingCounter, name, &[limit, window_ms])
}

/// A fixed-window counter (`RL.FIXEDWINDOW`): at most `limit` units per
/// window of `window_ms`, the windows aligned to the epoch, or with
/// `from_first` starting at a key's first grant (`FROMFIRST`, as INCR +
/// `PEXPIRE … NX` does). Up to 2 × `limit` can pass across one boundary.
/// On the module it needs `RL.FIXEDWINDOW` (0.3.0 or later); its Lua twin
/// is `lua/fixedwindow.lua`. Inside `all_of` it is `RL.MULTI`'s
/// `FIXEDWINDOW` limit.
pub fn fixed_window(name: &str, limit: u64, window_ms: u64, from_first: bool) -> Result<Policy> {
    let mut p = single(Kind::FixedWindow, name, &[limit, window_ms])?;
    p.from_first = from_first;
    Ok(p)
}

/// An in-flight limit (`RL.CONCURRENCY`, twin `lua/concurrency.lua`): at
/// most `limit` units held at once on a key, each hold a lease of
/// `lease_ms` on the server's clock. Its `window_ms` (for headers' `w`) is
/// `lease_ms`. It is not a rate: only [`RateLimit::inflight`] takes it;
/// the per-call and leased limiters and [`all_of`] refuse it.
///
/// [`RateLimit::inflight`]: crate::RateLimit::inflight
pub fn concurrency(name: &str, limit: u64, lease_ms: u64) -> Result<Policy> {
    single(Kind::Concurrency, name, &[limit, lease_ms])
}

/// `Err` when `p` is a [`concurrency`] policy, which `what` does not take.
pub(crate) fn not_concurrency(p: &Policy, what: &str) -> Result<()> {
    if p.kind() == Kind::Concurrency {
        return Err(Error::Invalid(format!(
            "{what} does not take a concurrency policy ({:?}): it is not a rate; use RateLimit::inflight",
            p.name()
        )));
    }
    Ok(())
}

/// Several policies decided together, all or nothing (`RL.MULTI`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AllOf {
    name: String,
    parts: Vec<Policy>,
}

impl AllOf {
    /// Its name (default: the part names joined by `.`).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The parts, in order.
    pub fn parts(&self) -> &[Policy] {
        &self.parts
    }
}

/// `all_of(parts, name)`: 1–16 distinct-named policies, all or nothing.
/// Without a name, the part names joined by `.`, which must then be at most
/// 64 characters.
pub fn all_of(parts: Vec<Policy>, name: Option<&str>) -> Result<AllOf> {
    if parts.is_empty() || parts.len() > 16 {
        return Err(Error::Invalid("all_of takes 1 to 16 policies".into()));
    }
    for (i, p) in parts.iter().enumerate() {
        not_concurrency(p, "all_of")?;
        if parts[..i].iter().any(|q| q.name == p.name) {
            return Err(Error::Invalid(format!("all_of: policy names must be distinct, got {:?} twice", p.name)));
        }
    }
    let name = match name {
        Some(n) => n.to_owned(),
        None => {
            let n = parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(".");
            if n.len() > 64 {
                return Err(Error::Invalid(format!(
                    "all_of: the default name {n:?} is longer than 64 characters; give all_of a name"
                )));
            }
            n
        }
    };
    check_name(&name)?;
    Ok(AllOf { name, parts })
}

/// What a limiter limits: one policy or an `all_of`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A single policy.
    Single(Policy),
    /// Several, all or nothing.
    AllOf(AllOf),
}

impl Rule {
    /// The rule's name.
    pub fn name(&self) -> &str {
        match self {
            Rule::Single(p) => p.name(),
            Rule::AllOf(a) => a.name(),
        }
    }
    /// Its policies (one for a single policy).
    pub fn parts(&self) -> &[Policy] {
        match self {
            Rule::Single(p) => std::slice::from_ref(p),
            Rule::AllOf(a) => a.parts(),
        }
    }
}

impl From<Policy> for Rule {
    fn from(p: Policy) -> Rule {
        Rule::Single(p)
    }
}

impl From<AllOf> for Rule {
    fn from(a: AllOf) -> Rule {
        Rule::AllOf(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_the_other_libraries_refuse() {
        assert!(token_bucket("", 1, 1, 1).is_err());
        assert!(token_bucket(&"a".repeat(65), 1, 1, 1).is_err());
        assert!(token_bucket(&"a".repeat(64), 1, 1, 1).is_ok());
        assert!(token_bucket("a+b", 1, 1, 1).is_err());
        assert!(token_bucket("a", 0, 1, 1).is_err());
        assert!(token_bucket("a", MAX + 1, 1, 1).is_err());
        assert!(token_bucket("a", MAX, MAX, MAX).is_ok());
        assert!(sliding_log("a", 1, 0).is_err());
        assert!(sliding_counter("a", 0, 1).is_err());
        let p = token_bucket("a", 1, 1, 1).unwrap();
        assert!(p.weighted(0).is_err());
        assert!(all_of(vec![], None).is_err());
        assert!(all_of(vec![p.clone(); 17], Some("x")).is_err());
        assert!(all_of(vec![p.clone(), p.clone()], None).is_err());
        let long = token_bucket(&"b".repeat(63), 1, 1, 1).unwrap();
        let e = all_of(vec![p.clone(), long.clone()], None).unwrap_err();
        assert!(e.to_string().contains("longer than 64"), "{e}");
        assert_eq!(all_of(vec![p.clone(), long], Some("x")).unwrap().name(), "x");
        assert!(all_of(vec![p.clone()], Some("a+b")).is_err());
        let fw = fixed_window("fw", 10, 1000, true).unwrap();
        assert!(fw.from_first() && fw.window_ms() == 1000);
        assert_eq!(all_of(vec![p, fw], None).unwrap().name(), "a.fw");
        assert!(fixed_window("fw", 0, 1000, false).is_err() && fixed_window("fw", 1, MAX + 1, false).is_err());
        let c = concurrency("streams", 10, 30_000).unwrap();
        assert_eq!((c.kind(), c.limit(), c.window_ms(), c.params()), (Kind::Concurrency, 10, 30_000, &[10, 30_000][..]));
        assert!(concurrency("c", 0, 1).is_err() && concurrency("c", 1, 0).is_err() && concurrency("c+", 1, 1).is_err());
        let e = all_of(vec![token_bucket("a", 1, 1, 1).unwrap(), c], None).unwrap_err();
        assert!(e.to_string().contains("concurrency"), "{e}");
    }

    #[test]
    fn each_policy_sends_its_kinds_arguments_from_the_catalogue() {
        let ps = [
            token_bucket("t", 3, 1, 10).unwrap(),
            sliding_log("l", 5, 1000).unwrap(),
            sliding_counter("c", 5, 1000).unwrap(),
            fixed_window("f", 5, 1000, true).unwrap(),
            concurrency("n", 5, 1000).unwrap(),
        ];
        for (p, k) in ps.iter().zip(ratelimit_core::catalogue::KINDS) {
            assert_eq!(p.kind(), k);
            assert_eq!(p.params().len(), k.args().len(), "{k:?}");
            assert_eq!(p.limit(), p.params()[0]);
        }
        let e = sliding_counter("c", 5, 0).unwrap_err();
        assert_eq!(e.to_string(), "window_ms must be an integer from 1 to 2^53-1, not 0");
        let e = token_bucket("t", 3, 0, 10).unwrap_err();
        assert_eq!(e.to_string(), "rate must be an integer from 1 to 2^53-1, not 0");
    }

    #[test]
    fn windows_and_default_names() {
        let api = token_bucket("api", 100, 10, 6000).unwrap();
        assert_eq!(api.window_ms(), 60000);
        assert_eq!(token_bucket("t", 10, 3, 1000).unwrap().window_ms(), 3334);
        assert_eq!(token_bucket("t", MAX, 1, MAX).unwrap().window_ms(), u64::MAX);
        let day = sliding_log("day", 1000, 86_400_000).unwrap();
        assert_eq!(all_of(vec![api, day], None).unwrap().name(), "api.day");
    }
}
