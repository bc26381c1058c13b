//! A request's descriptors decided together (issue 43, item 1): a model of
//! the rules, written here, against the service on a random corpus of
//! requests that mixes counted, check-only (`hits_addend` 0), zero-limit
//! (`requests_per_unit: 0`) and shadow-mode descriptors over four
//! algorithms, with and without `SHADOW_MODE`. The rules (docs/envoy.md):
//!
//! - a descriptor *fits* when its hits fit in what is left (a check-only
//!   one: when one unit is left; a zero limit never);
//! - the request is denied when a descriptor that is not in shadow mode
//!   does not fit (never with `SHADOW_MODE`); a denied request takes
//!   nothing anywhere;
//! - an allowed request takes each counted descriptor's hits where they
//!   fit (the shadow ones that do not fit take nothing); check-only ones
//!   take nothing;
//! - a descriptor that does not fit answers OVER_LIMIT (OK in shadow mode)
//!   with 0 left; one that fits answers OK with what is left after the
//!   request; the overall code is OVER_LIMIT when a descriptor is (OK with
//!   `SHADOW_MODE`).
//!
//! Every limit is per hour or longer, so nothing is regained during a run;
//! a run that an hour boundary crosses is made again (`in_one_window`).

use std::collections::HashMap;

use crate::support::*;

const ATOMIC: &str = r#"
domain: atomic
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 9}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: tb
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 7}
  - key: log
    rate_limit: {algorithm: sliding_log, unit: hour, requests_per_unit: 6}
  - key: sc
    rate_limit: {algorithm: sliding_counter, unit: hour, requests_per_unit: 8}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: st
    shadow_mode: true
    rate_limit: {algorithm: token_bucket, unit: hour, requests_per_unit: 1, burst: 4}
  - key: z
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: zs
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
"#;

/// Each descriptor key: its limit (the bucket's burst) and shadow mode.
const LIMITS: [(&str, u64, bool); 9] = [
    ("a", 9, false),
    ("b", 5, false),
    ("tb", 7, false),
    ("log", 6, false),
    ("sc", 8, false),
    ("s", 3, true),
    ("st", 4, true),
    ("z", 0, false),
    ("zs", 0, true),
];

/// xorshift64*: the corpus from a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % n
    }
}

/// One descriptor of a request: the index in [`LIMITS`], its value, its
/// own `hits_addend` (None: the request's).
type Pick = (usize, &'static str, Option<u64>);

fn corpus(seed: u64, n: usize) -> Vec<(u64, Vec<Pick>)> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    (0..n)
        .map(|_| {
            let hits = r.below(3); // 0 means 1
            let mut picks: Vec<Pick> = Vec::new();
            for _ in 0..1 + r.below(4) {
                // the zero limits rarely (they deny or answer OVER every time)
                let i = if r.below(12) == 0 { 7 + r.below(2) as usize } else { r.below(7) as usize };
                let v = ["x", "y", "w"][r.below(3) as usize];
                if picks.iter().any(|p| p.0 == i && p.1 == v) {
                    continue; // one counter once per request
                }
                let own = match r.below(6) {
                    0 | 1 => Some(0),
                    2 => Some(1),
                    3 => Some(2),
                    _ => None,
                };
                picks.push((i, v, own));
            }
            (hits, picks)
        })
        .collect()
}

/// The model's answer to one request (overall code, each status's code and
/// remaining), its counters changed as the rules say.
fn model(left: &mut HashMap<(usize, &str), u64>, global_shadow: bool, hits: u64, picks: &[Pick]) -> (i32, Vec<(i32, u32)>) {
    let req_hits = hits.max(1);
    let mut rows = Vec::new(); // (key, hits, fits, shadow)
    for &(i, v, own) in picks {
        let (_, limit, shadow) = LIMITS[i];
        let h = own.unwrap_or(req_hits);
        let r = *left.entry((i, v)).or_insert(limit);
        let fits = limit > 0 && r >= h.max(1);
        rows.push(((i, v), h, fits, shadow));
    }
    let denied = !global_shadow && rows.iter().any(|&(_, _, fits, shadow)| !fits && !shadow);
    let mut statuses = Vec::new();
    for &(k, h, fits, shadow) in &rows {
        if !denied && fits {
            *left.get_mut(&k).unwrap() -= h;
        }
        let code = if !fits && !shadow { OVER } else { OK };
        let remaining = if fits { left[&k] } else { 0 };
        statuses.push((code, remaining as u32));
    }
    let over = statuses.iter().any(|s| s.0 == OVER) && !global_shadow;
    (if over { OVER } else { OK }, statuses)
}

async fn agree(seed: u64, global_shadow: bool) {
    let requests = corpus(seed, 250);
    in_one_window(HOUR_MS, || async {
        let env: &[(&str, &str)] = if global_shadow { &[("SHADOW_MODE", "true")] } else { &[] };
        let e = Env::start("atomic", ATOMIC, env).await;
        let mut left = HashMap::new();
        let (mut denied, mut kinds) = (0, [0usize; 4]);
        for (n, (hits, picks)) in requests.iter().enumerate() {
            let ds = picks
                .iter()
                .map(|&(i, v, own)| {
                    let mut d = desc(&[(LIMITS[i].0, v)]);
                    d.hits_addend = own.map(|value| UInt64Value { value });
                    d
                })
                .collect();
            let a = e.ask(RateLimitRequest { hits_addend: *hits as u32, ..req("atomic", ds) }).await;
            let got: Vec<(i32, u32)> = a.statuses.iter().map(rem).collect();
            let want = model(&mut left, global_shadow, *hits, picks);
            assert_eq!((a.overall_code, got), want, "request {n} of seed {seed}: {picks:?} hits {hits}");
            denied += usize::from(a.overall_code == OVER);
            for &(i, _, own) in picks {
                let k = if LIMITS[i].1 == 0 {
                    2
                } else if own == Some(0) {
                    1
                } else if LIMITS[i].2 {
                    3
                } else {
                    0
                };
                kinds[k] += 1;
            }
        }
        println!("seed {seed}: kinds {kinds:?}, {denied} of {} denied", requests.len());
        // the corpus mixes the four kinds, and denies some requests but not all
        assert!(kinds.iter().all(|&k| k >= 10), "{kinds:?}");
        assert!(global_shadow || (denied > 10 && denied < requests.len() - 10), "{denied} denied");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_one_decision_as_the_model() {
    for seed in [1, 2, 3] {
        agree(seed, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_as_the_model() {
    agree(4, true).await;
}
