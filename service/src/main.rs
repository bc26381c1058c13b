//! `redis-ratelimit-service`: reads envoyproxy/ratelimit's environment
//! variables (the service itself comes next).

use redis_ratelimit_service::settings::Settings;

fn main() {
    if let Err(e) = Settings::from_env() {
        eprintln!("redis-ratelimit-service: {e}");
        std::process::exit(2);
    }
    eprintln!("redis-ratelimit-service: settings read; the service is not built yet");
    std::process::exit(1);
}
