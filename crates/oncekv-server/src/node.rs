//! One oncekv server: raft over the durable log and the state machine, the client-facing
//! gRPC services and the peer service, and the background tasks (proposer, ticker).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::waiting_list::WaitingList;

use oncekv_core::{Command, RangeRequest, Response};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use tonic::transport::server::Connected;

use crate::config::NodeConfig;
use crate::error::{ApiError, ProposeError, StartError};
use crate::forwarder::{Forwarder, forward_rpc};
use crate::log_store::{LogStore, LogStoreOptions, TornTail};
use crate::network::{Network, PeerChannels};
use crate::proposer::Proposer;
use crate::sm_store::{Applied, SmStore};
use crate::transport::{Connector, Duplicator, NodeTransport};
use crate::types::{Member, NodeId, Raft, TypeConfig, member_id};

/// A request a follower hands to the leader over the peer service.
#[derive(Debug, Serialize, Deserialize)]
pub enum Forwarded {
    Propose(Command),
    ReadIndex,
    Info,
    /// Several client commands at once (answered with [`ForwardedReply::Responses`]).
    ProposeBatch(Vec<Command>),
}

/// The leader's answer to a [`Forwarded`] request.
#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardedReply {
    Response(Response),
    ReadIndex(u64),
    Info(Member),
    /// The leader could not serve it; the variant is kept so a timeout stays a timeout.
    Error(ProposeError),
    /// One result per command of a [`Forwarded::ProposeBatch`], in order.
    Responses(Vec<Result<Response, ProposeError>>),
}

/// What every request handler shares.
pub struct NodeCore {
    pub id: NodeId,
    pub config: NodeConfig,
    pub raft: Raft,
    pub applied: Arc<Applied>,
    pub proposer: Proposer,
    /// Batches writes bound for another leader into shared peer RPCs.
    pub forwarder: Forwarder,
    pub peers: PeerChannels,
    pub cluster_id: u64,
    pub members: BTreeMap<NodeId, Member>,
    /// Tracked requests being proposed by this node, keyed by `(client_id, seq)`: a retry
    /// that arrives meanwhile waits for the original instead of being proposed again.
    /// Tracked commands being proposed through this node, by `(client_id, seq,
    /// fingerprint)`: a retry of the same request joins the original, while a different
    /// request under the same seq does not (the state machine refuses it as `SeqReused`
    /// instead of it receiving the other request's reply).
    pub in_flight: WaitingList<(u64, u64, u64), Result<Response, ProposeError>, ProposeError>,
    /// The unacknowledged tail the log store cut off when this node started, if any.
    pub torn_tail: Option<TornTail>,
}

impl std::fmt::Debug for NodeCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCore")
            .field("id", &self.id)
            .field("name", &self.config.name)
            .finish()
    }
}

impl NodeCore {
    pub fn me(&self) -> Option<&Member> {
        self.members.get(&self.id)
    }

    /// The leader as this node currently sees it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Proposes `command` through the leader: locally if this node leads, else forwarded.
    pub async fn propose(&self, command: Command) -> Result<Response, ProposeError> {
        // Forward straight away when another member is known to lead; otherwise let raft
        // decide (it answers NotLeader with the leader it knows of, if any).
        let result = match self.leader() {
            Some(leader) if leader != self.id => Err(ProposeError::NotLeader {
                leader: Some(leader),
            }),
            _ => {
                self.proposer
                    .propose(command.clone(), self.config.request_timeout)
                    .await
            }
        };
        match result {
            Err(ProposeError::NotLeader {
                leader: Some(leader),
            }) if leader != self.id => {
                self.forwarder
                    .forward(leader, command, self.config.request_timeout)
                    .await
            }
            Err(ProposeError::NotLeader { leader: None }) => Err(ProposeError::NoLeader),
            other => other,
        }
    }

    /// Proposes only on this node (a forwarded request must not be forwarded again).
    pub async fn propose_local(&self, command: Command) -> Result<Response, ProposeError> {
        self.proposer
            .propose(command, self.config.request_timeout)
            .await
    }

