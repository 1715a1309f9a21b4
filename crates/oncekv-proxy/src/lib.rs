//! `oncekv grpc-proxy`: etcd's whole v3 API for clients that cannot change, with every
//! write they make relayed to the cluster exactly once.
//!
//! An etcd client (etcdctl, clientv3, python-etcd3, jetcd, ...) points at the proxy as
//! it would at etcd. The proxy is an oncekv client toward the cluster: each write (put,
//! delete, a txn that writes, compaction, lease grant and revoke and keep-alive, lock,
//! unlock, campaign, proclaim, resign) goes out under a session with a sequence number of
//! its own and is retried under that number through lost replies, leader changes and a
//! member's death, so the cluster applies it once. What this covers, and what not:
//!
//! - **Covered**: the leg from the proxy to the cluster. A reply lost on the network, a
//!   leader that crashed after applying but before answering, a member that died: the
//!   proxy retries, the cluster answers the retry with the saved result.
//! - **Not covered**: the leg from the application to the proxy, a plain etcd call. If
//!   the application gives up on the proxy and sends the write again, that is a second
//!   write. Run the proxy beside the application (loopback or a unix socket), where that
//!   leg does not lose replies. When the proxy itself cannot learn an outcome within its
//!   retry budget it answers etcd's "etcdserver: request timed out", as etcd does.
//!
//! # Layers
//!
//! Dependencies run downward only:
//! 1. **The cluster side** ([`upstream`], counting what it does in [`metrics`]): one [`oncekv_client::Client`] per downstream
//!    auth token (the caller's rights, never the proxy's), every relayed call in a task of
//!    its own within an in-flight bound.
//! 2. **Sharing** ([`watch::Hub`], the lease renewals in [`lease`]): coalesced watches
//!    and keep-alives, as etcd's proxy coalesces them.
//! 3. **The etcd services** ([`kv`], [`lease`], [`watch`], [`concurrency`],
//!    [`passthrough`]), [`namespace`] for `--namespace`, and the HTTP routes
//!    ([`http`]).
//! 4. **Serving** (this file): listeners, TLS toward downstream clients, shutdown.

mod concurrency;
mod http;
mod kv;
mod lease;
mod metrics;
mod namespace;
mod passthrough;
mod relay;
mod upstream;
mod watch;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use oncekv_client::ClientConfig;
use oncekv_proto::authority::SchemeTolerant;
use oncekv_proto::etcdserverpb::auth_server::AuthServer;
use oncekv_proto::etcdserverpb::cluster_server::ClusterServer;
use oncekv_proto::etcdserverpb::kv_server::KvServer;
use oncekv_proto::etcdserverpb::lease_server::LeaseServer;
use oncekv_proto::etcdserverpb::maintenance_server::MaintenanceServer;
use oncekv_proto::etcdserverpb::watch_server::WatchServer;
use oncekv_proto::net::Conn;
use oncekv_proto::v3electionpb::election_server::ElectionServer;
use oncekv_proto::v3lockpb::lock_server::LockServer;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::namespace::Namespace;
use crate::upstream::Upstream;

/// How a proxy runs. [`ProxyConfig::new`] gives etcd's defaults.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// The cluster's client URLs (`--endpoints`).
    pub endpoints: Vec<String>,
    /// How the proxy talks to the cluster: timeouts, retry budget, TLS (`--cacert`,
    /// `--cert`, `--key`). Its `credentials` stay `None`: callers bring their own tokens.
    pub client: ClientConfig,
    /// `--namespace`: a prefix every key lives under on the cluster.
    pub namespace: String,
    /// `--advertise-client-url`: the proxy's own URL, which MemberList then reports.
    pub advertise_client_url: Option<String>,
    /// TLS toward downstream clients (`--cert-file`, `--key-file`, `--trusted-ca-file`).
    pub tls: Option<ServerTls>,
    /// Calls relayed to the cluster at once; more wait.
    pub max_in_flight: usize,
    /// The largest request accepted from a client (the cluster refuses anything above its
    /// own `--max-request-bytes` with etcd's error; this bounds what the proxy buffers).
    pub max_request_bytes: usize,
    /// Requests one downstream connection may have open at once.
    pub max_concurrent_streams: u32,
}

/// The proxy's server certificate, and the CA its clients' certificates must chain to
/// when it asks for them.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Require and check client certificates against this CA (etcd's
    /// `--trusted-ca-file` on the proxy).
    pub trusted_ca_file: Option<PathBuf>,
}

impl ProxyConfig {
    pub fn new(endpoints: Vec<String>) -> ProxyConfig {
        ProxyConfig {
            endpoints,
            client: ClientConfig::default(),
            namespace: String::new(),
            advertise_client_url: None,
            tls: None,
            max_in_flight: 10_000,
            // etcd's default --max-request-bytes, and room for gRPC's own framing.
            max_request_bytes: 3 * 1024 * 1024,
            max_concurrent_streams: 1000,
        }
    }
}

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("oncekv grpc-proxy: {0}")]
    Client(#[from] oncekv_client::Error),
    #[error("oncekv grpc-proxy: TLS: {0}")]
    Tls(String),
    #[error("oncekv grpc-proxy: {0}")]
    Serve(String),
}

/// A proxy ready to serve: its cluster side is set up.
#[derive(Debug)]
pub struct Proxy {
    config: ProxyConfig,
    upstream: Arc<Upstream>,
    hub: Arc<watch::Hub>,
}

impl Proxy {
    /// Sets up the cluster side. Connects to nothing yet (the first request does).
    pub fn new(config: ProxyConfig) -> Result<Proxy, ProxyError> {
        let metrics = metrics::Metrics::new();
        let mut client = config.client.clone();
        client.credentials = None;
        let upstream = Upstream::new(
            config.endpoints.clone(),
            client,
            config.max_in_flight,
            metrics.clone(),
        )?;
        Ok(Proxy {
            hub: watch::Hub::new(metrics),
            config,
            upstream,
        })
    }

