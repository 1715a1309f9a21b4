//! Raft traffic between oncekv servers: framed connections on the peer port
//! ([`crate::peer_wire`]) for raft messages and forwards, gRPC for the rest.
//!
//! Raft messages go on framed connections, pooled per peer, one call per connection at a
//! time; the other peer calls (a joining member's `Identify`, health and hash checks) on
//! one tonic channel per peer, created lazily (a channel multiplexes requests over one
//! HTTP/2 connection and reconnects by itself). Every call has a deadline. A peer that
//! cannot be connected to is reported as [`Unreachable`], so openraft backs off instead
//! of hammering it. openraft's messages travel as postcard bytes either way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};

use crate::log_store::Durability;
use crate::pb::oncekv::raft_client::RaftClient;
use crate::peer_wire::{CallError, Dialer, Frame, Method, WirePool};
use crate::transport::Connector;
#[cfg(feature = "sim")]
use crate::transport::{Duplicator, MessageKind};
use crate::types::{Member, NodeId, TypeConfig};

pub use crate::config::{SNAPSHOT_CHUNK_BYTES, peer_message_limit};

/// Request metadata naming the sender's cluster and member (hex), checked by the
/// receiver's `PeerGate` (`peer_gate`) before it reads the body.
pub const PEER_CLUSTER_KEY: &str = "oncekv-peer-cluster";
pub const PEER_MEMBER_KEY: &str = "oncekv-peer-member";

/// Channels to peers, shared by every raft network client of this node.
#[derive(Debug, Clone, Default)]
pub struct PeerChannels {
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    /// `(cluster id, member id)` once this member knows them (a joining member asks its
    /// peers first, as an outsider).
    identity: Arc<std::sync::OnceLock<(u64, u64)>>,
    connect_timeout: Duration,
    /// [`peer_message_limit`]: the largest message sent or received.
    max_message: usize,
    /// How channels connect: tokio TCP when `None`, else this (a simulation's network).
    connector: Option<Connector>,
    /// Framed connections for raft messages and forwards (see [`crate::peer_wire`]).
    wire: WirePool,
    /// Messages the network delivers twice (a simulation's network only).
    #[cfg(feature = "sim")]
    duplicator: Option<Arc<dyn Duplicator>>,
}

impl PeerChannels {
    pub fn new(connect_timeout: Duration, max_message: usize) -> PeerChannels {
        PeerChannels {
            channels: Arc::default(),
            identity: Arc::default(),
            connect_timeout,
            max_message,
            connector: None,
            wire: WirePool::default(),
            #[cfg(feature = "sim")]
            duplicator: None,
        }
    }

    /// Names this member in every request from now on (every clone shares it).
    pub fn set_identity(&self, cluster_id: u64, member_id: u64) {
        let _ = self.identity.set((cluster_id, member_id));
    }

    /// Puts this member's cluster and member id into `request`'s metadata.
    pub fn tag<T>(&self, request: &mut tonic::Request<T>) {
        if let Some((cluster, member)) = self.identity.get() {
            let md = request.metadata_mut();
            if let Ok(v) = format!("{cluster:x}").parse() {
                md.insert(PEER_CLUSTER_KEY, v);
            }
            if let Ok(v) = format!("{member:x}").parse() {
                md.insert(PEER_MEMBER_KEY, v);
            }
        }
    }

    /// Channels whose messages `duplicator` may deliver twice.
    #[cfg(feature = "sim")]
    pub fn with_duplicator(mut self, duplicator: Arc<dyn Duplicator>) -> PeerChannels {
        self.duplicator = Some(duplicator);
        self
    }

    /// Whether the network delivers this message twice, and the second copy's delay.
    #[cfg(feature = "sim")]
    pub fn duplicate(&self, kind: MessageKind) -> Option<Duration> {
        self.duplicator.as_ref()?.duplicate(kind)
    }

