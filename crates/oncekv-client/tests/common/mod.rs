//! A real oncekv cluster on loopback sockets (members can be stopped and restarted), and a
//! TCP proxy that can swallow replies, for the client's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use oncekv_testkit::fault_proxy::FaultProxy;

pub const LEADER_WAIT: Duration = Duration::from_secs(10);

pub use oncekv_testkit::local_cluster::TempCluster as TestCluster;

/// The project's fault proxy in front of one member, as the tests use it: requests pass,
/// replies can be swallowed (the request still runs on the server).
pub struct Proxy(pub FaultProxy);

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        Proxy(
            FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 0)), target)
                .await
                .unwrap(),
        )
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.0.addr())
    }

    /// While on, every reply is dropped (and its connection reset).
    pub fn swallow_replies(&self, on: bool) {
        self.0.set_drop_replies(if on { 1.0 } else { 0.0 });
    }
}

/// A loopback port nobody listens on (bound and released; good enough for "dead").
pub fn free_port() -> u16 {
    oncekv_testkit::free_port().unwrap()
}
