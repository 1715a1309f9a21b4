//! A member's place in the membership as others see it: publishing its client URL
//! through raft, and telling a joining member who it is by its peer URL.

use crate::error::ProposeError;
use crate::forwarder::Identified;
use crate::types::NodeId;
use std::collections::BTreeMap;

use super::NodeCore;

impl NodeCore {
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
}
