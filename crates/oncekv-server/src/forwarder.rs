//! A follower's side of write forwarding: commands bound for the leader travel in batches,
//! one peer RPC per batch instead of one per client request.
//!
//! Client requests that reach a follower queue on a channel. A single task takes whatever
//! has queued for the same leader (up to a batch limit) and sends it as one
//! [`Forwarded::ProposeBatch`]; the leader proposes every command of it through its own
//! proposer (where they share log entries with everything else) and answers with one
//! response per command, in order. A bounded number of batches is in flight at once;
//! while they are, new requests accumulate into the next batch (as in the proposer).
//!
//! Failure semantics are those of forwarding one command at a time: an RPC that fails or
//! times out fails every command of its batch with the same error, each of which leaves
//! that command's outcome unknown (see [`ProposeError`]).
//!
//! A follower's linearizable read asks the leader for its read index the same way
//! ([`Forwarder::read_index`], one [`Forwarded::ReadIndex`] RPC, not batched).
//!
//! This module owns the follower side and the wire types; the leader answers them in
//! the peer port's listener (`peer_listener`), each with the owner of its concern.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use oncekv_core::{Command, Response};
use openraft::RaftMetrics;
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::config::BatchLimits;
use crate::error::ProposeError;
use crate::member_change::{Changed, MemberChange, MembershipError};
use crate::network::PeerChannels;
use crate::pb::oncekv::ForwardRequest;
use crate::peer_wire::{CallError, Frame, Method};
use crate::proposer::next_batch;
use crate::types::{Member, NodeId};

/// A request a follower hands to the leader over the peer service (postcard inside the
/// `oncekv.Raft/Forward` RPC's payload).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Forwarded {
    /// The leader's read index, for a linearizable read on the follower.
    ReadIndex,
    /// Client commands to propose, answered with [`ForwardedReply::Responses`].
    ProposeBatch(Vec<Command>),
    /// Record this name and client URL for the sending member in raft's membership
    /// (etcd's "publish"), answered with [`ForwardedReply::Published`].
    Publish {
        id: NodeId,
        name: String,
        client_url: String,
    },
    /// A membership change, answered with [`ForwardedReply::Members`].
    ChangeMembers(MemberChange),
    /// Served by any member, not only the leader: who the member with this peer URL is,
    /// for a member joining with `--initial-cluster-state existing`. Answered with
    /// [`ForwardedReply::Identified`].
    Identify { peer_url: String },
    /// Served by any member: its HashKV at `revision` once it has applied that far
    /// (the corruption check). Answered with [`ForwardedReply::HashKv`].
    HashKv { revision: i64 },
    /// Served by any member: its own health. Answered with [`ForwardedReply::Health`].
    Health,
    /// MoveLeader, to a follower that is not the transferee: start no election for `ms`.
    HoldElections { ms: u64 },
    /// MoveLeader, to the transferee: campaign now.
    Campaign,
}

/// The leader's answer to a [`Forwarded`] request.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ForwardedReply {
    ReadIndex(u64),
    /// The leader could not serve it; the variant is kept so a timeout stays a timeout.
    Error(ProposeError),
    /// One result per command of a [`Forwarded::ProposeBatch`], in order.
    Responses(Vec<Result<Response, ProposeError>>),
    /// A [`Forwarded::Publish`] is in the membership: `changed` if it took an entry,
    /// false if the leader's membership had that URL already.
    Published {
        changed: bool,
    },
    Members(Result<Changed, MembershipError>),
    Identified(Identified),
    HashKv(Result<u32, String>),
    /// "ok", or why the member is not healthy.
    Health(String),
    /// Done, nothing to report.
    Done,
}

/// What a member knows of the member with a peer URL, by its applied (so committed)
/// membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Identified {
    /// It is member `.0` of cluster `.1`.
    Member(NodeId, u64),
    /// A configuration without it is committed: it was removed (or never added).
    NotAMember,
    /// This member has applied no configuration yet (it is joining itself).
    Unknown,
}

struct Pending {
    leader: NodeId,
    command: Command,
    reply: oneshot::Sender<Result<Response, ForwardError>>,
}

