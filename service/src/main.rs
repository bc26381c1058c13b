//! `redis-ratelimit-service`: reads envoyproxy/ratelimit's environment
//! variables and serves until killed.

use redis_ratelimit_service::{server, settings::Settings};

fn main() {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("redis-ratelimit-service: {e}");
            std::process::exit(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("redis-ratelimit-service: tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(server::run(settings)) {
        eprintln!("redis-ratelimit-service: {e}");
        std::process::exit(1);
    }
}
