//! `REDIS_TLS` against real TLS servers: a throwaway CA, server and client
//! certificates made with the openssl command (Debian's `openssl` package)
//! in the test's temp dir; the server on a TLS port only (`--port 0
//! --tls-port`). A decision over TLS, mutual TLS with a client certificate,
//! a wrong CA refused at start, the files checked at startup, hostname
//! verification skipped (the chain still checked), and (on the first
//! server line) a TLS cluster and a TLS Sentinel.
//!
//! A server built without TLS (some wheels) is skipped, naming why;
//! `RL_SERVICE_TLS_REQUIRED=1` (`make test-service` sets it for Debian's
//! redis-server 7.0) fails instead.

use crate::support::*;
use rustls::pki_types::pem::PemObject;

/// The certificates of one test, in a temp dir removed when dropped:
/// `ca` (the CA), `server` (signed by it, for `localhost` and 127.0.0.1),
/// `elsewhere` (signed by it, for `elsewhere.example` only), `client`
/// (signed by it), `other-ca` (a CA that signed none of them).
pub(crate) struct Pki {
    dir: PathBuf,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (Debian's openssl package; make deps installs it)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

impl Pki {
    pub(crate) fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("rl-svc-tls-{}-{}", std::process::id(), port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pki = Pki { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.leaf("server", "subjectAltName=DNS:localhost,IP:127.0.0.1");
        pki.leaf("elsewhere", "subjectAltName=DNS:elsewhere.example");
        pki.leaf("client", "subjectAltName=DNS:rl-client");
        pki.leaf_of("other-ca", "stranger", "subjectAltName=DNS:rl-client");
        pki
    }

    fn ca(&self, name: &str) {
        let (key, crt, subj) = (format!("{name}.key"), format!("{name}.crt"), format!("/CN=rl-test-{name}"));
        let mut args = vec!["req", "-x509", "-new", "-nodes"];
        args.extend(EC);
        args.extend(["-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subj]);
        openssl(&self.dir, &args);
    }

    /// A certificate signed by `ca`, for servers and clients alike (Redis
    /// presents its own to the nodes it connects to).
    fn leaf(&self, name: &str, san: &str) {
        self.leaf_of("ca", name, san)
    }

    /// A certificate signed by the CA `ca`.
    fn leaf_of(&self, ca: &str, name: &str, san: &str) {
        let (key, csr, crt, ext) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.ext"));
        let subj = format!("/CN=rl-test-{name}");
        std::fs::write(
            self.dir.join(&ext),
            format!("{san}\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=critical,CA:FALSE\n"),
        )
        .unwrap();
        let mut args = vec!["req", "-new", "-nodes"];
        args.extend(EC);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(&self.dir, &args);
        openssl(
            &self.dir,
            &["x509", "-req", "-in", &csr, "-CA", &format!("{ca}.crt"), "-CAkey", &format!("{ca}.key")]
                .into_iter()
                .chain(["-CAcreateserial", "-days", "2", "-out", &crt, "-extfile", &ext])
                .collect::<Vec<_>>(),
        );
    }

    pub(crate) fn path(&self, file: &str) -> String {
        self.dir.join(file).to_string_lossy().into_owned()
    }

    /// A sync TLS connection to a server or a sentinel (with the client certificate).
    fn connect(&self, port: u16) -> redis::RedisResult<redis::Connection> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(self.dir.join("client.crt")).unwrap(),
                client_key: std::fs::read(self.dir.join("client.key")).unwrap(),
            }),
            root_cert: Some(std::fs::read(self.dir.join("ca.crt")).unwrap()),
        };
        let c = redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}/"), certs)?;
        c.get_connection_with_timeout(Duration::from_secs(2))
    }
}

/// `make test-service` sets it for Debian's redis-server, built with TLS.
fn tls_required() -> bool {
    std::env::var("RL_SERVICE_TLS_REQUIRED").is_ok_and(|v| v == "1")
}