    /// Waits until this node has applied everything committed before the call: the
    /// read-index protocol (the leader confirms leadership with a quorum, then every read
    /// after this returns at least that state).
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        let index = match self.local_read_index().await {
            Ok(index) => index,
            Err(ProposeError::NotLeader {
                leader: Some(leader),
            }) if leader != self.id => match self.forward(leader, Forwarded::ReadIndex).await? {
                ForwardedReply::ReadIndex(i) => i,
                other => return Err(unexpected(other)),
            },
            Err(ProposeError::NotLeader { leader: None }) => return Err(ProposeError::NoLeader),
            Err(e) => return Err(e),
        };
        // tokio's clock: the same as std's in production, simulated time in a simulation.
        let deadline = tokio::time::Instant::now().into_std() + self.config.request_timeout;
        self.applied
            .wait_applied(index, deadline)
            .await
            .map_err(ProposeError::from)
    }

    /// The leader's read index (errors with `NotLeader` on a follower).
    pub async fn local_read_index(&self) -> Result<u64, ProposeError> {
        use openraft::error::{CheckIsLeaderError, RaftError};
        let fut = self.raft.get_read_log_id();
        match tokio::time::timeout(self.config.request_timeout, fut).await {
            Err(_) => Err(ProposeError::Timeout),
            Ok(Ok((read, _applied))) => Ok(read.map_or(0, |l| l.index)),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id,
                })
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_)))) => {
                Err(ProposeError::NoLeader)
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ProposeError::Stopped),
        }
    }

    async fn forward(
        &self,
        leader: NodeId,
        req: Forwarded,
    ) -> Result<ForwardedReply, ProposeError> {
        forward_rpc(
            &self.peers,
            &self.members,
            leader,
            &req,
            self.config.request_timeout,
        )
        .await
    }

    /// Serves a request forwarded by a follower.
    pub async fn serve_forwarded(&self, req: Forwarded) -> ForwardedReply {
        let result = match req {
            Forwarded::Propose(c) => self.propose_local(c).await.map(ForwardedReply::Response),
            Forwarded::ReadIndex => self.local_read_index().await.map(ForwardedReply::ReadIndex),
            Forwarded::Info => Ok(ForwardedReply::Info(self.me().cloned().unwrap_or_default())),
            Forwarded::ProposeBatch(commands) => Ok(ForwardedReply::Responses(
                self.proposer
                    .propose_many(commands, self.config.request_timeout)
                    .await,
            )),
        };
        result.unwrap_or_else(ForwardedReply::Error)
    }

    /// A Range on this node's applied state, after `read_index` unless `serializable`.
    pub async fn range(
        &self,
        req: &RangeRequest,
        serializable: bool,
    ) -> Result<(i64, oncekv_core::RangeResponse), ApiError> {
        if !serializable {
            self.read_index().await?;
        }
        Ok(self.applied.read().sm.range(req)?)
    }
}

fn unexpected(reply: ForwardedReply) -> ProposeError {
    ProposeError::Internal(format!("unexpected reply from leader: {reply:?}"))
}

