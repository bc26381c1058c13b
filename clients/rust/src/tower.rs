//! A `tower` layer that limits HTTP (axum, hyper) and gRPC (tonic)
//! services: [`RateLimitLayer`].
//!
//! Each request goes through a key extractor, a closure over the request's
//! head (method, URI, headers, extensions) that names the caller, or
//! `None` to pass the request through unlimited. The caller becomes the
//! Redis key `rl:{caller}:<rule name>` (as the other libraries'
//! middleware build it; for `all_of`, `:<part>` per part), decided by a
//! [`Limiter`] (one bounded Redis call per request) or a [`LeasedLimiter`]
//! (local, no I/O on most requests).
//!
//! * Allowed: the inner service answers, with the decision's [`headers`]
//!   added to its response.
//! * Denied, HTTP: `429 Too Many Requests` with the headers, `Retry-After`
//!   when known, and [`problem`]'s body as `application/problem+json`
//!   (the request's path as its `instance`). The inner service is not
//!   called.
//! * Denied, gRPC ([`RateLimitLayer::grpc`]): a trailers-only response,
//!   status `RESOURCE_EXHAUSTED` (8) with the problem's detail as its
//!   message and the headers as metadata (lower-case names).
//! * An error of the limiter (a caller tag with `{` or `}`, a key of
//!   another type): `500` (gRPC: `INTERNAL`, 13) with the error's text;
//!   the inner service is not called. A Redis outage is not an error:
//!   the limiter answers it with its panic limits.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tower_layer::Layer;
use tower_service::Service;

use crate::client::Limiter;
use crate::decision::Decision;
use crate::error::{Error, Result};
use crate::headers::{headers, problem};
use crate::keys::make_key;
use crate::lease::LeasedLimiter;
use crate::request::Call;
use crate::transport::Connection;

/// The body of a limited service's responses: the inner service's, or the
/// layer's own (a 429's problem, an error's text, an empty gRPC body).
pub type LimitedBody<B> = Either<B, Full<Bytes>>;

enum Decide<C> {
    PerRequest(Limiter<C>),
    Leased(LeasedLimiter<C>),
}

impl<C: Connection> Decide<C> {
    fn name(&self) -> &str {
        match self {
            Decide::PerRequest(l) => l.rule().name(),
            Decide::Leased(l) => l.policy().name(),
        }
    }

    async fn decide(&self, caller: &str, cost: u64) -> Result<Decision> {
        let key = make_key(caller, &[self.name()])?;
        match self {
            Decide::PerRequest(l) => l.limit(&key, Call::cost(cost)).await,
            Decide::Leased(l) => l.limit(&key, cost).await,
        }
    }
}

type KeyFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

/// What a layer and its services share.
struct Shared<C> {
    decide: Arc<Decide<C>>,
    key: Arc<KeyFn>,
    grpc: bool,
    cost: u64,
}

impl<C> Clone for Shared<C> {
    fn clone(&self) -> Self {
        Shared { decide: self.decide.clone(), key: self.key.clone(), grpc: self.grpc, cost: self.cost }
    }
}

/// A `tower::Layer` that limits every request it wraps (see the module
/// documentation). Cheap to clone: the limiter is shared.
pub struct RateLimitLayer<C> {
    sh: Shared<C>,
}

impl<C> Clone for RateLimitLayer<C> {
    fn clone(&self) -> Self {
        RateLimitLayer { sh: self.sh.clone() }
    }
}

impl<C: Connection> RateLimitLayer<C> {
    fn with(decide: Decide<C>, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        RateLimitLayer { sh: Shared { decide: Arc::new(decide), key: Arc::new(key), grpc: false, cost: 1 } }
    }

    /// Per-request mode: one [`Limiter`] decision (one bounded Redis call)
    /// per request. `key`: the caller of a request (its hash tag: no `{`
    /// or `}`), or `None` to let it through unlimited.
    pub fn new(limiter: Limiter<C>, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::with(Decide::PerRequest(limiter), key)
    }

    /// Leased mode: decisions from a [`LeasedLimiter`]'s local reservoir.
    pub fn leased(limiter: LeasedLimiter<C>, key: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        Self::with(Decide::Leased(limiter), key)
    }