/// REDIS_SERVER with the module on `port`, TLS only, with the certificate
/// `cert`; clients must present a certificate when `auth_clients`. `None`
/// (printed) when the server is not built with TLS.
fn tls_server(pki: &Pki, cert: &str, auth_clients: bool, port: u16, extra: &[&str]) -> Option<Proc> {
    let bin = common::server_bin();
    let log = pki.dir.join(format!("server-{port}.log"));
    let mut child = Command::new(&bin)
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .args(["--tls-cert-file", &pki.path(&format!("{cert}.crt")), "--tls-key-file", &pki.path(&format!("{cert}.key"))])
        .args(["--tls-ca-cert-file", &pki.path("ca.crt"), "--tls-auth-clients", if auth_clients { "yes" } else { "no" }])
        .args(common::module_args())
        .arg("--dir")
        .arg(&pki.dir)
        .arg("--logfile")
        .arg(&log)
        .args(extra)
        .current_dir(&pki.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start REDIS_SERVER");
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut out = String::new();
            let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut out);
            out += &std::fs::read_to_string(&log).unwrap_or_default();
            // a build without TLS says so (Redis 7.2+, Valkey: "Missing
            // implement of connection type tls", "Failed finding TLS
            // support"); anything else is a failure
            let no_tls =
                ["Missing implement of connection type tls", "Failed finding TLS support"].iter().any(|m| out.contains(m));
            if no_tls && !tls_required() {
                let why: Vec<&str> = out.lines().filter(|l| l.contains("TLS") || l.contains(" tls")).collect();
                println!("skipped: {bin} is not built with TLS ({st}): {}", why.join(" / "));
                return None;
            }
            panic!("{bin} with --tls-port exited ({st}): {out}");
        }
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(Proc(child));
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{bin} did not listen on TLS port {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `user` is limited to 2 an hour: OK, OK, then OVER_LIMIT (in one hour:
/// made again on another user if an hour began during the calls). Returns
/// the user.
async fn two_then_over(e: &Env) -> String {
    let (who, got) = burst_in_one_window(HOUR_MS, 1_000, |attempt| async move {
        let who = format!("tls{attempt}");
        let user = || req("basic", vec![desc(&[("user", &who)])]);
        let mut got = Vec::new();
        for _ in 0..3 {
            let a = e.ask(user()).await;
            got.push((a.overall_code, rem(&a.statuses[0])));
        }
        (who, got)
    })
    .await;
    assert_eq!(got, [(OK, (OK, 1)), (OK, (OK, 0)), (OVER, (OVER, 0))]);
    who
}

/// The error of a start that must fail.
async fn refused(port: u16, vars: &[(&str, &str)]) -> String {
    match Env::try_serve("tls-refused", &[CONFIG], vars, port, None).await {
        Ok(_) => panic!("started with {vars:?}"),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_over_tls() {
    let pki = Pki::new();
    let p = port();
    let Some(srv) = tls_server(&pki, "server", false, p, &[]) else { return };
    // the port speaks TLS only: a plain connection gets no answer
    let plain = redis::Client::open(format!("redis://127.0.0.1:{p}/"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain.is_err(), "{plain:?}");
    let ca = pki.path("ca.crt");
    let e = Env::serve("tls", &[CONFIG], &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)], p, Some(srv)).await;
    let who = two_then_over(&e).await;
    // the count is on the server, seen through a TLS connection of our own
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("*user_{who}_*")).query(&mut pki.connect(p).unwrap()).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_a_client_certificate() {
    let pki = Pki::new();
    let p = port();
    let Some(srv) = tls_server(&pki, "server", true, p, &[]) else { return };
    let (ca, cert, key) = (pki.path("ca.crt"), pki.path("client.crt"), pki.path("client.key"));
    // without a client certificate the server ends the handshake: no start
    let err = refused(p, &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)]).await;
    assert!(err.contains("connecting to Redis over TLS"), "{err}");
    println!("no client certificate: {err}");
    let vars =
        [("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca), ("REDIS_TLS_CLIENT_CERT", &cert), ("REDIS_TLS_CLIENT_KEY", &key)];
    let e = Env::serve("mtls", &[CONFIG], &vars, p, Some(srv)).await;
    two_then_over(&e).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_at_start() {
    let pki = Pki::new();
    let p = port();
    let Some(_srv) = tls_server(&pki, "server", false, p, &[]) else { return };
    // a CA that did not sign the server's certificate
    let other = pki.path("other-ca.crt");
    let err = refused(p, &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &other)]).await;
    assert!(err.contains("connecting to Redis over TLS") && err.contains("UnknownIssuer"), "{err}");
    println!("wrong CA: {err}");
    // no CA: the system's roots do not know the test CA either
    let err = refused(p, &[("REDIS_TLS", "true")]).await;
    assert!(err.contains("connecting to Redis over TLS") && err.contains("UnknownIssuer"), "{err}");
    // REDIS_TLS unset: plain Redis protocol to a TLS port fails too (the flag is what makes it work)
    let err = refused(p, &[("REDIS_TLS_CACERT", &pki.path("ca.crt"))]).await;
    assert!(err.contains("connecting to Redis") && !err.contains("over TLS"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_hostname_verification_still_checks_the_chain() {
    let pki = Pki::new();
    let p = port();
    // a certificate for elsewhere.example, reached as 127.0.0.1
    let Some(srv) = tls_server(&pki, "elsewhere", false, p, &[]) else { return };
    let (ca, other) = (pki.path("ca.crt"), pki.path("other-ca.crt"));
    let err = refused(p, &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)]).await;
    assert!(err.contains("connecting to Redis over TLS") && err.contains("not valid for name"), "{err}");
    println!("host name not in the certificate: {err}");
    let skip = ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true");
    let err = refused(p, &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &other), skip]).await;
    assert!(err.contains("UnknownIssuer"), "the chain is still verified: {err}");
    let e = Env::serve("tls-skip", &[CONFIG], &[("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca), skip], p, Some(srv)).await;
    two_then_over(&e).await;
}

/// What the binary refuses before connecting (exit 2): the files, and the
/// combinations not built. No server needed.
#[test]
fn the_tls_settings_are_checked_at_startup() {
    let pki = Pki::new();
    let vars = |extra: &[(&str, &str)]| -> HashMap<String, String> {
        [("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "127.0.0.1:6379"), ("REDIS_TLS", "true")]
            .iter()
            .chain(extra)
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let err = |extra: &[(&str, &str)]| Settings::from_map(&vars(extra)).unwrap_err();
    let (ca, cert, key, server_key) =
        (pki.path("ca.crt"), pki.path("client.crt"), pki.path("client.key"), pki.path("server.key"));
    let missing = pki.path("missing.crt");
    let not_pem = pki.path("client.ext");
    let s = Settings::from_map(&vars(&[
        ("REDIS_TLS_CACERT", &ca),
        ("REDIS_TLS_CLIENT_CERT", &cert),
        ("REDIS_TLS_CLIENT_KEY", &key),
    ]))
    .unwrap();
    let tls = s.redis_tls.as_ref().unwrap();
    assert!(tls.ca.is_some() && tls.client.is_some() && !tls.skip_hostname_verification);
    assert!(!format!("{s:?}").contains("PRIVATE KEY"), "the key is not in the settings' Debug");
    assert!(matches!(s.redis_info().addr(), redis::ConnectionAddr::TcpTls { .. }));
    for (extra, want) in [
        (vec![("REDIS_TLS_CACERT", missing.as_str())], "REDIS_TLS_CACERT"),
        (vec![("REDIS_TLS_CACERT", pki.dir.to_str().unwrap())], "cannot read it"),
        (vec![("REDIS_TLS_CACERT", not_pem.as_str())], "no PEM certificate"),
        (vec![("REDIS_TLS_CLIENT_CERT", cert.as_str())], "set both or neither"),
        (vec![("REDIS_TLS_CLIENT_KEY", key.as_str())], "set both or neither"),
        (vec![("REDIS_TLS_CLIENT_CERT", cert.as_str()), ("REDIS_TLS_CLIENT_KEY", cert.as_str())], "no PEM private key"),
        (vec![("REDIS_TLS_CLIENT_CERT", key.as_str()), ("REDIS_TLS_CLIENT_KEY", key.as_str())], "no PEM certificate"),
        // the key of another certificate
        (
            vec![("REDIS_TLS_CLIENT_CERT", cert.as_str()), ("REDIS_TLS_CLIENT_KEY", server_key.as_str())],
            "REDIS_TLS_CLIENT_KEY",
        ),
        (vec![("REDIS_TLS", "yes")], "REDIS_TLS"),
        (vec![("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "maybe")], "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"),
        (vec![("REDIS_SOCKET_TYPE", "unix")], "REDIS_SOCKET_TYPE=tcp"),
        (
            vec![
                ("REDIS_TYPE", "sentinel"),
                ("REDIS_URL", "m,127.0.0.1:26379"),
                ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "1"),
            ],
            "not supported with REDIS_TYPE=sentinel",
        ),
        (vec![("REDIS_PERSECOND_TLS", "yes")], "REDIS_PERSECOND_TLS"),
    ] {
        let e = err(&extra);
        assert!(e.contains(want), "{extra:?}: {e}");
        println!("{extra:?}: {e}");
    }
    // REDIS_TLS false: the companions are not read, as envoyproxy/ratelimit
    let s = Settings::from_map(&vars(&[("REDIS_TLS", "false"), ("REDIS_TLS_CACERT", &missing)])).unwrap();
    assert!(s.redis_tls.is_none());
    // cluster: rediss:// seed nodes
    let s =
        Settings::from_map(&vars(&[("REDIS_TYPE", "cluster"), ("REDIS_URL", "10.0.0.1:7000"), ("REDIS_TLS_CACERT", &ca)]))
            .unwrap();
    assert_eq!(s.redis_urls(), vec!["rediss://10.0.0.1:7000/"]);
}

/// A free port whose cluster bus port (+10000) exists.
fn cluster_port() -> u16 {
    loop {
        let p = port();
        if p <= 55_535 {
            return p;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls() {
    if !topology() {
        return;
    }
    let pki = Pki::new();
    let ports: Vec<u16> = (0..3).map(|_| cluster_port()).collect();
    let mut nodes = Vec::new();
    for p in &ports {
        let conf = format!("nodes-{p}.conf");
        let extra = ["--cluster-enabled", "yes", "--cluster-config-file", &conf, "--cluster-node-timeout", "5000"];
        let Some(n) = tls_server(&pki, "server", false, *p, &[&extra[..], &["--tls-cluster", "yes"]].concat()) else {
            return;
        };
        nodes.push(n);
    }
    let mut create =
        vec!["--tls".to_owned(), "--cacert".to_owned(), pki.path("ca.crt"), "--cluster".into(), "create".into()];
    create.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(str::to_owned));
    common::cli(&create);
    common::wait_until(60, "the TLS cluster's state ok", || async {
        ports.iter().all(|p| {
            let info: String =
                pki.connect(*p).and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c)).unwrap_or_default();
            info.contains("cluster_state:ok")
        })
    })
    .await;
    let url = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let ca = pki.path("ca.crt");
    let vars = [("REDIS_TYPE", "cluster"), ("REDIS_URL", url.as_str()), ("REDIS_TLS", "true"), ("REDIS_TLS_CACERT", &ca)];
    let e = Env::serve("tls-cluster", &[CONFIG], &vars, 0, None).await;
    two_then_over(&e).await;
    drop(e);
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_mutual_tls() {
    if !topology() {
        return;
    }
    let pki = Pki::new();
    let p = port();
    let Some(primary) = tls_server(&pki, "server", true, p, &[]) else { return };
    // one sentinel on a TLS port, reaching the primary over TLS with its certificate
    let sp = port();
    let conf = pki.dir.join(format!("sentinel-{sp}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {sp}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {dir}/sentinel-{sp}.log\n\
             tls-cert-file {crt}\ntls-key-file {key}\ntls-ca-cert-file {ca}\ntls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {p} 1\nsentinel down-after-milliseconds mymaster 1000\n",
            dir = pki.dir.display(),
            crt = pki.path("server.crt"),
            key = pki.path("server.key"),
            ca = pki.path("ca.crt"),
        ),
    )
    .unwrap();
    let sentinel = Proc(
        Command::new(common::server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .current_dir(&pki.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a sentinel"),
    );
    common::wait_until(30, "the sentinel sees the primary over TLS", || async {
        let flags = pki
            .connect(sp)
            .and_then(|mut c| redis::cmd("SENTINEL").arg("MASTER").arg("mymaster").query::<Vec<String>>(&mut c))
            .unwrap_or_default();
        flags.chunks(2).any(|kv| kv.len() == 2 && kv[0] == "flags" && kv[1] == "master")
    })
    .await;
    let url = format!("mymaster,127.0.0.1:{sp}");
    let (ca, cert, key) = (pki.path("ca.crt"), pki.path("client.crt"), pki.path("client.key"));
    let vars = [
        ("REDIS_TYPE", "sentinel"),
        ("REDIS_URL", url.as_str()),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CACERT", &ca),
        ("REDIS_TLS_CLIENT_CERT", &cert),
        ("REDIS_TLS_CLIENT_KEY", &key),
    ];
    let e = Env::serve("tls-sentinel", &[CONFIG], &vars, 0, None).await;
    two_then_over(&e).await;
    // counted on the primary the sentinel names
    let keys: Vec<String> = redis::cmd("KEYS").arg("*user_tls*").query(&mut pki.connect(p).unwrap()).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    drop(e);
    drop((sentinel, primary));
}

// ---- the gRPC listener's own TLS (GRPC_SERVER_USE_TLS) and GRPC_UDS ----

/// A gRPC client over TLS to the service on `port` (the server named
/// `localhost`, verified against `ca.crt`), with the client certificate
/// `client` when given; the error of the handshake or of the call.
async fn ask_tls(pki: &Pki, port: u16, client: Option<&str>) -> Result<RateLimitResponse, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(pki.path("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let b = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut cfg = match client {
        None => b.with_no_client_auth(),
        Some(name) => {
            let chain = rustls::pki_types::CertificateDer::pem_file_iter(pki.path(&format!("{name}.crt")))
                .unwrap()
                .map(|c| c.unwrap())
                .collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_file(pki.path(&format!("{name}.key"))).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let r = RateLimitServiceClient::new(channel).should_rate_limit(one_user()).await;
    r.map(|r| r.into_inner()).map_err(|e| format!("call: {e:?}"))
}

fn one_user() -> RateLimitRequest {
    req("basic", vec![desc(&[("user", "grpc-tls")])])
}

/// The service with plain Redis and the gRPC listener's TLS of `vars`.
async fn grpc_tls_service(name: &str, vars: &[(&str, &str)]) -> Env {
    Env::start(name, CONFIG, vars).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_and_plaintext_refused() {
    let pki = Pki::new();
    let (cert, key) = (pki.path("server.crt"), pki.path("server.key"));
    let vars = [("GRPC_SERVER_USE_TLS", "true"), ("GRPC_SERVER_TLS_CERT", &*cert), ("GRPC_SERVER_TLS_KEY", &*key)];
    let e = grpc_tls_service("grpc-tls", &vars).await;
    let a = ask_tls(&pki, e.grpc, None).await.unwrap();
    assert_eq!(a.overall_code, OK);
    // a plaintext HTTP/2 client is not answered
    let plain = match RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", e.grpc)).await {
        Ok(mut c) => c.should_rate_limit(one_user()).await.map(|_| ()).map_err(|e| e.to_string()),
        Err(err) => Err(err.to_string()),
    };
    assert!(plain.is_err(), "a plaintext call was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_mutual_tls_refuses_no_certificate_a_stranger_and_a_wrong_san() {
    let pki = Pki::new();
    let (cert, key, ca) = (pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt"));
    let mut vars = vec![
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", &*cert),
        ("GRPC_SERVER_TLS_KEY", &*key),
        ("GRPC_CLIENT_TLS_CACERT", &*ca),
        ("GRPC_CLIENT_TLS_SAN", "rl-client"),
        // Envoy Gateway's name: checked to be a CA file, without effect (as upstream)
        ("GRPC_SERVER_TLS_CA_CERT", &*ca),
    ];
    let e = grpc_tls_service("grpc-mtls", &vars).await;
    assert_eq!(ask_tls(&pki, e.grpc, Some("client")).await.unwrap().overall_code, OK);
    let none = ask_tls(&pki, e.grpc, None).await;
    assert!(none.is_err(), "no client certificate was answered");
    let stranger = ask_tls(&pki, e.grpc, Some("stranger")).await;
    assert!(stranger.is_err(), "a certificate of another CA was answered");
    // the right CA, another name: the server's own certificate (localhost)
    let wrong_san = ask_tls(&pki, e.grpc, Some("server")).await;
    assert!(wrong_san.is_err(), "a certificate without GRPC_CLIENT_TLS_SAN was answered");
    drop(e);
    // without GRPC_CLIENT_TLS_SAN the same CA's server certificate is a client certificate
    vars.retain(|(k, _)| *k != "GRPC_CLIENT_TLS_SAN");
    let e = grpc_tls_service("grpc-mtls-nosan", &vars).await;
    assert_eq!(ask_tls(&pki, e.grpc, Some("server")).await.unwrap().overall_code, OK);
    assert!(ask_tls(&pki, e.grpc, None).await.is_err(), "no client certificate was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_tls_settings_checked_at_start() {
    let pki = Pki::new();
    let (cert, key, ca) = (pki.path("server.crt"), pki.path("server.key"), pki.path("ca.crt"));
    let p = port();
    let on = ("GRPC_SERVER_USE_TLS", "true");
    let err = refused(p, &[on, ("GRPC_SERVER_TLS_CERT", &cert)]).await;
    assert!(err.contains("GRPC_SERVER_TLS_KEY"), "{err}");
    let err = refused(p, &[on, ("GRPC_SERVER_TLS_CERT", &cert), ("GRPC_SERVER_TLS_KEY", &ca)]).await;
    assert!(err.contains("GRPC_SERVER_TLS_KEY"), "{err}");
    let err =
        refused(p, &[on, ("GRPC_SERVER_TLS_CERT", &cert), ("GRPC_SERVER_TLS_KEY", &key), ("GRPC_CLIENT_TLS_SAN", "x")])
            .await;
    assert!(err.contains("GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT"), "{err}");
    let err = refused(p, &[("GRPC_SERVER_TLS_CERT", &cert)]).await;
    assert!(err.contains("GRPC_SERVER_USE_TLS is not true"), "{err}");
    let missing = pki.path("missing.crt");
    let err = refused(
        p,
        &[on, ("GRPC_SERVER_TLS_CERT", &cert), ("GRPC_SERVER_TLS_KEY", &key), ("GRPC_CLIENT_TLS_CACERT", &missing)],
    )
    .await;
    assert!(err.contains("GRPC_CLIENT_TLS_CACERT"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_on_a_unix_socket() {
    let pki = Pki::new();
    let sock = pki.path("grpc.sock");
    let e = grpc_tls_service("grpc-uds", &[("GRPC_UDS", &sock)]).await;
    let path = sock.clone();
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .unwrap();
    let a = RateLimitServiceClient::new(channel).should_rate_limit(one_user()).await.unwrap().into_inner();
    assert_eq!(a.overall_code, OK);
    // no TCP gRPC listener was bound
    assert_eq!(e.grpc, 0);
}
