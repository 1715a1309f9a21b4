//! A whole cluster in one process on loopback sockets: what `oncekv demo`, the
//! integration tests and the client library's tests run against. Members can be stopped
//! and restarted from their data directories.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use oncekv_server::config::ClusterState;
use oncekv_server::error::StartError;
use oncekv_server::types::Member;
use oncekv_server::{Node, NodeConfig};

/// Members named `n1..nN`, each with its own data directory under one root.
#[derive(Debug)]
pub struct LocalCluster {
    pub configs: Vec<NodeConfig>,
    pub nodes: Vec<Option<Node>>,
}

impl LocalCluster {
    /// Starts `n` members under `root` on fresh loopback ports. Every listener is bound
    /// before any member starts, so no other process can take a port in between.
    /// `tweak` adjusts each member's config (timeouts, snapshot count, settings).
    pub async fn start(
        n: usize,
        root: &Path,
        tweak: impl Fn(&mut NodeConfig),
    ) -> Result<LocalCluster, StartError> {
        let mut listeners = Vec::new();
        for _ in 0..n {
            listeners.push((bind_any().await?, bind_any().await?));
        }
        let addrs: Vec<(SocketAddr, SocketAddr)> = listeners
            .iter()
            .map(|(c, p)| Ok((local_addr(c)?, local_addr(p)?)))
            .collect::<Result<_, StartError>>()?;
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
            .zip(&members)
            .map(|((c, p), m)| {
                let mut cfg = NodeConfig::new(&m.name, root.join(&m.name), *c, *p, members.clone());
                tweak(&mut cfg);
                cfg
            })
            .collect();
        let mut nodes = Vec::with_capacity(n);
        for (config, (client, peer)) in configs.iter().zip(listeners) {
            nodes.push(Some(
                Node::start_with_listeners(config.clone(), client, peer).await?,
            ));
        }
        Ok(LocalCluster { configs, nodes })
    }

    /// Test-friendly timings: 50 ms heartbeats, 500 ms election timeout, 5 s requests.
    pub fn fast_timings(config: &mut NodeConfig) {
        config.heartbeat_ms = 50;
        config.election_timeout_ms = 500;
        config.request_timeout = Duration::from_secs(5);
    }

    pub fn len(&self) -> usize {
        self.configs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// `http://` client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}", self.configs[i].client_addr)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.len()).map(|i| self.endpoint(i)).collect()
    }

    pub fn data_dir(&self, i: usize) -> &PathBuf {
        &self.configs[i].data_dir
    }

    /// Member `i` if it is running.
    pub fn get(&self, i: usize) -> Option<&Node> {
        self.nodes[i].as_ref()
    }

    pub fn running(&self) -> impl Iterator<Item = (usize, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// Stops member `i` (a no-op if it is not running) without a leadership hand-over,
    /// so that a leader stopped this way leaves the others to elect one, as a crash would.
    pub async fn stop(&mut self, i: usize) {
        if let Some(node) = self.nodes[i].take() {
            node.halt().await;
        }
    }

    /// Stops member `i` as `oncekv serve` does on SIGTERM: a leader hands leadership over
    /// first (see [`Node::shutdown`]).
    pub async fn stop_gracefully(&mut self, i: usize) {
        if let Some(node) = self.nodes[i].take() {
            node.shutdown().await;
        }
    }

    /// Starts member `i` again from its data directory, on the same ports.
    pub async fn restart(&mut self, i: usize) -> Result<(), StartError> {
        if self.nodes[i].is_none() {
            self.nodes[i] = Some(Node::start(self.configs[i].clone()).await?);
        }
        Ok(())
    }

    /// The leader the running members agree on, if they do.
    pub fn leader(&self) -> Option<usize> {
        let mut leaders = self.running().map(|(_, n)| n.core.leader());
        let first = leaders.next()??;
        if leaders.any(|l| l != Some(first)) {
            return None;
        }
        self.running()
            .find(|(_, n)| n.core.id() == first)
            .map(|(i, _)| i)
    }

    /// Waits for [`leader`](Self::leader), up to `timeout`.
    pub async fn wait_leader(&self, timeout: Duration) -> Option<usize> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader() {
                return Some(i);
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running member has applied at least `index`; `false` on timeout.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self
                .running()
                .all(|(_, n)| n.core.applied().read().sm.applied_index() >= index)
            {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Binds the ports of a member `n{len+1}` to be added, and makes its config: every
    /// member so far plus itself as `--initial-cluster`, joining an existing cluster, with
    /// `template`'s other settings. Add it with MemberAdd (its [`Joining::peer_url`]), then
    /// [`join`](Self::join) starts it.
    pub async fn prepare_member(&self, template: &NodeConfig) -> Result<Joining, StartError> {
        let (client, peer) = (bind_any().await?, bind_any().await?);
        let (c, p) = (local_addr(&client)?, local_addr(&peer)?);
        let name = format!("n{}", self.len() + 1);
        let mut initial: Vec<Member> = self
            .configs
            .iter()
            .filter_map(|cfg| cfg.initial_cluster.iter().find(|m| m.name == cfg.name))
            .cloned()
            .collect();
        initial.push(Member {
            name: name.clone(),
            peer_url: format!("http://{p}"),
            client_url: format!("http://{c}"),
        });
        let root = template
            .data_dir
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let mut config = template.clone();
        config.name = name.clone();
        config.data_dir = root.join(&name);
        config.client_addr = c;
        config.peer_addr = p;
        config.initial_cluster = initial;
        config.initial_cluster_state = ClusterState::Existing;
        Ok(Joining {
            config,
            client,
            peer,
        })
    }

    /// Starts a member prepared by [`prepare_member`](Self::prepare_member) (after
    /// MemberAdd added it); returns its index.
    pub async fn join(&mut self, joining: Joining) -> Result<usize, StartError> {
        let node = Node::start_with_listeners(joining.config.clone(), joining.client, joining.peer)
            .await?;
        self.configs.push(joining.config);
        self.nodes.push(Some(node));
        Ok(self.configs.len() - 1)
    }

    /// Stops every member.
    pub async fn shutdown(mut self) {
        for i in 0..self.len() {
            self.stop(i).await;
        }
    }
}

/// A member about to join: its config and its bound ports.
#[derive(Debug)]
pub struct Joining {
    pub config: NodeConfig,
    client: TcpListener,
    peer: TcpListener,
}

impl Joining {
    /// The peer URL to give MemberAdd.
    pub fn peer_url(&self) -> String {
        format!("http://{}", self.config.peer_addr)
    }

    pub fn client_url(&self) -> String {
        format!("http://{}", self.config.client_addr)
    }
}

async fn bind_any() -> Result<TcpListener, StartError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })
}