    /// Answer denials and errors as gRPC statuses (for tonic) instead of
    /// HTTP 429 and 500.
    pub fn grpc(mut self) -> Self {
        self.sh.grpc = true;
        self
    }

    /// The units each request takes (default 1; 0 checks without taking).
    pub fn cost(mut self, cost: u64) -> Self {
        self.sh.cost = cost;
        self
    }

    /// On shutdown: a leased layer gives its reservoirs back
    /// ([`LeasedLimiter::close`]); the units given back (0 per request).
    pub async fn close(&self) -> Result<u64> {
        match &*self.sh.decide {
            Decide::PerRequest(_) => Ok(0),
            Decide::Leased(l) => l.close().await,
        }
    }
}

impl<S, C> Layer<S> for RateLimitLayer<C> {
    type Service = RateLimitService<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService { inner, sh: self.sh.clone() }
    }
}

/// The service [`RateLimitLayer`] wraps around another.
pub struct RateLimitService<S, C> {
    inner: S,
    sh: Shared<C>,
}

impl<S: Clone, C> Clone for RateLimitService<S, C> {
    fn clone(&self) -> Self {
        RateLimitService { inner: self.inner.clone(), sh: self.sh.clone() }
    }
}

impl<S, C, ReqB, ResB> Service<Request<ReqB>> for RateLimitService<S, C>
where
    S: Service<Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send,
    C: Connection,
    ReqB: Send + 'static,
{
    type Response = Response<LimitedBody<ResB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // the service that was polled ready answers this request; a clone
        // takes its place for the next
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let sh = self.sh.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let Some(caller) = (sh.key)(&parts) else {
                return inner.call(Request::from_parts(parts, body)).await.map(|r| r.map(Either::Left));
            };
            match sh.decide.decide(&caller, sh.cost).await {
                Ok(d) if d.allowed => {
                    let mut resp = inner.call(Request::from_parts(parts, body)).await?;
                    add_headers(resp.headers_mut(), &d);
                    Ok(resp.map(Either::Left))
                }
                Ok(d) => Ok(denied(&d, parts.uri.path(), sh.grpc)),
                Err(e) => Ok(failed(&e, sh.grpc)),
            }
        })
    }
}

fn add_headers(h: &mut HeaderMap, d: &Decision) {
    for (name, value) in headers(d) {
        // the names are constants and the values ASCII digits, quotes and
        // policy names (A-Z a-z 0-9 . _ -): both always valid
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value)) {
            h.append(n, v);
        }
    }
}

/// gRPC's status message: percent-encoded as the gRPC HTTP/2 protocol
/// asks (bytes outside 0x20..=0x7e, and '%').
fn grpc_message(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

fn grpc_status<B>(code: u16, message: &str) -> Response<LimitedBody<B>> {
    let mut r = Response::new(Either::Right(Full::default()));
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&grpc_message(message)) {
        h.insert("grpc-message", v);
    }
    r
}

/// gRPC's RESOURCE_EXHAUSTED and INTERNAL.
const GRPC_RESOURCE_EXHAUSTED: u16 = 8;
const GRPC_INTERNAL: u16 = 13;

fn denied<B>(d: &Decision, path: &str, grpc: bool) -> Response<LimitedBody<B>> {
    let p = problem(d, Some(path));
    let mut r = if grpc {
        grpc_status(GRPC_RESOURCE_EXHAUSTED, &p.detail)
    } else {
        let mut r = Response::new(Either::Right(Full::from(p.to_json())));
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        r
    };
    add_headers(r.headers_mut(), d);
    debug_assert!(d.retry_after_ms < 0 || r.headers().contains_key(RETRY_AFTER));
    r
}

fn failed<B>(e: &Error, grpc: bool) -> Response<LimitedBody<B>> {
    let text = format!("rate limit: {e}");
    if grpc {
        return grpc_status(GRPC_INTERNAL, &text);
    }
    let mut r = Response::new(Either::Right(Full::from(text)));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(grpc_message("Rate limit \"api\" exceeded; 5% é"), "Rate limit \"api\" exceeded; 5%25 %C3%A9");
    }
}