/// Why a forwarded command got no response from the leader.
#[derive(Debug)]
pub enum ForwardError {
    /// The leader could not be dialed, so the command was never sent: it comes back, to
    /// go to another leader (no copy of it is kept for that case).
    Unsent { command: Command, reason: String },
    /// Anything else; the command may have reached the leader.
    Failed(ProposeError),
}

impl From<ProposeError> for ForwardError {
    fn from(e: ProposeError) -> Self {
        ForwardError::Failed(e)
    }
}

/// Handle for forwarding commands to the leader in batches.
#[derive(Debug, Clone)]
pub struct Forwarder {
    tx: mpsc::Sender<Pending>,
    route: Arc<Route>,
    stats: Arc<Stats>,
}

/// Counters of what a [`Forwarder`] sent (metrics, tests).
#[derive(Debug, Default)]
struct Stats {
    batches: AtomicU64,
    commands: AtomicU64,
}

/// What the batching task needs to reach the leader.
#[derive(Debug)]
struct Route {
    peers: PeerChannels,
    /// The founding members: where a leader is looked up until raft's membership (in
    /// `raft`'s metrics) names it.
    members: Arc<BTreeMap<NodeId, Member>>,
    raft: tokio::sync::watch::Receiver<RaftMetrics<NodeId, Member>>,
    timeout: Duration,
}

impl Route {
    /// Where `id`'s raft service is: raft's membership first (members added since
    /// formation, peer URLs updated), then the founding list.
    fn peer_url(&self, id: NodeId) -> Option<String> {
        let from_raft = self
            .raft
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|m| m.peer_url.clone());
        from_raft.or_else(|| self.members.get(&id).map(|m| m.peer_url.clone()))
    }
}

impl Forwarder {
    /// Starts the batching task. Batches obey `limits.max_commands` and `max_bytes`; at
    /// most `limits.max_forwards_in_flight` RPCs are outstanding. Each RPC has `timeout`.
    pub fn spawn(
        peers: PeerChannels,
        members: Arc<BTreeMap<NodeId, Member>>,
        raft: tokio::sync::watch::Receiver<RaftMetrics<NodeId, Member>>,
        limits: BatchLimits,
        timeout: Duration,
    ) -> Forwarder {
        let (tx, rx) = mpsc::channel(64 * 1024);
        let route = Arc::new(Route {
            peers,
            members,
            raft,
            timeout,
        });
        let stats = Arc::new(Stats::default());
        tokio::spawn(run(route.clone(), rx, limits, stats.clone()));
        Forwarder { tx, route, stats }
    }

    /// `(batches, commands)` sent to a leader so far: the batching factor is their ratio.
    pub fn sent(&self) -> (u64, u64) {
        (
            self.stats.batches.load(Ordering::Relaxed),
            self.stats.commands.load(Ordering::Relaxed),
        )
    }

