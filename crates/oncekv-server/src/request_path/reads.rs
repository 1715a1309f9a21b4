//! Linearizable reads: a read index (the leader confirms its leadership with a quorum,
//! or under a lease; a follower asks the leader), then a read of the applied state once
//! this member has applied that far.

use crate::config::NodeConfig;
use crate::error::{ApiError, ProposeError};
use crate::forwarder::Forwarder;
use crate::metrics::{NodeMetrics, SharedMetrics};
use crate::read_batch::ReadBatcher;
use crate::read_lease::ReadLease;
use crate::types::{NodeId, Raft};
use oncekv_core::{AlarmKind, OpError, RangeRequest, RangeResponse};
use std::sync::Arc;
use std::time::Duration;

use super::NodeCore;

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
            let index = read.map_or(0, |l| l.index);
            if let Some(lease) = lease {
                lease.confirmed(term, started, index);
            }
            Ok(index)
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
pub(super) async fn settled_leader(raft: &Raft, limit: Duration) -> Option<NodeId> {
    leader_other_than(raft, limit, None).await
}

/// The leader `raft` knows, if it is not `gone`; else waits up to `limit` for one that is
/// not.
pub(super) async fn leader_other_than(
    raft: &Raft,
    limit: Duration,
    gone: Option<NodeId>,
) -> Option<NodeId> {
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

/// The index raft's core counts committed, asked of the core itself: the read index of
/// a read under the leader lease (see [`crate::read_lease`]). Shared, as a round is, by
/// the reads that arrive while one ask is out.
pub(super) fn committed_batcher(raft: &Raft) -> Arc<ReadBatcher> {
    let raft = raft.clone();
    ReadBatcher::new(Arc::new(move || {
        let raft = raft.clone();
        Box::pin(async move {
            raft.with_raft_state(|state| state.committed.map_or(0, |l| l.index))
                .await
                .map_err(|_| ProposeError::Stopped)
        })
    }))
}

/// How long a request waits for an election: about what one takes.
pub(super) fn election_wait(config: &NodeConfig) -> Duration {
    Duration::from_millis(config.election_timeout_ms.saturating_mul(2)).min(config.request_timeout)
}

/// How long a request waits for a leader to replace one that crashed: the others first
/// wait out its lease (an election timeout after its last heartbeat), then one of them
/// times out (half to one election timeout, randomized) and wins a vote; twice that
/// leaves room for one split vote and a slow machine.
pub(super) fn failover_wait(config: &NodeConfig) -> Duration {
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
pub(super) fn read_batchers(
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

/// A read under the leader lease.
enum LeasedRead {
    /// Everything in this leader's log was applied: its last index is the read index,
    /// with nothing to wait for and no need to ask raft's core.
    Idle(u64),
    /// Writes are in flight: the committed index, asked of raft's core, at least `floor`,
    /// so the read does not wait for writes that were not committed when it came.
    Busy { floor: u64 },
}

impl NodeCore {
    /// Waits until this node has applied everything committed before the call: the
    /// read-index protocol (the leader confirms leadership with a quorum, then every read
    /// after this returns at least that state).
    ///
    /// The confirmation is shared by every read waiting for one (see
    /// `ReadBatcher`); a follower asks the leader once
    /// per batch.
    pub async fn read_index(&self) -> Result<(), ProposeError> {
        if oncekv_core::broken::is(oncekv_core::broken::Break::StaleRead) {
            return Ok(());
        }
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
        match self.leased_read() {
            Some(LeasedRead::Idle(index)) => Ok(index),
            Some(LeasedRead::Busy { floor }) => Ok(floor.max(self.committed.read_index().await?)),
            None => batcher.read_index().await,
        }
    }

    /// With `--leader-lease-reads`, on a leader whose lease of this term runs: how a read
    /// finds its index under the lease (see [`crate::read_lease`]), renewing the lease in
    /// the background once half of it is gone. `None`: confirm with a round instead.
    fn leased_read(&self) -> Option<LeasedRead> {
        let lease = self.lease.as_ref()?;
        if self.transferring.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let (leader, term, last, applied) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            let applied = m.last_applied.map_or(0, |l| l.index);
            (m.current_leader, m.current_term, m.last_log_index, applied)
        };
        if leader != Some(self.id) {
            return None;
        }
        let (remaining, floor) = lease.current(term, tokio::time::Instant::now())?;
        if lease.start_renewal(remaining) {
            let (lease, reads) = (lease.clone(), self.leader_reads.clone());
            tokio::spawn(async move {
                let _ = reads.read_index().await;
                lease.renewed();
            });
        }
        self.metrics.lease_read();
        let last = last.unwrap_or(0);
        Some(match last <= applied {
            true => LeasedRead::Idle(floor.max(last)),
            false => LeasedRead::Busy { floor },
        })
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
}
