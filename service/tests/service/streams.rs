//! The gRPC listener under a burst: the streams of a connection capped,
//! a burst on a stalled connection answered in full, cancelled requests
//! sparing the others.

use crate::support::*;

/// The gRPC listener caps the streams of a connection: its first SETTINGS
/// frame says `server::MAX_CONCURRENT_STREAMS` (parameter 3). tonic's
/// default is no cap, with which h2 closed every connection of a burst
/// beyond the service's CPU (the constant says why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_caps_the_streams_of_a_connection() {
    let e = Env::start("streams", CONFIG, &[]).await;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", e.grpc)).await.unwrap();
    // the client's preface, then an empty SETTINGS frame
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").await.unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!((head[3], head[4]), (4, 0), "the server's first frame is its SETTINGS");
    let mut body = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    s.read_exact(&mut body).await.unwrap();
    let settings: HashMap<u16, u32> = body
        .chunks_exact(6)
        .map(|p| (u16::from_be_bytes([p[0], p[1]]), u32::from_be_bytes([p[2], p[3], p[4], p[5]])))
        .collect();
    assert_eq!(settings.get(&3), Some(&server::MAX_CONCURRENT_STREAMS), "SETTINGS_MAX_CONCURRENT_STREAMS: {settings:?}");
}

/// The server-side socket of the connection to `port`: its receive queue
/// in bytes (/proc/net/tcp), or None before the connection is there.
fn rx_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let local_port = u16::from_str_radix(f[1].rsplit(':').next()?, 16).ok()?;
        // 01: ESTABLISHED (the listener is 0A)
        (local_port == port && f[3] == "01").then(|| u64::from_str_radix(f[4].rsplit(':').next().unwrap(), 16).unwrap())
    })
}

/// Until the client has sent what it can to the stalled service on `port`:
/// the service's receive queue holds bytes and stays the same 20 polls.
fn wait_sent(port: u16, what: &str) {
    let (mut last, mut same) = (0, 0);
    wait_for(what, Duration::from_secs(20), || {
        let q = rx_queue(port).unwrap_or(0);
        same = if q > 0 && q == last { same + 1 } else { 0 };
        last = q;
        same >= 20
    });
}

/// A service that cannot run, as in a CPU stall: the service's runtime
/// `srt`, its client on a runtime of its own (`crt`), connected with one
/// decision made; both of `srt`'s workers held until `go` is passed.
struct Stalled {
    /// the service's runtime: held, not read
    _srt: tokio::runtime::Runtime,
    crt: tokio::runtime::Runtime,
    e: Option<Env>,
    c: Grpc,
    go: std::sync::Arc<std::sync::Barrier>,
}

type Call = tokio::task::JoinHandle<Result<i32, tonic::Status>>;

impl Stalled {
    fn new(name: &str) -> Stalled {
        let rt = |workers| tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
        let (srt, crt) = (rt(2), rt(1));
        let e = srt.block_on(Env::start(name, CONFIG, &[]));
        let grpc = e.grpc;
        let c =
            crt.block_on(async move { RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}")).await.unwrap() });
        let first = crt.block_on(c.clone().should_rate_limit(Stalled::site())).unwrap().into_inner();
        assert_eq!(rem(&first.statuses[0]), (OK, 99));
        let (held, go) = (std::sync::Arc::new(std::sync::Barrier::new(3)), std::sync::Arc::new(std::sync::Barrier::new(3)));
        for _ in 0..2 {
            let (h, g) = (held.clone(), go.clone());
            srt.spawn(async move {
                h.wait();
                g.wait();
            });
        }
        held.wait();
        Stalled { _srt: srt, crt, e: Some(e), c, go }
    }

    fn site() -> RateLimitRequest {
        req("basic", vec![desc(&[("site", "")])])
    }

    /// `n` concurrent calls on the one connection.
    fn calls(&self, n: usize) -> Vec<Call> {
        let call =
            |mut c: Grpc| async move { c.should_rate_limit(Stalled::site()).await.map(|a| a.into_inner().overall_code) };
        (0..n).map(|_| self.crt.spawn(call(self.c.clone()))).collect()
    }

    fn port(&self) -> u16 {
        self.e.as_ref().unwrap().grpc
    }

    /// The service runs again; the answers of `calls`, none of which may
    /// have failed.
    fn resume(&mut self, calls: Vec<Call>) -> Vec<i32> {
        self.go.wait();
        let n = calls.len();
        let answers = self.crt.block_on(async move {
            let mut answers = Vec::with_capacity(n);
            for c in calls {
                answers.push(c.await.unwrap());
            }
            answers
        });
        let failed: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert!(failed.is_empty(), "{} of {n} failed, the first: {:?}", failed.len(), failed.first());
        answers.into_iter().flatten().collect()
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        // the service's task aborted before its runtime (a field) goes
        drop(self.e.take());
    }
}

/// A burst on one connection while the service cannot run is answered in
/// full once it runs again: every request decided, none lost to a closed
/// connection (without `MAX_CONCURRENT_STREAMS`, 6,000 of 6,000 failed),
/// and the limit's count exact.
#[test]
fn a_burst_on_one_stalled_connection_is_answered_in_full() {
    in_one_window_sync(HOUR_MS, || {
        const N: usize = 6000;
        let mut st = Stalled::new("burst");
        let calls = st.calls(N);
        wait_sent(st.port(), "the burst in the service's receive queue");
        let codes = st.resume(calls);
        let ok = codes.iter().filter(|&&c| c == OK).count();
        assert_eq!((ok, N - ok), (99, N - 99), "the 100/hour limit: 99 granted after the first call");
    });
}

/// Requests the client gives up on while the service cannot run (Envoy's
/// timeout cancels them: RST_STREAM) do not take the others on the
/// connection down with them once it runs again (without
/// `MAX_PENDING_RESETS`, 300 of 300 failed).
#[test]
fn cancelled_requests_of_a_stall_spare_the_others() {
    let mut st = Stalled::new("cancel");
    let kept = st.calls(300);
    let cancelled = st.calls(200);
    wait_sent(st.port(), "the requests in the service's receive queue");
    for c in &cancelled {
        c.abort();
    }
    wait_sent(st.port(), "the resets in the service's receive queue");
    let codes = st.resume(kept);
    assert_eq!(codes.len(), 300);
}
