//! The service under load: max decisions/s (closed loop) and latency at
//! a fixed offered load (open loop).

use super::*;

/// The HTTP/2 connections to the service, and a rate-limit client on each.
pub(crate) struct Clients(pub(crate) Vec<Client>, pub(crate) Vec<Channel>);
impl Clients {
    pub(crate) fn get(&self, j: u64) -> Client {
        self.0[(j % self.0.len() as u64) as usize].clone()
    }
    /// A gRPC health client on the same connection as [`Clients::get`]`(j)`.
    pub(crate) fn health(&self, j: u64) -> HealthClient<Channel> {
        HealthClient::new(self.1[(j % self.1.len() as u64) as usize].clone())
    }
}

pub(crate) struct MaxCell {
    pub(crate) n: usize,
    pub(crate) rate: f64,
    pub(crate) svc_cpu_ns_per_dec: f64,
    pub(crate) svc_util: f64,
    pub(crate) errors: u64,
}

/// Closed loop: `inflight` tasks each sending one request after the other;
/// counted over `secs` after a warm-up.
pub(crate) async fn max_cell(cl: &Arc<Clients>, svc_pid: u32, n: usize, a: &Args) -> MaxCell {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let seq = Arc::new(AtomicU64::new(n as u64 * 10_000_000));
    let mut tasks = Vec::new();
    for _ in 0..a.inflight {
        let (cl, stop, done, errors, seq, keys) =
            (cl.clone(), stop.clone(), done.clone(), errors.clone(), seq.clone(), a.keys);
        tasks.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let j = seq.fetch_add(1, Relaxed);
                match cl.get(j).should_rate_limit(bench_request(j, n, keys)).await {
                    Ok(r) if r.get_ref().overall_code == OK => {}
                    _ => {
                        errors.fetch_add(1, Relaxed);
                    }
                }
                done.fetch_add(1, Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(if a.quick { 0.3 } else { 1.0 })).await;
    let (d0, c0, t0) = (done.load(Relaxed), cpu_ns(svc_pid), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(a.max_secs)).await;
    let (d1, c1, el) = (done.load(Relaxed), cpu_ns(svc_pid), t0.elapsed().as_secs_f64());
    stop.store(true, Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let dec = (d1 - d0).max(1) as f64;
    MaxCell {
        n,
        rate: dec / el,
        svc_cpu_ns_per_dec: (c1 - c0) as f64 / dec,
        svc_util: (c1 - c0) as f64 / 1e9 / el,
        errors: errors.load(Relaxed),
    }
}

/// Open loop at `rate`: request i is due at t0 + i/rate; a pacing thread
/// starts each at its due time (or at once when late). `f(i, due)` is the
/// request; it returns the latency from `due` in ns (or u64::MAX on error).
/// Returns the latencies and the pacer's lateness (ns) per request.
pub(crate) async fn open_loop<F, Fut>(rate: f64, count: u64, f: F) -> (Vec<u64>, Vec<u64>)
where
    F: Fn(u64, Instant) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = u64> + Send + 'static,
{
    let lat: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(u64::MAX)).collect());
    let late: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let pending = Arc::new(AtomicU64::new(count));
    let notify = Arc::new(tokio::sync::Notify::new());
    let handle = tokio::runtime::Handle::current();
    let f = Arc::new(f);
    let (lat2, late2, pending2, notify2) = (lat.clone(), late.clone(), pending.clone(), notify.clone());
    let pacer = std::thread::spawn(move || {
        let t0 = Instant::now() + Duration::from_millis(5);
        for i in 0..count {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            late2[i as usize].store(Instant::now().saturating_duration_since(due).as_nanos() as u64, Relaxed);
            let (f, lat, pending, notify) = (f.clone(), lat2.clone(), pending2.clone(), notify2.clone());
            handle.spawn(async move {
                let ns = f(i, due).await;
                lat[i as usize].store(ns, Relaxed);
                if pending.fetch_sub(1, Relaxed) == 1 {
                    notify.notify_one();
                }
            });
        }
    });
    while pending.load(Relaxed) > 0 {
        let _ = tokio::time::timeout(Duration::from_millis(50), notify.notified()).await;
    }
    pacer.join().unwrap();
    let lat = lat.iter().map(|x| x.load(Relaxed)).collect();
    let late = late.iter().map(|x| x.load(Relaxed)).collect();
    (lat, late)
}

