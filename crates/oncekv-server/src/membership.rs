//! Growing and shrinking the cluster (etcd's MemberAdd / MemberRemove / MemberUpdate /
//! MemberPromote) on openraft's learners and joint consensus.
//!
//! - A voter is added as etcd adds one: the new member enters the configuration at once
//!   (a learner entry, then a joint-consensus change to voters), before its process has
//!   started; it then starts with `--initial-cluster-state existing`, asks a peer for the
//!   membership, finds itself by its peer URL, and gets the leader's snapshot (sessions and
//!   saved replies included, so exactly-once holds across the change).
//! - A learner is added with only the learner entry; promoting it is the change to voters,
//!   refused (as etcd does) until it has nearly caught up with the leader's log.
//! - Removing a member, the leader included, is one joint-consensus change. openraft's
//!   leader steps down once a configuration without it is committed; a member that finds
//!   itself outside the configuration stops ([`Node::failed`](crate::Node::failed) says
//!   so), as etcd's removed member does.
//!
//! Every change runs on the leader; a follower forwards it. etcd's checks and messages:
//! peer URLs in use, the member not found, one learner at most, promoting a voter or a
//! learner still behind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use openraft::ChangeMembers;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};

pub use crate::config::DEFAULT_CLUSTER_TOKEN;
use crate::error::ProposeError;
pub use crate::identity::Identity;
pub use crate::member_change::{Changed, MemberChange, MemberInfo, MembershipError};
use crate::request_path::NodeCore;
use crate::types::{Member, NodeId};

/// Counts a membership change as running while it lives.
struct Running(Arc<AtomicUsize>);

impl Running {
    fn start(count: &Arc<AtomicUsize>) -> Running {
        count.fetch_add(1, Ordering::AcqRel);
        Running(count.clone())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The most learners a cluster may have at once (etcd 3.4's limit).
pub const MAX_LEARNERS: usize = 1;

/// A learner is in sync, for promotion, once it has this share of the leader's log
/// (etcd's `readyPercent`).
const READY_PERCENT: f64 = 0.9;

/// The members of `membership` (both halves of a joint configuration), by id.
pub fn members_of(membership: &openraft::Membership<NodeId, Member>) -> Vec<MemberInfo> {
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, m)| MemberInfo {
            id: *id,
            member: m.clone(),
            learner: !voters.contains(id),
        })
        .collect()
}

/// A fresh member id for a member added with `peer_url`: from the URL and the leader's
/// log position (`salt`), so that a member removed and added again at the same URL is a
/// new member to raft. Not from the clock (etcd uses the time): a deterministic
/// simulation must draw the same id on every replay of a seed.
fn new_member_id(peer_url: &str, salt: u64, taken: &BTreeSet<NodeId>) -> NodeId {
    let mut salt = salt;
    loop {
        let id = crate::types::member_id(&format!("{peer_url}#{salt}"));
        if !taken.contains(&id) {
            return id;
        }
        salt = salt.wrapping_add(1);
    }
}

impl NodeCore {
    /// Makes `change` on the leader (forwarding it from a follower).
    pub async fn change_members(&self, change: MemberChange) -> Result<Changed, MembershipError> {
        match self.settled_leader().await {
            Some(leader) if leader == self.id() => self.change_members_local(change).await,
            Some(leader) => self.forwarder().change_members(leader, change).await,
            None => Err(ProposeError::NoLeader.into()),
        }
    }

