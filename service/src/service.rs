//! `ShouldRateLimit`: a request's descriptors matched against the
//! configuration and decided together in one atomic `RL.MULTI` (the Rust
//! client's `all_of`; each limit with its algorithm, the fixed window by
//! default), answered as envoyproxy/ratelimit answers
//! (`src/service/ratelimit.go`, `src/limiter/base_limiter.go`,
//! `src/redis/fixed_cache_impl.go` read for behaviour).

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit as PbLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use redis_ratelimit_client::{
    all_of, fixed_window, sliding_counter, sliding_log, token_bucket, Call, Connection, Decision, Limiter, Panic, RateLimit,
    Source, MAX,
};

use crate::config::{Algorithm, Config, Matched, RateLimit as Limit, Unit};
use crate::metrics::{near_hits, Metrics};
use crate::settings::{PanicMode, Settings};

/// Why a request gets no decision (a gRPC error; `/json` answers 400, as
/// envoyproxy/ratelimit's does for any error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceError {
    /// The request is malformed or asks for what is not supported.
    Invalid(String),
    /// Redis could not decide within the bound (timeout, connection, breaker open).
    Unavailable(String),
    /// Anything else (a Redis error reply).
    Internal(String),
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceError::Invalid(m) | ServiceError::Unavailable(m) | ServiceError::Internal(m) => f.write_str(m),
        }
    }
}

/// The most descriptors with a counted limit one request may have: the
/// parts of one `RL.MULTI`.
pub const MAX_LIMITED_DESCRIPTORS: usize = 16;

/// The numbers of one part of an `RL.MULTI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PartShape {
    algorithm: Algorithm,
    /// `requests_per_unit`.
    limit: u64,
    window_ms: u64,
    /// The token bucket's capacity.
    burst: u64,
    weight: u64,
}

impl std::hash::Hash for PartShape {
    /// One write of all its numbers: a request's limiter is looked up by its
    /// parts' shapes (a write per field cost ~1k instructions at 4 parts).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut b = [0u8; 33];
        b[0] = self.algorithm as u8;
        for (i, n) in [self.limit, self.window_ms, self.burst, self.weight].into_iter().enumerate() {
            b[1 + 8 * i..9 + 8 * i].copy_from_slice(&n.to_le_bytes());
        }
        state.write(&b);
    }
}

/// The numbers of the parts of one `RL.MULTI`.
type Shape = Vec<PartShape>;

/// One part of an `RL.MULTI`: its key (a range of the request's buffer
/// of keys), its numbers and, once decided, what it says.
#[derive(Debug, Clone)]
struct PartSpec {
    key: std::ops::Range<usize>,
    shape: PartShape,
    state: PartState,
    /// Counted parts: whether its units were taken (its remaining is after them).
    taken: bool,
}

/// The rate-limit service: the live configuration, the client, the settings.
pub struct Service<C> {
    rl: RateLimit<C>,
    config: RwLock<Arc<Config>>,
    settings: Settings,
    /// One limiter per shape of request (the numbers of each part).
    limiters: Mutex<HashMap<Shape, Limiter<C>>>,
    /// The error of the last configuration refused since the last one loaded.
    refused: Mutex<Option<String>>,
    /// The statistics (`/metrics`).
    metrics: Metrics,
}

/// The key of a limit's counter: envoyproxy/ratelimit's
/// `prefix + domain + "_" + (key + "_" + value + "_")*`, with the domain as
/// the hash tag and the window length in seconds in place of the window's
/// start (`RL.FIXEDWINDOW` keeps the window itself). `{`, `}` and `%` are
/// %-escaped so that the only hash tag is the domain.
pub fn cache_key(prefix: &str, domain: &str, entries: &[(&str, &str)], share: &[Option<String>], unit: Unit) -> String {
    cache_key_with(prefix, domain, entries, share, &unit.seconds().to_string())
}

