//! Server TLS and mutual TLS on the gRPC listener, as envoyproxy/ratelimit
//! reads them: `GRPC_SERVER_USE_TLS` with `GRPC_SERVER_TLS_CERT` and
//! `GRPC_SERVER_TLS_KEY`; `GRPC_CLIENT_TLS_CACERT` requires and verifies a
//! client certificate against that CA; `GRPC_CLIENT_TLS_SAN` also requires
//! the client certificate to name it (a DNS name of its subject alternative
//! names). Every file is read and checked at startup; a handshake that
//! fails closes that connection only.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The gRPC listener's TLS: a rustls server configuration checked at startup.
#[derive(Clone)]
pub struct GrpcTls {
    /// The configuration every handshake uses (ALPN `h2`).
    pub config: Arc<rustls::ServerConfig>,
    /// `GRPC_CLIENT_TLS_CACERT` was set: client certificates are required.
    pub mutual: bool,
}

impl PartialEq for GrpcTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
    }
}

impl std::fmt::Debug for GrpcTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpcTls").field("mutual", &self.mutual).finish_non_exhaustive()
    }
}

/// The `GRPC_*` TLS variables as set (empty: unset).
pub struct GrpcTlsVars<'a> {
    /// `GRPC_SERVER_USE_TLS`, already parsed.
    pub use_tls: bool,
    /// `GRPC_SERVER_TLS_CERT`.
    pub cert: &'a str,
    /// `GRPC_SERVER_TLS_KEY`.
    pub key: &'a str,
    /// `GRPC_CLIENT_TLS_CACERT`.
    pub client_ca: &'a str,
    /// `GRPC_CLIENT_TLS_SAN`.
    pub client_san: &'a str,
    /// `GRPC_SERVER_TLS_CA_CERT` (Envoy Gateway's; not upstream's).
    pub server_ca: &'a str,
}

fn read(name: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{name}={path:?}: {e}"))
}

/// The PEM certificates of the file a setting names (errors name the setting).
pub fn certs(name: &str, path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(name, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{name}={path:?}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{name}={path:?}: no PEM certificate"));
    }
    Ok(certs)
}

/// The PEM private key of the file a setting names (PKCS#8, PKCS#1 or SEC1).
pub fn key(name: &str, path: &str) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(&read(name, path)?)
        .map_err(|e| format!("{name}={path:?}: no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"))
}

/// A setting's name and the path it holds.
pub type Setting<'a> = (&'a str, &'a str);

/// A TLS client's configuration checked at startup (the xDS client's, the
/// OTLP exporter's): the handshake's configuration and the name the
/// server's certificate must have.
#[derive(Clone)]
pub struct ClientTls {
    /// rustls's client configuration.
    pub config: Arc<rustls::ClientConfig>,
    /// The name the server's certificate must have.
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.server_name == other.server_name
    }
}

impl ClientTls {
    /// Trusting only the certificates of `ca` (the system's roots are not
    /// read), presenting `client`'s certificate and key when given, ALPN
    /// `h2` when `h2`.
    pub fn new(
        ca: Setting<'_>,
        client: Option<(Setting<'_>, Setting<'_>)>,
        h2: bool,
        server_name: ServerName<'static>,
    ) -> Result<ClientTls, String> {
        let (ca_name, ca_path) = ca;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_name, ca_path)? {
            roots.add(c).map_err(|e| format!("{ca_name}={ca_path:?}: {e}"))?;
        }
        let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .map_err(|e| format!("{ca_name}: {e}"))?
            .with_root_certificates(roots);
        let mut config = match client {
            None => b.with_no_client_auth(),
            Some(((cn, cert), (kn, k))) => b
                .with_client_auth_cert(certs(cn, cert)?, key(kn, k)?)
                .map_err(|e| format!("{cn}={cert:?} with {kn}={k:?}: {e}"))?,
        };
        if h2 {
            config.alpn_protocols = vec![b"h2".to_vec()];
        }
        Ok(ClientTls { config: Arc::new(config), server_name })
    }
}

