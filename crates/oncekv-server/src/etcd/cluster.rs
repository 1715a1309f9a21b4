//! etcd's Cluster service: member list, add, remove, update, promote (see
//! [`crate::membership`]).

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::auth::{Caller, Need};
use crate::membership::{Changed, MemberChange, MemberInfo, members_of};
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::request_path::NodeCore;

#[derive(Debug, Clone)]
pub struct ClusterService {
    pub node: Arc<NodeCore>,
}

impl ClusterService {
    /// The members as raft's configuration in effect has them (learners marked), with
    /// client URLs from `--initial-cluster` for founders that have not published theirs.
    fn members(&self, infos: Vec<MemberInfo>) -> Vec<pb::Member> {
        let founders = self.node.members();
        infos
            .into_iter()
            .map(|info| {
                let mut m = info.member;
                if m.client_url.is_empty()
                    && let Some(f) = founders.get(&info.id)
                {
                    m.client_url = f.client_url.clone();
                }
                pb::Member {
                    id: info.id,
                    name: m.name,
                    peer_ur_ls: vec![m.peer_url],
                    // `--advertise-client-urls` may list several, comma separated.
                    client_ur_ls: m
                        .client_url
                        .split(',')
                        .map(str::trim)
                        .filter(|u| !u.is_empty())
                        .map(String::from)
                        .collect(),
                    is_learner: info.learner,
                }
            })
            .collect()
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        let revision = self.node.applied().read().sm.revision();
        self.node.header(revision)
    }

    async fn change(&self, change: MemberChange) -> Result<Changed, Status> {
        Ok(self.node.change_members(change).await?)
    }
}

/// The one peer URL of a MemberAdd or MemberUpdate (oncekv members have one).
fn one_peer_url(urls: Vec<String>) -> Result<String, Status> {
    match <[String; 1]>::try_from(urls) {
        Ok([url]) => Ok(url),
        Err(urls) if urls.is_empty() => Err(Status::invalid_argument(
            "etcdserver: member peer URLs are required",
        )),
        Err(_) => Err(Status::invalid_argument(
            "oncekv: a member has exactly one peer URL",
        )),
    }
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        _request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let membership = self.node.metrics().membership_config.membership().clone();
        Ok(Response::new(pb::MemberListResponse {
            header: self.header(),
            members: self.members(members_of(&membership)),
        }))
    }

    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let r = request.into_inner();
        let peer_url = one_peer_url(r.peer_ur_ls)?;
        let changed = self
            .change(MemberChange::Add {
                peer_url,
                learner: r.is_learner,
            })
            .await?;
        let members = self.members(changed.members);
        let member = members
            .iter()
            .find(|m| Some(m.id) == changed.added)
            .cloned();
        Ok(Response::new(pb::MemberAddResponse {
            header: self.header(),
            member,
            members,
        }))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRemoveRequest>,
    ) -> Result<Response<pb::MemberRemoveResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let id = request.into_inner().id;
        let changed = self.change(MemberChange::Remove { id }).await?;
        Ok(Response::new(pb::MemberRemoveResponse {
            header: self.header(),
            members: self.members(changed.members),
        }))
    }

    async fn member_update(
        &self,
        request: Request<pb::MemberUpdateRequest>,
    ) -> Result<Response<pb::MemberUpdateResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let r = request.into_inner();
        let peer_url = one_peer_url(r.peer_ur_ls)?;
        let changed = self
            .change(MemberChange::Update { id: r.id, peer_url })
            .await?;
        Ok(Response::new(pb::MemberUpdateResponse {
            header: self.header(),
            members: self.members(changed.members),
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberPromoteRequest>,
    ) -> Result<Response<pb::MemberPromoteResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let id = request.into_inner().id;
        let changed = self.change(MemberChange::Promote { id }).await?;
        Ok(Response::new(pb::MemberPromoteResponse {
            header: self.header(),
            members: self.members(changed.members),
        }))
    }
}