/// [`cache_key`] with the end given: a limit's [`Limit::key_suffix`] (the
/// window, then the algorithm's tag), so that no two algorithms or windows
/// share a key.
pub fn cache_key_with(
    prefix: &str,
    domain: &str,
    entries: &[(&str, &str)],
    share: &[Option<String>],
    suffix: &str,
) -> String {
    let mut k = String::with_capacity(prefix.len() + domain.len() + 32);
    push_cache_key(&mut k, prefix, domain, entries.iter().copied(), share);
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
    out.push('{');
    esc(out, domain);
    out.push_str("}_");
    for (i, (key, value)) in entries.enumerate() {
        esc(out, key);
        out.push('_');
        match share.get(i).and_then(|s| s.as_deref()) {
            Some(pattern) => esc(out, pattern),
            None => esc(out, value),
        }
        out.push('_');
    }
}

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

/// One descriptor of a request: what it matched and, for a limit to
/// decide, how.
struct Desc {
    /// The match, if any (kept when unlimited or replaced: its `replaces`
    /// still count).
    matched: Option<Matched>,
    /// Its limit is one another matched limit `replaces`: as no match.
    replaced: bool,
    /// The window in ms.
    window_ms: u64,
    /// The hits it adds: 0 for a check-only descriptor ([`Desc::checked`]).
    hits: u64,
    /// Index into the counted parts, or the checked ones when
    /// [`Desc::checked`] (`usize::MAX`: decided here).
    part: usize,
    /// The stats key of a `detailed_metric` limit (`domain.key_value…` of
    /// the request's values), else `None` (the limit's own `full_key`).
    detailed_key: Option<String>,
}

impl Desc {
    /// A limit to decide: matched, neither `unlimited` nor replaced (else
    /// `OK`, remaining `u32::MAX` when unlimited, 0 otherwise).
    fn is_limited(&self) -> bool {
        !self.replaced && self.matched.as_ref().is_some_and(|m| !m.limit.unlimited)
    }

    fn limit(&self) -> Option<&Arc<Limit>> {
        self.matched.as_ref().map(|m| &m.limit)
    }

    /// A check-only descriptor (`hits_addend` 0): its part is among the
    /// checked ones, sent with `COST 0`.
    fn checked(&self) -> bool {
        self.hits == 0
    }
}

/// What one part of a decision says: over the limit, units left, and
/// (from the module's reply) ms until the part's units fit (−1: never) and
/// until the state is fresh again.
#[derive(Debug, Clone, Copy, Default)]
struct PartState {
    over: bool,
    remaining: u64,
    retry_ms: i64,
    reset_ms: u64,
}

/// `duration_until_reset` in seconds, rounded up (Envoy reads the seconds).
/// The fixed window (and `requests_per_unit: 0`): the window's end, as
/// envoyproxy/ratelimit answers. Token bucket and sliding windows, from the
/// module's reply: over the limit, the time until the descriptor's hits fit
/// again (when a client may retry); else the time until the state is full
/// again (the whole quota back, what `RateLimit-Reset` means); a check
/// (`hits_addend` 0) over the limit, and hits above the limit, the latter.
fn reset_seconds(limit: &Limit, window_ms: u64, state: Option<&PartState>) -> u64 {
    let ms = match state {
        Some(p) if limit.algorithm != Algorithm::FixedWindow => {
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

fn status(code: Code, limit: &Limit, remaining: u64, reset_s: u64) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(PbLimit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.reported_unit().map(Unit::proto).unwrap_or(0),
        }),
        limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(PbDuration { seconds: i64::try_from(reset_s).unwrap_or(i64::MAX), nanos: 0 }),
        quota: None,
    }
}

impl<C: Connection> Service<C> {
    /// A service over a client and a first configuration.
    pub fn new(rl: RateLimit<C>, config: Config, settings: Settings) -> Service<C> {
        Service {
            rl,
            config: RwLock::new(Arc::new(config)),
            settings,
            limiters: Mutex::new(HashMap::new()),
            refused: Mutex::new(None),
            metrics: Metrics::new(),
        }
    }