    /// On the leader: checks `change` against the membership in effect and proposes it.
    pub(crate) async fn change_members_local(
        &self,
        change: MemberChange,
    ) -> Result<Changed, MembershipError> {
        let metrics = self.metrics();
        if metrics.current_leader != Some(self.id()) {
            return Err(ProposeError::NotLeader {
                leader: metrics.current_leader,
            }
            .into());
        }
        let membership = metrics.membership_config.membership().clone();
        let current = members_of(&membership);
        let find = |id: NodeId| current.iter().find(|m| m.id == id).cloned();
        let url_taken = |url: &str, except: Option<NodeId>| {
            current
                .iter()
                .any(|m| m.member.peer_url == url && Some(m.id) != except)
        };
        let mut added = None;
        let result = match change {
            MemberChange::Add { peer_url, learner } => {
                check_peer_url(&peer_url)?;
                if url_taken(&peer_url, None) {
                    return Err(MembershipError::PeerUrlExists);
                }
                if learner && current.iter().filter(|m| m.learner).count() >= MAX_LEARNERS {
                    return Err(MembershipError::TooManyLearners);
                }
                let taken = current.iter().map(|m| m.id).collect();
                // The log only grows: a later add of the same URL gets another salt.
                let salt = metrics.last_log_index.unwrap_or(0);
                let id = new_member_id(&peer_url, salt, &taken);
                let node = Member {
                    name: String::new(),
                    peer_url,
                    client_url: String::new(),
                };
                added = Some(id);
                // Not blocking: the new member's process may not be running yet.
                let learner_added = self.timed(self.raft().add_learner(id, node, false)).await?;
                if learner {
                    learner_added
                } else if membership.voter_ids().eq([self.id()]) {
                    // A one-member cluster growing, as etcd grows one: the joint
                    // configuration needs the new member to commit, which has not started
                    // yet. The add is done once this leader, the old configuration's whole
                    // quorum, has that configuration on disk; from then on nothing commits
                    // without the new member, as in etcd, and the change finishes when it
                    // joins.
                    let change = self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])));
                    tokio::select! {
                        done = change => done?,
                        entered = self.joint_on_disk(id) => {
                            entered?;
                            let members = members_of(self.metrics().membership_config.membership());
                            return Ok(Changed { added, members });
                        }
                    }
                } else {
                    self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                        .await?
                }
            }
            MemberChange::Remove { id } => {
                let m = find(id).ok_or(MembershipError::NotFound)?;
                let change = if m.learner {
                    ChangeMembers::RemoveNodes(BTreeSet::from([id]))
                } else {
                    ChangeMembers::RemoveVoters(BTreeSet::from([id]))
                };
                self.change(change).await?
            }
            MemberChange::Update { id, peer_url } => {
                check_peer_url(&peer_url)?;
                let m = find(id).ok_or(MembershipError::NotFound)?;
                if url_taken(&peer_url, Some(id)) {
                    return Err(MembershipError::PeerUrlExists);
                }
                let node = Member {
                    peer_url,
                    ..m.member
                };
                self.change(ChangeMembers::SetNodes(BTreeMap::from([(id, node)])))
                    .await?
            }
            MemberChange::Promote { id } => {
                let m = find(id).ok_or(MembershipError::NotFound)?;
                if !m.learner {
                    return Err(MembershipError::NotLearner);
                }
                let leader_last = metrics.last_log_index.unwrap_or(0);
                let matched = metrics
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).cloned().flatten())
                    .map_or(0, |l| l.index);
                if (matched as f64) < (leader_last as f64) * READY_PERCENT {
                    return Err(MembershipError::LearnerNotReady);
                }
                self.change(ChangeMembers::AddVoterIds(BTreeSet::from([id])))
                    .await?
            }
        };
        let members = result
            .membership
            .as_ref()
            .map(members_of)
            .unwrap_or_else(|| members_of(&self.metrics().membership_config.membership().clone()));
        Ok(Changed { added, members })
    }

    async fn change(
        &self,
        change: ChangeMembers<NodeId, Member>,
    ) -> Result<openraft::raft::ClientWriteResponse<crate::types::TypeConfig>, MembershipError>
    {
        // In a task of its own: openraft takes a joint change's two steps within this one
        // call, so a call dropped between them (the request timed out, its client went
        // away) would leave the cluster in the joint configuration.
        let raft = self.raft().clone();
        let running = Running::start(&self.changes_running);
        let task = tokio::spawn(async move {
            let _running = running;
            // `retain: false`: a voter removed leaves the configuration entirely rather
            // than staying on as a learner.
            raft.change_membership(change, false).await
        });
        self.timed(async move {
            task.await
                .unwrap_or(Err(RaftError::Fatal(openraft::error::Fatal::Stopped)))
        })
        .await
    }

    /// Returns once the membership in effect here names `id` as a voter and its entry is
    /// on this member's disk (within the request timeout).
    async fn joint_on_disk(&self, id: NodeId) -> Result<(), MembershipError> {
        let mut metrics = self.raft().metrics();
        let entered = async {
            let index = loop {
                let entry = {
                    let m = metrics.borrow_and_update();
                    let config = &m.membership_config;
                    let voter = config.membership().voter_ids().any(|v| v == id);
                    voter.then(|| config.log_id().as_ref().map_or(0, |l| l.index))
                };
                if let Some(index) = entry {
                    break index;
                }
                if metrics.changed().await.is_err() {
                    return Err(ProposeError::Stopped.into());
                }
            };
            self.log_durable(index)
                .await
                .map_err(|e| MembershipError::Refused(format!("the log failed: {e}")))
        };
        match tokio::time::timeout(self.config().request_timeout, entered).await {
            Ok(entered) => entered,
            Err(_) => Err(ProposeError::Timeout.into()),
        }
    }

    /// On the leader, with no change running here: finishes a joint configuration left
    /// behind (its leader crashed, or stepped down, between the two steps), by changing
    /// to the configuration's newer half, in a task. Called by the ticker; once the joint
    /// entry is committed only, as openraft refuses a change before.
    pub(crate) fn finish_joint_membership(self: &Arc<Self>) {
        if self.changes_running.load(Ordering::Acquire) > 0 {
            return;
        }
        let target = {
            let m = self.metrics();
            let config = &m.membership_config;
            let committed = config.log_id().as_ref().map(|l| l.index)
                <= m.last_applied.as_ref().map(|l| l.index);
            let joint = config.membership().get_joint_config();
            match (m.current_leader == Some(self.id()), committed, joint.last()) {
                (true, true, Some(newer)) if joint.len() > 1 => newer.clone(),
                _ => return,
            }
        };
        tracing::info!(?target, "finishing a joint membership change left behind");
        // Counted from now, so the next tick does not start a second one.
        let running = Running::start(&self.changes_running);
        let core = self.clone();
        tokio::spawn(async move {
            let _running = running;
            if let Err(e) = core.change(ChangeMembers::ReplaceAllVoters(target)).await {
                tracing::warn!("finishing the joint membership change failed: {e}");
            }
        });
    }

    /// `fut` within the request timeout, with openraft's refusals as etcd's.
    async fn timed<T>(
        &self,
        fut: impl Future<Output = Result<T, RaftError<NodeId, ClientWriteError<NodeId, Member>>>>,
    ) -> Result<T, MembershipError> {
        match tokio::time::timeout(self.config().request_timeout, fut).await {
            Err(_) => Err(ProposeError::Timeout.into()),
            Ok(Ok(r)) => Ok(r),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ProposeError::NotLeader {
                    leader: f.leader_id,
                }
                .into())
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(match e {
                    ChangeMembershipError::LearnerNotFound(_) => MembershipError::NotFound,
                    other => MembershipError::Refused(other.to_string()),
                })
            }
            Ok(Err(RaftError::Fatal(_))) => Err(ProposeError::Stopped.into()),
        }
    }
}

