//! A node's request path: what a client request goes through between its gRPC handler and
//! the state machine, owned by [`NodeCore`]. This file holds the node's state and what
//! every part reads of it; each concern has a file of its own:
//!
//! - `writes`: [`NodeCore::execute`] turns an op into a tracked command (with a session)
//!   or an untracked one. A tracked request already being proposed through this node
//!   waits for that original instead of being proposed again (the in-flight list).
//!   [`NodeCore::propose`] then hands the command to this node's proposer when it leads,
//!   or to the forwarder, which batches it to the leader.
//! - `reads`: [`NodeCore::read_index`] gets a read index (the leader confirms its
//!   leadership with a quorum; a follower asks the leader) and waits until this node has
//!   applied that far; the read then runs on the applied state.
//! - `leadership`: etcd's MoveLeader and the hand-over before a leader stops.
//! - `publish`: this member's client URL in the membership, and who a joining member is.
//! - `upkeep`: what the background tasks drive: snapshots, the db size and alarms,
//!   expiring waiters, failing them when leadership is lost, proposing a `Tick` when a
//!   session or lease is due.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use oncekv_core::Response;
use oncekv_core::waiting_list::WaitingList;
use openraft::RaftMetrics;

use crate::config::NodeConfig;
use crate::error::{ApiError, ProposeError};
use crate::forwarder::Forwarder;
use crate::identity::Identity;
use crate::log_store::{LogStore, TornTail};
use crate::metrics::SharedMetrics;
use crate::network::PeerChannels;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::proposer::Proposer;
use crate::read_batch::ReadBatcher;
use crate::read_lease::ReadLease;
use crate::sm_store::Applied;
use crate::types::{Member, NodeId, Raft, TypeConfig};

mod answers;
mod leadership;
mod publish;
mod reads;
mod upkeep;
mod writes;

pub use answers::{
    Answer, Answered, Compacted, LeaseGranted, LeaseKept, LeaseRevoked, Registered, answer,
};

use reads::{committed_batcher, election_wait, read_batchers, settled_leader};
pub use writes::Permit;
use writes::RequestKey;

