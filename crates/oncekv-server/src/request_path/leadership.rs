//! Handing leadership over: etcd's MoveLeader, and a leader's hand-over before it stops.

use crate::forwarder::Forwarded;
use crate::types::{Member, NodeId};
use openraft::RaftMetrics;
use std::sync::Arc;
use std::time::Duration;

use super::NodeCore;

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

impl NodeCore {
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
}
