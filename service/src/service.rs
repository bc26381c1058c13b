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
    all_of, fixed_window, sliding_counter, sliding_log, token_bucket, Call, Connection, Decision, Limiter, Panic, Part,
    RateLimit, Source, MAX,
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

/// The numbers of one part of an `RL.MULTI`: (algorithm, requests_per_unit,
/// window_ms, burst (the token bucket's capacity), weight).
type PartShape = (Algorithm, u64, u64, u64, u64);

/// The numbers of the parts of one `RL.MULTI`.
type Shape = Vec<PartShape>;

/// One part of an `RL.MULTI`: its key and its numbers.
#[derive(Debug, Clone)]
struct PartSpec {
    key: String,
    shape: PartShape,
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
    fn esc(out: &mut String, s: &str) {
        for c in s.chars() {
            match c {
                '%' => out.push_str("%25"),
                '{' => out.push_str("%7B"),
                '}' => out.push_str("%7D"),
                c => out.push(c),
            }
        }
    }
    let mut k = String::with_capacity(prefix.len() + domain.len() + 32);
    k.push_str(prefix);
    k.push('{');
    esc(&mut k, domain);
    k.push_str("}_");
    for (i, (key, value)) in entries.iter().enumerate() {
        esc(&mut k, key);
        k.push('_');
        match share.get(i).and_then(|s| s.as_deref()) {
            Some(pattern) => esc(&mut k, pattern),
            None => esc(&mut k, value),
        }
        k.push('_');
    }
    k.push_str(suffix);
    k
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

/// One descriptor's limit once matched.
struct Slot {
    limit: Arc<Limit>,
    /// The window in ms.
    window_ms: u64,
    hits: u64,
    /// Index into the counted or checked parts.
    part: usize,
    /// The stats key of a `detailed_metric` limit (`domain.key_value…` of
    /// the request's values), else `None` (the limit's own `full_key`).
    detailed_key: Option<String>,
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
fn reset_seconds(slot: &Slot, state: Option<&PartState>) -> u64 {
    let ms = match state {
        Some(p) if slot.limit.algorithm != Algorithm::FixedWindow => {
            if p.over && p.retry_ms > 0 {
                p.retry_ms as u64
            } else {
                p.reset_ms
            }
        }
        _ => ms_until_window_end(slot.window_ms),
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

    fn limiter(&self, shape: &[PartShape]) -> Result<Limiter<C>, ServiceError> {
        let mut cache = self.limiters.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = cache.get(shape) {
            return Ok(l.clone());
        }
        let inv = |e: redis_ratelimit_client::Error| ServiceError::Invalid(e.to_string());
        let mut parts = Vec::with_capacity(shape.len());
        for (i, &(algorithm, limit, window_ms, burst, weight)) in shape.iter().enumerate() {
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
        let l = if let [(Algorithm::FixedWindow, limit, window_ms, _, _)] = *shape {
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

    /// One `RL.MULTI` over `parts`, `cost` 1 or 0.
    async fn multi(&self, parts: &[PartSpec], cost: u64) -> Result<Decision, ServiceError> {
        let shape: Shape = parts.iter().map(|p| p.shape).collect();
        let lim = self.limiter(&shape)?;
        let keys: Vec<&str> = parts.iter().map(|p| p.key.as_str()).collect();
        let d = if let [PartSpec { key, shape: (Algorithm::FixedWindow, _, _, _, weight) }] = parts {
            // a single RL.FIXEDWINDOW (`limiter`): its weight is the cost, and
            // its decision is the one part's
            lim.limit(key, Call::cost(if cost == 0 { 0 } else { *weight })).await.map(|mut d| {
                d.parts = vec![Part {
                    policy: std::mem::take(&mut d.policy),
                    granted: d.granted,
                    limit: d.limit,
                    remaining: d.remaining,
                    retry_after_ms: d.retry_after_ms,
                    reset_after_ms: d.reset_after_ms,
                }];
                d
            })
        } else {
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
                    for p in &mut d.parts {
                        (p.retry_after_ms, p.remaining) = (0, p.limit);
                    }
                }
                PanicMode::Deny => {
                    d.allowed = false;
                    for p in &mut d.parts {
                        (p.retry_after_ms, p.remaining) = (1, 0);
                    }
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
        let n = req.descriptors.len();
        let mut limits: Vec<Option<Matched>> = Vec::with_capacity(n);
        let mut unlimited = vec![false; n];
        let has_domain = cfg.has_domain(&req.domain);
        for d in &req.descriptors {
            if d.is_negative_hits {
                return Err(ServiceError::Invalid("is_negative_hits is not supported yet".into()));
            }
            let entries: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            let m = match (&d.limit, has_domain) {
                (_, false) => None,
                (Some(o), true) => {
                    let unit = Unit::from_proto(o.unit)
                        .ok_or_else(|| ServiceError::Invalid(format!("limit override with an unknown unit {}", o.unit)))?;
                    let full_key = std::iter::once(req.domain.clone())
                        .chain(std::iter::once(
                            entries
                                .iter()
                                .map(|(k, v)| if v.is_empty() { (*k).to_owned() } else { format!("{k}_{v}") })
                                .collect::<Vec<_>>()
                                .join("."),
                        ))
                        .collect::<Vec<_>>()
                        .join(".");
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
                (None, true) => cfg.get_limit(&req.domain, &entries),
            };
            limits.push(m);
        }
        let mut replacing: Vec<String> = Vec::new();
        for (i, m) in limits.iter_mut().enumerate() {
            if let Some(x) = m {
                replacing.extend(x.limit.replaces.iter().cloned());
                if x.limit.unlimited {
                    unlimited[i] = true;
                    *m = None;
                }
            }
        }
        for m in limits.iter_mut() {
            if m.as_ref().is_some_and(|x| !x.limit.name.is_empty() && replacing.contains(&x.limit.name)) {
                *m = None;
            }
        }
        self.decide(req, limits, unlimited).await
    }

    async fn decide(
        &self,
        req: &RateLimitRequest,
        limits: Vec<Option<Matched>>,
        unlimited: Vec<bool>,
    ) -> Result<RateLimitResponse, ServiceError> {
        let n = limits.len();
        // counted parts (hits > 0) and checked parts (hits 0), merged by key
        let mut counted: Vec<PartSpec> = Vec::new();
        let mut checked: Vec<PartSpec> = Vec::new();
        let mut slots: Vec<Option<(Slot, bool)>> = Vec::with_capacity(n);
        for (i, m) in limits.into_iter().enumerate() {
            let Some(m) = m else {
                slots.push(None);
                continue;
            };
            let d = &req.descriptors[i];
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend.max(1)),
            };
            if hits > MAX {
                return Err(ServiceError::Invalid(format!("hits_addend {hits} is above 2^53-1")));
            }
            let window_ms = m.limit.window().unwrap_or(1000);
            let entries: Vec<(&str, &str)> = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str())).collect();
            let mut key = cache_key_with(&self.settings.cache_key_prefix, &req.domain, &entries, &m.share, "");
            m.limit.push_key_suffix(&mut key);
            let rpu = u64::from(m.limit.requests_per_unit);
            let burst = m.limit.burst.unwrap_or(rpu);
            let list = if hits == 0 { &mut checked } else { &mut counted };
            let part = if rpu == 0 {
                usize::MAX // decided here: nothing to ask Redis
            } else if let Some(j) = list.iter().position(|p| p.key == key) {
                // the same counter twice in one request (the key holds the
                // algorithm and the window): one part, the hits added up
                let s = &mut list[j].shape;
                s.1 = s.1.min(rpu);
                s.3 = s.3.min(burst);
                s.4 = s.4.saturating_add(hits).min(MAX);
                j
            } else {
                // a check-only part (hits 0) is sent with weight 1 and COST 0
                list.push(PartSpec { key, shape: (m.limit.algorithm, rpu, window_ms, burst, hits.max(1)) });
                list.len() - 1
            };
            let detailed_key = m.limit.detailed_metric.then(|| {
                // envoyproxy/ratelimit's detailed key: domain, then key_value per
                // entry (the wildcard pattern for a share_threshold entry)
                let mut k = req.domain.clone();
                for (j, (key, value)) in entries.iter().enumerate() {
                    k.push('.');
                    k.push_str(key);
                    k.push('_');
                    k.push_str(m.share.get(j).and_then(|s| s.as_deref()).unwrap_or(value));
                }
                k
            });
            slots.push(Some((Slot { limit: m.limit, window_ms, hits, part, detailed_key }, hits == 0)));
        }
        if counted.len() > MAX_LIMITED_DESCRIPTORS || checked.len() > MAX_LIMITED_DESCRIPTORS {
            return Err(ServiceError::Invalid(format!(
                "at most {MAX_LIMITED_DESCRIPTORS} limited descriptors per request (one RL.MULTI)"
            )));
        }
        let global_shadow = self.settings.shadow_mode;
        let shadow_of =
            |j: usize| slots.iter().flatten().filter(|(s, chk)| !chk && s.part == j).all(|(s, _)| s.limit.shadow_mode);
        // the counted parts: one RL.MULTI; the check-only parts (hits 0): one with COST 0, at the same time
        let (main, check) = tokio::join!(
            async {
                if counted.is_empty() {
                    Ok(None)
                } else {
                    self.multi(&counted, 1).await.map(Some)
                }
            },
            async {
                if checked.is_empty() {
                    Ok(None)
                } else {
                    self.multi(&checked, 0).await.map(Some)
                }
            },
        );
        let main = main?;
        let check = check?;
        // what each counted part says
        let mut counted_state: Vec<PartState> = Vec::new();
        // per counted part: whether its units were taken (its remaining is after them)
        let mut counted_taken: Vec<bool> = Vec::new();
        if let Some(d) = &main {
            counted_state = part_states(d);
            counted_taken = vec![d.allowed; counted.len()];
            let over_parts: Vec<usize> = (0..counted.len()).filter(|&j| counted_state[j].over).collect();
            if !d.allowed && !over_parts.is_empty() && over_parts.iter().all(|&j| shadow_of(j)) && !global_shadow {
                // denied only by shadow-mode limits: the request passes, so the
                // enforced limits count it (a second RL.MULTI without the shadow ones)
                let keep: Vec<usize> = (0..counted.len()).filter(|&j| !shadow_of(j)).collect();
                if !keep.is_empty() {
                    let parts: Vec<_> = keep.iter().map(|&j| counted[j].clone()).collect();
                    let d2 = self.multi(&parts, 1).await?;
                    let st2 = part_states(&d2);
                    for (x, &j) in keep.iter().enumerate() {
                        counted_state[j] = st2[x];
                        counted_taken[j] = d2.allowed;
                    }
                }
            }
        }
        let check_state: Vec<PartState> = match &check {
            Some(d) => part_states(d).into_iter().map(|p| PartState { over: p.remaining == 0, ..p }).collect(),
            None => Vec::new(),
        };
        let mut statuses = Vec::with_capacity(n);
        let mut over_any = false;
        let mut header_from: Option<(u64, u32, u64)> = None; // (remaining, limit, reset seconds)
        let mut min_remaining = u64::from(u32::MAX);
        for (i, s) in slots.iter().enumerate() {
            let Some((slot, chk)) = s else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: if unlimited[i] { u32::MAX } else { 0 },
                    ..DescriptorStatus::default()
                });
                continue;
            };
            let state = if slot.part == usize::MAX {
                None
            } else if *chk {
                Some(&check_state[slot.part])
            } else {
                Some(&counted_state[slot.part])
            };
            let (over, remaining) = state.map_or((slot.hits > 0, 0), |p| (p.over, p.remaining));
            // the statistics, as envoyproxy/ratelimit counts them (docs/envoy.md)
            let stats_key = slot.detailed_key.as_deref().unwrap_or(slot.limit.full_key.as_str());
            self.metrics.with_key(stats_key, |k| {
                k.total_hits.fetch_add(slot.hits, Relaxed);
                if over {
                    // a denied request takes nothing: all its hits are over
                    k.over_limit.fetch_add(slot.hits, Relaxed);
                    if slot.limit.shadow_mode {
                        k.shadow_mode.fetch_add(slot.hits, Relaxed);
                    }
                } else {
                    k.within_limit.fetch_add(slot.hits, Relaxed);
                    if slot.part != usize::MAX && !*chk {
                        let limit = u64::from(slot.limit.requests_per_unit);
                        let count = limit.saturating_sub(remaining);
                        // a part of a request denied by another took nothing: count + hits is where it would be
                        let after = if counted_taken[slot.part] { count } else { count.saturating_add(slot.hits) };
                        let near = near_hits(limit, self.settings.near_limit_ratio, after, slot.hits);
                        k.near_limit.fetch_add(near, Relaxed);
                    }
                }
            });
            let mut code = if over { Code::OverLimit } else { Code::Ok };
            let remaining = if over { 0 } else { remaining };
            if over && slot.limit.shadow_mode {
                code = Code::Ok;
            }
            let reset_s = reset_seconds(slot, state);
            let st = status(code, &slot.limit, remaining, reset_s);
            // the headers: the descriptor with the fewest left, or the last over the limit
            if u64::from(st.limit_remaining) < min_remaining {
                min_remaining = u64::from(st.limit_remaining);
                header_from = Some((min_remaining, slot.limit.requests_per_unit, reset_s));
            }
            if code == Code::OverLimit {
                over_any = true;
                min_remaining = 0;
                header_from = Some((0, slot.limit.requests_per_unit, reset_s));
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

/// What each part of an `RL.MULTI` decision says. A part that could take
/// its units in a call denied by another took nothing, and its reply's
/// remaining is what it has now.
fn part_states(d: &Decision) -> Vec<PartState> {
    d.parts
        .iter()
        .map(|p| PartState {
            over: p.retry_after_ms != 0,
            remaining: p.remaining,
            retry_ms: p.retry_after_ms,
            reset_ms: p.reset_after_ms,
        })
        .collect()
}
