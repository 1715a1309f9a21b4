//! A node's request path: what a client request goes through between its gRPC handler and
//! the state machine, owned by [`NodeCore`].
//!
//! - Writes: [`NodeCore::execute`] turns an op into a tracked command (with a session) or
//!   an untracked one. A tracked request already being proposed through this node waits
//!   for that original instead of being proposed again (the in-flight list).
//!   [`NodeCore::propose`] then hands the command to this node's proposer when it leads,
//!   or to the forwarder, which batches it to the leader.
//! - Linearizable reads: [`NodeCore::read_index`] gets a read index (the leader confirms
//!   its leadership with a quorum; a follower asks the leader) and waits until this node
//!   has applied that far; the read then runs on the applied state.
//! - The leader's side of forwarding: [`NodeCore::serve_forwarded`].
//! - Housekeeping the node's background tasks drive: expiring waiters, failing them when
//!   leadership is lost, proposing a `Tick` when a session or lease is due.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use oncekv_core::waiting_list::WaitingList;
use oncekv_core::{
    AlarmKind, Command, Op, OpError, OpReply, RangeRequest, RangeResponse, Response, Tracked,
};
use oncekv_proto::SessionMeta;
use openraft::RaftMetrics;

use crate::config::NodeConfig;
use crate::error::{ApiError, ProposeError};
use crate::forwarder::{ForwardError, Forwarded, Forwarder, Identified};
use crate::identity::Identity;
use crate::log_store::{LogStore, TornTail};
use crate::metrics::{NodeMetrics, SharedMetrics};
use crate::network::PeerChannels;
use crate::pb::etcdserverpb::ResponseHeader;
use crate::proposer::Proposer;
use crate::read_batch::ReadBatcher;
use crate::read_lease::ReadLease;
use crate::sm_store::Applied;
#[cfg(feature = "sim")]
use crate::transport::MessageKind;
use crate::types::{Member, NodeId, Raft, TypeConfig};

/// A tracked request, by `(client_id, seq, op fingerprint)`.
type RequestKey = (u64, u64, u64);

type Waiter = oncekv_core::waiting_list::Waiter<Result<Response, ProposeError>, ProposeError>;

/// [`NodeCore::join_or_claim`]'s answer.
enum InFlight {
    /// The same request is in flight: this waits for its result.
    Joined(Waiter),
    /// This caller proposes it; the marker keeps the key visibly in flight.
    Claimed(Waiter),
}

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
}

/// A snapshot at least this large is written again only once the log since it is a
/// quarter of its size (see [`snapshot_due`]).
pub const LARGE_SNAPSHOT_BYTES: u64 = 64 << 20;

/// A large snapshot waits for a log of `1 / SNAPSHOT_LOG_FRACTION` of its size.
const SNAPSHOT_LOG_FRACTION: u64 = 4;

/// How long after asking for a snapshot that has not come the ticker asks again.
const SNAPSHOT_ASK_AGAIN: Duration = Duration::from_secs(30);

/// Whether a member should snapshot now: `entries` applied since its last snapshot have
/// reached `snapshot_count` (etcd's rule), and, once the last snapshot was large, the
/// log written since (`log_bytes`) is at least a quarter of that snapshot's size
/// (`snapshot_bytes`).
///
/// A snapshot here is the whole state (etcd's state is its database file, already on
/// disk), so counting entries alone would write a large state again for every few MB of
/// log: a 1 GB state under light traffic, one put per entry, would be rewritten on every
/// member for each 10,000 puts. With the size rule a snapshot writes at most four times
/// the log written since the last one (LogCabin snapshots by log size the same way).
/// Why a quarter and not more: the log since the snapshot counts in the member's size on
/// disk, which the space quota limits, so it stays within a quarter of the state.
pub fn snapshot_due(
    entries: u64,
    snapshot_count: u64,
    log_bytes: u64,
    snapshot_bytes: u64,
) -> bool {
    entries >= snapshot_count
        && (snapshot_bytes < LARGE_SNAPSHOT_BYTES
            || log_bytes.saturating_mul(SNAPSHOT_LOG_FRACTION) >= snapshot_bytes)
}

/// The most voters for which a leader's vote and the transferee's own are a majority:
/// up to this many, leadership is handed over without waiting out the followers' lease
/// (see [`NodeCore::hand_over`]).
const QUICK_HAND_OVER_MAX_VOTERS: usize = 3;

/// Whether `membership` is small enough for the quick hand-over.
fn quick_hand_over_fits(membership: &openraft::Membership<NodeId, Member>) -> bool {
    membership.voter_ids().count() <= QUICK_HAND_OVER_MAX_VOTERS
}

/// The last log index the leader knows `id` holds (`None` on a follower, or nothing yet).
fn matched_index(metrics: &RaftMetrics<NodeId, Member>, id: &NodeId) -> Option<u64> {
    metrics
        .replication
        .as_ref()
        .and_then(|r| r.get(id).cloned().flatten())
        .map(|l| l.index)
}