    /// The statistics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus text of the statistics and of the client's counters.
    pub fn render_metrics(&self) -> String {
        let m = self.rl.metrics();
        self.metrics.render(&[
            ("redis_ratelimit_client_redis_calls", "Redis calls made by the client.", m.calls),
            ("redis_ratelimit_client_redis_failures", "Redis calls that failed or timed out (REDIS_TIMEOUT).", m.failures),
            ("redis_ratelimit_client_breaker_trips", "Times the client's circuit breaker opened.", m.trips),
            (
                "redis_ratelimit_client_decisions_unavailable",
                "Decisions Redis did not give (timeout, failure, breaker open).",
                m.decisions_panic,
            ),
        ])
    }

    /// The live configuration.
    pub fn config(&self) -> Arc<Config> {
        self.config.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `config` the live configuration (requests already running keep theirs).
    pub fn set_config(&self, config: Config) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.metrics.config_load_success.fetch_add(1, Relaxed);
    }

    /// Records why a configuration was refused (the live one stays).
    pub fn refuse_config(&self, error: String) {
        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        self.metrics.config_load_error.fetch_add(1, Relaxed);
    }

    /// The error of the last configuration refused since one last loaded, if any.
    pub fn last_refusal(&self) -> Option<String> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn limiter(&self, parts: &[PartSpec]) -> Result<Limiter<C>, ServiceError> {
        // the shape looked up on the stack: `decide` refuses a request of
        // more than MAX_LIMITED_DESCRIPTORS parts before any call
        let zero = PartShape { algorithm: Algorithm::FixedWindow, limit: 0, window_ms: 0, burst: 0, weight: 0 };
        let mut buf = [zero; MAX_LIMITED_DESCRIPTORS];
        let Some(shape) = buf.get_mut(..parts.len()) else {
            return Err(ServiceError::Invalid(format!("more than {MAX_LIMITED_DESCRIPTORS} limited descriptors")));
        };
        for (b, p) in shape.iter_mut().zip(parts) {
            *b = p.shape;
        }
        let shape: &[PartShape] = shape;
        let mut cache = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = cache.get(shape) {
            return Ok(l.clone());
        }
        let inv = |e: redis_ratelimit_client::Error| ServiceError::Invalid(e.to_string());
        let mut parts = Vec::with_capacity(shape.len());
        for (i, &PartShape { algorithm, limit, window_ms, burst, weight }) in shape.iter().enumerate() {
            let name = format!("d{i}");
            let p = match algorithm {
                Algorithm::FixedWindow => fixed_window(&name, limit, window_ms, false),
                Algorithm::TokenBucket => token_bucket(&name, burst, limit, window_ms),
                Algorithm::SlidingLog => sliding_log(&name, limit, window_ms),
                Algorithm::SlidingCounter => sliding_counter(&name, limit, window_ms),
            };
            parts.push(p.and_then(|p| p.weighted(weight)).map_err(inv)?);
        }
        let panic = match self.settings.panic_mode {
            PanicMode::Local(instances) => Panic::Instances(instances),
            _ => Panic::default(),
        };
        let l = if let [PartShape { algorithm: Algorithm::FixedWindow, limit, window_ms, .. }] = *shape {
            // one fixed window: RL.FIXEDWINDOW itself, its weight the call's
            // cost (`multi`): the same decision, for fewer instructions in
            // Redis than a one-part RL.MULTI (make bench-envoy)
            self.rl.limiter(fixed_window("d0", limit, window_ms, false).map_err(inv)?, panic)
        } else {
            self.rl.limiter(all_of(parts, Some("envoy")).map_err(inv)?, panic)
        }
        .map_err(inv)?;
        if cache.len() >= 10_000 {
            cache.clear();
        }
        cache.insert(shape.to_vec(), l.clone());
        Ok(l)
    }

