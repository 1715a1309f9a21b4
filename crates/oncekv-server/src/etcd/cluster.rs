//! etcd's Cluster (MemberList) and Maintenance (Status) services.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::cluster_server::Cluster;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::request_path::NodeCore;
use crate::types::member_id;

/// The etcd version oncekv reports: the API level it is compatible with.
pub const ETCD_API_VERSION: &str = "3.4.0";

#[derive(Debug, Clone)]
pub struct ClusterService {
    pub node: Arc<NodeCore>,
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn member_list(
        &self,
        _request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        // Raft's membership has the client URLs members published; the formation list is
        // the fallback for a member not (yet) in it.
        let mut known = self.node.members().clone();
        for (id, m) in self.node.membership() {
            let configured = known.entry(id).or_insert_with(|| m.clone());
            if !m.client_url.is_empty() {
                configured.client_url = m.client_url;
            }
        }
        let members = known
            .values()
            .map(|m| pb::Member {
                id: member_id(&m.name),
                name: m.name.clone(),
                peer_ur_ls: vec![m.peer_url.clone()],
                client_ur_ls: if m.client_url.is_empty() {
                    Vec::new()
                } else {
                    vec![m.client_url.clone()]
                },
                is_learner: false,
            })
            .collect();
        let revision = self.node.applied().read().sm.revision();
        Ok(Response::new(pb::MemberListResponse {
            header: self.node.header(revision),
            members,
        }))
    }
}

#[derive(Debug, Clone)]
pub struct MaintenanceService {
    pub node: Arc<NodeCore>,
}

#[tonic::async_trait]
impl Maintenance for MaintenanceService {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let metrics = self.node.metrics();
        let (revision, applied, db_size) = {
            let inner = self.node.applied().read();
            (
                inner.sm.revision(),
                inner.last_applied.map_or(0, |l| l.index),
                inner.snapshot_bytes as i64,
            )
        };
        Ok(Response::new(pb::StatusResponse {
            header: self.node.header(revision),
            version: ETCD_API_VERSION.to_string(),
            db_size,
            leader: metrics.current_leader.unwrap_or(0),
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: applied,
            errors: Vec::new(),
            db_size_in_use: db_size,
            is_learner: false,
        }))
    }
}