/// What every request handler of one node shares, and the path their requests take.
pub struct NodeCore {
    id: NodeId,
    config: NodeConfig,
    raft: Raft,
    applied: Arc<Applied>,
    proposer: Proposer,
    /// Batches writes bound for another leader into shared peer RPCs; also asks the
    /// leader for its read index.
    forwarder: Forwarder,
    /// The peer channels' duplicator decides which client writes arrive twice.
    #[cfg(feature = "sim")]
    peers: PeerChannels,
    cluster_id: u64,
    members: Arc<BTreeMap<NodeId, Member>>,
    /// Tracked commands being proposed through this node. A retry of the same request
    /// joins the original, while a different request under the same seq (another
    /// fingerprint) does not: the state machine refuses it as `SeqReused` instead of it
    /// receiving the other request's reply.
    in_flight: WaitingList<RequestKey, Result<Response, ProposeError>, ProposeError>,
    /// The unacknowledged tail the log store cut off when this node started, if any.
    torn_tail: Option<TornTail>,
    /// The raft log (a handle sharing the store raft writes), for its size.
    log: LogStore<TypeConfig>,
    /// The member's data on disk (snapshot file and live log), as last measured by the
    /// ticker: etcd's db size, which the space quota limits.
    db_size: std::sync::atomic::AtomicU64,
    /// Waiters of the questions asked of every member (the corruption check, cluster
    /// health), each a quorum of every member's answer, told apart by `fanout_ids`.
    fanouts: WaitingList<u64, String, String>,
    fanout_ids: std::sync::atomic::AtomicU64,
    /// Set while this leader hands leadership over (MoveLeader): it proposes nothing.
    transferring: std::sync::atomic::AtomicBool,
    /// Membership changes running in their tasks here (see `NodeCore::change`); while
    /// any runs, the ticker does not finish a joint configuration itself.
    pub(crate) changes_running: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether this member's client URL is in the membership as its leader has it.
    published: tokio::sync::watch::Sender<bool>,
    /// When this member last saw itself become leader, and of which term (set by the
    /// leadership watch, so never earlier than raft's own moment).
    leading_since: std::sync::Mutex<Option<(u64, tokio::time::Instant)>>,
    /// The snapshot index at which this member last asked raft for a snapshot, and when:
    /// a build takes a while, and the ticker asks once per snapshot.
    snapshot_asked: std::sync::Mutex<Option<(u64, tokio::time::Instant)>>,
    metrics: SharedMetrics,
    /// Linearizable reads here: the leader's confirmation, or (on a follower) the
    /// leader's answer, shared by the reads waiting at that moment.
    reads: Arc<ReadBatcher>,
    /// This member's own confirmations: asked by followers (a forwarded request is never
    /// forwarded again), by its own reads while it leads, and by the rounds of `reads`
    /// here, so a leader runs one stream of rounds for all of them.
    leader_reads: Arc<ReadBatcher>,
    /// With `--leader-lease-reads`: while a recent confirmation's lease runs, the leader
    /// answers reads without another round.
    lease: Option<Arc<ReadLease>>,
    /// Under the lease: the committed index, asked of raft's core.
    committed: Arc<ReadBatcher>,
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
    /// The request path of the member `config.name` of `members`, on a started `raft`
    /// whose state machine publishes `applied`. Spawns the proposer and the forwarder, so
    /// it MUST be called inside a tokio runtime.
    pub(crate) fn new(
        config: NodeConfig,
        raft: Raft,
        applied: Arc<Applied>,
        peers: PeerChannels,
        (identity, members): (Identity, BTreeMap<NodeId, Member>),
        log: LogStore<TypeConfig>,
        metrics: SharedMetrics,
    ) -> NodeCore {
        let torn_tail = log.torn_tail().cloned();
        let members = Arc::new(members);
        let proposer = Proposer::spawn(
            raft.clone(),
            applied.clone(),
            config.batch,
            config.clock.clone(),
            config.request_timeout,
        );
        let forwarder = Forwarder::spawn(
            peers.clone(),
            members.clone(),
            raft.metrics(),
            config.batch,
            config.request_timeout,
        );
        let lease = config
            .leader_lease_reads
            .then(|| Arc::new(ReadLease::new(config.vote_lease())));
        let (reads, leader_reads) = read_batchers(
            &raft,
            &forwarder,
            identity.member_id,
            (config.request_timeout, election_wait(&config)),
            lease.clone(),
            &metrics,
        );
        NodeCore {
            reads,
            leader_reads,
            lease,
            committed: committed_batcher(&raft),
            id: identity.member_id,
            cluster_id: identity.cluster_id,
            config,
            raft,
            applied,
            proposer,
            forwarder,
            #[cfg(feature = "sim")]
            peers,
            members,
            in_flight: WaitingList::new(),
            torn_tail,
            log,
            db_size: std::sync::atomic::AtomicU64::new(0),
            fanouts: WaitingList::default(),
            fanout_ids: std::sync::atomic::AtomicU64::new(0),
            transferring: std::sync::atomic::AtomicBool::new(false),
            changes_running: Arc::default(),
            published: tokio::sync::watch::Sender::new(false),
            leading_since: std::sync::Mutex::new(None),
            snapshot_asked: std::sync::Mutex::new(None),
            metrics,
        }
    }

    /// Records that this member leads in `term` from now (`None`: it does not lead).
    pub(crate) fn set_leading(&self, term: Option<u64>) {
        let mut since = self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        *since = term.map(|t| (t, tokio::time::Instant::now()));
    }

