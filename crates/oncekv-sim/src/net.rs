//! turmoil's simulated TCP behind oncekv's network seam
//! ([`oncekv_server::transport`]): accepted connections for a node's servers, and a
//! connector for the channels of nodes and clients.

use futures::StreamExt;
use oncekv_server::transport::{Conn, Connector, Incoming};
use tonic::transport::Uri;

/// Port of every node's client (etcd API) server.
pub const CLIENT_PORT: u16 = 2379;
/// Port of every node's peer (raft) server.
pub const PEER_PORT: u16 = 2380;

/// Binds `port` on the current simulated host and yields its accepted connections.
pub async fn listen(port: u16) -> std::io::Result<Incoming> {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let accepted = futures::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(stream, _)| Conn::new(stream));
        Some((next, listener))
    });
    Ok(accepted.boxed())
}

/// Dials `http://host:port` URLs over the simulated network.
pub fn connector() -> Connector {
    Connector::new(|uri: Uri| async move {
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(80);
        turmoil::net::TcpStream::connect((host.as_str(), port))
            .await
            .map(Conn::new)
    })
}
