//! The two gRPC servers of a node: clients (etcd API, Lock and Election + Session) and
//! peers (raft).

use std::sync::Arc;

use oncekv_proto::net::Conn;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Connected;

use crate::error::StartError;
use crate::etcd::{
    AuthService, ClusterService, ElectionService, KvService, LeaseService, LockService,
    MaintenanceService, SessionService, WatchService,
};
use crate::http::GrpcMetricsLayer;
use crate::pb::etcdserverpb::auth_server::AuthServer;
use crate::pb::etcdserverpb::cluster_server::ClusterServer;
use crate::pb::etcdserverpb::kv_server::KvServer;
use crate::pb::etcdserverpb::lease_server::LeaseServer;
use crate::pb::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::pb::etcdserverpb::watch_server::WatchServer;
use crate::pb::oncekv::raft_server::RaftServer;
use crate::pb::oncekv::session_server::SessionServer;
use crate::pb::v3electionpb::election_server::ElectionServer;
use crate::pb::v3lockpb::lock_server::LockServer;
use crate::request_path::NodeCore;

/// How many connections the kernel queues for a port before `accept`: etcd's (Go's)
/// figure. std's 128 overflows when many clients (re)connect at once (after a failover,
/// or at a start), and every overflow costs the client a SYN retry a second later. The
/// kernel caps it at `net.core.somaxconn`.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener on `addr` with `LISTEN_BACKLOG` (and `SO_REUSEADDR`, so that a restarted
/// member gets its port back while old connections linger in TIME_WAIT).
pub async fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepted connections with Nagle's algorithm off: tonic's own `tcp_nodelay` applies only
/// to listeners it binds itself, and a small response held back for a delayed ACK costs
/// tens of milliseconds per request.
pub fn incoming(
    listener: TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    use futures::StreamExt;
    TcpListenerStream::new(listener).map(|conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// The connections of every listener in `listeners`, as they come (etcd's
/// `--listen-client-urls` and `--listen-peer-urls` may each name several).
pub fn incoming_all(
    listeners: Vec<TcpListener>,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> + Send + 'static {
    futures::stream::select_all(listeners.into_iter().map(|l| Box::pin(incoming(l))))
}

/// Unix socket listeners at `paths` (etcd's `unix://` peer URLs). A socket file left by
/// a member that stopped is replaced; any other file at a path is refused.
pub fn bind_unix_all(paths: &[std::path::PathBuf]) -> Result<Vec<UnixListener>, StartError> {
    use std::os::unix::fs::FileTypeExt;
    paths
        .iter()
        .map(|path| {
            let listen_err = |source| StartError::ListenUnix {
                path: path.clone(),
                source,
            };
            match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_socket() => {
                    std::fs::remove_file(path).map_err(listen_err)?
                }
                _ => {}
            }
            UnixListener::bind(path).map_err(listen_err)
        })
        .collect()
}

/// Every connection of `tcp` and `unix`, as one stream of [`Conn`]s.
pub fn incoming_with_unix(
    tcp: Vec<TcpListener>,
    unix: Vec<UnixListener>,
) -> impl futures::Stream<Item = std::io::Result<Conn>> + Send + 'static {
    use futures::StreamExt;
    let tcp = incoming_all(tcp).map(|c| c.map(Conn::new));
    let unix = futures::stream::select_all(unix.into_iter().map(|l| {
        Box::pin(futures::stream::unfold(l, |l| async move {
            let accepted = l.accept().await.map(|(stream, _)| Conn::new(stream));
            Some((accepted, l))
        }))
    }));
    futures::stream::select(tcp, unix)
}

/// A client connection as the gRPC server reads it.
pub type ClientConn = oncekv_proto::authority::SchemeTolerant<
    crate::tls::MaybeTls<crate::conn_guard::Guarded<tokio::net::TcpStream>>,
>;

/// The client port's connections: [`incoming`], bounded by
/// `conn_guard::guard`, through TLS when `tls` is given, and each read
/// through [`SchemeTolerant`](oncekv_proto::authority::SchemeTolerant) (on the decrypted bytes)
/// so that etcdctl 3.4's `--cluster` requests (a URL as the HTTP/2 authority) are served
/// rather than reset.
///
/// Every listener in `listeners` (etcd's `--listen-client-urls` may name several) serves
/// the same API; `max_connections` bounds them together.
pub fn client_incoming(
    listeners: Vec<TcpListener>,
    max_connections: usize,
    tls: Option<Arc<crate::tls::ServerTls>>,
) -> impl futures::Stream<Item = std::io::Result<ClientConn>> + Send + 'static {
    use futures::StreamExt;
    let guarded = crate::conn_guard::guard(incoming_all(listeners), max_connections, "client");
    crate::tls::accept(guarded, tls)
        .map(|conn| conn.map(oncekv_proto::authority::SchemeTolerant::new))
}

