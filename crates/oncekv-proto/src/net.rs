//! The connection seam client and server share: what a connection runs on, and how a
//! channel dials one.
//!
//! Production uses tokio's TCP. A deterministic simulation passes streams of simulated
//! connections to the server and a [`Connector`] that dials simulated hosts to its
//! channels; everything above the byte stream (HTTP/2, gRPC, raft) is the same code.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::future::BoxFuture;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tonic::transport::{Channel, Endpoint, Uri};

/// A byte stream a connection can run on.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

/// One connection of any [`Io`] type.
pub struct Conn(pub Box<dyn Io>);

impl Conn {
    pub fn new(io: impl Io) -> Conn {
        Conn(Box::new(io))
    }
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Conn")
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// Accepted connections for one of a node's servers.
pub type Incoming = Pin<Box<dyn Stream<Item = io::Result<Conn>> + Send>>;

type Dial = dyn Fn(Uri) -> BoxFuture<'static, io::Result<Conn>> + Send + Sync;

/// A check of a server's certificate (DER) after the TLS handshake: `Err` says why it is
/// refused.
pub type CertCheck = Arc<dyn Fn(&[u8]) -> Result<(), String> + Send + Sync>;

/// Opens a connection to a URL's host and port.
#[derive(Clone)]
pub struct Connector(Arc<Dial>);

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Connector")
    }
}

impl Connector {
    pub fn new<F, Fut>(dial: F) -> Connector
    where
        F: Fn(Uri) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<Conn>> + Send + 'static,
    {
        Connector(Arc::new(move |uri| Box::pin(dial(uri))))
    }

    /// Dials TCP (Nagle off) and then TLS with `config`, checking the server's
    /// certificate against the URL's host. The channel's URL stays `http://`: TLS is this
    /// connector's business, not tonic's.
    pub fn tls(config: Arc<rustls::ClientConfig>) -> Connector {
        Connector::tls_checked(config, None)
    }

    /// [`tls`](Self::tls), and then `check` on the server's certificate (DER): an `Err`
    /// refuses the connection with its reason (a member's `--peer-cert-allowed-cn`,
    /// applied to the members it dials as to those that dial it).
    ///
    /// With TLS 1.3 the server judges the client's certificate after the client's side of
    /// the handshake ends; when `check` refuses, a refusal the server sends meanwhile
    /// (its alert) is reported instead, as the first reason.
    pub fn tls_checked(config: Arc<rustls::ClientConfig>, check: Option<CertCheck>) -> Connector {
        let tls = tokio_rustls::TlsConnector::from(config);
        Connector::new(move |uri: Uri| {
            let (tls, check) = (tls.clone(), check.clone());
            async move {
                let host = uri.host().ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} has no host"))
                })?;
                let port = uri.port_u16().unwrap_or(443);
                let name = crate::tls::server_name(host)?;
                let addr = (host.trim_start_matches('[').trim_end_matches(']'), port);
                let tcp = tokio::net::TcpStream::connect(addr).await?;
                tcp.set_nodelay(true)?;
                let mut stream = tls.connect(name, tcp).await?;
                let refused = match (&check, stream.get_ref().1.peer_certificates()) {
                    (Some(check), Some([cert, ..])) => check(cert.as_ref()).err(),
                    (Some(_), _) => Some("the server presented no certificate".to_string()),
                    (None, _) => None,
                };
                if let Some(why) = refused {
                    use tokio::io::AsyncReadExt;
                    let mut byte = [0u8; 1];
                    let wait = std::time::Duration::from_millis(200);
                    if let Ok(Err(e)) = tokio::time::timeout(wait, stream.read(&mut byte)).await {
                        return Err(e);
                    }
                    return Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
                }
                Ok(Conn::new(stream))
            }
        })
    }

    /// Dials the unix socket a `unix://` URL names: etcd's form, whose host and port
    /// together are the socket's path (`unix://etcd.unix:1` is `./etcd.unix:1`), or an
    /// absolute path (`unix:///run/oncekv.sock`).
    pub fn unix() -> Connector {
        Connector::new(|uri: Uri| async move {
            let path = match uri.authority().map(|a| a.as_str()) {
                Some(a) if !a.is_empty() => a.to_string(),
                _ if uri.path().len() > 1 => uri.path().to_string(),
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{uri} names no socket"),
                    ));
                }
            };
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok(Conn::new(stream))
        })
    }

    /// Opens one connection to `uri`'s host and port (for protocols other than gRPC on
    /// the same network: the peers' framed raft connections).
    pub fn dial(&self, uri: Uri) -> BoxFuture<'static, io::Result<Conn>> {
        (self.0)(uri)
    }

    /// A lazily connecting channel to `endpoint` that dials through this connector.
    /// Must be called inside a tokio runtime.
    pub fn channel(&self, endpoint: &Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(DialService(self.0.clone()))
    }
}

/// [`Connector`] as the `tower::Service<Uri>` tonic wants.
struct DialService(Arc<Dial>);

impl tonic::codegen::Service<Uri> for DialService {
    type Response = TokioIo<Conn>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<TokioIo<Conn>>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dial = (self.0)(uri);
        Box::pin(async move { dial.await.map(TokioIo::new) })
    }
}