/// The leader's read index after it confirmed its leadership with a quorum (errors with
/// `NotLeader` on a follower). A confirmation extends `lease`, from the round's start.
async fn leader_read_index(
    raft: &Raft,
    timeout: Duration,
    lease: Option<&ReadLease>,
    metrics: &NodeMetrics,
) -> Result<u64, ProposeError> {
    use openraft::error::{CheckIsLeaderError, RaftError};
    // Taken before the round: a term that changes meanwhile leaves the lease unused.
    let (term, started) = (
        raft.metrics().borrow().current_term,
        tokio::time::Instant::now(),
    );
    match tokio::time::timeout(timeout, raft.get_read_log_id()).await {
        Err(_) => Err(ProposeError::Timeout),
        Ok(Ok((read, _applied))) => {
            metrics.read_round();
            if let Some(lease) = lease {
                lease.confirmed(term, started);
            }
            Ok(read.map_or(0, |l| l.index))
        }
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

/// The leader `raft` knows, waiting up to `limit` while it knows none (an election in
/// progress). A request that meets an election is held through it, as a linearizable
/// read is in etcd, instead of failing with "no leader" at once (etcd's clients do not
/// retry that); the limit keeps a member cut off from the majority answering "no leader"
/// soon enough for a client to try another.
pub(crate) async fn settled_leader(raft: &Raft, limit: Duration) -> Option<NodeId> {
    leader_other_than(raft, limit, None).await
}

/// The leader `raft` knows, if it is not `gone`; else waits up to `limit` for one that is
/// not.
async fn leader_other_than(raft: &Raft, limit: Duration, gone: Option<NodeId>) -> Option<NodeId> {
    let mut metrics = raft.metrics();
    let wanted = |leader: Option<NodeId>| leader.is_some_and(|l| Some(l) != gone);
    let now = metrics.borrow().current_leader;
    if wanted(now) {
        return now;
    }
    let known = metrics.wait_for(|m| wanted(m.current_leader));
    match tokio::time::timeout(limit, known).await {
        Ok(Ok(m)) => m.current_leader,
        _ => None,
    }
}

/// How long a request waits for an election: about what one takes.
fn election_wait(config: &NodeConfig) -> Duration {
    Duration::from_millis(config.election_timeout_ms.saturating_mul(2)).min(config.request_timeout)
}

/// How long a request waits for a leader to replace one that crashed: the others first
/// wait out its lease (an election timeout after its last heartbeat), then one of them
/// times out (half to one election timeout, randomized) and wins a vote; twice that
/// leaves room for one split vote and a slow machine.
fn failover_wait(config: &NodeConfig) -> Duration {
    Duration::from_millis(config.election_timeout_ms.saturating_mul(4)).min(config.request_timeout)
}

/// The two read batchers of member `id`: any read here, and the leader's rounds.
///
/// Every round of confirmation on a leader goes through `leader_reads`, whether for its
/// own clients' reads (a round of `reads` asks `leader_reads`) or for reads its followers
/// forward (served from `leader_reads` directly): one round of heartbeats serves both
/// instead of two rounds running side by side. A forwarded read is confirmed only, never
/// forwarded again, so two members that each think the other leads cannot pass a read
/// back and forth.
fn read_batchers(
    raft: &Raft,
    forwarder: &Forwarder,
    id: NodeId,
    (timeout, settle): (Duration, Duration),
    lease: Option<Arc<ReadLease>>,
    metrics: &SharedMetrics,
) -> (Arc<ReadBatcher>, Arc<ReadBatcher>) {
    let (r, m) = (raft.clone(), metrics.clone());
    let leader_reads = ReadBatcher::new(Arc::new(move || {
        let (raft, lease, metrics) = (r.clone(), lease.clone(), m.clone());
        Box::pin(async move { leader_read_index(&raft, timeout, lease.as_deref(), &metrics).await })
    }));
    let (r, f, own) = (raft.clone(), forwarder.clone(), leader_reads.clone());
    let reads = ReadBatcher::new(Arc::new(move || {
        let (raft, forwarder, own) = (r.clone(), f.clone(), own.clone());
        Box::pin(async move {
            // A follower that knows its leader asks it at once: asking its own raft core
            // first would only tell it what its metrics already say. Should the leader
            // have changed meanwhile, the answer says so and the full path below runs.
            let known = raft.metrics().borrow().current_leader;
            if let Some(leader) = known.filter(|&l| l != id) {
                match forwarder.read_index(leader).await {
                    Err(ProposeError::NotLeader { .. }) => {}
                    other => return other,
                }
            }
            let first = own.read_index().await;
            let first = match first {
                // An election: wait for its leader, then ask again (here or there).
                Err(ProposeError::NotLeader { leader: None }) => {
                    match settled_leader(&raft, settle).await {
                        Some(leader) if leader == id => own.read_index().await,
                        Some(leader) => Err(ProposeError::NotLeader {
                            leader: Some(leader),
                        }),
                        None => Err(ProposeError::NoLeader),
                    }
                }
                other => other,
            };
            match first {
                Err(ProposeError::NotLeader {
                    leader: Some(leader),
                }) if leader != id => forwarder.read_index(leader).await,
                Err(ProposeError::NotLeader { leader: None }) => Err(ProposeError::NoLeader),
                other => other,
            }
        })
    }));
    (reads, leader_reads)
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

    /// Records that this member's client URL is published (see [`NodeCore::published`]).
    pub(crate) fn mark_published(&self) {
        self.published.send_replace(true);
    }

    pub(crate) fn is_published(&self) -> bool {
        *self.published.borrow()
    }

    /// Returns once this member's client URL is in the membership as its leader has it,
    /// so that a MemberList lists it (etcd's member publishes its attributes before it
    /// calls itself ready).
    pub async fn published(&self) {
        let mut published = self.published.subscribe();
        let _ = published.wait_for(|p| *p).await;
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

    /// Measures this member's data on disk again (the snapshot file plus the log entries
    /// not yet purged) and returns it.
    pub fn measure_db_size(&self) -> u64 {
        let size = self.applied.read().snapshot_bytes + self.log.live_bytes();
        self.db_size
            .store(size, std::sync::atomic::Ordering::Relaxed);
        size
    }

    /// Asks raft for a snapshot when one is due by [`snapshot_due`]; the ticker calls it
    /// on every member (raft's own policy is off: it counts entries only).
    pub async fn snapshot_if_due(&self) {
        let metrics = self.metrics();
        let applied = metrics.last_applied.map_or(0, |l| l.index);
        let snapshot = metrics.snapshot.map_or(0, |l| l.index);
        let snapshot_bytes = self.applied.read().snapshot_bytes;
        if !snapshot_due(
            applied.saturating_sub(snapshot),
            self.config.snapshot_count,
            self.log.live_bytes(),
            snapshot_bytes,
        ) {
            return;
        }
        {
            let mut asked = self
                .snapshot_asked
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let now = tokio::time::Instant::now();
            // Raft ignores a request while it builds; ask again only if the snapshot
            // asked for has not come in a long while (a failed build).
            if let Some((at_index, when)) = *asked
                && at_index == snapshot
                && now.duration_since(when) < SNAPSHOT_ASK_AGAIN
            {
                return;
            }
            *asked = Some((snapshot, now));
        }
        if let Err(e) = self.raft.trigger().snapshot().await {
            tracing::warn!("could not ask raft for a snapshot: {e}");
        }
    }

    /// This member's data on disk, as last measured (etcd's db size).
    pub fn db_size(&self) -> u64 {
        self.db_size.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The raised alarms, by member.
    pub fn alarms(&self) -> Vec<(NodeId, AlarmKind)> {
        self.applied.read().sm.alarms().collect()
    }

    /// Raises or clears `alarm` for `member` through the log; returns once applied here.
    pub async fn set_alarm(
        &self,
        activate: bool,
        member: NodeId,
        alarm: AlarmKind,
    ) -> Result<(), ProposeError> {
        let command = Command::Alarm {
            activate,
            member,
            alarm,
        };
        self.propose(command).await.map(|_| ())
    }

    /// Before a write that adds data: past the space quota, raise NOSPACE (once, as etcd's
    /// quota check does) so that the state machine refuses the write. The refusal comes
    /// from the log, not from here: a retried tracked write that was applied before the
    /// quota filled must still get its saved reply.
    async fn check_quota(&self, op: &Op) -> Result<(), ProposeError> {
        let quota = self.config.quota_backend_bytes;
        // Far below the quota (the common case) nothing about the op needs measuring.
        let size = self.db_size();
        if quota == 0 || size + self.config.max_request_bytes as u64 <= quota {
            return Ok(());
        }
        if !op.adds_data() || size + op.approx_size() as u64 <= quota {
            return Ok(());
        }
        let raised = self
            .applied
            .read()
            .sm
            .alarms()
            .any(|(_, a)| a == AlarmKind::NoSpace);
        if !raised {
            tracing::warn!(
                db_size = self.db_size(),
                quota,
                "space quota exceeded; raising the NOSPACE alarm"
            );
            self.set_alarm(true, self.id, AlarmKind::NoSpace).await?;
        }
        Ok(())
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

    /// The leader, waiting through an election if one is on (see [`settled_leader`]).
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

    /// Whether the tracked request `(client_id, seq, op fingerprint)` is being proposed
    /// through this node.
    pub fn is_in_flight(&self, key: &RequestKey) -> bool {
        self.in_flight.contains_key(key)
    }

    /// How many tracked requests wait in the in-flight list: originals being proposed
    /// plus retries joined to them.
    pub fn in_flight_waiters(&self) -> usize {
        self.in_flight.len()
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

    /// Proposes `op`, tracked under the session in `meta` if there is one (exactly once),
    /// untracked otherwise (etcd behaviour).
    pub async fn execute(
        self: &Arc<Self>,
        op: Op,
        meta: Option<SessionMeta>,
    ) -> Result<OpReply, ApiError> {
        #[cfg(feature = "sim")]
        if let Some(delay) = self.peers.duplicate(MessageKind::ClientWrite) {
            // The network delivered this request twice; the copy's reply goes nowhere.
            let (node, op) = (self.clone(), op.clone());
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = node.execute_once(op, meta).await;
            });
        }
        self.execute_once(op, meta).await
    }

    async fn execute_once(&self, op: Op, meta: Option<SessionMeta>) -> Result<OpReply, ApiError> {
        self.check_quota(&op).await?;
        let response = match meta {
            Some(m) => {
                let key = (m.client_id, m.seq, op.fingerprint());
                let command = Command::Tracked(Tracked {
                    client_id: m.client_id,
                    secret: m.secret,
                    seq: m.seq,
                    first_incomplete: m.first_incomplete,
                    fingerprint: key.2,
                    op,
                });
                self.propose_tracked(key, command).await?
            }
            None => self.propose(Command::Untracked(op)).await?,
        };
        match response {
            Response::Op(Ok(reply)) => Ok(reply),
            Response::Op(Err(e)) => Err(ApiError::Session(e)),
            other => Err(ApiError::Internal(format!("{other:?}"))),
        }
    }

    /// Proposes a tracked command, or, if the same request is already being proposed
    /// through this node, waits for that one's response. Correctness does not depend on
    /// this: a duplicate that does get proposed is answered from the session's saved
    /// response by the state machine.
    async fn propose_tracked(
        &self,
        key: RequestKey,
        command: Command,
    ) -> Result<Response, ProposeError> {
        let _marker = match self.join_or_claim(key) {
            InFlight::Joined(waiter) => return waiter.await?,
            InFlight::Claimed(marker) => marker,
        };
        let result = self.propose(command).await;
        self.in_flight.complete(&key, result.clone());
        result
    }

    /// Joins the request `key` if it is in flight through this node, else marks it in
    /// flight (until the marker is dropped) so that copies arriving meanwhile join it; the
    /// claimer MUST complete `key` with its result.
    fn join_or_claim(&self, key: RequestKey) -> InFlight {
        if self.in_flight.contains_key(&key) {
            let deadline = tokio::time::Instant::now().into_std() + self.config.request_timeout;
            InFlight::Joined(self.in_flight.register(key, Some(deadline)))
        } else {
            InFlight::Claimed(self.in_flight.register(key, None))
        }
    }

    /// Proposes `command` through the leader: locally if this node leads, else forwarded.
    pub async fn propose(&self, command: Command) -> Result<Response, ProposeError> {
        // Forward straight away when another member is known to lead; otherwise let raft
        // decide (it answers NotLeader with the leader it knows of, if any).
        let result = match self.settled_leader().await {
            Some(leader) if leader != self.id => Err(ProposeError::NotLeader {
                leader: Some(leader),
            }),
            _ => self.propose_local(command.clone()).await,
        };
        let result = match result {
            Err(ProposeError::NotLeader {
                leader: Some(leader),
            }) if leader != self.id => {
                let sent = self
                    .forwarder
                    .forward(leader, command, self.config.request_timeout)
                    .await;
                match sent {
                    Ok(response) => Ok(response),
                    // The leader could not be dialed, so the command was not sent: a
                    // leader that crashed is still the one this member knows until the
                    // others elect a new one, so wait for that and send it there once.
                    Err(ForwardError::Unsent { command, .. }) => {
                        self.propose_after(leader, command).await
                    }
                    Err(ForwardError::Failed(e)) => Err(e),
                }
            }
            Err(ProposeError::NotLeader { leader: None }) => Err(ProposeError::NoLeader),
            other => other,
        };
        if result.is_err() {
            self.metrics.proposal_failed();
        }
        result
    }

    /// Proposes `command` through whichever member leads after `gone`, waiting up to
    /// [`failover_wait`] for one; "no leader" if none does by then.
    async fn propose_after(
        &self,
        gone: NodeId,
        command: Command,
    ) -> Result<Response, ProposeError> {
        let leader = leader_other_than(&self.raft, failover_wait(&self.config), Some(gone)).await;
        let result = match leader {
            Some(leader) if leader == self.id => self.propose_local(command).await,
            Some(leader) => match self
                .forwarder
                .forward(leader, command, self.config.request_timeout)
                .await
            {
                Ok(response) => Ok(response),
                Err(ForwardError::Unsent { .. }) => Err(ProposeError::NoLeader),
                Err(ForwardError::Failed(e)) => Err(e),
            },
            None => Err(ProposeError::NoLeader),
        };
        result.map_err(|e| match e {
            ProposeError::NotLeader { .. } => ProposeError::NoLeader,
            other => other,
        })
    }

    /// Proposes only on this node (a forwarded request must not be forwarded again).
    async fn propose_local(&self, command: Command) -> Result<Response, ProposeError> {
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            // Handing leadership over: new entries would keep the followers' leader lease
            // alive and stop the transferee's election.
            return Err(ProposeError::NoLeader);
        }
        self.proposer
            .propose(command, self.config.request_timeout)
            .await
    }

    /// Waits until this node has applied everything committed before the call: the
    /// read-index protocol (the leader confirms leadership with a quorum, then every read
    /// after this returns at least that state).
    ///
    /// The confirmation is shared by every read waiting for one (see
    /// [`ReadBatcher`](crate::read_batch::ReadBatcher)); a follower asks the leader once
    /// per batch.
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        // A member that leads joins its own rounds directly: through `reads` its read
        // would wait for a round of `reads` that waits for one of `leader_reads`. Should
        // it have lost the lead meanwhile, `reads` finds the new leader.
        let leading = self.raft.metrics().borrow().current_leader == Some(self.id);
        let index = match leading {
            true => match self.read_index_via(&self.leader_reads).await {
                Err(ProposeError::NotLeader { .. }) => self.read_index_via(&self.reads).await,
                other => other,
            },
            false => self.read_index_via(&self.reads).await,
        }?;
        // tokio's clock: the same as std's in production, simulated time in a simulation.
        let deadline = tokio::time::Instant::now().into_std() + self.config.request_timeout;
        Ok(self.applied.wait_applied(index, deadline).await?)
    }

    /// A read index: under the leader lease if this member holds one, else from a round
    /// of `batcher`.
    async fn read_index_via(&self, batcher: &Arc<ReadBatcher>) -> Result<u64, ProposeError> {
        match self.lease_read_index() {
            Some(index) => Ok(index),
            None => batcher.read_index().await,
        }
    }

    /// With `--leader-lease-reads`, on a leader whose lease of this term runs: its last
    /// log index (see [`crate::read_lease`]), renewing the lease in the background once
    /// half of it is gone. `None`: confirm with a round instead.
    fn lease_read_index(&self) -> Option<u64> {
        let lease = self.lease.as_ref()?;
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let (leader, term, last) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.current_term, m.last_log_index)
        };
        if leader != Some(self.id) {
            return None;
        }
        let remaining = lease.remaining(term, tokio::time::Instant::now())?;
        if lease.start_renewal(remaining) {
            let (lease, reads) = (lease.clone(), self.leader_reads.clone());
            tokio::spawn(async move {
                let _ = reads.read_index().await;
                lease.renewed();
            });
        }
        self.metrics.lease_read();
        Some(last.unwrap_or(0))
    }

    /// Whether this member grants votes now: with lease reads, not during its first two
    /// election timeouts (it has forgotten which leader it heard from last).
    pub(crate) fn voting_allowed(&self) -> bool {
        self.lease
            .as_ref()
            .is_none_or(|l| l.voting_allowed(tokio::time::Instant::now()))
    }

    /// A Range on this node's applied state, after `read_index` unless `serializable`.
    pub async fn range(
        &self,
        req: &RangeRequest,
        serializable: bool,
    ) -> Result<(i64, RangeResponse), ApiError> {
        if !serializable {
            self.read_index().await?;
        }
        let inner = self.applied.read();
        if inner.sm.alarms().any(|(_, a)| a == AlarmKind::Corrupt) {
            return Err(OpError::Corrupt.into());
        }
        Ok(inner.sm.range(req)?)
    }

    /// A read index for a follower's read: the leader's own round of confirmation,
    /// shared with its clients' reads.
    pub(crate) async fn read_index_for_follower(&self) -> Result<u64, ProposeError> {
        self.read_index_via(&self.leader_reads).await
    }

    /// A follower's batch, on the leader. A tracked command whose request is already in
    /// flight here (a retry or hedge that went through another member) joins it instead of
    /// being proposed again; the others are proposed together, each visibly in flight
    /// until answered, so that copies arriving meanwhile join them in turn.
    pub(crate) async fn propose_forwarded(
        &self,
        commands: Vec<Command>,
    ) -> Vec<Result<Response, ProposeError>> {
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            return vec![Err(ProposeError::NoLeader); commands.len()];
        }
        let mut results: Vec<Option<Result<Response, ProposeError>>> = vec![None; commands.len()];
        let (mut joined, mut proposing, mut batch, mut markers) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (i, command) in commands.into_iter().enumerate() {
            let key = match &command {
                Command::Tracked(t) => Some((t.client_id, t.seq, t.fingerprint)),
                _ => None,
            };
            if let Some(key) = key {
                match self.join_or_claim(key) {
                    InFlight::Joined(waiter) => {
                        joined.push((i, waiter));
                        continue;
                    }
                    InFlight::Claimed(marker) => markers.push(marker),
                }
            }
            proposing.push((i, key));
            batch.push(command);
        }
        let proposed = self
            .proposer
            .propose_many(batch, self.config.request_timeout)
            .await;
        for ((i, key), result) in proposing.into_iter().zip(proposed) {
            if let Some(key) = key {
                self.in_flight.complete(&key, result.clone());
            }
            results[i] = Some(result);
        }
        drop(markers);
        for (i, waiter) in joined {
            results[i] = Some(waiter.await.map_err(ProposeError::from).and_then(|r| r));
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(ProposeError::Internal(
                        "the proposer answered fewer commands than it was given".into(),
                    ))
                })
            })
            .collect()
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

    /// Takes a snapshot of the applied state now (compacting the log before it) and
    /// waits until one covers at least `index`.
    pub async fn snapshot_now(&self, index: u64) -> Result<(), String> {
        let covered =
            |m: &RaftMetrics<NodeId, Member>| m.snapshot.is_some_and(|s| s.index >= index);
        if covered(&self.metrics()) {
            return Ok(());
        }
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| e.to_string())?;
        let mut metrics = self.raft.metrics();
        // Covered, and the log before it purged: then the space is given back.
        let wait = metrics
            .wait_for(|m| covered(m) && m.purged.map(|p| p.index) >= m.snapshot.map(|s| s.index));
        let result = match tokio::time::timeout(self.config.request_timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err("raft stopped".to_string()),
            Err(_) => Err("the snapshot did not complete in time".to_string()),
        };
        self.measure_db_size();
        result
    }

    /// etcd's MoveLeader, on the leader: hands leadership to voter `target`, and returns
    /// once `target` leads. This leader proposes nothing meanwhile (clients see it
    /// unavailable and retry). See `NodeCore::hand_over` for how, without raft's
    /// transfer message, which openraft 0.9 lacks.
    pub async fn move_leader(self: &Arc<Self>, target: NodeId) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        let metrics = self.metrics();
        if metrics.current_leader != Some(self.id) {
            return Err("etcdserver: not leader".into());
        }
        if target == self.id {
            return Ok(());
        }
        let membership = metrics.membership_config.membership().clone();
        if !membership.voter_ids().any(|id| id == target) {
            return Err("etcdserver: bad leader transferee".into());
        }
        if self.transferring.load(Ordering::Acquire) {
            return Err("etcdserver: a leadership transfer is already in progress".into());
        }
        self.outlive_own_lease(&membership).await;
        if self.metrics().current_leader != Some(self.id) {
            return Err("etcdserver: not leader".into());
        }
        if self.transferring.swap(true, Ordering::AcqRel) {
            return Err("etcdserver: a leadership transfer is already in progress".into());
        }
        // In a task of its own: a client that gives up waiting must not stop the hand-over
        // half way, with this leader refusing proposals and sending no heartbeats.
        let core = self.clone();
        let handing = tokio::spawn(async move {
            tracing::info!("leadership transfer to {target:x} starting");
            let started = tokio::time::Instant::now();
            let result = core.hand_over(target, &membership, true).await;
            core.raft.runtime_config().heartbeat(true);
            core.transferring.store(false, Ordering::Release);
            match &result {
                Ok(()) => tracing::info!(
                    "leadership transfer to {target:x} finished in {:?}",
                    started.elapsed()
                ),
                Err(e) => tracing::warn!("leadership transfer to {target:x} failed: {e}"),
            }
            result
        });
        handing
            .await
            .map_err(|e| format!("etcdserver: leadership transfer failed: {e}"))?
    }

    /// Before a graceful stop (etcd transfers leadership on stop too): if this member
    /// leads and another voter is there, hands leadership to the voter whose log is
    /// furthest along, so that clients find a leader at once instead of after an election
    /// timeout. Only the quick way is tried (see `NodeCore::hand_over`): waiting out the
    /// followers' lease would keep writes stopped as long as the election it replaces. A
    /// leader younger than its own lease serves on until it has run out (at most one
    /// election timeout). Leaves this member refusing proposals, as it is about to stop.
    pub async fn hand_over_before_stop(&self) {
        use std::sync::atomic::Ordering;
        let metrics = self.metrics();
        if metrics.current_leader != Some(self.id) {
            return;
        }
        let membership = metrics.membership_config.membership().clone();
        if !quick_hand_over_fits(&membership) {
            tracing::info!(
                "not handing leadership over before stopping: with more than {QUICK_HAND_OVER_MAX_VOTERS} voters it would take as long as the election"
            );
            return;
        }
        let Some(target) = membership
            .voter_ids()
            .filter(|id| *id != self.id)
            .max_by_key(|id| matched_index(&metrics, id))
        else {
            return;
        };
        let started = tokio::time::Instant::now();
        self.outlive_own_lease(&membership).await;
        if self.metrics().current_leader != Some(self.id)
            || self.transferring.swap(true, Ordering::AcqRel)
        {
            return;
        }
        match self.hand_over(target, &membership, false).await {
            Ok(()) => tracing::info!(
                "leadership transferred to {target:x} before stopping, in {:?}",
                started.elapsed()
            ),
            Err(e) => tracing::warn!(
                "leadership not transferred before stopping ({e}); the other members will elect a leader"
            ),
        }
    }

    /// Waits until this leader's own vote is no longer under openraft's leader lease
    /// (see [`NodeCore::hand_over`]): the longest election timeout from when it began to
    /// lead, plus a margin. Proposals go on meanwhile. With more than three voters the
    /// quick way is not tried, and there is nothing to wait for.
    async fn outlive_own_lease(&self, membership: &openraft::Membership<NodeId, Member>) {
        if !quick_hand_over_fits(membership) {
            return;
        }
        let since = *self.leading_since.lock().unwrap_or_else(|p| p.into_inner());
        let lease = self.config.vote_lease();
        if let Some((term, at)) = since
            && term == self.metrics().current_term
        {
            tokio::time::sleep_until(at + lease + Duration::from_millis(50)).await;
        }
    }

    /// Makes `target` the leader; this member leads and has `transferring` set, and
    /// [`NodeCore::outlive_own_lease`] has returned.
    ///
    /// Raft in openraft 0.9 has no transfer message (etcd's TimeoutNow), and a follower
    /// refuses votes while its leader lease from this leader lasts. The leader's own vote
    /// has no such lease once it has led for a lease's length (openraft's lease is the
    /// longest election timeout, counted from the election). So the quick way: wait until
    /// `target` holds this leader's whole log, then ask it to campaign; this leader
    /// grants its vote, and in a cluster of up to three voters those two votes are a
    /// quorum. Otherwise (more voters, a leadership younger than its lease, a message
    /// lost), and only if `patient`: stop heartbeats, keep the other followers from
    /// campaigning, wait out their lease and ask again.
    async fn hand_over(
        &self,
        target: NodeId,
        membership: &openraft::Membership<NodeId, Member>,
        patient: bool,
    ) -> Result<(), String> {
        let peer_url = |id: NodeId| membership.get_node(&id).map(|m| m.peer_url.clone());
        let Some(target_url) = peer_url(target) else {
            return Err("etcdserver: bad leader transferee".into());
        };
        let election = Duration::from_millis(self.config.election_timeout_ms);
        let lease = self.config.vote_lease();
        if quick_hand_over_fits(membership) {
            let mut watch = self.raft.metrics();
            // Nothing new is proposed now, so the target's log catches up with this one.
            let caught_up = matches!(
                tokio::time::timeout(
                    election,
                    watch.wait_for(|m| matched_index(m, &target) >= m.last_log_index),
                )
                .await,
                Ok(Ok(_))
            );
            if caught_up
                && self
                    .forwarder
                    .ask_member(&target_url, Forwarded::Campaign)
                    .await
                    .is_ok()
                && self.leads_within(target, election).await
            {
                return Ok(());
            }
        }
        if !patient {
            return Err("the transferee did not win its election at once".into());
        }
        // A refused campaign may have deposed this leader already (a higher term in the
        // target's answers); then the target wins its next election without help.
        if self.metrics().current_leader != Some(self.id) {
            return if self.leads_within(target, lease * 2).await {
                Ok(())
            } else {
                Err("etcdserver: leadership transfer timed out".into())
            };
        }
        self.raft.runtime_config().heartbeat(false);
        let hold_ms = (lease * 3).as_millis() as u64;
        for id in membership
            .voter_ids()
            .filter(|id| *id != target && *id != self.id)
        {
            if let Some(url) = peer_url(id) {
                let _ = self
                    .forwarder
                    .ask_member(&url, Forwarded::HoldElections { ms: hold_ms })
                    .await;
            }
        }
        // Followers refuse votes while their lease from this leader lasts.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let campaign = self
            .forwarder
            .ask_member(&target_url, Forwarded::Campaign)
            .await;
        let led = self.leads_within(target, lease * 2).await;
        match (campaign, led) {
            (_, true) => Ok(()),
            (Err(e), _) => Err(format!("etcdserver: leadership transfer failed: {e}")),
            _ => Err("etcdserver: leadership transfer timed out".into()),
        }
    }

    /// Whether `target` leads, in this member's view, within `limit`.
    async fn leads_within(&self, target: NodeId, limit: Duration) -> bool {
        let mut watch = self.raft.metrics();
        matches!(
            tokio::time::timeout(limit, watch.wait_for(|m| m.current_leader == Some(target))).await,
            Ok(Ok(_))
        )
    }

    /// The waiting list of the questions asked of every member, and a fresh id for one.
    pub(crate) fn new_fanout(&self) -> (u64, &WaitingList<u64, String, String>) {
        let id = self
            .fanout_ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (id, &self.fanouts)
    }

    /// The waiting list of the questions asked of every member.
    pub(crate) fn fanouts(&self) -> &WaitingList<u64, String, String> {
        &self.fanouts
    }

    /// Overwrites `key`'s value in this member's applied state only, bypassing the log:
    /// breaks replica agreement on purpose. For corruption-detection tests; nothing in
    /// the server calls it.
    #[doc(hidden)]
    pub fn corrupt_value_for_test(&self, key: &[u8], value: &[u8]) -> bool {
        self.applied.corrupt_value_for_test(key, value)
    }

    /// Who the member with `peer_url` is, by this member's applied (committed)
    /// membership.
    pub(crate) fn identify(&self, peer_url: &str) -> Identified {
        let inner = self.applied.read();
        if inner.membership.log_id().is_none() {
            return Identified::Unknown;
        }
        inner
            .membership
            .membership()
            .nodes()
            .find(|(_, m)| m.peer_url == peer_url)
            .map_or(Identified::NotAMember, |(id, _)| {
                Identified::Member(*id, self.cluster_id)
            })
    }

    /// Whether the membership in effect is still the one each member wrote for itself at
    /// formation (log index 0), which differs between members in the client URLs.
    pub fn membership_is_initial(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .is_none_or(|l| l.index == 0)
    }

    /// Records this member's client URL in raft's membership, where every member's
    /// member list reads it (etcd publishes its client URLs through raft the same way).
    /// A follower asks the leader.
    /// Returns whether it took a membership entry (false: the leader had it already).
    pub(crate) async fn publish(&self, client_url: String) -> Result<bool, ProposeError> {
        let name = self.config.name.clone();
        match self.settled_leader().await {
            Some(leader) if leader == self.id => {
                self.publish_local(self.id, name, client_url).await
            }
            Some(leader) => {
                self.forwarder
                    .publish(leader, self.id, name, client_url)
                    .await
            }
            None => Err(ProposeError::NoLeader),
        }
    }

    /// On the leader: sets member `id`'s name and client URL, keeping its peer URL as the
    /// membership has them (a peer can change where clients find it, never where raft
    /// reaches it).
    pub(crate) async fn publish_local(
        &self,
        id: NodeId,
        name: String,
        client_url: String,
    ) -> Result<bool, ProposeError> {
        use openraft::ChangeMembers;
        use openraft::error::{ClientWriteError, RaftError};
        let Some(mut member) = self.membership().remove(&id) else {
            return Err(ProposeError::Internal(format!(
                "member {id:x} is not in the membership"
            )));
        };
        if member.client_url == client_url && member.name == name {
            return Ok(false);
        }
        member.client_url = client_url;
        // A member added by MemberAdd is known by its peer URL only until it starts.
        member.name = name;
        let change = ChangeMembers::SetNodes(BTreeMap::from([(id, member)]));
        let fut = self.raft.change_membership(change, false);
        match tokio::time::timeout(self.config.request_timeout, fut).await {
            Err(_) => Err(ProposeError::Timeout),
            Ok(Ok(_)) => Ok(true),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id,
                })
            }
            // Another membership change is under way: the publisher tries again later.
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                tracing::debug!("publishing member {id:x}'s client URL: {e}");
                Err(ProposeError::NoLeader)
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ProposeError::Stopped),
        }
    }

    /// Fails with `Timeout` every waiter whose deadline is past `now`: retries joined to
    /// an in-flight original, and reads waiting for the applied index.
    pub(crate) fn expire_waiters(&self, now: Instant) {
        self.in_flight.expire(now);
        self.fanouts.expire(now);
        self.applied.waiters().expire(now);
    }

    /// Fails everything waiting on this node with `err` (leadership lost: the clients go
    /// to the new leader at once instead of waiting for a timeout). Returns how many.
    pub(crate) fn fail_waiters(&self, err: ProposeError) -> usize {
        self.in_flight.fail_all(err.clone()) + self.applied.waiters().fail_all(err)
    }

    /// On the leader, proposes a `Tick` when a session or lease is due by this member's
    /// clock (traffic would have moved cluster time past it otherwise).
    pub(crate) async fn tick_if_due(&self) {
        if self.leader() != Some(self.id) {
            return;
        }
        let due = self
            .applied
            .read()
            .sm
            .next_deadline()
            .is_some_and(|d| d <= self.config.clock.now_ms());
        if due && let Err(e) = self.propose_local(Command::Tick).await {
            tracing::debug!("tick: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LARGE_SNAPSHOT_BYTES, snapshot_due};

    #[test]
    fn small_states_snapshot_by_entries_large_ones_also_by_log_size() {
        const MB: u64 = 1 << 20;
        // etcd's rule while the last snapshot is small: entries alone.
        assert!(!snapshot_due(9_999, 10_000, 0, MB));
        assert!(snapshot_due(10_000, 10_000, 0, MB));
        assert!(snapshot_due(10_000, 10_000, 0, 0));
        // A 1 GiB snapshot waits for 256 MiB of log, however many entries.
        let big = 1024 * MB;
        assert!(!snapshot_due(10_000, 10_000, 3 * MB, big));
        assert!(!snapshot_due(5_000_000, 10_000, 256 * MB - 1, big));
        assert!(snapshot_due(5_000_000, 10_000, 256 * MB, big));
        // ... and still needs the entries.
        assert!(!snapshot_due(9_999, 10_000, 2 * big, big));
        // The line between the two rules.
        assert!(snapshot_due(10_000, 10_000, 0, LARGE_SNAPSHOT_BYTES - 1));
        assert!(!snapshot_due(10_000, 10_000, 0, LARGE_SNAPSHOT_BYTES));
    }
}
