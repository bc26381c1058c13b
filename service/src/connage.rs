//! `GRPC_MAX_CONNECTION_AGE_GRACE`: a gRPC connection closed once it is
//! `GRPC_MAX_CONNECTION_AGE` + the grace old, whatever is still open on it.
//!
//! tonic's own `max_connection_age_grace` (0.14) is not grpc-go's: with a
//! grace set, its timer sleeps the age, then the grace, then drops the
//! connection, and never sends the GOAWAY in between; every request in
//! flight at that moment fails (measured: 7 of 667,000 over 31 s, one per
//! worker, and no GOAWAY frame at all). So the server is given the age
//! alone (GOAWAY, then the requests in flight are answered) and each
//! accepted connection is wrapped in an [`Aged`], whose reads fail once the
//! age and the grace have passed: the connection then ends, as grpc-go's
//! `MaxConnectionAgeGrace` ends it.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// A connection that ends (its reads fail) at a deadline.
pub struct Aged<T> {
    io: T,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<T> Aged<T> {
    /// `io`, ending `limit` from now (`None`: never).
    pub fn new(io: T, limit: Option<std::time::Duration>) -> Aged<T> {
        let deadline =
            limit.and_then(|l| tokio::time::Instant::now().checked_add(l)).map(|d| Box::pin(tokio::time::sleep_until(d)));
        Aged { io, deadline }
    }
}

/// The accepted connections of `incoming`, each [`Aged`] `limit`.
pub fn aged<T, S>(
    incoming: S,
    limit: Option<std::time::Duration>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Aged<T>>>
where
    S: tokio_stream::Stream<Item = std::io::Result<T>>,
{
    tokio_stream::StreamExt::map(incoming, move |r| r.map(|io| Aged::new(io, limit)))
}

impl<T: Connected> Connected for Aged<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Aged<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if let Some(d) = self.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                let e = "GRPC_MAX_CONNECTION_AGE + GRPC_MAX_CONNECTION_AGE_GRACE reached";
                return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, e)));
            }
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Aged<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