    /// Channels that connect through `connector` instead of tokio's TCP.
    pub fn with_connector(mut self, connector: Connector) -> PeerChannels {
        self.connector = Some(connector);
        self
    }

    /// The channel to `url`, created on first use (connection made lazily).
    pub fn channel(&self, url: &str) -> Result<Channel, String> {
        let mut map = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ch) = map.get(url) {
            return Ok(ch.clone());
        }
        // Pings even while no request is open: a connection whose writes are stuck (the
        // peer stopped acknowledging, a silent middlebox, TCP backing off after a long
        // partition) keeps hyper's request queue from opening any stream, so the
        // connection looks idle and, without this, would never be pinged, never be
        // declared dead and never be replaced (seed 135 of the simulation: a follower
        // unreachable for good after the partition healed).
        // TLS, if the peers speak it, is the connector's: tonic is given plain HTTP/2.
        let plain = match url.strip_prefix("https://") {
            Some(rest) => format!("http://{rest}"),
            None => url.to_string(),
        };
        let endpoint = Endpoint::from_shared(plain)
            .map_err(|e| format!("bad peer url {url:?}: {e}"))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let ch = match (url.starts_with("unix://"), &self.connector) {
            (true, _) => Connector::unix().channel(&endpoint),
            (false, Some(c)) => c.channel(&endpoint),
            (false, None) => endpoint.connect_lazy(),
        };
        map.insert(url.to_string(), ch.clone());
        Ok(ch)
    }

    /// Sends `frame` to the member at `url` over a framed connection and returns the
    /// answer's payload. Only once this member knows its identity (every
    /// framed connection names the sender's cluster and member).
    pub async fn call(
        &self,
        url: &str,
        frame: &Frame,
        timeout: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let hello = *self.identity.get().ok_or_else(|| {
            CallError::Unreachable("this member does not know its cluster yet".into())
        })?;
        let dialer = Dialer {
            connector: self.connector.clone(),
            connect_timeout: self.connect_timeout,
            max_message: self.max_message,
        };
        // Simulation only: the network may deliver this message a second time, later;
        // the copy's reply goes nowhere (the caller sent one request and sees one answer).
        #[cfg(feature = "sim")]
        if let Some(delay) = self.duplicate(frame.method().kind()) {
            let (peers, url, copy, dialer) =
                (self.clone(), url.to_string(), frame.clone(), dialer.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = (peers.wire)
                    .call(&dialer, &url, hello, &copy, timeout)
                    .await;
            });
        }
        self.wire.call(&dialer, url, hello, frame, timeout).await
    }

    pub fn raft_client(&self, url: &str) -> Result<RaftClient<Channel>, String> {
        Ok(RaftClient::new(self.channel(url)?)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }
}

/// Builds a [`PeerClient`] per target for openraft.
#[derive(Debug, Clone)]
pub struct Network {
    pub peers: PeerChannels,
    /// This member's log, when it acknowledges its own appends before they are durable
    /// ([`LogStore::ack_own_appends_early`](crate::log_store::LogStore::ack_own_appends_early)):
    /// appends then carry the commit index only as far as it is durable (see
    /// [`PeerClient`]'s `append_entries`).
    pub durability: Option<Durability<NodeId>>,
    /// How long openraft waits before it tries an unreachable peer again: a heartbeat
    /// interval (see [`PeerClient`]'s `backoff`).
    pub retry_after: Duration,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            target,
            url: node.peer_url.clone(),
            peers: self.peers.clone(),
            durability: self.durability.clone(),
            retry_after: self.retry_after,
        }
    }
}