/// A running node. Dropping it does not stop it; call [`Node::shutdown`].
#[derive(Debug)]
pub struct Node {
    pub core: Arc<NodeCore>,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Node {
    /// Opens the data directory, starts raft and the servers, and forms the cluster if this
    /// is the first start. Returns once the ports are listening.
    pub async fn start(config: NodeConfig) -> Result<Node, StartError> {
        let client_listener = TcpListener::bind(config.client_addr)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.client_addr,
                source,
            })?;
        let peer_listener = TcpListener::bind(config.peer_addr)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.peer_addr,
                source,
            })?;
        Node::start_with_listeners(config, client_listener, peer_listener).await
    }

    /// As [`start`](Self::start), on listeners the caller bound (tests bind port 0 first,
    /// so no other process can take the port between choosing and binding it).
    pub async fn start_with_listeners(
        config: NodeConfig,
        client_listener: TcpListener,
        peer_listener: TcpListener,
    ) -> Result<Node, StartError> {
        let client_addr = client_listener.local_addr().unwrap_or(config.client_addr);
        let peer_addr = peer_listener.local_addr().unwrap_or(config.peer_addr);
        let core = Node::open(config, None, None).await?;
        Ok(Node::run(
            core,
            (client_addr, peer_addr),
            crate::services::client_incoming(client_listener),
            crate::services::incoming(peer_listener),
        ))
    }

    /// As [`start`](Self::start), on connections from `transport` instead of tokio's TCP
    /// (a deterministic simulation's network). The node reports `config`'s addresses.
    pub async fn start_with_transport(
        config: NodeConfig,
        transport: NodeTransport,
    ) -> Result<Node, StartError> {
        let (client_addr, peer_addr) = (config.client_addr, config.peer_addr);
        let core = Node::open(config, Some(transport.connector), transport.duplicator).await?;
        Ok(Node::run(
            core,
            (client_addr, peer_addr),
            transport.clients,
            transport.peers,
        ))
    }

    /// Opens storage, starts raft and the proposer, and forms the cluster on first start.
    async fn open(
        config: NodeConfig,
        connector: Option<Connector>,
        duplicator: Option<Arc<dyn Duplicator>>,
    ) -> Result<Arc<NodeCore>, StartError> {
        let id = member_id(&config.name);
        let members: BTreeMap<NodeId, Member> = config
            .initial_cluster
            .iter()
            .map(|m| (member_id(&m.name), m.clone()))
            .collect();
        if !members.contains_key(&id) {
            return Err(StartError::NotAMember(config.name.clone()));
        }
        let cluster_id = members.keys().fold(0x9e37_79b9_7f4a_7c15u64, |h, id| {
            (h ^ id).wrapping_mul(0x100_0000_01b3)
        });

        let log_options = LogStoreOptions::default().with_disk(config.disk.clone());
        let log = LogStore::<TypeConfig>::open(config.data_dir.join("log"), log_options).await?;
        let torn_tail = log.torn_tail().cloned();
        let sm = SmStore::open_with(
            &config.data_dir.join("state"),
            config.settings,
            config.disk.clone(),
            config.observer.clone(),
        )
        .map_err(StartError::StateMachine)?;
        let applied = sm.applied();

        let raft_config = openraft::Config {
            cluster_name: "oncekv".into(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms,
            election_timeout_max: config.election_timeout_ms * 2,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_count),
            max_in_snapshot_log_to_keep: 0,
            max_payload_entries: 64,
            install_snapshot_timeout: 10_000,
            ..openraft::Config::default()
        }
        .validate()
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let mut peers = PeerChannels::new(Duration::from_millis(config.heartbeat_ms.max(100) * 5));
        if let Some(c) = connector {
            peers = peers.with_connector(c);
        }
        if let Some(d) = duplicator {
            peers = peers.with_duplicator(d);
        }
        let network = Network {
            peers: peers.clone(),
        };
        let raft = Raft::new(id, Arc::new(raft_config), network, log, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        if !raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?
        {
            // Every member calls this with the same membership; openraft makes one leader.
            if let Err(e) = raft.initialize(members.clone()).await {
                tracing::debug!("initialize: {e}");
            }
        }

        let proposer = Proposer::spawn(
            raft.clone(),
            applied.clone(),
            config.batch,
            config.clock.clone(),
            config.request_timeout,
        );
        let forwarder = Forwarder::spawn(
            peers.clone(),
            Arc::new(members.clone()),
            config.batch,
            config.request_timeout,
        );
        let core = Arc::new(NodeCore {
            id,
            config,
            raft,
            applied,
            proposer,
            forwarder,
            peers,
            cluster_id,
            members,
            in_flight: WaitingList::new(),
            torn_tail,
        });
        Ok(core)
    }

    /// Serves clients and peers on the given connection streams and spawns the background
    /// tasks.
    fn run<C, P, CIO, PIO>(
        core: Arc<NodeCore>,
        (client_addr, peer_addr): (SocketAddr, SocketAddr),
        clients: C,
        peers: P,
    ) -> Node
    where
        C: futures::Stream<Item = std::io::Result<CIO>> + Send + 'static,
        P: futures::Stream<Item = std::io::Result<PIO>> + Send + 'static,
        CIO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
        PIO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(crate::services::serve_clients(
                core.clone(),
                clients,
                stop_rx.clone(),
            )),
            tokio::spawn(crate::services::serve_peers(
                core.clone(),
                peers,
                stop_rx.clone(),
            )),
            tokio::spawn(ticker(core.clone(), stop_rx.clone())),
            tokio::spawn(leadership_watch(core.clone(), stop_rx)),
        ];
        let id = core.id;
        tracing::info!(name = %core.config.name, id = format!("{id:x}"), %client_addr, %peer_addr, "oncekv node started");
        Node {
            core,
            client_addr,
            peer_addr,
            stop,
            tasks,
        }
    }

    /// Stops serving and shuts raft down (what is acknowledged is already durable).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        // The servers stop gracefully (in-flight requests finish), but a client that keeps
        // a connection open must not hold the shutdown forever.
        let grace = self.core.config.request_timeout;
        for mut t in self.tasks {
            if tokio::time::timeout(grace, &mut t).await.is_err() {
                tracing::warn!("a server task did not stop within {grace:?}; aborting it");
                t.abort();
            }
        }
        if let Err(e) = self.core.raft.shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
    }
}

/// On the leader, proposes a `Tick` when a session or lease is due and no traffic has
/// moved cluster time past it. An idle cluster with nothing due writes nothing.
async fn ticker(core: Arc<NodeCore>, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis(core.config.heartbeat_ms.max(10));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(period) => {}
        }
        // Waiters past their deadline fail with Timeout, on every member: in-flight
        // retries and reads waiting for the applied index.
        let now = tokio::time::Instant::now().into_std();
        core.in_flight.expire(now);
        core.applied.waiters().expire(now);
        if core.leader() != Some(core.id) {
            continue;
        }
        let due = core
            .applied
            .read()
            .sm
            .next_deadline()
            .is_some_and(|d| d <= core.config.clock.now_ms());
        if due && let Err(e) = core.propose_local(Command::Tick).await {
            tracing::debug!("tick: {e}");
        }
    }
}

/// When this node stops leading, everything waiting on it fails with `NotLeader` so that
/// clients go to the new leader at once instead of waiting for a timeout.
async fn leadership_watch(core: Arc<NodeCore>, mut stop: watch::Receiver<bool>) {
    let mut metrics = core.raft.metrics();
    let mut was_leader = false;
    loop {
        let leader = metrics.borrow_and_update().current_leader;
        let is_leader = leader == Some(core.id);
        if was_leader && !is_leader {
            let err = ProposeError::NotLeader { leader };
            let n = core.in_flight.fail_all(err.clone()) + core.applied.waiters().fail_all(err);
            tracing::info!(
                failed = n,
                ?leader,
                "lost leadership; failed waiting requests"
            );
        }
        was_leader = is_leader;
        tokio::select! {
            _ = stop.changed() => return,
            changed = metrics.changed() => if changed.is_err() { return },
        }
    }
}