    /// Serves the HTTP routes alone (`/metrics`, `/health`) on `listener`, in the
    /// background (`--metrics-addr`).
    pub fn spawn_http(&self, listener: TcpListener) {
        let routes = tonic::service::Routes::from(http::routes(self.upstream.clone()));
        tokio::spawn(async move {
            let served = tonic::transport::Server::builder()
                .accept_http1(true)
                .add_routes(routes)
                .serve_with_incoming(accept(listener.into(), None))
                .await;
            if let Err(e) = served {
                tracing::error!("oncekv grpc-proxy: the metrics server stopped: {e}");
            }
        });
    }

    /// Serves etcd's API (and `/metrics`, `/health`) on `listener` until `shutdown`
    /// resolves, then closes the proxy's sessions on the cluster.
    pub async fn serve(
        self,
        listener: impl Into<Listener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ProxyError> {
        let up = self.upstream.clone();
        let limit = self.config.max_request_bytes;
        let ns = Namespace::new(&self.config.namespace);
        let mut grpc = tonic::service::Routes::builder();
        grpc.add_service(
            KvServer::new(kv::KvProxy {
                up: up.clone(),
                ns: ns.clone(),
            })
            .max_decoding_message_size(limit),
        )
        .add_service(
            LeaseServer::new(lease::LeaseProxy::new(up.clone())).max_decoding_message_size(limit),
        )
        .add_service(
            WatchServer::new(watch::WatchProxy {
                up: up.clone(),
                ns,
                hub: self.hub.clone(),
            })
            .max_decoding_message_size(limit),
        )
        .add_service(
            LockServer::new(concurrency::LockProxy { up: up.clone() })
                .max_decoding_message_size(limit),
        )
        .add_service(
            ElectionServer::new(concurrency::ElectionProxy { up: up.clone() })
                .max_decoding_message_size(limit),
        )
        .add_service(ClusterServer::new(passthrough::ClusterProxy {
            up: up.clone(),
            advertise: self.config.advertise_client_url.clone(),
        }))
        .add_service(MaintenanceServer::new(passthrough::MaintenanceProxy {
            up: up.clone(),
        }))
        .add_service(AuthServer::new(passthrough::AuthProxy { up: up.clone() }));
        let routes = grpc
            .routes()
            .into_axum_router()
            .merge(http::routes(up.clone()));
        let tls = match &self.config.tls {
            Some(t) => Some(tls_acceptor(t)?),
            None => None,
        };
        let incoming = accept(listener.into(), tls);
        let result = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(Duration::from_secs(10)))
            .http2_keepalive_timeout(Some(Duration::from_secs(20)))
            .max_concurrent_streams(Some(self.config.max_concurrent_streams))
            .accept_http1(true)
            .add_routes(routes.into())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await;
        up.close_all().await;
        result.map_err(|e| ProxyError::Serve(e.to_string()))
    }
}

/// Where the proxy accepts clients: a TCP address, or a unix socket (for an application
/// on the same host, the hop that nothing on the network can break).
#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Unix(tokio::net::UnixListener),
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Listener {
        Listener::Tcp(l)
    }
}

impl From<tokio::net::UnixListener> for Listener {
    fn from(l: tokio::net::UnixListener) -> Listener {
        Listener::Unix(l)
    }
}

impl Listener {
    async fn accept(&self) -> std::io::Result<(Conn, String)> {
        match self {
            Listener::Tcp(l) => {
                let (tcp, peer) = l.accept().await?;
                let _ = tcp.set_nodelay(true);
                Ok((Conn::new(tcp), peer.to_string()))
            }
            Listener::Unix(l) => {
                let (unix, _) = l.accept().await?;
                Ok((Conn::new(unix), "a unix socket client".into()))
            }
        }
    }
}

/// Accepted connections, through TLS when configured. A handshake runs in a task of its
/// own, so a client that connects and says nothing holds up no one else. Every connection
/// takes etcdctl 3.4's URL-shaped `:authority` ([`SchemeTolerant`]), as a member does.
fn accept(
    listener: Listener,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (conn, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!("oncekv grpc-proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let tx = tx.clone();
            match tls.clone() {
                None => {
                    if tx
                        .send(Ok(Conn::new(SchemeTolerant::new(conn))))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                Some(acceptor) => {
                    tokio::spawn(async move {
                        let handshake = acceptor.accept(conn);
                        match tokio::time::timeout(Duration::from_secs(10), handshake).await {
                            Ok(Ok(stream)) => {
                                let _ = tx.send(Ok(Conn::new(SchemeTolerant::new(stream)))).await;
                            }
                            Ok(Err(e)) => {
                                tracing::info!(
                                    "oncekv grpc-proxy: TLS handshake from {peer} failed: {e}"
                                )
                            }
                            Err(_) => {
                                tracing::info!(
                                    "oncekv grpc-proxy: TLS handshake from {peer} timed out"
                                )
                            }
                        }
                    });
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

fn tls_acceptor(t: &ServerTls) -> Result<tokio_rustls::TlsAcceptor, ProxyError> {
    use oncekv_proto::tls::{load_certs, load_key, load_roots, provider};
    let err = |e: &dyn std::fmt::Display| ProxyError::Tls(e.to_string());
    let certs = load_certs(&t.cert_file).map_err(|e| err(&e))?;
    let key = load_key(&t.key_file).map_err(|e| err(&e))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(&e))?;
    let builder = match &t.trusted_ca_file {
        Some(ca) => {
            let roots = load_roots(ca).map_err(|e| err(&e))?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| err(&e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| err(&e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