    /// One `RL.MULTI` over `parts` (their keys in `keys`), `cost` 1 or 0.
    /// A single fixed window is one `RL.FIXEDWINDOW`, its decision's
    /// `parts` empty ([`part_states`] reads the decision itself).
    async fn multi(&self, keys: &str, parts: &[PartSpec], cost: u64) -> Result<Decision, ServiceError> {
        let lim = self.limiter(parts)?;
        let key = |p: &PartSpec| keys.get(p.key.clone()).unwrap_or_default();
        let d = if let [p @ PartSpec { shape: PartShape { algorithm: Algorithm::FixedWindow, weight, .. }, .. }] = parts {
            // a single RL.FIXEDWINDOW (`limiter`): its weight is the cost
            lim.limit(key(p), Call::cost(if cost == 0 { 0 } else { *weight })).await
        } else {
            let keys: Vec<&str> = parts.iter().map(key).collect();
            lim.limit_keys(&keys, Call::cost(cost)).await
        };
        let mut d = d.map_err(|e| match e {
            redis_ratelimit_client::Error::Unavailable(m) => ServiceError::Unavailable(m),
            redis_ratelimit_client::Error::Invalid(m) => ServiceError::Invalid(m),
            // the keys share the domain's hash tag, so this is a bug here: an
            // error answer, and nothing was counted anywhere (refused before any call)
            redis_ratelimit_client::Error::CrossSlot(m) => {
                ServiceError::Internal(format!("the keys of one request span cluster slots, nothing counted: {m}"))
            }
            e => ServiceError::Internal(e.to_string()),
        })?;
        if d.source == Source::Panic {
            // Redis did not answer within REDIS_TIMEOUT, or the breaker is open
            match self.settings.panic_mode {
                PanicMode::Error => {
                    return Err(ServiceError::Unavailable(
                        "Redis is unavailable (no reply within REDIS_TIMEOUT, or the breaker is open)".into(),
                    ))
                }
                // the client's panic limits decided, all parts or none
                PanicMode::Local(_) => {}
                PanicMode::Allow => {
                    d.allowed = true;
                    set_parts(&mut d, |limit| (0, limit));
                }
                PanicMode::Deny => {
                    d.allowed = false;
                    set_parts(&mut d, |_| (1, 0));
                }
            }
        }
        Ok(d)
    }

    /// `ShouldRateLimit`, timed and counted in the statistics.
    pub async fn should_rate_limit(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        let t0 = std::time::Instant::now();
        let r = self.should_rate_limit_uncounted(req).await;
        self.metrics.observe(t0.elapsed());
        match &r {
            Ok(_) => {}
            Err(ServiceError::Unavailable(_) | ServiceError::Internal(_)) => {
                self.metrics.redis_error.fetch_add(1, Relaxed);
            }
            Err(ServiceError::Invalid(_)) => {
                self.metrics.service_error.fetch_add(1, Relaxed);
            }
        }
        r
    }