/// A wake-up probe's figures in words.
pub(crate) fn probe_text((n, over1, over2, max): (u64, u64, u64, u64)) -> String {
    format!("{} of {} wake-ups late by over 1 ms, {} by over 2 ms, the latest by {} ms", over1, f0(n as f64), over2, ms(max))
}

/// A latency row's first cell: the control or the descriptor count, and `tail`.
pub(crate) fn lat_label(n: usize, tail: &str) -> String {
    if n == 0 {
        format!("control: health check{tail}")
    } else {
        format!("{n}{tail}")
    }
}

pub(crate) fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

pub(crate) struct LatCell {
    pub(crate) n: usize,
    pub(crate) rate: f64,
    pub(crate) achieved: f64,
    pub(crate) p50: u64,
    pub(crate) p99: u64,
    pub(crate) p999: u64,
    pub(crate) max: u64,
    pub(crate) late_p99: u64,
    pub(crate) errors: usize,
    /// the service's and the load generator's CPU use during the cell (1.0 = one core)
    pub(crate) svc_busy: f64,
    pub(crate) gen_busy: f64,
}

pub(crate) async fn lat_cell(cl: &Arc<Clients>, svc_pid: u32, n: usize, rate: f64, a: &Args) -> LatCell {
    let count = (rate * a.lat_secs).max(100.0) as u64;
    let keys = a.keys;
    let base = 20_000_000 * n as u64;
    let cl2 = cl.clone();
    let (s0, g0) = (cpu_ns(svc_pid), cpu_ns(std::process::id()));
    let t0 = Instant::now();
    let (lat, late) = open_loop(rate, count, move |i, due| {
        let (mut c, mut h) = (cl2.get(i), cl2.health(i));
        async move {
            let r = if n == 0 {
                // the control: the gRPC health check, on the same connections
                // and load, through the same server, without Redis
                h.check(HealthCheckRequest { service: String::new() }).await.map(|_| ()).map_err(|e| format!("{e:?}"))
            } else {
                match c.should_rate_limit(bench_request(base + i, n, keys)).await {
                    Ok(r) if r.get_ref().overall_code == OK => Ok(()),
                    r => Err(format!("{r:?}")),
                }
            };
            match r {
                Ok(()) => due.elapsed().as_nanos() as u64,
                Err(e) => {
                    if FIRST_ERROR.swap(false, Relaxed) {
                        eprintln!("  first error of a latency cell: {e}");
                    }
                    u64::MAX
                }
            }
        }
    })
    .await;
    let el = t0.elapsed().as_secs_f64();
    let (svc_busy, gen_busy) =
        ((cpu_ns(svc_pid) - s0) as f64 / 1e9 / el, (cpu_ns(std::process::id()) - g0) as f64 / 1e9 / el);
    let errors = lat.iter().filter(|&&x| x == u64::MAX).count();
    let mut ok: Vec<u64> = lat.into_iter().filter(|&x| x != u64::MAX).collect();
    ok.sort_unstable();
    let mut late = late;
    late.sort_unstable();
    LatCell {
        n,
        rate,
        achieved: count as f64 / el,
        p50: pct(&ok, 50.0),
        p99: pct(&ok, 99.0),
        p999: pct(&ok, 99.9),
        max: ok.last().copied().unwrap_or(0),
        late_p99: pct(&late, 99.0),
        errors,
        svc_busy,
        gen_busy,
    }
}