/// Serves the etcd-compatible API and the Session service on `incoming` connections
/// until `stop`.
pub async fn serve_clients<S, IO>(core: Arc<NodeCore>, incoming: S, stop: watch::Receiver<bool>)
where
    S: futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let limit = core.config().max_request_bytes + crate::config::GRPC_OVERHEAD_BYTES;
    let mut grpc = tonic::service::Routes::builder();
    grpc.add_service(
        KvServer::new(KvService { node: core.clone() }).max_decoding_message_size(limit),
    )
    .add_service(
        LeaseServer::new(LeaseService {
            node: core.clone(),
            stop: stop.clone(),
        })
        .max_decoding_message_size(limit),
    )
    .add_service(
        WatchServer::new(WatchService {
            node: core.clone(),
            stop: stop.clone(),
        })
        .max_decoding_message_size(limit),
    )
    .add_service(ClusterServer::new(ClusterService { node: core.clone() }))
    .add_service(MaintenanceServer::new(MaintenanceService {
        node: core.clone(),
    }))
    .add_service(
        LockServer::new(LockService { node: core.clone() }).max_decoding_message_size(limit),
    )
    .add_service(
        ElectionServer::new(ElectionService {
            node: core.clone(),
            stop: stop.clone(),
        })
        .max_decoding_message_size(limit),
    )
    .add_service(SessionServer::new(SessionService { node: core.clone() }))
    .add_service(AuthServer::new(AuthService { node: core.clone() }))
    .add_service(health_service(stop.clone()));
    // HTTP/1.1 too, for curl and Prometheus on the HTTP routes; gRPC clients speak HTTP/2
    // with prior knowledge and are told apart by the connection preface.
    let routes = grpc
        .routes()
        .into_axum_router()
        .merge(crate::http::routes(core.clone()))
        .merge(crate::gateway::routes(core.clone(), stop.clone()))
        .fallback(crate::http::not_found);
    let result = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(core.config().grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(core.config().grpc_keepalive_timeout))
        .max_concurrent_streams(Some(core.config().max_concurrent_streams))
        .accept_http1(true)
        .layer(GrpcMetricsLayer {
            metrics: core.node_metrics().clone(),
        })
        .add_routes(routes.into())
        .serve_with_incoming_shutdown(incoming, crate::runtime::stopped(stop))
        .await;
    if let Err(e) = result {
        tracing::error!("client server stopped: {e}");
    }
}

/// gRPC's health service (`grpc.health.v1.Health`), as etcd registers it: the server as a
/// whole (service name "") is SERVING while it serves; other names are unknown
/// (`NOT_FOUND`). At `stop` it turns NOT_SERVING and is then cleared, which ends every
/// `Watch` of it (after it has told the watcher), so that no health watch holds the
/// graceful shutdown open.
fn health_service(
    stop: watch::Receiver<bool>,
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (mut reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        crate::runtime::stopped(stop).await;
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        reporter.clear_service_status("").await;
    });
    service
}

/// Serves raft traffic from peers on `incoming` connections until `stop`.
pub async fn serve_peers<S, IO>(core: Arc<NodeCore>, incoming: S, stop: watch::Receiver<bool>)
where
    S: futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
{
    let (gate_core, split_core) = (core.clone(), core.clone());
    let limit = crate::network::peer_message_limit(core.config());
    let service = RaftServer::new(crate::peer_listener::PeerService { core })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    let (interval, timeout) = (
        gate_core.config().grpc_keepalive_interval,
        gate_core.config().grpc_keepalive_timeout,
    );
    let result = tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(interval))
        .http2_keepalive_timeout(Some(timeout))
        .layer(crate::peer_gate::PeerGate { core: gate_core })
        .add_service(service)
        .serve_with_incoming_shutdown(
            crate::peer_listener::split(incoming, split_core, stop.clone()),
            crate::runtime::stopped(stop),
        )
        .await;
    if let Err(e) = result {
        tracing::error!("peer server stopped: {e}");
    }
}