    async fn should_rate_limit_uncounted(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, ServiceError> {
        if req.domain.is_empty() {
            return Err(ServiceError::Invalid("rate limit domain must not be empty".into()));
        }
        if req.descriptors.is_empty() {
            return Err(ServiceError::Invalid("rate limit descriptor list must not be empty".into()));
        }
        let cfg = self.config();
        let mut descs: Vec<Desc> = Vec::with_capacity(req.descriptors.len());
        let domain = cfg.domain(&req.domain);
        for d in &req.descriptors {
            if d.is_negative_hits {
                return Err(ServiceError::Invalid("is_negative_hits is not supported yet".into()));
            }
            let entries = || d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            let m = match (&d.limit, domain) {
                (_, None) => None,
                (Some(o), Some(_)) => {
                    let unit = Unit::from_proto(o.unit)
                        .ok_or_else(|| ServiceError::Invalid(format!("limit override with an unknown unit {}", o.unit)))?;
                    // `domain.key_value.key…` (an empty value: the key alone)
                    let mut full_key = req.domain.clone();
                    full_key.push('.');
                    for (j, (k, v)) in entries().enumerate() {
                        if j > 0 {
                            full_key.push('.');
                        }
                        full_key.push_str(k);
                        if !v.is_empty() {
                            full_key.push('_');
                            full_key.push_str(v);
                        }
                    }
                    Some(Matched {
                        limit: Arc::new(Limit {
                            requests_per_unit: o.requests_per_unit,
                            unit: Some(unit),
                            unlimited: false,
                            name: String::new(),
                            replaces: Vec::new(),
                            shadow_mode: false,
                            detailed_metric: false,
                            full_key,
                            // an override has a unit and a number: envoyproxy/ratelimit's fixed window
                            algorithm: Algorithm::FixedWindow,
                            window_ms: None,
                            burst: None,
                        }),
                        share: Vec::new(),
                    })
                }
                (None, Some(domain)) => domain.get_limit_of(entries()),
            };
            descs.push(Desc { matched: m, replaced: false, window_ms: 0, hits: 0, part: usize::MAX, detailed_key: None });
        }
        // a named limit that any matched limit (unlimited ones too) replaces is dropped
        for i in 0..descs.len() {
            let replaced = match descs[i].limit() {
                Some(l) if descs[i].is_limited() && !l.name.is_empty() => {
                    descs.iter().filter_map(Desc::limit).any(|x| x.replaces.iter().any(|r| *r == l.name))
                }
                _ => false,
            };
            descs[i].replaced = replaced;
        }
        self.decide(req, descs).await
    }

    /// The counted parts in one `RL.MULTI` and the check-only ones in
    /// another with `COST 0`, at the same time: requests with a
    /// `hits_addend` of 0, rare, out of line (boxed) so that their second
    /// call does not make every request's future larger.
    async fn counted_and_checked(
        &self,
        keys: &str,
        counted: &[PartSpec],
        checked: &[PartSpec],
    ) -> Result<(Option<Decision>, Option<Decision>), ServiceError> {
        let (main, check) = tokio::join!(
            async {
                if counted.is_empty() {
                    Ok(None)
                } else {
                    self.multi(keys, counted, 1).await.map(Some)
                }
            },
            self.multi(keys, checked, 0),
        );
        Ok((main?, Some(check?)))
    }

    async fn decide(&self, req: &RateLimitRequest, mut descs: Vec<Desc>) -> Result<RateLimitResponse, ServiceError> {
        let n = descs.len();
        let prefix = self.settings.cache_key_prefix.as_str();
        // every part's key, one after another (a range of it per part)
        let mut keys = String::with_capacity(
            req.descriptors
                .iter()
                .map(|d| {
                    prefix.len()
                        + req.domain.len()
                        + 24
                        + d.entries.iter().map(|e| e.key.len() + e.value.len() + 2).sum::<usize>()
                })
                .sum(),
        );
        // counted parts (hits > 0) and checked parts (hits 0), merged by key
        let mut counted: Vec<PartSpec> = Vec::new();
        let mut checked: Vec<PartSpec> = Vec::new();
        for (desc, d) in descs.iter_mut().zip(&req.descriptors) {
            if !desc.is_limited() {
                continue;
            }
            let Some(m) = &desc.matched else { continue };
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            if hits > MAX {
                return Err(ServiceError::Invalid(format!("hits_addend {hits} is above 2^53-1")));
            }
            let window_ms = m.limit.window().unwrap_or(1000);
            let entries = || d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            let start = keys.len();
            push_cache_key(&mut keys, prefix, &req.domain, entries(), &m.share);
            m.limit.push_key_suffix(&mut keys);
            let rpu = u64::from(m.limit.requests_per_unit);
            let burst = m.limit.burst.unwrap_or(rpu);
            let list = if hits == 0 { &mut checked } else { &mut counted };
            let part = if rpu == 0 {
                keys.truncate(start);
                usize::MAX // decided here: nothing to ask Redis
            } else if let Some(j) = list.iter().position(|p| keys.get(p.key.clone()) == keys.get(start..)) {
                // the same counter twice in one request (the key holds the
                // algorithm and the window): one part, the hits added up
                keys.truncate(start);
                let s = &mut list[j].shape;
                s.limit = s.limit.min(rpu);
                s.burst = s.burst.min(burst);
                s.weight = s.weight.saturating_add(hits).min(MAX);
                j
            } else {
                if list.capacity() == 0 {
                    list.reserve(n);
                }
                // a check-only part (hits 0) is sent with weight 1 and COST 0
                list.push(PartSpec {
                    key: start..keys.len(),
                    shape: PartShape { algorithm: m.limit.algorithm, limit: rpu, window_ms, burst, weight: hits.max(1) },
                    state: PartState::default(),
                    taken: false,
                });
                list.len() - 1
            };
            desc.detailed_key = m.limit.detailed_metric.then(|| {
                // envoyproxy/ratelimit's detailed key: domain, then key_value per
                // entry (the wildcard pattern for a share_threshold entry)
                let mut k = req.domain.clone();
                for (j, (key, value)) in entries().enumerate() {
                    k.push('.');
                    k.push_str(key);
                    k.push('_');
                    k.push_str(m.share.get(j).and_then(|s| s.as_deref()).unwrap_or(value));
                }
                k
            });
            (desc.window_ms, desc.hits, desc.part) = (window_ms, hits, part);
        }
        if counted.len() > MAX_LIMITED_DESCRIPTORS || checked.len() > MAX_LIMITED_DESCRIPTORS {
            return Err(ServiceError::Invalid(format!(
                "at most {MAX_LIMITED_DESCRIPTORS} limited descriptors per request (one RL.MULTI)"
            )));
        }
        let global_shadow = self.settings.shadow_mode;
        let shadow_of = |j: usize| {
            descs
                .iter()
                .filter(|x| x.is_limited() && !x.checked() && x.part == j)
                .all(|x| x.limit().is_some_and(|l| l.shadow_mode))
        };
        // the counted parts: one RL.MULTI; the check-only parts (hits 0): one with COST 0, at the same time
        let (main, check) = if checked.is_empty() {
            (if counted.is_empty() { None } else { Some(self.multi(&keys, &counted, 1).await?) }, None)
        } else {
            Box::pin(self.counted_and_checked(&keys, &counted, &checked)).await?
        };
        if let Some(d) = &main {
            for (p, st) in counted.iter_mut().zip(part_states(d)) {
                (p.state, p.taken) = (st, d.allowed);
            }
            let over = || (0..counted.len()).filter(|&j| counted[j].state.over);
            let shadow_only = !d.allowed && over().next().is_some() && over().all(shadow_of);
            if shadow_only && !global_shadow {
                // denied only by shadow-mode limits: the request passes, so the
                // enforced limits count it (a second RL.MULTI without the
                // shadow ones; rare, out of line)
                let keep: Vec<usize> = (0..counted.len()).filter(|&j| !shadow_of(j)).collect();
                if !keep.is_empty() {
                    let parts: Vec<_> = keep.iter().map(|&j| counted[j].clone()).collect();
                    let d2 = Box::pin(self.multi(&keys, &parts, 1)).await?;
                    for (&j, st) in keep.iter().zip(part_states(&d2)) {
                        (counted[j].state, counted[j].taken) = (st, d2.allowed);
                    }
                }
            }
        }
        if let Some(d) = &check {
            for (p, st) in checked.iter_mut().zip(part_states(d)) {
                p.state = PartState { over: st.remaining == 0, ..st };
            }
        }
        let mut statuses = Vec::with_capacity(n);
        let mut over_any = false;
        let mut header_from: Option<(u64, u32, u64)> = None; // (remaining, limit, reset seconds)
        let mut min_remaining = u64::from(u32::MAX);
        for desc in &descs {
            let (true, Some(limit)) = (desc.is_limited(), desc.limit()) else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: if desc.limit().is_some_and(|l| l.unlimited) { u32::MAX } else { 0 },
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let state = if desc.part == usize::MAX {
                None
            } else if desc.checked() {
                checked.get(desc.part).map(|p| &p.state)
            } else {
                counted.get(desc.part).map(|p| &p.state)
            };
            let (over, remaining) = state.map_or((desc.hits > 0, 0), |p| (p.over, p.remaining));
            // the statistics, as envoyproxy/ratelimit counts them (docs/envoy.md)
            let stats_key = desc.detailed_key.as_deref().unwrap_or(limit.full_key.as_str());
            self.metrics.with_key(stats_key, |k| {
                k.total_hits.fetch_add(desc.hits, Relaxed);
                if over {
                    // a denied request takes nothing: all its hits are over
                    k.over_limit.fetch_add(desc.hits, Relaxed);
                    if limit.shadow_mode {
                        k.shadow_mode.fetch_add(desc.hits, Relaxed);
                    }
                } else {
                    k.within_limit.fetch_add(desc.hits, Relaxed);
                    if let (false, Some(p)) = (desc.checked(), counted.get(desc.part)) {
                        let rpu = u64::from(limit.requests_per_unit);
                        let count = rpu.saturating_sub(remaining);
                        // a part of a request denied by another took nothing: count + hits is where it would be
                        let after = if p.taken { count } else { count.saturating_add(desc.hits) };
                        let near = near_hits(rpu, self.settings.near_limit_ratio, after, desc.hits);
                        k.near_limit.fetch_add(near, Relaxed);
                    }
                }
            });
            let mut code = if over { Code::OverLimit } else { Code::Ok };
            let remaining = if over { 0 } else { remaining };
            if over && limit.shadow_mode {
                code = Code::Ok;
            }
            let reset_s = reset_seconds(limit, desc.window_ms, state);
            let st = status(code, limit, remaining, reset_s);
            // the headers: the descriptor with the fewest left, or the last over the limit
            if u64::from(st.limit_remaining) < min_remaining {
                min_remaining = u64::from(st.limit_remaining);
                header_from = Some((min_remaining, limit.requests_per_unit, reset_s));
            }
            if code == Code::OverLimit {
                over_any = true;
                min_remaining = 0;
                header_from = Some((0, limit.requests_per_unit, reset_s));
            }
            statuses.push(st);
        }
        let overall = if over_any && !global_shadow { Code::OverLimit } else { Code::Ok };
        if over_any && global_shadow {
            self.metrics.global_shadow_mode.fetch_add(1, Relaxed);
        }
        let response_headers_to_add = match header_from {
            Some((rem, lim, reset_s)) if self.settings.headers_enabled => vec![
                header(&self.settings.header_limit, lim.to_string()),
                header(&self.settings.header_remaining, rem.to_string()),
                header(&self.settings.header_reset, reset_s.to_string()),
            ],
            _ => Vec::new(),
        };
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add,
            ..RateLimitResponse::default()
        })
    }
}

