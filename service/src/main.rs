//! `redis-ratelimit-service`: reads envoyproxy/ratelimit's environment
//! variables and serves until killed.

use redis_ratelimit_service::logger::{self, Level, LogSettings};
use redis_ratelimit_service::{server, settings::Settings};

fn main() {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            // the refusal in the log's format when LOG_LEVEL and LOG_FORMAT read
            let var = |n: &str| std::env::var(n).unwrap_or_default();
            logger::init(LogSettings::parse(&var("LOG_LEVEL"), &var("LOG_FORMAT")).unwrap_or_default());
            logger::write(Level::Fatal, &format!("redis-ratelimit-service: {e}"));
            std::process::exit(2);
        }
    };
    logger::init(settings.log);
    for n in &settings.notices {
        logger::write(Level::Warn, &format!("redis-ratelimit-service: {n}"));
    }
    // One CPU (an affinity mask or a cgroup quota of one): tokio's
    // single-threaded runtime, which costs less per decision than a
    // multi-threaded one with one worker (BENCHMARKS.md). More CPUs: one
    // worker per CPU.
    let cpus = std::thread::available_parallelism().map(|n| n.get()).ok();
    let built = if cpus == Some(1) {
        logger::write(Level::Info, "runtime: single-threaded (1 CPU)");
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        match cpus {
            Some(n) => logger::write(Level::Info, &format!("runtime: {n} worker threads ({n} CPUs)")),
            None => logger::write(Level::Info, "runtime: tokio's default worker threads (the CPU count is unknown)"),
        }
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    };
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            logger::write(Level::Fatal, &format!("redis-ratelimit-service: tokio runtime: {e}"));
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(server::run(settings)) {
        logger::write(Level::Fatal, &format!("redis-ratelimit-service: {e}"));
        std::process::exit(1);
    }
}