fn local_addr(l: &TcpListener) -> Result<SocketAddr, StartError> {
    let fallback = SocketAddr::from(([127, 0, 0, 1], 0));
    l.local_addr().map_err(|source| StartError::Listen {
        addr: fallback,
        source,
    })
}

/// A [`LocalCluster`] in its own temporary directory with test timings, whose waits panic
/// instead of returning: the integration tests' cluster (server and client crates alike).
/// For tests only: every method that can fail panics with a message saying what failed.
#[derive(Debug)]
pub struct TempCluster {
    pub dir: tempfile::TempDir,
    pub inner: LocalCluster,
}

impl std::ops::Deref for TempCluster {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.inner
    }
}

impl std::ops::DerefMut for TempCluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.inner
    }
}

#[allow(clippy::expect_used, clippy::panic)]
impl TempCluster {
    /// Starts `n` members with [`LocalCluster::fast_timings`]; `tweak` adjusts each config.
    pub async fn start(n: usize, tweak: impl Fn(&mut NodeConfig)) -> TempCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let inner = LocalCluster::start(n, dir.path(), |c| {
            LocalCluster::fast_timings(c);
            tweak(c)
        })
        .await
        .expect("the cluster starts");
        TempCluster { dir, inner }
    }

    /// Member `i`, which must be running.
    pub fn node(&self, i: usize) -> &Node {
        self.inner.get(i).expect("member is running")
    }

    /// Restarts member `i`, which must be stopped.
    pub async fn restart(&mut self, i: usize) {
        assert!(self.inner.get(i).is_none(), "member {i} is still running");
        self.inner.restart(i).await.expect("the member restarts");
    }

    /// Waits for a leader the running members agree on.
    pub async fn wait_leader(&self, timeout: Duration) -> usize {
        match self.inner.wait_leader(timeout).await {
            Some(i) => i,
            None => {
                let leaders: Vec<_> = self.running().map(|(_, n)| n.core.leader()).collect();
                panic!("no agreed leader within {timeout:?}: {leaders:?}")
            }
        }
    }

    /// Waits until every running member has applied at least `index`.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) {
        if !self.inner.wait_applied(index, timeout).await {
            let applied: Vec<u64> = self
                .running()
                .map(|(_, n)| n.core.applied().read().sm.applied_index())
                .collect();
            panic!("not applied to {index} within {timeout:?}: {applied:?}");
        }
    }

    /// Waits until every running member has applied what member `leader` has applied so
    /// far: after it, their states can be compared.
    pub async fn wait_caught_up(&self, leader: usize, timeout: Duration) {
        let applied = self.node(leader).core.applied().read().sm.applied_index();
        self.wait_applied(applied, timeout).await;
    }

    /// Waits until `cond` holds.
    pub async fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        cond: impl Fn(&TempCluster) -> bool,
    ) {
        let start = Instant::now();
        while !cond(self) {
            assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many sessions member `i` holds.
    pub fn sessions(&self, i: usize) -> usize {
        self.node(i).core.applied().read().sm.sessions().len()
    }

    /// Whether member `i` holds session `client_id`.
    pub fn has_session(&self, i: usize, client_id: u64) -> bool {
        self.node(i)
            .core
            .applied()
            .read()
            .sm
            .sessions()
            .get(client_id)
            .is_some()
    }

    /// An etcd KV client connected to member `i`.
    pub async fn kv(
        &self,
        i: usize,
    ) -> oncekv_proto::etcdserverpb::kv_client::KvClient<tonic::transport::Channel> {
        oncekv_proto::etcdserverpb::kv_client::KvClient::connect(self.endpoint(i))
            .await
            .expect("connects to the member")
    }
}
