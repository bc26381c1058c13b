//! The debug listener, as envoyproxy/ratelimit's: HTTP on
//! `DEBUG_HOST:DEBUG_PORT` (`0.0.0.0:6070`), bound at startup (a port that
//! cannot be bound stops the start, naming `DEBUG_PORT`; upstream logs it
//! and serves without). Its endpoints:
//!
//! * `/rlconfig`: the live configuration, a line per limit
//!   ([`Config::dump`](crate::config::Config::dump), upstream's `Dump()`);
//! * `/stats`: every counter, `name: value`, sorted (upstream prints Go's
//!   expvar variables there, which this process has not);
//! * any other path: the index, `path: help` per endpoint, sorted (Go's
//!   `ServeMux` sends every unknown path to upstream's `/` handler).
//!
//! Upstream's `/debug/pprof/*` (Go's profiler) has no equivalent here.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::routing::get;
use redis_ratelimit_client::Connection;

use crate::service::Service;

/// The endpoints and their help, as the index lists them (sorted).
pub const ENDPOINTS: [(&str, &str); 2] =
    [("/rlconfig", "print out the currently loaded configuration for debugging"), ("/stats", "print out stats")];

const TEXT: [(header::HeaderName, &str); 1] = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];

async fn rlconfig<C: Connection>(State(svc): State<Arc<Service<C>>>) -> impl axum::response::IntoResponse {
    (TEXT, svc.config().dump())
}

async fn stats<C: Connection>(State(svc): State<Arc<Service<C>>>) -> impl axum::response::IntoResponse {
    let mut lines = Vec::new();
    svc.metrics().for_each_counter(|name, v| lines.push(format!("{name}: {v}\n")));
    lines.sort();
    (TEXT, lines.concat())
}

async fn index() -> impl axum::response::IntoResponse {
    (TEXT, ENDPOINTS.iter().map(|(p, h)| format!("{p}: {h}\n")).collect::<String>())
}

/// The debug router: `/rlconfig`, `/stats`, the index for any other path.
pub fn router<C: Connection>(svc: Arc<Service<C>>) -> axum::Router {
    axum::Router::new()
        .route("/rlconfig", get(rlconfig::<C>))
        .route("/stats", get(stats::<C>))
        .fallback(index)
        .with_state(svc)
}

/// Binds `DEBUG_HOST:DEBUG_PORT` (`addr`); the error names `DEBUG_PORT`.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, String> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("DEBUG_PORT {addr}: {e} (the debug listener; set DEBUG_HOST/DEBUG_PORT to a free address)"))
}

/// Serves [`router`] on `listener` until `stop` completes.
pub async fn serve<C: Connection>(
    svc: Arc<Service<C>>,
    listener: tokio::net::TcpListener,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    axum::serve(listener, router(svc)).with_graceful_shutdown(stop).await.map_err(|e| format!("debug server: {e}"))
}