    /// Forwards `command` to `leader` and waits for its response (or `timeout`).
    pub async fn forward(
        &self,
        leader: NodeId,
        command: Command,
        timeout: Duration,
    ) -> Result<Response, ForwardError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Pending {
                leader,
                command,
                reply,
            })
            .await
            .map_err(|_| ProposeError::Stopped)?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ProposeError::Stopped.into()),
            Err(_) => Err(ProposeError::Timeout.into()),
        }
    }

    /// Asks `leader` to record `name` and `client_url` as member `id`'s in raft's
    /// membership.
    pub(crate) async fn publish(
        &self,
        leader: NodeId,
        id: NodeId,
        name: String,
        client_url: String,
    ) -> Result<bool, ProposeError> {
        let req = Forwarded::Publish {
            id,
            name,
            client_url,
        };
        match forward_rpc(&self.route, leader, &req).await? {
            ForwardedReply::Published { changed } => Ok(changed),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the member at `url` who the member with `peer_url` is.
    pub(crate) async fn identify(&self, url: &str, peer_url: &str) -> Result<Identified, String> {
        identify(&self.route.peers, url, peer_url, self.route.timeout).await
    }

    /// The HashKV of the member at `url` at `revision` (it waits until it has applied it).
    pub(crate) async fn hash_kv_at(&self, url: &str, revision: i64) -> Result<u32, String> {
        match ask(
            &self.route.peers,
            url,
            &Forwarded::HashKv { revision },
            self.route.timeout,
        )
        .await?
        {
            ForwardedReply::HashKv(result) => result,
            other => Err(format!("unexpected reply: {other:?}")),
        }
    }

    /// Sends `req` to the member at `url`; its error answer as an error.
    pub(crate) async fn ask_member(&self, url: &str, req: Forwarded) -> Result<(), String> {
        match ask(&self.route.peers, url, &req, self.route.timeout).await? {
            ForwardedReply::Error(e) => Err(e.to_string()),
            _ => Ok(()),
        }
    }

    /// The health of the member at `url`: "ok" or its reason.
    pub(crate) async fn health_of(&self, url: &str) -> Result<String, String> {
        match ask(
            &self.route.peers,
            url,
            &Forwarded::Health,
            self.route.timeout,
        )
        .await?
        {
            ForwardedReply::Health(h) => Ok(h),
            other => Err(format!("unexpected reply: {other:?}")),
        }
    }

    /// Asks `leader` to make a membership change.
    pub(crate) async fn change_members(
        &self,
        leader: NodeId,
        change: MemberChange,
    ) -> Result<Changed, MembershipError> {
        match forward_rpc(&self.route, leader, &Forwarded::ChangeMembers(change)).await? {
            ForwardedReply::Members(result) => result,
            other => Err(unexpected(&other).into()),
        }
    }

    /// `leader`'s read index: the leader confirms its leadership with a quorum first.
    pub(crate) async fn read_index(&self, leader: NodeId) -> Result<u64, ProposeError> {
        match forward_rpc(&self.route, leader, &Forwarded::ReadIndex).await? {
            ForwardedReply::ReadIndex(index) => Ok(index),
            other => Err(unexpected(&other)),
        }
    }
}

async fn run(
    route: Arc<Route>,
    mut rx: mpsc::Receiver<Pending>,
    limits: BatchLimits,
    stats: Arc<Stats>,
) {
    let in_flight = Arc::new(Semaphore::new(limits.max_forwards_in_flight.max(1)));
    let mut carry: Option<Pending> = None;
    loop {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        // A batch goes to one leader: a command for another starts the next batch.
        let Some(batch) = next_batch(
            &mut rx,
            &mut carry,
            &limits,
            |p: &Pending| &p.command,
            |first, p| p.leader != first.leader,
        )
        .await
        else {
            return;
        };
        let leader = batch[0].leader;
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        stats.batches.fetch_add(1, Ordering::Relaxed);
        stats
            .commands
            .fetch_add(commands.len() as u64, Ordering::Relaxed);
        let route = route.clone();
        tokio::spawn(async move {
            let n = commands.len();
            let result = send(&route, leader, commands).await;
            drop(permit);
            match result {
                Ok(responses) if responses.len() == n => {
                    for (reply, r) in replies.into_iter().zip(responses) {
                        let _ = reply.send(r.map_err(ForwardError::Failed));
                    }
                }
                Ok(responses) => {
                    let err = ProposeError::Internal(format!(
                        "the leader answered {} of {n} forwarded commands",
                        responses.len()
                    ));
                    for reply in replies {
                        let _ = reply.send(Err(err.clone().into()));
                    }
                }
                Err(Batch::Unsent(commands, reason)) => {
                    for (reply, command) in replies.into_iter().zip(commands) {
                        let reason = reason.clone();
                        let _ = reply.send(Err(ForwardError::Unsent { command, reason }));
                    }
                }
                Err(Batch::Failed(err)) => {
                    for reply in replies {
                        let _ = reply.send(Err(err.clone().into()));
                    }
                }
            }
        });
    }
}

/// Why a batch got no per-command results.
enum Batch {
    /// The leader could not be dialed: the commands, unsent, and why.
    Unsent(Vec<Command>, String),
    Failed(ProposeError),
}

/// One `Forward` RPC carrying `commands`; the leader's per-command results.
async fn send(
    route: &Route,
    leader: NodeId,
    commands: Vec<Command>,
) -> Result<Vec<Result<Response, ProposeError>>, Batch> {
    let request = Forwarded::ProposeBatch(commands);
    match forward_rpc_once(route, leader, &request).await {
        Ok(ForwardedReply::Responses(r)) => Ok(r),
        Ok(other) => Err(Batch::Failed(unexpected(&other))),
        Err(ProposeError::PeerUnreachable(reason)) => match request {
            Forwarded::ProposeBatch(commands) => Err(Batch::Unsent(commands, reason)),
            _ => Err(Batch::Failed(ProposeError::NoLeader)),
        },
        Err(e) => Err(Batch::Failed(e)),
    }
}

fn unexpected(reply: &ForwardedReply) -> ProposeError {
    ProposeError::Internal(format!("unexpected reply from leader: {reply:?}"))
}

/// As [`forward_rpc_once`], with a leader that could not be dialed reported as "no
/// leader" (the caller does not try another).
async fn forward_rpc(
    route: &Route,
    leader: NodeId,
    req: &Forwarded,
) -> Result<ForwardedReply, ProposeError> {
    forward_rpc_once(route, leader, req)
        .await
        .map_err(|e| match e {
            ProposeError::PeerUnreachable(_) => ProposeError::NoLeader,
            other => other,
        })
}

/// Sends one [`Forwarded`] request to `leader` on a framed peer connection. A
/// [`ForwardedReply::Error`] comes back as that error; `PeerUnreachable` means no
/// connection could be made, so the request was not sent and may go to another leader.
async fn forward_rpc_once(
    route: &Route,
    leader: NodeId,
    req: &Forwarded,
) -> Result<ForwardedReply, ProposeError> {
    let url = route.peer_url(leader).ok_or(ProposeError::NoLeader)?;
    let frame = Frame::encode(Method::Forward, req).map_err(ProposeError::Internal)?;
    let reply = route
        .peers
        .call(&url, &frame, route.timeout)
        .await
        .map_err(|e| match e {
            CallError::Unreachable(e) => ProposeError::PeerUnreachable(e),
            CallError::Timeout => ProposeError::Timeout,
            CallError::Status(s)
                if matches!(
                    s.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                ) =>
            {
                ProposeError::Timeout
            }
            // Cut off or refused after the request may have been sent: the caller
            // looks for the leader again, but the request must not be sent twice.
            _ => ProposeError::NoLeader,
        })?;
    let reply: ForwardedReply = postcard::from_bytes(&reply)
        .map_err(|e| ProposeError::Internal(format!("bad reply from leader: {e}")))?;
    match reply {
        ForwardedReply::Error(e) => Err(e),
        other => Ok(other),
    }
}

/// Sends `req` to the member at `url` (any member, not the leader) and returns its reply.
async fn ask(
    peers: &PeerChannels,
    url: &str,
    req: &Forwarded,
    timeout: Duration,
) -> Result<ForwardedReply, String> {
    let payload = postcard::to_allocvec(req).map_err(|e| e.to_string())?;
    let mut client = peers.raft_client(url)?;
    let mut request = tonic::Request::new(ForwardRequest {
        payload: payload.into(),
    });
    request.set_timeout(timeout);
    peers.tag(&mut request);
    let reply = client
        .forward(request)
        .await
        .map_err(|s| s.message().to_string())?;
    postcard::from_bytes(&reply.into_inner().payload).map_err(|e| format!("undecodable reply: {e}"))
}

/// Asks the member at `url` who the member with `peer_url` is (its id and the cluster's):
/// for a member joining a running cluster, and for one that may have been removed.
pub(crate) async fn identify(
    peers: &PeerChannels,
    url: &str,
    peer_url: &str,
    timeout: Duration,
) -> Result<Identified, String> {
    let req = Forwarded::Identify {
        peer_url: peer_url.to_string(),
    };
    match ask(peers, url, &req, timeout).await? {
        ForwardedReply::Identified(found) => Ok(found),
        other => Err(format!("unexpected reply: {other:?}")),
    }
}