impl GrpcTls {
    /// The TLS of the `GRPC_*` variables; `None` when `GRPC_SERVER_USE_TLS`
    /// is false (the other variables must then be unset: set, they would
    /// ask for something this configuration does not do).
    pub fn from_vars(v: &GrpcTlsVars<'_>) -> Result<Option<GrpcTls>, String> {
        if !v.use_tls {
            for (name, val) in [
                ("GRPC_SERVER_TLS_CERT", v.cert),
                ("GRPC_SERVER_TLS_KEY", v.key),
                ("GRPC_CLIENT_TLS_CACERT", v.client_ca),
                ("GRPC_CLIENT_TLS_SAN", v.client_san),
                ("GRPC_SERVER_TLS_CA_CERT", v.server_ca),
            ] {
                if !val.is_empty() {
                    return Err(format!("{name} is set but GRPC_SERVER_USE_TLS is not true"));
                }
            }
            return Ok(None);
        }
        if v.cert.is_empty() || v.key.is_empty() {
            return Err("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY".into());
        }
        let chain = certs("GRPC_SERVER_TLS_CERT", v.cert)?;
        let key = key("GRPC_SERVER_TLS_KEY", v.key)?;
        // Envoy Gateway sets it; envoyproxy/ratelimit does not read it, so
        // it asks for nothing there: checked to be a CA file, without effect
        if !v.server_ca.is_empty() {
            certs("GRPC_SERVER_TLS_CA_CERT", v.server_ca)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(rustls::DEFAULT_VERSIONS)
            .map_err(|e| format!("GRPC_SERVER_USE_TLS: {e}"))?;
        let mutual = !v.client_ca.is_empty();
        let builder = if mutual {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs("GRPC_CLIENT_TLS_CACERT", v.client_ca)? {
                roots.add(c).map_err(|e| format!("GRPC_CLIENT_TLS_CACERT={:?}: {e}", v.client_ca))?;
            }
            let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("GRPC_CLIENT_TLS_CACERT={:?}: {e}", v.client_ca))?;
            let san = match v.client_san {
                "" => None,
                s => Some(ServerName::try_from(s.to_owned()).map_err(|e| format!("GRPC_CLIENT_TLS_SAN={s:?}: {e}"))?),
            };
            builder.with_client_cert_verifier(Arc::new(SanVerifier { inner, san }))
        } else {
            if !v.client_san.is_empty() {
                return Err("GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT (the CA of the client certificates)".into());
            }
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("GRPC_SERVER_TLS_CERT={:?} with GRPC_SERVER_TLS_KEY={:?}: {e}", v.cert, v.key))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Some(GrpcTls { config: Arc::new(config), mutual }))
    }
}

/// The chain checked by webpki against `GRPC_CLIENT_TLS_CACERT`, then the
/// leaf's names against `GRPC_CLIENT_TLS_SAN`.
#[derive(Debug)]
struct SanVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    san: Option<ServerName<'static>>,
}

impl ClientCertVerifier for SanVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let ok = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        if let Some(san) = &self.san {
            let cert = webpki::EndEntityCert::try_from(end_entity)
                .map_err(|e| rustls::Error::General(format!("client certificate: {e}")))?;
            cert.verify_is_valid_for_subject_name(san).map_err(|_| {
                rustls::Error::General(format!("client certificate does not name GRPC_CLIENT_TLS_SAN {:?}", san.to_str()))
            })?;
        }
        Ok(ok)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS connection accepted on the gRPC listener.
pub struct TlsConn(pub tokio_rustls::server::TlsStream<TcpStream>);

impl Connected for TlsConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The TLS connections of `listener`, handshaken each in its own task (a
/// slow or failed handshake holds up no other), as tonic's incoming stream.
pub fn incoming(
    listener: tokio::net::TcpListener,
    tls: &GrpcTls,
) -> tokio_stream::wrappers::ReceiverStream<Result<TlsConn, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    tokio::spawn(async move {
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(c) => c,
                // out of descriptors and the like: this connection is lost, not the listener
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            if tx.is_closed() {
                return;
            }
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                if let Ok(Ok(s)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    let _ = tx.send(Ok(TlsConn(s))).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
