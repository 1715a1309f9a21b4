//! A real oncekv cluster on loopback sockets (members can be stopped and restarted), and a
//! TCP proxy that can swallow replies, for the client's integration tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod proxy;

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use oncekv_server::{Member, Node, NodeConfig};

pub const LEADER_WAIT: Duration = Duration::from_secs(10);

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub configs: Vec<NodeConfig>,
    pub nodes: Vec<Option<Node>>,
}

impl TestCluster {
    /// Starts `n` members (heartbeat 50 ms, election timeout 500 ms); `tweak` adjusts every
    /// member's config (e.g. the replicated session TTL).
    pub async fn start(n: usize, tweak: impl Fn(&mut NodeConfig)) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let members: Vec<Member> = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| Member {
                name: format!("n{}", i + 1),
                peer_url: format!("http://127.0.0.1:{p}"),
                client_url: format!("http://127.0.0.1:{c}"),
            })
            .collect();
        let configs: Vec<NodeConfig> = ports
            .iter()
            .enumerate()
            .map(|(i, (c, p))| {
                let mut cfg = NodeConfig::new(
                    format!("n{}", i + 1),
                    dir.path().join(format!("n{}", i + 1)),
                    SocketAddr::from(([127, 0, 0, 1], *c)),
                    SocketAddr::from(([127, 0, 0, 1], *p)),
                    members.clone(),
                );
                cfg.heartbeat_ms = 50;
                cfg.election_timeout_ms = 500;
                cfg.request_timeout = Duration::from_secs(5);
                tweak(&mut cfg);
                cfg
            })
            .collect();
        let mut cluster = TestCluster {
            dir,
            configs,
            nodes: Vec::new(),
        };
        for i in 0..n {
            let node = Node::start(cluster.configs[i].clone()).await.unwrap();
            cluster.nodes.push(Some(node));
        }
        cluster
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.configs[i].client_addr)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.configs.len()).map(|i| self.endpoint(i)).collect()
    }

    pub fn node(&self, i: usize) -> &Node {
        self.nodes[i].as_ref().expect("member is running")
    }

    pub fn running(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    pub async fn stop(&mut self, i: usize) {
        if let Some(node) = self.nodes[i].take() {
            node.shutdown().await;
        }
    }

    pub async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "member {i} is still running");
        let node = Node::start(self.configs[i].clone()).await.unwrap();
        self.nodes[i] = Some(node);
    }

    /// Waits for a leader that every running member agrees on.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        let start = Instant::now();
        loop {
            let leaders: Vec<Option<u64>> = self.running().map(|(_, n)| n.core.leader()).collect();
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|l| l == &Some(*leader))
                && let Some((i, _)) = self.running().find(|(_, n)| n.core.id == *leader)
            {
                return i;
            }
            assert!(
                start.elapsed() < timeout,
                "no agreed leader within {timeout:?}: {leaders:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