    /// This member's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// This member's cluster's id (etcd's `cluster_id` in response headers).
    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Returns once this member knows a leader and has applied everything committed
    /// before the call (a read index confirmed), retrying every 100 ms until then: the
    /// moment etcd calls ready, when its member has joined and serves current reads.
    pub async fn caught_up(&self) {
        loop {
            if self.leader().is_some() && self.read_index().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until log entry `index` and those before it are on this member's disk.
    pub(crate) async fn log_durable(&self, index: u64) -> Result<(), String> {
        self.log
            .durability()
            .wait(index)
            .await
            .map_err(|e| e.to_string())
    }

    pub(crate) fn forwarder(&self) -> &Forwarder {
        &self.forwarder
    }

    /// Waits until everything queued on the raft log, the latest committed id included,
    /// is durable, and marks the log as stopped cleanly. Only once raft is stopped.
    pub(crate) async fn close_log_cleanly(&self) -> Result<(), crate::log_store::LogError> {
        self.log.close_cleanly().await
    }

    /// What the scrape-time metrics show, read now.
    pub fn scrape(&self) -> crate::metrics::Scrape {
        let raft = self.metrics();
        let inner = self.applied.read();
        let sm = &inner.sm;
        let (saved_replies, saved_reply_bytes) = sm.sessions().saved_summary();
        crate::metrics::Scrape {
            has_leader: raft.current_leader.is_some(),
            is_leader: raft.current_leader == Some(self.id),
            applied_index: raft.last_applied.map_or(0, |l| l.index),
            last_log_index: raft.last_log_index.unwrap_or(0),
            in_flight: self.in_flight_waiters(),
            db_size: self.db_size(),
            keys: sm.kv().len(),
            revision: sm.revision(),
            compacted_revision: sm.compacted_revision(),
            leases: sm.leases().len(),
            sessions: sm.sessions().len(),
            stats: sm.stats(),
            saved_replies,
            saved_reply_bytes,
        }
    }

    /// This member's Prometheus metrics.
    pub fn node_metrics(&self) -> &SharedMetrics {
        &self.metrics
    }

    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Every member, by id (the initial cluster; membership does not change).
    pub fn members(&self) -> &BTreeMap<NodeId, Member> {
        &self.members
    }

    /// What this node has applied. Never hold its lock across an `.await`.
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// The leader as this node currently sees it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// The leader, waiting through an election if one is on (see `reads::settled_leader`).
    pub async fn settled_leader(&self) -> Option<NodeId> {
        settled_leader(&self.raft, election_wait(&self.config)).await
    }

    pub fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// A copy of raft's current metrics (log indexes, snapshot, purged, leader, term).
    pub fn metrics(&self) -> RaftMetrics<NodeId, Member> {
        self.raft.metrics().borrow().clone()
    }

    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The unacknowledged tail the log store cut off when this node started, if any.
    pub fn torn_tail(&self) -> Option<&TornTail> {
        self.torn_tail.as_ref()
    }

    /// `(batches, commands)` this node has forwarded to a leader: the batching factor is
    /// their ratio.
    pub fn forwarded(&self) -> (u64, u64) {
        self.forwarder.sent()
    }

    /// etcd's response header at `revision`.
    pub fn header(&self, revision: i64) -> Option<ResponseHeader> {
        Some(ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.id,
            revision,
            raft_term: self.term(),
        })
    }

    /// Refuses a request whose encoding exceeds `--max-request-bytes`.
    pub fn check_size(&self, req: &impl prost::Message) -> Result<(), ApiError> {
        if req.encoded_len() > self.config.max_request_bytes {
            return Err(ApiError::TooLarge);
        }
        Ok(())
    }

    /// The members as raft's membership records them: peer URLs from formation, client
    /// URLs as each member published its own.
    pub fn membership(&self) -> BTreeMap<NodeId, Member> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .map(|(id, m)| (*id, m.clone()))
            .collect()
    }

    /// The waiting list of the questions asked of every member, and a fresh id for one.
    pub(crate) fn new_fanout(&self) -> (u64, &WaitingList<u64, String, String>) {
        let id = self
            .fanout_ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (id, &self.fanouts)
    }

    /// Overwrites `key`'s value in this member's applied state only, bypassing the log:
    /// breaks replica agreement on purpose. For corruption-detection tests; nothing in
    /// the server calls it.
    #[doc(hidden)]
    pub fn corrupt_value_for_test(&self, key: &[u8], value: &[u8]) -> bool {
        self.applied.corrupt_value_for_test(key, value)
    }
}
