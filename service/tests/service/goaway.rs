//! `GRPC_MAX_CONNECTION_AGE` and `_GRACE`: a gRPC connection older than
//! the age gets GOAWAY (read here in the HTTP/2 frames the server sends),
//! the client opens a new one, and no request fails, those in flight on
//! the old connection included: every decision the service made was
//! answered (requests the client had queued for the closing connection, or
//! opened above the GOAWAY's last stream id, were not processed, and a
//! client sends them again, as Envoy and gRPC clients do).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::support::*;

const CONFIG: &str =
    "domain: age\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100000000}\n";

/// A client's TCP stream that reads the server's HTTP/2 frame headers as
/// they pass and raises `goaway` at the first GOAWAY frame (type 7).
struct Spy {
    tcp: tokio::net::TcpStream,
    /// The frame header being read (9 bytes), and how many are in.
    head: [u8; 9],
    have: usize,
    /// Payload bytes still to skip.
    skip: usize,
    goaway: Arc<AtomicBool>,
}

impl Spy {
    fn saw(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.head[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                self.have = 0;
                self.skip = usize::from(self.head[0]) << 16 | usize::from(self.head[1]) << 8 | usize::from(self.head[2]);
                if self.head[3] == 7 {
                    self.goaway.store(true, SeqCst);
                }
            }
        }
    }
}

impl tokio::io::AsyncRead for Spy {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let new = buf.filled()[before..].to_vec();
            self.saw(&new);
        }
        r
    }
}

impl tokio::io::AsyncWrite for Spy {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// Whether a client error is of a request the server never processed.
fn unprocessed(debug: &str) -> bool {
    debug.contains("hyper::Error(Canceled") || debug.contains("kind: GoAway(b\"\", NO_ERROR, Remote)")
}

/// One flag per connection a channel opened: whether it got GOAWAY.
type Conns = Arc<std::sync::Mutex<Vec<Arc<AtomicBool>>>>;

/// A channel to the gRPC port whose connections are [`Spy`]s.
async fn spied(grpc: u16) -> (tonic::transport::Channel, Conns) {
    let conns: Conns = Arc::default();
    let opened = conns.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let opened = opened.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", grpc)).await?;
                tcp.set_nodelay(true)?;
                let goaway = Arc::new(AtomicBool::new(false));
                opened.lock().unwrap().push(goaway.clone());
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Spy { tcp, head: [0; 9], have: 0, skip: 0, goaway }))
            }
        }))
        .await
        .unwrap();
    (channel, conns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_connection_gets_goaway_and_no_request_fails() {
    let e =
        Env::start("goaway", CONFIG, &[("GRPC_MAX_CONNECTION_AGE", "1s"), ("GRPC_MAX_CONNECTION_AGE_GRACE", "30s")]).await;
    let (channel, conns) = spied(e.grpc).await;
    let goaways = || conns.lock().unwrap().iter().filter(|g| g.load(SeqCst)).count();
    // requests in flight all along, on the one channel
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed, unsent) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut workers = Vec::new();
    for w in 0..8 {
        let mut c = RateLimitServiceClient::new(channel.clone());
        let (stop, ok, failed, unsent) = (stop.clone(), ok.clone(), failed.clone(), unsent.clone());
        workers.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            while !stop.load(SeqCst) {
                match c.should_rate_limit(req("age", vec![desc(&[("user", &format!("w{w}"))])])).await {
                    Ok(r) if r.get_ref().overall_code == OK => ok.fetch_add(1, SeqCst),
                    Ok(r) => panic!("{r:?}"),
                    // Not processed by the server, which a client sends again
                    // (Envoy and gRPC's transparent retry do; tonic does not):
                    // hyper's Canceled, a request queued for the closing
                    // connection and never written to it; h2's GoAway error, a
                    // stream opened above the GOAWAY's last stream id, which
                    // HTTP/2 says the server did not process (RFC 9113, 6.8).
                    // That none was decided is checked below against the
                    // service's own count.
                    Err(e) if unprocessed(&format!("{e:?}")) => unsent.fetch_add(1, SeqCst),
                    Err(e) => {
                        errors.push(e.to_string());
                        failed.fetch_add(1, SeqCst)
                    }
                };
            }
            errors
        }));
    }
    // two connections aged out (each 1 s old, then replaced); the bound is this machine's load
    let t0 = Instant::now();
    while (goaways() < 2 || conns.lock().unwrap().len() < 3) && failed.load(SeqCst) == 0 {
        assert!(t0.elapsed() < Duration::from_secs(120), "no GOAWAY on {} connection(s)", conns.lock().unwrap().len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, SeqCst);
    let mut errors = Vec::new();
    for w in workers {
        errors.extend(w.await.unwrap());
    }
    let mut decided = 0;
    e.svc.service.metrics().for_each_counter(|n, v| {
        if n == "ratelimit.service.rate_limit.age.user.total_hits" {
            decided = v;
        }
    });
    assert_eq!(failed.load(SeqCst), 0, "requests failed across GOAWAY: {errors:?}");
    // every request the service decided was answered: none lost in flight
    assert_eq!(decided, ok.load(SeqCst), "decisions made whose answer never came");
    let opened = conns.lock().unwrap().len();
    assert!(opened >= 3, "a new connection after each GOAWAY: {opened} opened");
    let (n, u) = (ok.load(SeqCst), unsent.load(SeqCst));
    println!(
        "{n} decisions over {opened} connections, {} GOAWAY, 0 failed, {u} not processed (a client sends them again)",
        goaways()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_still_open_after_the_grace_ends_with_its_connection() {
    // Redis stopped: a decision would wait for REDIS_TIMEOUT (60 s); the
    // connection's age (3 s: room for the first request on a loaded
    // machine, which must end before it) and grace (1 s) end it first
    let e = Env::start(
        "grace",
        CONFIG,
        &[("GRPC_MAX_CONNECTION_AGE", "3s"), ("GRPC_MAX_CONNECTION_AGE_GRACE", "1s"), ("REDIS_TIMEOUT", "60s")],
    )
    .await;
    let (channel, conns) = spied(e.grpc).await;
    let mut c = RateLimitServiceClient::new(channel);
    let one = || req("age", vec![desc(&[("user", "held")])]);
    assert_eq!(c.should_rate_limit(one()).await.unwrap().into_inner().overall_code, OK);
    let pid = e.redis.as_ref().unwrap().0.id();
    sig(pid, libc::SIGSTOP);
    let (r, took) = timed(&mut c, one()).await;
    sig(pid, libc::SIGCONT);
    let err = r.expect_err("a request held past the age and the grace");
    // the connection's end, not the service's answer to a slow Redis
    assert!(format!("{err:?}").contains("transport error"), "{err:?}");
    assert!(took < Duration::from_secs(60), "ended by REDIS_TIMEOUT, not the grace: {took:?}");
    assert!(conns.lock().unwrap()[0].load(SeqCst), "no GOAWAY before the connection was closed");
}
