//! A real cluster on loopback sockets for integration tests: members can be stopped and
//! restarted from their data directories.
#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use oncekv_server::pb::etcdserverpb::kv_client::KvClient;
use oncekv_server::pb::etcdserverpb::{PutRequest, RangeRequest};
use oncekv_server::{Member, Node, NodeConfig};
use tonic::transport::Channel;

pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub configs: Vec<NodeConfig>,
    pub nodes: Vec<Option<Node>>,
}

impl TestCluster {
    /// Starts `n` members with fast elections; `tweak` adjusts every member's config.
    /// Every listener is bound (port 0) before any member starts, so no other process
    /// can take a port between choosing and binding it.
    pub async fn start(n: usize, tweak: impl Fn(&mut NodeConfig)) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push((bind().await.unwrap(), bind().await.unwrap()));
        }
        let addrs: Vec<(SocketAddr, SocketAddr)> = listeners
            .iter()
            .map(|(c, p)| (c.local_addr().unwrap(), p.local_addr().unwrap()))
            .collect();
        let members: Vec<Member> = addrs
            .iter()
            .enumerate()
            .map(|(i, (c, p))| Member {
                name: format!("n{}", i + 1),
                peer_url: format!("http://{p}"),
                client_url: format!("http://{c}"),
            })
            .collect();
        let configs: Vec<NodeConfig> = addrs
            .iter()
            .enumerate()
            .map(|(i, (c, p))| {
                let name = format!("n{}", i + 1);
                let mut cfg =
                    NodeConfig::new(&name, dir.path().join(&name), *c, *p, members.clone());
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
        for (i, (client, peer)) in listeners.into_iter().enumerate() {
            let node = Node::start_with_listeners(cluster.configs[i].clone(), client, peer)
                .await
                .unwrap();
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

    /// Waits for a leader among the running members that they all agree on.
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

    /// Waits until every running member has applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) {
        let start = Instant::now();
        loop {
            let applied: Vec<u64> = self
                .running()
                .map(|(_, n)| n.core.applied.read().sm.applied_index())
                .collect();
            if applied.iter().all(|a| *a >= index) {
                return;
            }
            assert!(
                start.elapsed() < timeout,
                "not applied to {index} within {timeout:?}: {applied:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn kv(&self, i: usize) -> KvClient<Channel> {
        KvClient::connect(self.endpoint(i)).await.unwrap()
    }
}

pub async fn put(kv: &mut KvClient<Channel>, key: &str, value: &str) -> Result<i64, tonic::Status> {
    let resp = kv
        .put(PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await?;
    Ok(resp.into_inner().header.map_or(0, |h| h.revision))
}

/// A linearizable get: `(value, version)` or `None` if the key does not exist.
pub async fn get(
    kv: &mut KvClient<Channel>,
    key: &str,
) -> Result<Option<(String, i64)>, tonic::Status> {
    let resp = kv
        .range(RangeRequest {
            key: key.as_bytes().to_vec().into(),
            ..Default::default()
        })
        .await?;
    Ok(resp
        .into_inner()
        .kvs
        .first()
        .map(|kv| (String::from_utf8_lossy(&kv.value).into_owned(), kv.version)))
}