fn header(k: &str, v: String) -> HeaderValue {
    HeaderValue { key: k.to_owned(), value: v, raw_value: Vec::new() }
}

/// What each part of a decision says: an `RL.MULTI`'s parts, or a single
/// `RL.FIXEDWINDOW`'s decision itself (its `parts` empty). A part that
/// could take its units in a call denied by another took nothing, and its
/// reply's remaining is what it has now.
fn part_states(d: &Decision) -> impl Iterator<Item = PartState> + '_ {
    let state =
        |retry_ms: i64, remaining: u64, reset_ms: u64| PartState { over: retry_ms != 0, remaining, retry_ms, reset_ms };
    let single = d.parts.is_empty().then(|| state(d.retry_after_ms, d.remaining, d.reset_after_ms));
    single.into_iter().chain(d.parts.iter().map(move |p| state(p.retry_after_ms, p.remaining, p.reset_after_ms)))
}

/// Each part's (retry_after_ms, remaining) set to `f(its limit)`: an
/// `RL.MULTI`'s parts, or a single `RL.FIXEDWINDOW`'s decision itself (its
/// `parts` empty), as [`part_states`] reads them.
fn set_parts(d: &mut Decision, f: impl Fn(u64) -> (i64, u64)) {
    if d.parts.is_empty() {
        (d.retry_after_ms, d.remaining) = f(d.limit);
    }
    for p in &mut d.parts {
        (p.retry_after_ms, p.remaining) = f(p.limit);
    }
}
