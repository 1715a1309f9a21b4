//! etcd's Maintenance service: Status, Snapshot (a consistent point-in-time copy, see
//! [`crate::backup`]), Hash and HashKV (the basis of corruption checks), Defragment.

use std::sync::Arc;

use oncekv_core::AlarmKind;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use crate::auth::{Caller, Need};
pub use crate::compat::{ETCD_API_VERSION, alarm_name};
use crate::error::ApiError;
pub use crate::fanout::hash_kv;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::maintenance_server::Maintenance;
use crate::request_path::NodeCore;

/// Snapshot stream chunks (etcd sends 32 KiB).
const SNAPSHOT_CHUNK: usize = 32 * 1024;

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
        let (revision, applied) = {
            let inner = self.node.applied().read();
            (
                inner.sm.revision(),
                inner.last_applied.map_or(0, |l| l.index),
            )
        };
        let db_size = self.node.db_size() as i64;
        // etcd lists the raised alarms as the member's errors.
        let errors = self
            .node
            .alarms()
            .into_iter()
            .map(|(member, alarm)| format!("memberID:{member} alarm:{} ", alarm_name(alarm)))
            .collect();
        let is_learner = !metrics
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.node.id());
        Ok(Response::new(pb::StatusResponse {
            header: self.node.header(revision),
            version: ETCD_API_VERSION.to_string(),
            db_size,
            leader: metrics.current_leader.unwrap_or(0),
            raft_index: metrics.last_log_index.unwrap_or(0),
            raft_term: metrics.current_term,
            raft_applied_index: applied,
            errors,
            db_size_in_use: db_size,
            is_learner,
        }))
    }

    /// The applied state now, as an etcd database file (see [`crate::backup`]) written to
    /// a temporary file in the data directory, then streamed from it in chunks; the
    /// first carries the header.
    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<BoxStream<pb::SnapshotResponse>>, Status> {
        use tokio::io::AsyncReadExt;
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let node = self.node.clone();
        let dir = self.node.config().data_dir.clone();
        // Writing the copy walks the whole state: off the async workers.
        let (file, total) =
            tokio::task::spawn_blocking(move || crate::backup::current(node.applied(), &dir))
                .await
                .map_err(|e| Status::internal(format!("snapshot: {e}")))?
                .map_err(|e| Status::internal(format!("snapshot: {e}")))?;
        let revision = self.node.applied().read().sm.revision();
        let header = self.node.header(revision);
        let file = tokio::fs::File::from_std(file);
        // (file, bytes sent, header still to send); the file is closed (and so removed)
        // when the stream ends or the client goes away.
        let chunks = futures::stream::unfold(
            (Some(file), 0u64, header),
            move |(file, sent, header)| async move {
                // A copy is never empty: a database has at least its four first pages.
                let mut file = file?;
                if sent >= total {
                    return None;
                }
                let len = (total - sent).min(SNAPSHOT_CHUNK as u64) as usize;
                let mut blob = vec![0u8; len];
                match file.read_exact(&mut blob).await {
                    Ok(_) => {
                        let sent = sent + len as u64;
                        let chunk = pb::SnapshotResponse {
                            header,
                            remaining_bytes: total - sent,
                            blob: blob.into(),
                        };
                        Some((Ok(chunk), (Some(file), sent, None)))
                    }
                    Err(e) => Some((
                        Err(Status::internal(format!("snapshot: reading the copy: {e}"))),
                        (None, sent, None),
                    )),
                }
            },
        );
        Ok(Response::new(Box::pin(chunks)))
    }

    /// A CRC-32 of this member's whole replicated state (keys with history, leases,
    /// sessions): equal on members at the same applied index.
    async fn hash(
        &self,
        request: Request<pb::HashRequest>,
    ) -> Result<Response<pb::HashResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let (hash, revision) = {
            let inner = self.node.applied().read();
            let image = inner
                .sm
                .snapshot()
                .map_err(|e| Status::internal(format!("hash: {e}")))?;
            (crc32fast::hash(&image), inner.sm.revision())
        };
        Ok(Response::new(pb::HashResponse {
            header: self.node.header(revision),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<pb::HashKvRequest>,
    ) -> Result<Response<pb::HashKvResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let revision = request.into_inner().revision;
        let (hash, compact_revision, at) = hash_kv(&self.node, revision)?;
        Ok(Response::new(pb::HashKvResponse {
            header: self.node.header(at),
            hash,
            compact_revision,
        }))
    }

    /// Hands leadership to `target_id` (see [`NodeCore::move_leader`]); only the leader
    /// takes it, as etcd.
    async fn move_leader(
        &self,
        request: Request<pb::MoveLeaderRequest>,
    ) -> Result<Response<pb::MoveLeaderResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let target = request.into_inner().target_id;
        self.node.move_leader(target).await.map_err(|e| {
            if e == "etcdserver: not leader" {
                Status::unavailable(e)
            } else {
                Status::failed_precondition(e)
            }
        })?;
        // etcd answers MoveLeader and Defragment with no header; clients test for that.
        Ok(Response::new(pb::MoveLeaderResponse { header: None }))
    }

    /// GET lists the raised alarms; ACTIVATE and DEACTIVATE raise and clear one through the
    /// log (etcdctl's `alarm disarm` deactivates each listed alarm in turn).
    async fn alarm(
        &self,
        request: Request<pb::AlarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        use pb::alarm_request::AlarmAction;
        let need = if request.get_ref().action == AlarmAction::Get as i32 {
            Need::Anyone
        } else {
            Need::Admin
        };
        self.node.authorize(&Caller::of(&request), &[need]).await?;
        let r = request.into_inner();
        let kind = match pb::AlarmType::try_from(r.alarm) {
            Ok(pb::AlarmType::Nospace) => Some(AlarmKind::NoSpace),
            Ok(pb::AlarmType::Corrupt) => Some(AlarmKind::Corrupt),
            _ => None,
        };
        let listed = |alarms: Vec<(u64, AlarmKind)>| -> Vec<pb::AlarmMember> {
            alarms
                .into_iter()
                .map(|(member_id, alarm)| pb::AlarmMember {
                    member_id,
                    alarm: match alarm {
                        AlarmKind::NoSpace => pb::AlarmType::Nospace as i32,
                        AlarmKind::Corrupt => pb::AlarmType::Corrupt as i32,
                    },
                })
                .collect()
        };
        // As etcd's applier: a Get names one type or (NONE) every one; activating or
        // deactivating a type other than NOSPACE and CORRUPT changes nothing and is not an
        // error (etcd-client's own tests deactivate NONE).
        let every_type = r.alarm == pb::AlarmType::None as i32;
        if r.action == AlarmAction::Get as i32 {
            // etcd answers a Get through raft: an alarm raised through any member before
            // the Get is listed, so this member first catches up with the leader.
            self.node.read_index().await.map_err(ApiError::from)?;
        }
        let alarms = match (AlarmAction::try_from(r.action), kind) {
            (Ok(AlarmAction::Get), _) => listed(
                self.node
                    .alarms()
                    .into_iter()
                    .filter(|(_, a)| every_type || kind == Some(*a))
                    .collect(),
            ),
            (Ok(_), None) => Vec::new(),
            (Ok(action), Some(kind)) => {
                let activate = action == AlarmAction::Activate;
                let was = self.node.alarms().contains(&(r.member_id, kind));
                self.node
                    .set_alarm(activate, r.member_id, kind)
                    .await
                    .map_err(ApiError::from)?;
                // As etcd: the alarm changed, if it did.
                if activate != was {
                    listed(vec![(r.member_id, kind)])
                } else {
                    Vec::new()
                }
            }
            (Err(_), _) => {
                return Err(Status::invalid_argument("etcdserver: unknown alarm action"));
            }
        };
        let revision = self.node.applied().read().sm.revision();
        Ok(Response::new(pb::AlarmResponse {
            header: self.node.header(revision),
            alarms,
        }))
    }

    /// oncekv keeps its state in memory and on disk as the log plus one snapshot file;
    /// what etcd's defragmentation gives back (space freed inside the database file), it
    /// gets by taking a snapshot now: the file is rewritten from the live state and the log
    /// before it is dropped. Returns once that snapshot is taken.
    async fn defragment(
        &self,
        request: Request<pb::DefragmentRequest>,
    ) -> Result<Response<pb::DefragmentResponse>, Status> {
        self.node
            .authorize(&Caller::of(&request), &[Need::Admin])
            .await?;
        let applied = self.node.applied().read().sm.applied_index();
        self.node
            .snapshot_now(applied)
            .await
            .map_err(|e| Status::unavailable(format!("defragment: {e}")))?;
        Ok(Response::new(pb::DefragmentResponse { header: None }))
    }
}
