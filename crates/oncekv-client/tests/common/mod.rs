//! A real oncekv cluster on loopback sockets (members can be stopped and restarted), and a
//! TCP proxy that can swallow replies, for the client's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use oncekv_server::fault_proxy::FaultProxy;
use oncekv_server::local_cluster::LocalCluster;
use oncekv_server::{Node, NodeConfig};

pub const LEADER_WAIT: Duration = Duration::from_secs(10);

/// A [`LocalCluster`] in a temporary directory with test-friendly timings, whose waits
/// fail the test instead of returning.
pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub inner: LocalCluster,
}

impl Deref for TestCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl DerefMut for TestCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

impl TestCluster {
    /// Starts `n` members (heartbeat 50 ms, election timeout 500 ms); `tweak` adjusts every
    /// member's config (e.g. the replicated session TTL).
    pub async fn start(n: usize, tweak: impl Fn(&mut NodeConfig)) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let inner = LocalCluster::start(n, dir.path(), |c| {
            LocalCluster::fast_timings(c);
            tweak(c)
        })
        .await
        .unwrap();
        TestCluster { dir, inner }
    }

    pub fn node(&self, i: usize) -> &Node {
        self.inner.get(i).expect("member is running")
    }

    pub async fn restart(&mut self, i: usize) {
        assert!(self.inner.get(i).is_none(), "member {i} is still running");
        self.inner.restart(i).await.unwrap();
    }

    /// Waits for a leader that every running member agrees on.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        self.inner
            .wait_leader(timeout)
            .await
            .expect("no agreed leader in time")
    }

    /// How many sessions member `i` holds.
    pub fn sessions(&self, i: usize) -> usize {
        self.node(i).core.applied.read().sm.sessions().len()
    }

    /// Whether member `i` holds session `client_id`.
    pub fn has_session(&self, i: usize, client_id: u64) -> bool {
        self.node(i)
            .core
            .applied
            .read()
            .sm
            .sessions()
            .get(client_id)
            .is_some()
    }

    /// Waits until `cond` holds, failing the test after `timeout`.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&TestCluster) -> bool,
    ) {
        let start = Instant::now();
        while !cond(self) {
            assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

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
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