fn check_peer_url(url: &str) -> Result<(), MembershipError> {
    // An IP or a host name (the peers resolve it), and a port.
    let ok = url
        .strip_prefix("http://")
        .map(|r| r.trim_end_matches('/'))
        .and_then(|hp| hp.rsplit_once(':'))
        .is_some_and(|(host, port)| {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.[]:".contains(c))
                && port.parse::<u16>().is_ok()
        });
    if ok {
        Ok(())
    } else {
        Err(MembershipError::BadPeerUrl(url.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_member_id_avoids_taken_ones() {
        let first = new_member_id("http://127.0.0.1:2380", 7, &BTreeSet::new());
        let second = new_member_id("http://127.0.0.1:2380", 7, &BTreeSet::from([first]));
        assert_ne!(first, second);
        assert_ne!(
            first,
            new_member_id("http://127.0.0.1:2380", 8, &BTreeSet::new())
        );
    }

    #[test]
    fn peer_urls_must_be_http_host_port() {
        assert!(check_peer_url("http://127.0.0.1:2380").is_ok());
        assert!(check_peer_url("http://n2:2380").is_ok());
        assert!(check_peer_url("https://127.0.0.1:2380").is_err());
        assert!(check_peer_url("http://localhost").is_err());
        assert!(check_peer_url("http://a/b:2380").is_err());
    }
}