/// openraft's client for one peer.
#[derive(Debug)]
pub struct PeerClient {
    target: NodeId,
    url: String,
    peers: PeerChannels,
    durability: Option<Durability<NodeId>>,
    retry_after: Duration,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        method: Method,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, RPCError<NodeId, Member, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let frame = Frame::encode(method, req)
            .map_err(|e| RPCError::Network(NetworkError::new(&std::io::Error::other(e))))?;
        let reply = match self.peers.call(&self.url, &frame, timeout).await {
            Ok(reply) => reply,
            // Unreachable makes openraft back off instead of retrying at once; so does a
            // member that refuses to vote yet.
            Err(e @ CallError::Unreachable(_)) => return Err(unreachable_err(&e)),
            Err(CallError::Status(s)) if s.code() == tonic::Code::Unavailable => {
                return Err(unreachable_err(&s.message()));
            }
            Err(e) => return Err(RPCError::Network(NetworkError::new(&e))),
        };
        let result: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn unreachable_err<E: std::error::Error>(
    e: &impl std::fmt::Display,
) -> RPCError<NodeId, Member, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        e.to_string(),
    )))
}

impl PeerClient {
    /// Sends one append, split into several when its entries add up to more than a peer
    /// accepts.
    async fn send_append(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        // The common case, one entry (or a heartbeat), goes as it is.
        if rpc.entries.len() <= 1 {
            return self.call(Method::Append, &rpc, option.hard_ttl()).await;
        }
        // Several entries (a follower catching up) may add up to more than a peer accepts:
        // send them as consecutive appends, each a valid AppendEntries on its own (the
        // previous one's last entry is the next one's `prev_log_id`).
        let budget = self.peers.max_message - (256 << 10);
        let sizes: Vec<usize> = rpc
            .entries
            .iter()
            .map(|e| postcard::experimental::serialized_size(e).unwrap_or(budget))
            .collect();
        if sizes.iter().sum::<usize>() <= budget {
            return self.call(Method::Append, &rpc, option.hard_ttl()).await;
        }
        let AppendEntriesRequest {
            vote,
            mut prev_log_id,
            leader_commit,
            entries,
        } = rpc;
        let mut entries = entries.into_iter().zip(sizes).peekable();
        while entries.peek().is_some() {
            let mut part = Vec::new();
            let mut bytes = 0;
            while let Some((_, size)) = entries.peek() {
                if !part.is_empty() && bytes + size > budget {
                    break;
                }
                bytes += size;
                part.extend(entries.next().map(|(e, _)| e));
            }
            let last = part.last().map(|e: &openraft::Entry<TypeConfig>| e.log_id);
            // What this part may commit: no further than its own last entry.
            let commit = match (leader_commit, last) {
                (Some(c), Some(l)) if c.index > l.index => Some(l),
                (c, _) => c,
            };
            let request = AppendEntriesRequest::<TypeConfig> {
                vote,
                prev_log_id,
                leader_commit: commit,
                entries: part,
            };
            match self
                .call(Method::Append, &request, option.hard_ttl())
                .await?
            {
                AppendEntriesResponse::Success => prev_log_id = last,
                other => return Ok(other),
            }
        }
        Ok(AppendEntriesResponse::Success)
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    /// openraft waits 500 ms by default before it tries an unreachable peer again. A
    /// member that restarts after a crash knows no leader and stands for election after
    /// half to one election timeout (`NodeConfig::raft_election_timeouts`); the leader's
    /// first heartbeat must reach it before that, or it deposes a healthy leader. Trying
    /// again every heartbeat interval costs a refused connection per interval while a
    /// peer is down.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.retry_after))
    }

    /// With this member's own appends acknowledged before they are durable, raft's commit
    /// index may run ahead of this log's fdatasync; an append tells the follower only as
    /// much of it as is durable here (the argument is on [`Durability`]). A follower never
    /// lowers its commit index, and the next append or heartbeat carries the rest.
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        if let (Some(durability), Some(commit)) = (&self.durability, rpc.leader_commit) {
            rpc.leader_commit = durability
                .durable_prefix(commit)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        }
        self.send_append(rpc, option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Method::Snapshot, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        self.call(Method::Vote, &rpc, option.hard_ttl()).await
    }
}
